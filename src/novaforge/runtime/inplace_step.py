"""The runner of an in-place update step (a KV cache's `index_copy_` on the caller's buffer).

The CPU backend turns an extern whose result is the new value of a mutated input into its
in-place ATen form on the input's own buffer (`codegen/cpu/backend.py: _inplace_updates`). Its
kernel body is that one extern plus views of the other operands; run every call by a decoding
step, that body costs about as much Python time as the whole rest of a decode step. Here the
views are composed once into strided layouts (`ir.views.apply_view` from each input's
contiguous buffer) and the call's argument list is built once with the tensor positions
marked, so a call is a few `as_strided` and one op call.

Invariant: the runner calls the in-place op with exactly the arguments the body's extern
would receive (the same values, strides and storage), or `make_runner` returns None and the
caller interprets the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ir import Graph
from ..ir.extern import decode, resolve
from ..ir.views import Strided, apply_view


class _Arg:
    """A placeholder for the extern's i-th tensor operand in its decoded argument list."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def make_runner(body: Graph, ins: list[int], env: list[Any], target: str) -> Callable[[], None] | None:
    layouts: dict[Any, tuple[int, Strided]] = {
        bi.value: (s, Strided.contiguous(bi.value.type.shape)) for bi, s in zip(body.inputs, ins, strict=True)}
    ext = None
    for m in body.nodes:
        if m.op.startswith("extern"):
            if ext is not None:
                return None
            ext = m
            continue
        src = layouts.get(m.inputs[0])
        new = apply_view(src[1], m.op, m.attrs) if src is not None else None
        if new is None:
            return None
        layouts[m.outputs[0]] = (src[0], new)
    if ext is None or any(v not in layouts for v in ext.inputs):
        return None
    operands = [layouts[v] for v in ext.inputs]
    if not operands or operands[0][1] != Strided.contiguous(ext.inputs[0].type.shape) \
            or ext.inputs[0] not in {bi.value for bi in body.inputs}:
        return None  # the first operand must be the input's buffer itself
    args, kwargs = decode(ext.attrs["spec"], [_Arg(i) for i in range(len(operands))])
    if any(isinstance(v, list | tuple) and any(isinstance(e, _Arg) for e in v) for v in (*args, *kwargs.values())):
        return None  # tensors nested in lists: not this fast path
    positions = [(j, a.index) for j, a in enumerate(args) if isinstance(a, _Arg)]
    kw_positions = [(k, a.index) for k, a in kwargs.items() if isinstance(a, _Arg)]
    op = resolve(target)
    base = {s: Strided.contiguous(bi.value.type.shape) for bi, s in zip(body.inputs, ins, strict=True)}
    plans = [(s, None if lay == base[s] else lay) for s, lay in operands]

    def run() -> None:
        xs = []
        for s, lay in plans:
            t = env[s]
            # env tensors are contiguous (the program binds inputs contiguous), as the layouts assume
            xs.append(t if lay is None else torch.as_strided(t, lay.shape, lay.strides,
                                                             t.storage_offset() + lay.offset))
        call_args = list(args)
        for j, i in positions:
            call_args[j] = xs[i]
        call_kwargs = dict(kwargs)
        for k, i in kw_positions:
            call_kwargs[k] = xs[i]
        op(*call_args, **call_kwargs)

    return run

"""Extern calls: ATen ops kept as calls instead of being lowered to IR primitives.

An extern node's attributes hold the op's qualified name (`aten.cumsum.default`) and a
hashable `spec` of its arguments in which every tensor argument is replaced by a marker
`TensorArg(i)` for the node's i-th input. Invariant: `call_extern(target, spec, inputs)` calls
the op with exactly the arguments the captured program used, so an extern computes what eager
computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorArg:
    index: int


def encode(obj: Any, tensors: list[Any], is_tensor) -> Any:
    """Replace tensor-like leaves (per `is_tensor`) by TensorArg markers, lists by tuples."""
    if is_tensor(obj):
        tensors.append(obj)
        return TensorArg(len(tensors) - 1)
    if isinstance(obj, list | tuple):
        return ("__list__",) + tuple(encode(x, tensors, is_tensor) for x in obj)
    if isinstance(obj, dict):
        return ("__dict__",) + tuple((k, encode(v, tensors, is_tensor)) for k, v in sorted(obj.items()))
    return obj


def decode(spec: Any, xs) -> Any:
    if isinstance(spec, TensorArg):
        return xs[spec.index]
    if isinstance(spec, tuple) and spec and spec[0] == "__list__":
        return [decode(x, xs) for x in spec[1:]]
    if isinstance(spec, tuple) and spec and spec[0] == "__dict__":
        return {k: decode(v, xs) for k, v in spec[1:]}
    return spec


_resolved: dict[str, Any] = {}


FUNCTIONALIZED = "auto_functionalized_v2"  # target prefix of a functionalized mutating (custom) op


def resolve(target: str):
    """The callable of an extern target: an op overload's qualified name (`aten.cumsum.default`),
    or `auto_functionalized_v2(ns.op.overload)`: torch's functional form of an op that mutates
    its arguments (it clones the bases the op writes, calls the op on the clones and returns the
    op's results followed by the clones; its keyword arguments are the HOP node's)."""
    op = _resolved.get(target)
    if op is None:
        if target.startswith(FUNCTIONALIZED + "("):
            from functools import partial

            op = partial(torch.ops.higher_order.auto_functionalized_v2, resolve(target[len(FUNCTIONALIZED) + 1:-1]))
        else:
            ns, name, overload = target.split(".")
            op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        _resolved[target] = op
    return op


def call_extern(target: str, spec: Any, xs) -> Any:
    args, kwargs = decode(spec, xs)
    out = resolve(target)(*args, **kwargs)
    if isinstance(out, list):
        out = tuple(out)
    return out

"""The reference interpreter: runs an IR graph op by op through torch.

This is the oracle for every pass (a pass must not change what the interpreter computes, up
to rounding) and the `backend="interpret"` executor. It runs on CPU or CUDA tensors, frees
each intermediate after its last use, and, with NOVAFORGE_CHECK=1, checks every produced
tensor against its IR type. Fused kernels run by interpreting their bodies. Because every op
is an ordinary differentiable torch call, running it with autograd enabled gives correct
gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import settings
from ..ir import OPS, Graph, Value


class InterpretError(RuntimeError):
    pass


class InterpretIndexError(InterpretError, IndexError):
    """An op raised IndexError (an index out of range), as eager raises it."""


class InterpretValueError(InterpretError, ValueError):
    pass


def _error_like(e: Exception, msg: str) -> InterpretError:
    """An InterpretError that is also of the failing op's exception kind, so callers catching
    what eager raises (IndexError for an index out of range) catch it here too."""
    if isinstance(e, IndexError):
        return InterpretIndexError(msg)
    if isinstance(e, ValueError):
        return InterpretValueError(msg)
    return InterpretError(msg)


def _last_uses(graph: Graph) -> dict[int, list[Value]]:
    last: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v] = i
    keep = set(graph.outputs) | {new for _, new in graph.mutations}
    free: dict[int, list[Value]] = {}
    for v, i in last.items():
        if v not in keep:
            free.setdefault(i, []).append(v)
    return free


def interpret(graph: Graph, inputs: Sequence[torch.Tensor], check: bool | None = None) -> list[torch.Tensor]:
    """Run `graph`. `inputs` bind the graph's non-const inputs in order; const inputs use their
    own tensors. Returns the outputs followed by the new values of mutated inputs."""
    check = settings.check_enabled() if check is None else check
    env: dict[Value, torch.Tensor] = {}
    it = iter(inputs)
    for gi in graph.inputs:
        if gi.kind == "const":
            env[gi.value] = gi.tensor
        else:
            try:
                env[gi.value] = next(it)
            except StopIteration:
                raise InterpretError(f"missing input {gi.name or gi.value}") from None
    free = _last_uses(graph)
    for i, n in enumerate(graph.nodes):
        args = [env[v] for v in n.inputs]
        try:
            if n.op == "kernel":
                out = interpret(n.attrs["kernel"].body, args, check)
            else:
                out = OPS[n.op].impl(args, n.attrs)
        except Exception as e:
            src = n.meta.get("source", "")
            raise _error_like(e, f"{n.op} failed{' at ' + src if src else ''}: {e}") from e
        outs = out if isinstance(out, list | tuple) else (out,)
        if len(outs) != len(n.outputs):
            raise InterpretError(f"{n.op}: produced {len(outs)} outputs, expected {len(n.outputs)}")
        for v, t in zip(n.outputs, outs, strict=True):
            if check:
                _check(n.op, v, t)
            env[v] = t
        for v in free.get(i, ()):
            env.pop(v, None)
    return [env[v] for v in graph.outputs] + [env[new] for _, new in graph.mutations]


def _check(op: str, v: Value, t: torch.Tensor) -> None:
    if tuple(t.shape) != v.type.shape or t.dtype != v.type.dtype:
        raise InterpretError(f"{op}: produced {t.dtype}{list(t.shape)}, IR says {v.type}")


# ATen ops whose result depends on where their argument lies in its storage
STORAGE_RELATIVE = frozenset({"aten.as_strided.default", "aten.as_strided_copy.default",
                              "aten.as_strided_scatter.default"})


def storage_relative(body: Graph) -> bool:
    """Does the body call an ATen op relative to its argument's storage (as_strided)? Then a
    runtime passes it each planned buffer as a tensor of its own (a copy), not as a view of its
    arena: the interpreter's values each have their own storage."""
    return any(m.op.startswith("extern") and m.attrs["target"] in STORAGE_RELATIVE for m in body.nodes)

"""The reference interpreter: runs an IR graph op by op through torch.

This is the oracle for every pass (a pass must not change what the interpreter computes, up
to rounding) and the `backend="interpret"` executor. It runs on CPU or CUDA tensors, frees
each intermediate after its last use, and, with NOVAFORGE_CHECK=1, checks every produced
tensor against its IR type. Fused kernels run by interpreting their bodies. Because every op
is an ordinary differentiable torch call, running it with autograd enabled gives correct
gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
    return prepare(graph, check)(inputs)


def prepare(graph: Graph, check: bool | None = None) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]:
    """`interpret(graph, ·)` with the walk over the graph done once: values numbered into a list,
    each node's implementation, argument and output positions and the values freed after it
    resolved ahead (a runtime calls this once per ATen step and the result at every call)."""
    check = settings.check_enabled() if check is None else check
    slots: dict[Value, int] = {}

    def slot(v: Value) -> int:
        return slots.setdefault(v, len(slots))

    consts = [(slot(gi.value), gi.tensor) for gi in graph.inputs if gi.kind == "const"]
    bound = [(slot(gi.value), gi.name or gi.value) for gi in graph.inputs if gi.kind != "const"]
    free = _last_uses(graph)
    steps = []
    for i, n in enumerate(graph.nodes):
        ins = [slot(v) for v in n.inputs]
        outs = [(slot(v), v) for v in n.outputs]
        body = prepare(n.attrs["kernel"].body, check) if n.op == "kernel" else None
        steps.append((n, body, None if body else OPS[n.op].impl, ins, outs, [slots[v] for v in free.get(i, ())]))
    results = [slot(v) for v in graph.outputs] + [slot(new) for _, new in graph.mutations]
    size = len(slots)

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env: list = [None] * size
        for k, t in consts:
            env[k] = t
        if len(inputs) < len(bound):
            raise InterpretError(f"missing input {bound[len(inputs)][1]}")
        for (k, _), t in zip(bound, inputs, strict=False):
            env[k] = t
        for n, body, impl, ins, outs, frees in steps:
            args = [env[k] for k in ins]
            try:
                out = body(args) if body is not None else impl(args, n.attrs)
            except Exception as e:
                src = n.meta.get("source", "")
                raise _error_like(e, f"{n.op} failed{' at ' + src if src else ''}: {e}") from e
            produced = out if isinstance(out, list | tuple) else (out,)
            if len(produced) != len(outs):
                raise InterpretError(f"{n.op}: produced {len(produced)} outputs, expected {len(outs)}")
            for (k, v), t in zip(outs, produced, strict=True):
                if check:
                    _check(n.op, v, t)
                env[k] = t
            for k in frees:
                env[k] = None
        return [env[k] for k in results]

    return run


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

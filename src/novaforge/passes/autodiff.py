"""Reverse-mode automatic differentiation on the IR: forward graph -> forward + backward graph.

`autodiff(graph, wrt=None, seed="inputs")` returns ONE graph that computes the forward graph's
outputs and, after them, the gradients of those outputs with respect to the chosen inputs:

* `wrt`: indices into `graph.inputs` to differentiate with respect to (default: every
  floating-point input that is not a constant); the result has one gradient output per index,
  in that order (zeros when an output does not depend on it);
* `seed`: the output cotangents. `"inputs"`: one new user input per floating-point output,
  appended after the graph's inputs in output order (the result is then a VJP function:
  outputs..., grads = f(inputs..., cotangents...)); `"ones"`: the first output is the loss
  (any shape; its cotangent is all ones), the others get none (they are returned unchanged).

Each op's rule is its record's `vjp` (`OpDef.defvjp`, beside the op in ir/ops/<family>.py):
`vjp(b, node, cotangents) -> input cotangents`, where `cotangents` has one entry per node output
(None: that output's gradient is zero) and the result one entry per input (None: no gradient).
Rules build IR through `b`, a `Builder` (emit, constants, casts, `unbroadcast`, `zeros`). The
forward nodes are kept as they are; the backward nodes follow them, in reverse order of the
forward nodes whose cotangents they propagate, and read forward values directly (what to keep
and what to recompute is the remat pass's decision, not this one's). Cotangents of a value
used several times are summed.

Invariant: the result is a valid graph (verified) whose first outputs, mutations and inputs are
those of `graph` (plus the seed inputs); its gradient outputs have the dtype and shape of the
inputs they belong to. An op without a VJP rule on the path from a `wrt` input to a seeded
output raises NotImplementedError naming it. The function is pure: `graph` is not changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ir import OPS, Graph, GraphInput, Node, Value, make_node, verify
from ..ir.types import TensorType, is_float, opmath_dtype

__all__ = ["Builder", "autodiff"]


class Builder:
    """What a VJP rule builds IR with: every value it emits lands in the backward graph."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def emit(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
        node = make_node(op, list(inputs), attrs, {"autodiff": True})
        self.nodes.append(node)
        return node.outputs[0]

    def node(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Node:
        node = make_node(op, list(inputs), attrs, {"autodiff": True})
        self.nodes.append(node)
        return node

    # -- constants and dtypes ----------------------------------------------------------
    def const(self, value: float | int | bool, like: Value | TensorType) -> Value:
        """A 0-d constant of `like`'s dtype and device."""
        t = like.type if isinstance(like, Value) else like
        v = float(value) if is_float(t.dtype) else (bool(value) if t.dtype == torch.bool else int(value))
        return self.emit("scalar", [], value=v, dtype=t.dtype, device=t.device)

    def full(self, value: float | int | bool, t: TensorType) -> Value:
        s = self.const(value, t)
        return s if t.rank == 0 else self.emit("expand", [s], shape=t.shape)

    def zeros(self, t: TensorType) -> Value:
        return self.full(0, t)

    def cast(self, v: Value, dtype: torch.dtype) -> Value:
        return v if v.type.dtype == dtype else self.emit("cast", [v], dtype=dtype)

    def opmath(self, v: Value) -> Value:
        """v in the dtype its math is done in (float32 for 16-bit floats)."""
        return self.cast(v, opmath_dtype(v.type.dtype))

    def _num(self, x: Value | float, like: Value) -> Value:
        return x if isinstance(x, Value) else self.const(x, like)

    # -- arithmetic shorthands (Python numbers become constants of the other operand's dtype)
    def add(self, x: Value, y: Value | float) -> Value:
        return self.emit("add", [x, self._num(y, x)])

    def _binary(self, op: str, x: Value | float, y: Value | float) -> Value:
        if not isinstance(x, Value):
            return self.emit(op, [self._num(x, y), y])
        return self.emit(op, [x, self._num(y, x)])

    def sub(self, x: Value | float, y: Value | float) -> Value:
        return self._binary("sub", x, y)

    def mul(self, x: Value, y: Value | float) -> Value:
        return self.emit("mul", [x, self._num(y, x)])

    def div(self, x: Value | float, y: Value | float) -> Value:
        return self._binary("div", x, y)

    def neg(self, x: Value) -> Value:
        return self.emit("neg", [x])

    def where(self, c: Value, x: Value | float, y: Value | float) -> Value:
        like = x if isinstance(x, Value) else y
        return self.emit("where", [c, self._num(x, like), self._num(y, like)])

    # -- shapes ------------------------------------------------------------------------
    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        return v if v.type.shape == shape else self.emit("reshape", [v], shape=shape)

    def expand(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        return v if v.type.shape == shape else self.emit("expand", [v], shape=shape)

    def sum(self, v: Value, axes: Sequence[int], keepdim: bool = True) -> Value:
        axes = tuple(sorted(axes))
        if not axes or v.type.rank == 0:
            return v
        return self.emit("sum", [v], axes=axes, keepdim=keepdim)

    def unbroadcast(self, g: Value, shape: Sequence[int]) -> Value:
        """The cotangent of a value of `shape` that was broadcast to g's shape: g summed over
        the broadcast dims, as that shape."""
        shape = tuple(shape)
        if g.type.shape == shape:
            return g
        off = g.type.rank - len(shape)
        axes = [d for d in range(g.type.rank)
                if d < off or (shape[d - off] == 1 and g.type.shape[d] != 1)]
        return self.reshape(self.sum(g, axes, keepdim=True), shape)

    def transpose_last(self, v: Value) -> Value:
        r = v.type.rank
        return self.emit("permute", [v], perm=tuple(range(r - 2)) + (r - 1, r - 2))


def _differentiable(v: Value) -> bool:
    return is_float(v.type.dtype)


def autodiff(graph: Graph, wrt: Sequence[int] | None = None, seed: str = "inputs") -> Graph:
    """The forward graph extended with the gradients of its outputs (see the module docstring)."""
    if seed not in ("inputs", "ones"):
        raise ValueError(f"seed must be 'inputs' or 'ones', got {seed!r}")
    if wrt is None:
        wrt = [i for i, gi in enumerate(graph.inputs) if gi.kind != "const" and _differentiable(gi.value)]
    targets = [graph.inputs[i].value for i in wrt]
    for i, v in zip(wrt, targets, strict=True):
        if not _differentiable(v):
            raise TypeError(f"input {i} ({graph.inputs[i].name or v}) is {v.type}: only float inputs have gradients")
    # which values depend on a target (only their cotangents are propagated)
    active: set[Value] = set(targets)
    for n in graph.nodes:
        if any(v in active for v in n.inputs):
            active.update(o for o in n.outputs if _differentiable(o))
    b = Builder()
    ct: dict[Value, Value] = {}
    seed_inputs: list[GraphInput] = []
    if seed == "ones":
        if not graph.outputs:
            raise ValueError("seed='ones' needs an output (the loss)")
        loss = graph.outputs[0]
        if not _differentiable(loss):
            raise TypeError(f"the loss {loss.type} is not a float value")
        ct[loss] = b.full(1.0, loss.type)
    else:
        for k, o in enumerate(graph.outputs):
            if _differentiable(o):
                g = Value(o.type, hint=f"ct{k}")
                seed_inputs.append(GraphInput(g, "user", f"cotangent_{k}"))
                _accumulate(b, ct, o, g)
    for n in reversed(graph.nodes):
        cts = [ct.get(o) for o in n.outputs]
        if all(c is None for c in cts) or not any(v in active for v in n.inputs):
            continue
        rule = OPS[n.op].vjp
        if rule is None:
            raise NotImplementedError(f"autodiff: {n.op} has no VJP rule (its record in ir/ops/ defines none); "
                                      f"it lies between a differentiated input and an output")
        in_cts = rule(b, n, cts)
        if len(in_cts) != len(n.inputs):
            raise AssertionError(f"{n.op}: its VJP returned {len(in_cts)} cotangents for {len(n.inputs)} inputs")
        for v, g in zip(n.inputs, in_cts, strict=True):
            if g is not None and v in active:
                _accumulate(b, ct, v, g)
    grads = []
    for v in targets:
        g = ct.get(v)
        grads.append(g if g is not None else b.zeros(v.type))
    out = Graph(list(graph.inputs) + seed_inputs, list(graph.nodes) + b.nodes, list(graph.outputs) + grads,
                graph.mutations, graph.meta)
    verify(out, "autodiff")
    return out


def _accumulate(b: Builder, ct: dict[Value, Value], v: Value, g: Value) -> None:
    if g.type.shape != v.type.shape:
        g = b.unbroadcast(g, v.type.shape) if g.type.numel >= v.type.numel else b.expand(g, v.type.shape)
    g = b.cast(g, v.type.dtype)
    prev = ct.get(v)
    ct[v] = g if prev is None else b.emit("add", [prev, g])


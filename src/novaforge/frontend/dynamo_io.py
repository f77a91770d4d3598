"""What a Dynamo graph takes and gives besides tensors, for the torch.compile entry (dynamo.py).

* `sized_arguments`: which call arguments carry a symbolic lowering's sizes. Invariant: every other
  axis is static and held equal to the traced size by Dynamo's guards, so a call's symbol values are
  read from these arguments alone.
* Non-tensor outputs: a constant (`constant_output`), an IR dim of a symbolic graph
  (`symbolic_output`), or one of the graph's own opaque inputs returned as it came
  (`InputPassthrough`), never a tensor (`is_tensor_node` tells them apart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..ir.symbolic import Sym


def sized_arguments(graph: Any, specs: Sequence[Any], sizes: Sequence[Any]) -> list[tuple[int, int | None, Any]]:
    """The call arguments that carry the symbolic lowering's sizes: (position, rank, [(axis, dim)])
    per tensor with a symbolic dim, (position, None, dim) per size argument. The other axes are
    static, and Dynamo's guards hold them equal to the traced sizes on every call that reaches
    this graph, so a call's symbol values are read from these alone (GPT-2's decode step takes
    273 tensors, 24 of them sized: 0.9 ms a call when every dim was matched)."""
    out: list[tuple[int, int | None, Any]] = []
    it = iter(graph.user_inputs)
    for i, (spec, size) in enumerate(zip(specs, sizes, strict=True)):
        if spec.kind == "user":
            shape = next(it).value.type.shape
            dims = [(k, d) for k, d in enumerate(shape) if isinstance(d, Sym)]
            if dims:
                out.append((i, len(shape), dims))
        elif size is not None:
            out.append((i, None, size))
    return out


def symbolic_output(a: Any, conv: Any) -> Any:
    """A non-tensor graph output of a symbolic graph: a constant, or an IR dim."""
    if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.SymInt):
        d = conv.dim(a.meta["val"])
        if d is not None:
            return d
    return constant_output(a)


def is_tensor_node(a: Any) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)


@dataclass(frozen=True)
class InputPassthrough:
    """A graph output that is one of the graph's own non-tensor inputs, returned as it came: an
    opaque object such as a DTensor's mesh or process group (a tensor-parallel forward saves it
    for its backward). It is the call's argument at `index`, not a constant."""

    index: int


def is_opaque_input(a: Any) -> bool:
    """A placeholder whose value is an opaque (script) object rather than a tensor or number."""
    if not (isinstance(a, torch.fx.Node) and a.op == "placeholder"):
        return False
    val = a.meta.get("val")
    return not isinstance(val, torch.Tensor | torch.SymInt | torch.SymFloat | torch.SymBool | int | float | bool)


def constant_output(a: Any) -> Any:
    """A graph output that is not a tensor: a constant, or a node whose value is a Python number
    after specialization (a SymInt the static trace made concrete)."""
    if isinstance(a, torch.fx.Node):
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
            from torch.fx.experimental.symbolic_shapes import guard_scalar

            return guard_scalar(val)
        if isinstance(val, int | float | bool):
            return val
        from .lower import UnsupportedError

        raise UnsupportedError(f"graph output {a.name} is not a tensor ({type(val).__name__})")
    return a

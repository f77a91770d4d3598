"""Kernels that may compute a mutated graph input's new value into the input's own buffer.

A program's mutations (an optimizer step's parameters and moments, a cache's rows) are new
values written back into the inputs after the program ran. Where one kernel computes a new
value reading the old one only elementwise at the output's shape, as the last reader of the
old value, and neither is returned, the kernel can write the input's buffer directly: no
fresh buffer, no copy at the write-back (the caller sees the new value is its input and skips
it). Invariant: `pointwise_updates` names only such kernels; a backend that uses it must load
every element a lane reads before that lane stores (both backends' pointwise kernels do).
Used by the CPU and the Triton backends
(pointwise kernels and matmul epilogues).
"""

from __future__ import annotations

from collections.abc import Collection

from ..ir import OPS, Graph, Value
from ..ir.views import view_roots


def mutated_input_uses(graph: Graph) -> tuple[dict[Value, Value], dict[Value, int], set[Value]]:
    """What an in-place update of a mutated input must respect: each new value's input, the
    last node reading each value or a view of it, and the values read after the program ran,
    themselves or through a view: the outputs, and the new values of mutated inputs (an input's
    old value written back into another input, `x0.copy_(x1); x1.relu_()`)."""
    root = view_roots(graph.nodes)
    later_use: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            later_use[root.get(v, v)] = i
    returned = {root.get(v, v) for v in graph.outputs} | {root.get(new, new) for _, new in graph.mutations}
    return {new: old for old, new in graph.mutations}, later_use, returned


def pointwise_updates(graph: Graph, inputs: Collection[Value], kinds: tuple[str, ...]) -> dict[int, dict[Value, Value]]:
    """Pointwise kernels and matmul epilogues (by id) that may write a mutated graph input's new
    value into the input's own buffer: the kernel reads the input only elementwise at the output's
    shape (each element is read before its own lane writes it; the matmul's operands are not the
    input), nothing after the kernel reads the old value or a view of it, and neither the input
    nor a view of it is a graph output. The library never stores its raw matmul result there
    (`plan_kernel`'s `written_outs`). An optimizer step's parameters and moments are then
    updated in place, with no fresh buffer and no copy at the write-back."""
    new_of, later_use, returned = mutated_input_uses(graph)
    out: dict[int, dict[Value, Value]] = {}
    taken: set[Value] = set()
    for i, n in enumerate(graph.nodes):
        # pointwise kernels and matmul epilogues run one pass, each lane reading its own element
        # (a reduction kernel may read its input again after its first stores)
        if n.op != "kernel" or n.attrs["kernel"].kind not in kinds:
            continue
        body = n.attrs["kernel"].body
        pairs: dict[Value, Value] = {}
        for o in n.outputs:
            x = new_of.get(o)
            if (x is None or x not in inputs or x in taken or x in returned or later_use.get(x, -1) > i
                    or o in graph.outputs or x.type != o.type):
                continue
            reads = [bv.value for bv, v in zip(body.inputs, n.inputs, strict=True) if v is x]
            if all(read_elementwise_only(body, r) for r in reads):
                pairs[o] = x
                taken.add(x)
        if pairs:
            out[id(n)] = pairs
    return out


def read_elementwise_only(body: Graph, v: Value) -> bool:
    """Every reader of `v` in the body is elementwise at `v`'s shape (or there is none)."""
    return all(OPS[u.op].has("elementwise") and u.outputs[0].type.shape == v.type.shape for u in body.users(v))

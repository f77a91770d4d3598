"""Static parts of a dynamic ATen graph: the regions whose sizes do not depend on a symbol,
compiled once, with only the symbolic remainder run by torch.

A dynamic graph (Dynamo's SymInts) whose call has no program of its own runs eagerly
(`runtime/tiering.py`). Much of such a graph often has static sizes anyway: in a decode step
with a dynamic KV cache, only the cache concatenation and the attention over it depend on the
cache length; the projections, the MLP, the norms and the LM head see one token. `split` finds
the maximal regions of ATen nodes (and `getitem`s of their tuples) whose values, and every
tensor they read, have static shapes
(`torch.fx`'s capability-based partitioner, which keeps the split acyclic), keeps those holding
a matmul, convolution or attention, and replaces each by a module that runs its compiled
program. The symbolic nodes stay ATen ops in the outer graph, run by torch at every size.

Invariants:
* a static part reads and produces only tensors with static shapes and strides, so its program
  (built once, by `build_part`, at the part's example inputs) is valid for every call of the
  graph; its outputs come back in the part's order, as a tuple;
* the split module computes what the graph computes, for every input signature (the parts are
  the graph's own nodes, and each part's program computes what its nodes compute);
* the graph module given is not modified (the split works on a copy of its graph; its constant
  tensors are shared, not copied).
"""

from __future__ import annotations

import copy
import hashlib
import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

_aten = torch.ops.aten
# a part is worth a program when it holds one of these (else its ops cost less than a launch)
HEAVY = frozenset(
    p for op in (_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm, _aten.convolution,
                 _aten._scaled_dot_product_flash_attention_for_cpu, _aten.scaled_dot_product_attention)
    for p in (op.default,))
PREFIX = "nf_static_"


def _static_value(v: Any) -> bool:
    """A tensor (or a tuple of them) with static shape and strides, or a plain number."""
    if isinstance(v, torch.Tensor):
        return all(isinstance(s, int) for s in (*v.shape, *v.stride()))
    if isinstance(v, list | tuple):
        return len(v) > 0 and all(_static_value(x) for x in v)
    return isinstance(v, int | float | bool) and not isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool)


def is_static_node(node: torch.fx.Node) -> bool:
    """An ATen call (or a `getitem` of one's tuple, such as a layer norm's output) whose value and
    every argument are static (no SymInt anywhere)."""
    if node.op != "call_function" or not (isinstance(node.target, torch._ops.OpOverload)
                                          or node.target is operator.getitem):
        return False
    if node.target is operator.getitem and not is_static_node(node.args[0]):
        return False  # a part's inputs are tensors, never the tuple of a node outside it
    if not isinstance(node.meta.get("val"), torch.Tensor | list | tuple) or not _static_value(node.meta["val"]):
        return False
    ok = [True]

    def check(a: Any) -> Any:
        if isinstance(a, torch.fx.Node) and a.op != "get_attr":  # constants: inputs of the part
            if not _static_value(a.meta.get("val")):
                ok[0] = False
        elif isinstance(a, torch.SymInt | torch.SymFloat | torch.SymBool):
            ok[0] = False
        return a

    torch.fx.node.map_aggregate((node.args, node.kwargs), check)
    return ok[0]


def _describe(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), tuple(v.stride()), str(v.dtype), str(v.device), v.requires_grad)
    if isinstance(v, list | tuple):
        return tuple(_describe(x) for x in v)
    return repr(v)


def structure_key(gm: torch.fx.GraphModule) -> str:
    """Equal for two parts exactly when they are the same computation on inputs of the same
    shapes, strides, dtypes and devices (node names aside): one program serves both (a part
    reads every tensor, constants included, as an input)."""
    index: dict[torch.fx.Node, int] = {}
    items = []
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i

        def ref(a: Any) -> Any:
            return f"%{index[a]}" if isinstance(a, torch.fx.Node) else a

        args = torch.fx.node.map_aggregate((n.args, n.kwargs), ref)
        target = "" if n.op in ("placeholder", "output") else str(n.target)  # a placeholder's is its name
        items.append((n.op, target, repr(args), _describe(n.meta.get("val"))))
    return hashlib.sha256(repr(items).encode()).hexdigest()


class _StaticSupport(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return is_static_node(node)


_SPENT = threading.local()  # seconds this thread spent in static parts (see `time_in_parts`)


def time_in_parts() -> float:
    """The seconds this thread has spent running static parts (a running total)."""
    return getattr(_SPENT, "s", 0.0)


class StaticPart(torch.nn.Module):
    """A static region of the graph, run by its compiled program (`run(args) -> list`)."""

    def __init__(self, run: Callable[[Sequence[Any]], list[Any]], as_tuple: bool) -> None:
        super().__init__()
        self.run = run
        self.as_tuple = as_tuple

    def forward(self, *args: Any) -> Any:
        t0 = time.perf_counter()
        outs = self.run(args)
        _SPENT.s = time_in_parts() + time.perf_counter() - t0
        return tuple(outs) if self.as_tuple else outs[0]


def _tuple_output(gm: torch.fx.GraphModule) -> bool:
    """Make the part's graph return a tuple (the lowering expects one); True if it already did."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    if isinstance(out.args[0], list | tuple):
        return True
    out.args = ((out.args[0],),)
    gm.recompile()
    return False


def split(gm: torch.fx.GraphModule,
          build_part: Callable[[torch.fx.GraphModule, list[Any]], Callable[[Sequence[Any]], list[Any]]],
          ) -> tuple[torch.fx.GraphModule, int] | None:
    """(the graph with its static parts compiled, the number of parts), or None when no part is
    worth a program. `build_part(part_gm, example_inputs)` returns the part's runner (it may
    share one program among parts of equal `structure_key`, such as a model's layers)."""
    work = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # a new graph; constants shared, not copied
    partitioner = CapabilityBasedPartitioner(work, _StaticSupport(), allows_single_node_partition=True)
    parts = [p for p in partitioner.propose_partitions() if any(n.target in HEAVY for n in p.nodes)]
    if not parts:
        return None
    fused = partitioner.fuse_partitions(parts, prefix=PREFIX)
    count = 0
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith(PREFIX):
            continue
        part = getattr(fused, node.target)
        as_tuple = _tuple_output(part)
        examples = [p.meta["val"] for p in part.graph.nodes if p.op == "placeholder"]
        setattr(fused, node.target, StaticPart(build_part(part, examples), as_tuple))
        count += 1
    fused.recompile()
    return fused, count

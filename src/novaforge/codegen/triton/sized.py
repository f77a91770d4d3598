"""A Triton program for a range of sizes: built once from a graph with symbolic sizes,
instantiated per call size by `at`.

Its kernels are rendered and compiled once (`TritonBackend._choose_kernels` inside
`symbolic.formatting`): sizes are the kernels' integer arguments, every bound that depends on
them is masked, loops over a symbolic extent run to a run-time bound, and schedules are
planned at the symbols' planning hints (ir/symbolic.py) with single-pass rows only where one
block covers the longest row the ranges allow.

Invariant: `SizedTritonProgram.at(values)` is a TritonProgram that computes what the static
program of `specialize(graph, values)` computes. It runs the same compiled kernels with their
grids and size arguments evaluated at `values`, its arena placed by the symbolic memory plan at
these sizes (`MemoryPlan.at`), size inputs evaluated from their recipes, and the kernels that
run through torch on their bodies specialized at these sizes. Nothing is rendered or compiled
per size (on a GPU, Triton compiles a kernel again only for a new specialization of its integer
arguments: a size of 1, or one divisible by 16). Each instance has its own arena; the callers
keep the instances of the last sizes used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...ir import Graph, Value
from ...ir.specialize import specialize
from ...ir.symbolic import Sym, context_signature, graph_symbols, hint
from ...options import Options
from .program import Step, TritonProgram


class SizedTritonProgram:
    symbolic = True

    def __init__(self, backend: Any, graph: Graph, options: Options, chosen: dict[int, Any]) -> None:
        self.backend = backend
        self.graph = graph
        self.options = options
        self.chosen = chosen  # per kernel node index: (source, function, transposed) or a reason
        self.plan = graph.meta.memory_plan
        self.symbols = graph_symbols(graph)
        self.hints = {s: hint(Sym(s)) for s in self.symbols}  # (built inside the ranges' context)
        self.ranges = context_signature()
        self.calls = 0

    @property
    def kernels(self) -> list[Any]:
        """The KernelSource of each generated kernel, in node order."""
        return [c[0] for _, c in sorted(self.chosen.items()) if isinstance(c, tuple)]

    @property
    def steps(self) -> list[Step]:
        """One step per kernel node and top-level view, as an instance's (kind, title, and the
        generated source or the reason for torch), without instantiating one."""
        out = []
        for i, n in enumerate(self.graph.nodes):
            if n.op != "kernel":
                out.append(Step("view", n.op, [], []))
            elif i in self.chosen:
                c, name = self.chosen[i], n.attrs["kernel"].name
                out.append(Step("torch", name, [], [], reason=c) if isinstance(c, str) else
                           Step("triton", name, [], [], source=c[0]) if isinstance(c, tuple) else
                           Step("user", c.name, [], [], source=c))  # (a user Triton kernel of static sizes)
        return out

    def at(self, values: Mapping[Any, int]) -> TritonProgram:
        """The program at these symbol values (see the module invariant)."""
        values = {s: int(values[s]) for s in self.symbols}
        g = specialize(self.graph, values)
        plan = None
        if self.plan is not None:
            placed = self.plan.at(values)
            same = _value_map(self.graph, g)
            plan = dataclasses.replace(placed, offsets={same[v]: off for v, off in placed.offsets.items()},
                                       sizes={same[v]: n for v, n in placed.sizes.items()})
        prog = self.backend.program(g, self.options, plan, self.chosen, values)
        prog.sizes = values
        return prog

    def at_hints(self) -> TritonProgram:
        return self.at(self.hints)

    def run(self, inputs: Any) -> Any:
        raise ValueError("a program for a range of sizes runs through at(values)")

    def info(self) -> dict[str, Any]:
        kernels = [{"title": src.title, "kind": src.kind, "grid": [str(g) for g in src.grid],
                    "num_warps": src.num_warps, "num_stages": src.num_stages, "schedule": src.schedule.key(),
                    "size_args": list(src.symbols)} for src in self.kernels]
        return {"device": str(self.graph.outputs[0].type.device) if self.graph.outputs else "cpu",
                "sizes": self.ranges, "kernels": kernels,
                "fallbacks": [{"title": self.graph.nodes[i].attrs["kernel"].name, "reason": c}
                              for i, c in sorted(self.chosen.items()) if isinstance(c, str)]}


def _value_map(graph: Graph, special: Graph) -> dict[Value, Value]:
    """Each value of a symbolic graph to its value in `specialize(graph, ...)` (node for node)."""
    out: dict[Value, Value] = {}
    for a, b in zip(graph.inputs, special.inputs, strict=True):
        out[a.value] = b.value
    for n, m in zip(graph.nodes, special.nodes, strict=True):
        for a, b in zip(n.outputs, m.outputs, strict=True):
            out[a] = b
    return out

"""The ordered pass pipeline: one explicit list, every pass timed and counted.

For each pass the pipeline records wall time, nodes and values before and after, and the
pass's counters; that record is the pass-level visibility `explain` prints. With
NOVAFORGE_CHECK=1 (and in tests) the verifier runs after every pass.

With `keep_graphs=True` (argument or option) each record also keeps the graph the pass
returned. That costs no copy: graphs are immutable and share unchanged nodes, so a record only
holds a reference (the report prints them lazily). Each finished pass is logged on the
`passes` topic (fusion passes' counters also on `fusion`), and under `NOVAFORGE_DUMP` the IR
after every pass is written with its provenance line ("# after cse: 3.63 ms, ...").

Fuel (`novaforge.bisect`): option `pass_fuel` = {pass position in the list: n} limits that pass
to its first n rewrite/fusion decisions (passes/context.py); option `pass_trace=True` records
the description of every decision taken. Each record keeps `decisions` (asked for) and `trace`.
The option `check` ("1" or "numerics") turns the verifier on like NOVAFORGE_CHECK.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import logs, settings
from ..ir import Graph, verify
from ..ir.printer import format_graph
from ..options import Options
from .context import PassContext
from .cse import cse
from .dce import dce
from .fold_constants import fold_constants
from .layout import layout
from .simplify import simplify

Pass = Callable[[Graph, PassContext], Graph]


@dataclass
class PassRecord:
    name: str
    ms: float
    nodes_before: int
    nodes_after: int
    values_before: int
    values_after: int
    counters: dict[str, int] = field(default_factory=dict)
    graph: Graph | None = field(default=None, repr=False, compare=False)  # with keep_graphs
    decisions: int = 0  # rewrite/fusion decisions the pass asked for (fuel it would use)
    trace: list[str] | None = field(default=None, repr=False, compare=False)  # with pass_trace

    def effect(self) -> str:
        """The one-line summary logs, dumps and reports print."""
        eff = ", ".join(f"{k} {v}" for k, v in self.counters.items() if v)
        return (f"{self.ms:.2f} ms, {self.nodes_before} -> {self.nodes_after} nodes, "
                f"{self.values_before} -> {self.values_after} values" + (f"; {eff}" if eff else ""))


def _count_values(g: Graph) -> int:
    return len(g.inputs) + sum(len(n.outputs) for n in g.nodes)


def graph_passes() -> list[tuple[str, Pass]]:
    """The graph-level passes, in order (before fusion)."""
    from .expand_int_matmul import expand_int_matmul
    from .fuse_attention import fuse_attention
    from .hoist_size_only import hoist_size_only
    from .recognize_activations import recognize_activations
    from .recognize_int8_weights import recognize_int8_weights
    from .remat import remat
    from .split_reductions import split_reductions
    from .user_kernels import user_kernels

    return [
        ("dce", dce),
        ("cse", cse),
        ("expand_int_matmul", expand_int_matmul),  # (off the CPU: int8 products as exact float32 math)
        ("recognize_int8_weights", recognize_int8_weights),  # (before fold_constants: keeps W int8)
        ("fold_constants", fold_constants),
        ("simplify", simplify),
        ("recognize_activations", recognize_activations),
        ("layout", layout),
        ("cse", cse),
        ("fuse_attention", fuse_attention),
        ("hoist_size_only", hoist_size_only),  # (symbolic graphs only)
        ("remat", remat),
        ("split_reductions", split_reductions),  # (Triton only)
        ("user_kernels", user_kernels),  # (novaforge.register_kernel: a match whose kernel wins)
        ("dce", dce),
    ]


def lowering_passes() -> list[tuple[str, Pass]]:
    """Fusion, placement, ordering and memory planning."""
    from .fuse import fuse
    from .order import order
    from .overlap_collectives import overlap_collectives
    from .place import place
    from .plan_memory import plan_memory

    return [("fuse", fuse), ("place", place), ("order", order), ("overlap_collectives", overlap_collectives),
            ("plan_memory", plan_memory)]


def default_pipeline() -> list[tuple[str, Pass]]:
    return graph_passes() + lowering_passes()


def run_pipeline(
    graph: Graph,
    passes: list[tuple[str, Pass]] | None = None,
    options: Options | dict[str, Any] | None = None,
    target: Any = None,
    check: bool | None = None,
    backend: Any = None,
    keep_graphs: bool | None = None,
) -> tuple[Graph, list[PassRecord]]:
    opts = Options.of(options)
    check = (settings.check_enabled() or opts.check in ("1", "numerics")) if check is None else check
    keep = opts.keep_graphs if keep_graphs is None else keep_graphs
    fuel = dict(opts.pass_fuel)
    tracing = opts.pass_trace
    session = logs.current()
    dump = session.dump if session is not None else None
    if dump is not None:
        dump.write("passes/00-input.txt", f"# input graph: {len(graph.nodes)} nodes\n" + format_graph(graph),
                   "IR before the first pass")
    records: list[PassRecord] = []
    for i, (name, fn) in enumerate(passes if passes is not None else default_pipeline(), start=1):
        logs.stage(f"pass {name}")
        ctx = PassContext(options=opts, target=target, backend=backend, fuel=fuel.get(i - 1),
                          trace=[] if tracing else None)
        nb, vb = len(graph.nodes), _count_values(graph)
        t0 = time.perf_counter()
        graph = fn(graph, ctx)
        ms = (time.perf_counter() - t0) * 1e3
        if check:
            verify(graph, name)
        rec = PassRecord(name, ms, nb, len(graph.nodes), vb, _count_values(graph), dict(ctx.counters),
                         graph if keep else None, ctx.decisions, ctx.trace)
        records.append(rec)
        _log_pass(rec, graph)
        if dump is not None:
            dump.write(f"passes/{i:02d}-{name}.txt", f"# after {name}: {rec.effect()}\n" + format_graph(graph),
                       f"IR after {name} ({rec.effect()})")
    return graph, records


_log_passes = logs.get_logger("passes")
_log_fusion = logs.get_logger("fusion")


def _log_pass(rec: PassRecord, graph: Graph) -> None:
    _log_passes.info("%s: %s", rec.name, rec.effect())
    if rec.name in ("fuse", "fuse_attention") and _log_fusion.isEnabledFor(logging.INFO):
        _log_fusion.info("%s: %s", rec.name, ", ".join(f"{k} {v}" for k, v in rec.counters.items()) or "no change")
        if rec.name == "fuse" and _log_fusion.isEnabledFor(logging.DEBUG):
            for n in graph.nodes:
                if n.op == "kernel":
                    k = n.attrs["kernel"]
                    ops = [b.op for b in k.body.nodes]
                    _log_fusion.debug("kernel %s [%s]: %d ops (%s)%s", k.name, k.kind, len(ops), " ".join(ops[:12]),
                                      f"  # {n.meta['source']}" if n.meta.get("source") else "")

"""The ordered pass pipeline: one explicit list, every pass timed and counted.

For each pass the pipeline records wall time, nodes and values before and after, and the
pass's counters; that record is the pass-level visibility `explain` prints. With
NOVAFORGE_CHECK=1 (and in tests) the verifier runs after every pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import settings
from ..ir import Graph, verify
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


def _count_values(g: Graph) -> int:
    return len(g.inputs) + sum(len(n.outputs) for n in g.nodes)


def graph_passes() -> list[tuple[str, Pass]]:
    """The graph-level passes, in order (before fusion)."""
    from .fuse_attention import fuse_attention

    return [
        ("dce", dce),
        ("cse", cse),
        ("fold_constants", fold_constants),
        ("simplify", simplify),
        ("layout", layout),
        ("cse", cse),
        ("fuse_attention", fuse_attention),
        ("dce", dce),
    ]


def lowering_passes() -> list[tuple[str, Pass]]:
    """Fusion, placement, ordering and memory planning."""
    from .fuse import fuse
    from .order import order
    from .place import place
    from .plan_memory import plan_memory

    return [("fuse", fuse), ("place", place), ("order", order), ("plan_memory", plan_memory)]


def default_pipeline() -> list[tuple[str, Pass]]:
    return graph_passes() + lowering_passes()


def run_pipeline(
    graph: Graph,
    passes: list[tuple[str, Pass]] | None = None,
    options: dict[str, Any] | None = None,
    target: Any = None,
    check: bool | None = None,
    backend: Any = None,
) -> tuple[Graph, list[PassRecord]]:
    check = settings.check_enabled() if check is None else check
    records: list[PassRecord] = []
    for name, fn in passes if passes is not None else default_pipeline():
        ctx = PassContext(options=dict(options or {}), target=target, backend=backend)
        nb, vb = len(graph.nodes), _count_values(graph)
        t0 = time.perf_counter()
        graph = fn(graph, ctx)
        ms = (time.perf_counter() - t0) * 1e3
        if check:
            verify(graph, name)
        records.append(PassRecord(name, ms, nb, len(graph.nodes), vb, _count_values(graph), dict(ctx.counters)))
    return graph, records

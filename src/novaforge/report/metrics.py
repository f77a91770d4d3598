"""Compiler metrics from one compilation (a `CompileStats`).

fusion gain ratio = captured ATen ops / launches per call, where a launch is one generated
kernel or one library call (a program that splits a kernel, e.g. a GEMM call plus a separate
epilogue, reports its real launch count as `program.launches`). Higher means more work per
launch; eager PyTorch's ratio is 1 by definition.
"""

from __future__ import annotations

from typing import Any

from ..ir import OPS, Graph
from ..ir.ops import node_flops


def kernel_rows(graph: Graph) -> list[dict[str, Any]]:
    placement = graph.meta.get("placement", {})
    rows = []
    for n in graph.nodes:
        if n.op != "kernel":
            continue
        k = n.attrs["kernel"]
        flops = 0.0
        for bn in k.body.nodes:
            d = OPS[bn.op]
            if d.has("view") or d.has("generator"):
                continue
            flops += node_flops(bn.op, [v.type for v in bn.inputs], [o.type for o in bn.outputs], bn.attrs)
        bytes_moved = sum(v.type.nbytes for v in n.inputs) + sum(o.type.nbytes for o in n.outputs)
        rows.append({
            "name": k.name,
            "kind": k.kind,
            "ops": [bn.op for bn in k.body.nodes if not (OPS[bn.op].has("view") or OPS[bn.op].has("generator"))],
            "executor": placement.get(n, "?"),
            "flops": flops,
            "bytes": bytes_moved,
            "key": k.structural_key[:12],
            "source": n.meta.get("source", ""),
            "node": n,
        })
    return rows


def metrics(stats) -> dict[str, Any]:
    """A flat dict of the numbers benchmarks and reports print."""
    g = stats.graph
    rows = kernel_rows(g)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    program = stats.program
    launches = getattr(program, "launches", None) or len(rows)
    plan = g.meta.get("memory_plan")
    aten = stats.captured.aten_ops
    return {
        "aten_ops": aten,
        "ir_nodes_captured": len(stats.captured.graph.nodes),
        "kernels": len(rows),
        "kernels_by_kind": kinds,
        "distinct_kernels": len({r["key"] for r in rows}),
        "launches": launches,
        "library_calls": sum(1 for r in rows if r["executor"] in ("library", "torch")),
        "externs": list(stats.captured.externs),
        "fusion_gain_ratio": aten / max(launches, 1),
        "arena_bytes": plan.arena_bytes if plan else None,
        "sum_intermediate_bytes": plan.sum_bytes if plan else None,
        "transitions": g.meta.get("transitions"),
        "pass_ms": [(r.name, round(r.ms, 2)) for r in stats.records],
        "compile_s": dict(stats.times),
        "backend": stats.backend,
    }

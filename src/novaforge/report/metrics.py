"""Compiler metrics from one compilation (a `CompileStats`).

fusion gain ratio = captured ATen ops / launches per call, where a launch is one generated
kernel or one library call (a program that splits a kernel, e.g. a GEMM call plus a separate
epilogue, reports its real launch count as `program.launches`). Higher means more work per
launch; eager PyTorch's ratio is 1 by definition.

A kernel's `bytes` is the memory it must touch at least once: every output, and of every
input what its body reads of it (`touched_bytes`): a slice reads its part, an index op
(`take`, `gather`, ...) reads only the gathered rows of its table, and several reads of the
same buffer count once (capped at the buffer's size). Rooflines divide by this number, so it
must not count an embedding table of 150 MB for the 128 rows a `take` reads.
"""

from __future__ import annotations

from typing import Any

from ..ir import OPS, Graph, Node, Value
from ..ir.ops import node_flops


def _read_bytes(body: Graph, v: Value) -> int:
    """Bytes of `v` the body reads: views recurse (a slice reads less, an expand no more than its
    source), the table operand of an index op reads one element per output element."""
    total = 0
    for u in body.users(v):
        d = OPS[u.op]
        if d.has("view"):
            total += _read_bytes(body, u.outputs[0])
        elif d.has("index") and u.inputs[0] is v:
            total += u.outputs[0].type.numel * v.type.itemsize
        else:
            total += v.type.nbytes
    if body.is_output(v):
        total += v.type.nbytes
    return min(v.type.nbytes, total)


def touched_bytes(node: Node) -> int:
    """Minimum bytes a kernel node moves: its outputs plus what its body reads of each input."""
    body = node.attrs["kernel"].body
    read = sum(min(v.type.nbytes, _read_bytes(body, bi.value)) for bi, v in zip(body.inputs, node.inputs, strict=True))
    return read + sum(o.type.nbytes for o in node.outputs)


def kernel_rows(graph: Graph) -> list[dict[str, Any]]:
    from ..passes.user_kernels import user_kernel_name

    placement = graph.meta.placement or {}
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
        bytes_moved = touched_bytes(n)
        user = user_kernel_name(k.body)  # (novaforge.register_kernel: marked as the user's)
        rows.append({
            "name": k.name if user is None else f"user:{user}",
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
    """A flat dict of the numbers benchmarks and reports print (a program for a range of sizes:
    work counted at the symbols' planning hints)."""
    table = getattr(stats.captured, "symbols", None)
    if table is not None:
        with table.ranges_context():
            return _metrics(stats)
    return _metrics(stats)


def _metrics(stats) -> dict[str, Any]:
    g = stats.graph
    rows = kernel_rows(g)
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    program = stats.program
    launches = getattr(program, "launches", None) or len(rows)
    plan = g.meta.memory_plan
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
        "transitions": g.meta.transitions,
        "pass_ms": [(r.name, round(r.ms, 2)) for r in stats.records],
        "compile_s": dict(stats.times),
        "backend": stats.backend,
    }

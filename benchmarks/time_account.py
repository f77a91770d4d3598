"""Where the time goes on the CPU (issue 15): novaforge's per-kernel profile next to ONNX
Runtime's own profiler, on the same model and shapes, each in a fresh process.

    PYTHONPATH=src python benchmarks/time_account.py --models gpt2,bert,llama --batch 1 --calls 20

For every model and runner (novaforge with freeze=True and profile=True; ORT with
`enable_profiling`) it runs the model at 2 threads and at 1 thread and prints, per call:

* wall time (ORT's also without profiling, from a second session in the same process: its
  profiler costs time per node), and the categories that add up to it: GEMM, attention, normalisation, pointwise
  and other kernels, runtime overhead (novaforge: glue and program, measured; ORT: the session's
  `model_run` minus its nodes), and what is left unaccounted (the Python call around it);
* GEMM time per shape (M x N x K, launches, ms, GFLOP/s, share of the measured FMA peak);
* ORT's 4-d MatMuls (q k^T and p v) count as attention, as they do inside novaforge's
  attention kernels;
* thread loss: per category, 2-thread time minus half the 1-thread time. It is the time the
  second thread did not save: barrier waits, imbalance, and shared-cache or bandwidth limits
  (neither runtime exposes its barrier time directly; libgomp keeps no statistics).

The novaforge side is `report.roofline.profile_program` (launches timed in the generated glue);
ORT's is its JSON trace (`Node` events, `dur` in microseconds). Nothing else should run on the
machine: the load average before and after each process is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

CATEGORIES = ("gemm", "attention", "norm", "pointwise", "other", "overhead", "unaccounted")

# ONNX Runtime op types -> category (anything else: "other")
_ORT_CATEGORY = {
    "MatMul": "gemm", "Gemm": "gemm", "FusedMatMul": "gemm", "MatMulNBits": "gemm", "FusedGemm": "gemm",
    "Attention": "attention", "MultiHeadAttention": "attention", "GroupQueryAttention": "attention",
    "Softmax": "attention",
    "LayerNormalization": "norm", "SkipLayerNormalization": "norm", "SimplifiedLayerNormalization": "norm",
    "SkipSimplifiedLayerNormalization": "norm", "RMSNormalization": "norm", "ReduceMean": "norm",
    "Pow": "pointwise", "Sqrt": "pointwise", "Reciprocal": "pointwise",
    "Add": "pointwise", "Mul": "pointwise", "Sub": "pointwise", "Div": "pointwise", "Gelu": "pointwise",
    "FastGelu": "pointwise", "BiasGelu": "pointwise", "Tanh": "pointwise", "Where": "pointwise",
    "Cast": "pointwise", "Sigmoid": "pointwise", "Erf": "pointwise", "Neg": "pointwise", "Cos": "pointwise",
    "Sin": "pointwise", "Equal": "pointwise", "Less": "pointwise", "Greater": "pointwise", "Not": "pointwise",
    "And": "pointwise", "QuickGelu": "pointwise", "BiasAdd": "pointwise", "Relu": "pointwise",
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _model(name: str, batch: int, seq: int):
    import torch

    from novaforge.bench.workloads import build_inference_model

    model, vocab = build_inference_model(name)
    torch.manual_seed(1)
    return model, torch.randint(0, vocab, (batch, seq))


def _gemm_shape(node) -> str:
    """'M x N x K' of the kernel's largest matmul-like body op (batch dims folded into M)."""
    from novaforge.ir import OPS
    from novaforge.ir.ops.core import node_flops

    best, shape = 0.0, "?"
    for bn in node.attrs["kernel"].body.nodes:
        if OPS[bn.op].has("view"):
            continue
        f = node_flops(bn.op, [v.type for v in bn.inputs], [o.type for o in bn.outputs], bn.attrs)
        if f > best and bn.outputs[0].type.rank >= 2:
            out = bn.outputs[0].type.shape
            m = 1
            for d in out[:-1]:
                m *= int(d)
            k = f / 2 / max(m * int(out[-1]), 1)
            best, shape = f, f"{m} x {int(out[-1])} x {round(k)}"
    return shape


def _nf_category(kind: str, name: str) -> str:
    if kind == "matmul":
        return "gemm"
    if kind == "attention":
        return "attention"
    if kind == "reduction":
        return "attention" if "softmax" in name else "norm"
    if kind == "pointwise":
        return "pointwise"
    return "other"


def run_novaforge(name: str, batch: int, seq: int, calls: int) -> dict:
    import torch

    import novaforge
    from novaforge.report.metrics import kernel_rows
    from novaforge.report.roofline import profile_program

    model, ids = _model(name, batch, seq)
    compiled = novaforge.compile(model, freeze=True, backend="cpu", profile=True)
    with torch.no_grad():
        compiled(ids)
        prof = profile_program(compiled, (ids,), {}, runs=calls)
    assert prof is not None
    rows = kernel_rows(compiled.stats().graph)
    cats: dict[str, float] = defaultdict(float)
    gemms: dict[str, list[float]] = {}
    for i, r in enumerate(rows):
        cat = _nf_category(r["kind"], r["name"])
        cats[cat] += prof.per_kernel[i]
        if cat == "gemm":
            g = gemms.setdefault(_gemm_shape(r["node"]), [0, 0.0, 0.0])
            g[0] += 1
            g[1] += prof.per_kernel[i]
            g[2] += r["flops"]
    cats["overhead"] = prof.overhead_s
    cats["unaccounted"] = prof.unaccounted_s
    return {"wall_s": prof.wall_s, "categories": dict(cats), "gemms": gemms, "peak_flops": prof.peaks.flops}


def run_ort(name: str, batch: int, seq: int, calls: int, threads: int) -> dict:
    import onnxruntime as ort
    import torch

    model, ids = _model(name, batch, seq)
    work = tempfile.mkdtemp(prefix="nf-ta-")
    path = os.path.join(work, "model.onnx")
    with torch.no_grad():
        torch.onnx.export(model, (ids,), path, dynamo=True)
    def session_with(profiling: bool):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.enable_profiling = profiling
        so.profile_file_prefix = os.path.join(work, "ort")
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def timed(session) -> list[float]:
        for _ in range(3):
            session.run(None, feed)
        walls = []
        for _ in range(calls):
            t0 = time.perf_counter()
            session.run(None, feed)
            walls.append(time.perf_counter() - t0)
        return walls

    plain = session_with(False)
    feed = {i.name: x.numpy() for i, x in zip(plain.get_inputs(), (ids,), strict=True)}
    plain_wall = sorted(timed(plain))[calls // 2]  # the same session without profiling: its median call
    del plain
    session = session_with(True)
    walls = timed(session)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"][-calls:]
    start = runs[0]["ts"]
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("ts", 0) >= start
             and e.get("name", "").endswith("_kernel_time")]
    cats: dict[str, float] = defaultdict(float)
    gemms: dict[str, list[float]] = {}
    for e in nodes:
        op = e["args"].get("op_name", "?")
        shapes = e["args"].get("input_type_shape", [])
        cat = _ORT_CATEGORY.get(op, "other")
        if cat == "gemm" and any(len(next(iter(s_.values()), [])) == 4 for s_ in shapes):
            cat = "attention"  # the batched products of attention (q k^T, p v)
        s = e["dur"] * 1e-6 / calls
        cats[cat] += s
        if cat == "gemm":
            outs = e["args"].get("output_type_shape", [])
            key = f"{op} " + " * ".join("x".join(str(d) for d in next(iter(s_.values()))) for s_ in shapes[:2]) \
                + " -> " + " ".join("x".join(str(d) for d in next(iter(s_.values()))) for s_ in outs[:1])
            g = gemms.setdefault(key, [0, 0.0, 0.0])
            g[0] += 1 / calls
            g[1] += s
    run_s = sum(e["dur"] for e in runs) * 1e-6 / calls
    cats["overhead"] = max(run_s - sum(cats.values()), 0.0)
    wall = sum(walls) / calls
    cats["unaccounted"] = wall - run_s
    return {"wall_s": wall, "categories": dict(cats), "gemms": gemms, "unprofiled_wall_s": plain_wall,
            "op_types": sorted({e["args"].get("op_name", "?") for e in nodes})}


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.runner == "novaforge":
        out = run_novaforge(args.model, args.batch, args.seq, args.calls)
    else:
        out = run_ort(args.model, args.batch, args.seq, args.calls, args.threads)
    print("RESULT " + json.dumps(out))


def _spawn(model: str, runner: str, threads: int, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--runner", runner, "--threads", str(threads), "--models", model,
           "--model", model, "--batch", str(a.batch), "--seq", str(a.seq), "--calls", str(a.calls)]
    before = _load()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = _load()
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{runner} {model} failed:\n{p.stderr[-3000:]}")
    out = json.loads(line[7:])
    out["load"] = (before, after)
    print(f"  {model} {runner} {threads}t: {out['wall_s'] * 1e3:.1f} ms/call (load {before} -> {after})",
          flush=True)
    return out


def _table(model: str, res: dict, a: argparse.Namespace) -> str:
    lines = [f"### {model} batch {a.batch} x {a.seq} (ms per call; 2 threads, and thread loss = 2t - 1t/2)", "",
             "| | novaforge | thread loss | ORT | thread loss |", "|---|---|---|---|---|"]
    for cat in CATEGORIES:
        cells = []
        for r in ("novaforge", "ort"):
            t2, t1 = res[r][2]["categories"].get(cat, 0.0), res[r][1]["categories"].get(cat, 0.0)
            loss = t2 - t1 / 2 if cat not in ("overhead", "unaccounted") else None
            cells += [f"{t2 * 1e3:.1f}", "" if loss is None else f"{loss * 1e3:+.1f}"]
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    w2 = {r: res[r][2]["wall_s"] for r in res}
    w1 = {r: res[r][1]["wall_s"] for r in res}
    lines.append(f"| **wall** | **{w2['novaforge'] * 1e3:.1f}** | {(w2['novaforge'] - w1['novaforge'] / 2) * 1e3:+.1f} "
                 f"| **{w2['ort'] * 1e3:.1f}** | {(w2['ort'] - w1['ort'] / 2) * 1e3:+.1f} |")
    lines.append(f"| wall, ORT without profiling (median) | | | {res['ort'][2]['unprofiled_wall_s'] * 1e3:.1f} "
                 f"| ({res['ort'][1]['unprofiled_wall_s'] * 1e3:.1f} at 1 thread) |")
    peak = res["novaforge"][2]["peak_flops"]
    lines += ["", f"GEMM shapes, 2 threads (measured FMA peak {peak / 1e9:.0f} GFLOP/s):", "",
              "| novaforge M x N x K | launches | ms | GFLOP/s | of peak |", "|---|---|---|---|---|"]
    for shape, (n, s, f) in sorted(res["novaforge"][2]["gemms"].items(), key=lambda kv: -kv[1][1]):
        gf = f / s / 1e9 if s > 0 else 0.0
        lines.append(f"| {shape} | {n} | {s * 1e3:.2f} | {gf:.0f} | {100 * gf * 1e9 / peak:.0f}% |")
    lines += ["", "| ORT node (input shapes) | launches | ms |", "|---|---|---|"]
    for shape, (n, s, _) in sorted(res["ort"][2]["gemms"].items(), key=lambda kv: -kv[1][1])[:8]:
        lines.append(f"| {shape} | {n:.0f} | {s * 1e3:.2f} |")
    lines.append("")
    lines.append("ORT op types: " + ", ".join(res["ort"][2]["op_types"]))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,bert,llama")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", default="", help="also write the tables (markdown) and the raw JSON here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--runner", default="", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        _child(a)
        return
    print(f"load before: {_load()}", flush=True)
    tables, raw = [], {}
    for model in a.models.split(","):
        res = {r: {t: _spawn(model, r, t, a) for t in (2, 1)} for r in ("novaforge", "ort")}
        raw[model] = res
        tables.append(_table(model, res, a))
        print(tables[-1], flush=True)
    print(f"load after: {_load()}")
    if a.out:
        with open(a.out + ".md", "w") as f:
            f.write("\n\n".join(tables) + "\n")
        with open(a.out + ".json", "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()

"""Markdown tables of aggregated benchmark rows, and the novaforge compiler-metrics block.

One table per workload kind (inference, training, matmul), rows grouped by case in the order
they were run; ratios are against the eager runner of the same case in the same run.

Under an int8 `--dtype` the header names the quantization each runner family ran and the
inference table adds the mean abs difference and the top-1 agreement (logits outputs only, else
"–") against float32 eager.

Invariant: rendering only reads the rows (never recomputes a measurement), and every row,
skipped and failed ones included, appears with its status and reason.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

QUIET_LOAD = 1.2  # a 1-min load average above this is not a quiet machine (issue 15)

# what each int8 `--dtype` ran, for the header (benchmarks/README.md, "Runners")
QUANTIZATION_TEXT = {
    "int8-weight": "torchao Int8WeightOnlyConfig via novaforge.quantize (int8 weights, one scale per output "
                   "channel; float32 activations) for the torch runners; onnxruntime and openvino skipped",
    "int8-dynamic": "torchao Int8DynamicActivationInt8WeightConfig via novaforge.quantize (int8 weights, "
                    "activations quantized per row at run time) for the torch runners; onnxruntime: "
                    "quantize_dynamic(weight_type=QInt8) of the float32 export; openvino skipped",
}


def fmt_num(x: float | None, digits: int = 3) -> str:
    """About `digits` significant digits without exponent notation for ordinary magnitudes."""
    if x is None:
        return "–"
    ax = abs(x)
    if ax == 0:
        return "0"
    if ax >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    if ax < 1e-3:
        return f"{x:.1e}"
    decimals = digits - 1 - int(f"{ax:e}".split("e")[1])
    return f"{x:.{max(decimals, 0)}f}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    return f"{n / 2**20:.1f} MiB"


def _setup(r: dict[str, Any]) -> str:
    if r.get("setup_cold_s") is not None or r.get("setup_warm_s") is not None:
        parts = [f"{k} {fmt_num(r.get(f'setup_{k}_s'))}" for k in ("cold", "warm") if r.get(f"setup_{k}_s") is not None]
        return " / ".join(parts)
    vals = r.get("setup_s") or []
    if not vals:
        return "–"
    lo, hi = min(vals), max(vals)
    return fmt_num(lo) if fmt_num(lo) == fmt_num(hi) else f"{fmt_num(lo)}–{fmt_num(hi)}"


def _note(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('reason', '')}".replace("|", "/")
    notes = []
    if r.get("capped"):
        notes.append(f"time budget: {r['calls']} of {r.get('planned_calls', '?')} calls")
    if r.get("failed_processes"):
        notes.append(f"{r['failed_processes']} process(es) failed: {r.get('reason', '')}")
    if len(set(r.get("backends") or [])) > 1:
        notes.append(f"processes ran different backends: {' / '.join(map(str, r['backends']))}")
    if r.get("energy_j_per_call") is not None:
        notes.append(f"{fmt_num(r['energy_j_per_call'])} J/call")
    return "; ".join(notes).replace("|", "/")


def _ratio(r: dict[str, Any]) -> str:
    x = r.get("speedup_vs_eager")
    return "–" if x is None else f"{x:.2f}x"


def _procs(r: dict[str, Any]) -> str:
    return " / ".join(fmt_num(x) for x in r.get("proc_medians_ms", [])) or "–"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header))] + [_row(b) for b in body]


def inference_table(rows: list[dict[str, Any]], quantized: bool = False) -> list[str]:
    """`quantized`: add the mean abs diff and top-1 agreement columns (vs float32 eager)."""
    header = ["case", "runner", "median ms", "per-process medians", "min–max ms", "vs eager", "setup s",
              "peak MB", "max abs diff"] + (["mean abs diff", "top-1 = fp32 eager"] if quantized else []) + ["note"]
    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append([r["case"], r["runner"]] + ["–"] * (len(header) - 3) + [_note(r)])
            continue
        extra = []
        if quantized:
            top1 = r.get("top1_agreement")
            extra = [fmt_num(r.get("mean_abs_diff"), 2), "–" if top1 is None else f"{100 * top1:.1f}%"]
        body.append([r["case"], r["runner"], fmt_num(r["median_ms"]), _procs(r),
                     f"{fmt_num(r['min_ms'])}–{fmt_num(r['max_ms'])}", _ratio(r), _setup(r),
                     fmt_num(r["peak_mem_mb"], 4), fmt_num(r.get("max_abs_diff"), 2)] + extra + [_note(r)])
    return _table(header, body)


def training_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["case", "runner", "ms/step", "tokens/s", "per-process medians", "vs eager", "setup s (1st step)",
              "peak MB", "loss Δ vs eager (1st / max)", "note"]
    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append([r["case"], r["runner"]] + ["–"] * 7 + [_note(r)])
            continue
        loss = "–"
        if r.get("loss_diff_first_step") is not None:
            loss = f"{fmt_num(r['loss_diff_first_step'], 2)} / {fmt_num(r['loss_diff_max'], 2)}"
        body.append([r["case"], r["runner"], fmt_num(r["median_ms"]), fmt_num(r.get("tokens_per_s")), _procs(r),
                     _ratio(r), _setup(r), fmt_num(r["peak_mem_mb"], 4), loss, _note(r)])
    return _table(header, body)


def _tokens_cell(r: dict[str, Any]) -> str:
    """Equal to eager's tokens on the same (quantized or cast) model; with another dtype than
    float32, also the share of new tokens equal to float32 eager's."""
    cell = "yes" if r.get("tokens_equal") else "NO"
    agree = r.get("tokens_agree_fp32")
    return cell if agree is None else f"{cell}; {100 * agree:.0f}% of fp32's"


def generate_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["case (prompt)", "runner", "decode tok/s", "decode vs eager", "TTFT ms", "generate ms (new tokens)",
              "per-process medians", "setup s", "peak MB", "tokens = eager", "roof tok/s (weights / read BW)",
              "of roof", "note"]
    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append([r["case"], r["runner"]] + ["–"] * 10 + [_note(r)])
            continue
        x = r.get("decode_vs_eager")
        note = _note(r)
        if r.get("programs") is not None:
            note = "; ".join(filter(None, [f"{r['programs']} programs built", note]))
        body.append([r["case"], r["runner"], fmt_num(r.get("decode_tokens_per_s")), "–" if x is None else f"{x:.2f}x",
                     fmt_num(r.get("ttft_ms")), f"{fmt_num(r['median_ms'])} ({r.get('new_tokens')})", _procs(r),
                     _setup(r), fmt_num(r["peak_mem_mb"], 4), _tokens_cell(r),
                     f"{fmt_num(r.get('roof_tokens_per_s'))} ({fmt_num(r.get('weight_bytes', 0) / 1e6)} MB / "
                     f"{fmt_num(r.get('read_bw_gb_s'))} GB/s{_bw_range(r)})",
                     "–" if r.get("roof_fraction") is None else f"{100 * r['roof_fraction']:.0f}%", note])
    return _table(header, body)


def _bw_range(r: dict[str, Any]) -> str:
    """The spread of the read-bandwidth samples the roof is the median of (one per timed generate)."""
    lo_hi = r.get("read_bw_range_gb_s")
    return "" if not lo_hi else f", {fmt_num(lo_hi[0])}-{fmt_num(lo_hi[1])}"


def matmul_table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["shape (MxKxN)", "runner", "median ms", "GFLOP/s", "vs torch", "setup s", "max rel diff", "note"]
    body = []
    for r in rows:
        if r["status"] != "ok":
            body.append([r["case"], r["runner"]] + ["–"] * 5 + [_note(r)])
            continue
        body.append([r["case"], r["runner"], fmt_num(r["median_ms"]), fmt_num(r.get("gflops")), _ratio(r),
                     _setup(r), fmt_num(r.get("max_rel_diff"), 2), _note(r)])
    return _table(header, body)


def _grouped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of one case together, cases in first-seen order, runners in first-seen order."""
    cases: list[str] = []
    for r in rows:
        if r["case"] not in cases:
            cases.append(r["case"])
    return sorted(rows, key=lambda r: cases.index(r["case"]))


def _matmul_metrics_line(rows: list[dict[str, Any]]) -> list[str]:
    """The sweep compiles one tiny graph per shape: one line for all of them."""
    if not rows:
        return []
    m0 = rows[0]["metrics"]
    launches = sorted({r["metrics"].get("launches") for r in rows}, key=str)
    compiles = ", ".join(f"{r['case'].split(' ')[-1]} {fmt_num((r['metrics'].get('compile_s') or {}).get('total_s'))}"
                         for r in rows)
    return [f"- **matmul sweep** (backend {m0.get('backend')}): launches per call {launches}; "
            f"compile s per shape: {compiles}"]


def metrics_lines(rows: list[dict[str, Any]]) -> list[str]:
    mine = [r for r in rows if r["runner"] == "novaforge" and r.get("metrics")]
    out = _matmul_metrics_line([r for r in mine if r.get("kind") == "matmul"])
    for r in mine:
        m = r["metrics"]
        if r.get("kind") == "matmul":
            continue
        by_kind = sorted((m.get("kernels_by_kind") or {}).items(), key=lambda kv: -kv[1])
        kinds = ", ".join(f"{k} {v}" for k, v in by_kind)
        externs = m.get("externs") or []
        names = Counter(e[0] if isinstance(e, list) else str(e) for e in externs)
        ext = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(names.items())) or "none"
        arena, total = m.get("arena_bytes"), m.get("sum_intermediate_bytes")
        share = f" ({100 * arena / total:.1f}%)" if arena is not None and total else ""
        times = m.get("compile_s") or {}
        comp = ", ".join(f"{k.removesuffix('_s')} {fmt_num(v)}" for k, v in times.items() if k != "total_s")
        passes = sorted(m.get("pass_ms") or [], key=lambda p: -p[1])[:6]
        pass_txt = ", ".join(f"{name} {fmt_num(ms)}" for name, ms in passes)
        out.append(f"- **{r['case']}** (backend {m.get('backend')}): fusion gain ratio "
                   f"{fmt_num(m.get('fusion_gain_ratio'))} "
                   f"({m.get('aten_ops')} ATen ops / {m.get('launches')} launches); "
                   f"kernels {m.get('kernels')} ({kinds}), {m.get('distinct_kernels')} distinct; "
                   f"library calls {m.get('library_calls')}; extern ops {len(externs)}: {ext}; "
                   f"arena {fmt_bytes(arena)} vs {fmt_bytes(total)} sum of intermediates{share}; "
                   f"device transitions {m.get('transitions')}; compile {fmt_num(times.get('total_s'))} s ({comp}); "
                   f"slowest passes ms: {pass_txt}")
        if r.get("gemm_paths"):
            calls = ", ".join(f"{k} {v}" for k, v in sorted(r["gemm_paths"].items()))
            out[-1] += f"; nf_gemm low-precision calls in the first call (path: calls): {calls}"
    return out


def render(payload: dict[str, Any]) -> str:
    rows = payload["rows"]
    o = payload.get("options", {})
    gpu = f"; GPU {payload['gpu']}" if payload.get("gpu") else ""
    lines = [f"novaforge bench — {payload.get('date', '')}, device {o.get('device')}, dtype {o.get('dtype')}, "
             f"{o.get('threads')} threads, {o.get('procs')} processes per case, "
             f"novaforge backend {o.get('nf_backend')}",
             f"machine: {payload.get('machine', {}).get('cpu', '?')}{gpu}"]
    load, cores = payload.get("load_avg_1min"), payload.get("machine", {}).get("cores_available")
    if load:
        lines[-1] += f"; 1-min load average during the run {load[0]:.1f}–{load[1]:.1f}"
        if load[1] > QUIET_LOAD:
            lines.append(f"WARNING: the 1-min load average reached {load[1]:.1f} (> {QUIET_LOAD}, "
                         f"{cores or '?'} cores): other work competed with the runners; absolute times are "
                         "inflated and OpenMP runtimes lose more than other thread pools, so even ratios can "
                         "flip: rerun on a quiet machine")
    if payload.get("energy_counter"):
        lines.append(f"energy: {payload['energy_counter']}")
    quantization = QUANTIZATION_TEXT.get(o.get("dtype"))
    if quantization:
        lines.append(f"quantization {o.get('dtype')}: {quantization}; accuracy columns against float32 eager "
                     "(the full study: benchmarks/quant_accuracy.py)")

    def quantized_inference_table(rows: list[dict[str, Any]]) -> list[str]:
        return inference_table(rows, quantized=bool(quantization))

    for kind, render_kind in (("inference", quantized_inference_table), ("training", training_table),
                              ("matmul", matmul_table), ("generate", generate_table)):
        mine = _grouped([r for r in rows if r.get("kind") == kind])
        if mine:
            lines += ["", f"### {kind}", ""] + render_kind(mine)
    mlines = metrics_lines(rows)
    if mlines:
        lines += ["", "### novaforge compiler metrics", ""] + mlines
    return "\n".join(lines)

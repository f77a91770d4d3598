"""The tables of `gpu_check.py`'s results (gpu_check.md and the end of its output): the probe and
correctness lines, the matmul tables (fallbacks shown as such, never as timings; geomeans over
generated kernels only), the model table and the training table (gpu_training.markdown)."""

from __future__ import annotations

from typing import Any

import gpu_training


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _other(o: dict[str, Any] | None) -> str:
    if not o:
        return "-"
    if o.get("fallback"):
        return f"fallback ({o['fallback'][:60]})"
    return f"{_fmt(o['tflops'], '.1f')} ({_fmt(o.get('predicted_tflops'), '.0f')}) {o['schedule']}"


def _rounded(o: dict[str, Any] | None) -> str:
    if not o:
        return ""
    if o.get("fallback"):
        return f"; rounded: fallback ({o['fallback'][:60]})"
    return f"; rounded: {_fmt(o['tflops'], '.1f')} TFLOP/s, err {_fmt(o['rel_err'], '.2e')}"


def markdown(results: dict[str, Any]) -> str:
    parts = results["parts"]
    lines = []
    probe = parts.get("probe", {}).get("result")
    if probe:
        lines += ["probe (first GPU call) ran: " + ", ".join(f"{k} {'yes' if v else 'NO'}"
                                                          for k, v in probe["ran"].items())
                  + f"; matches eager: {'yes' if probe['ok'] else 'NO'}", ""]
    corr = parts.get("correctness", {}).get("result")
    if corr:
        bad = [r for r in corr["cases"] + corr["training_kernels"] if not r.get("ok")]
        lines += [f"correctness: {len(corr['cases'])} kernel cases + {len(corr['training_kernels'])} training kernels, "
                  f"{len(bad)} failed" + ("".join(f"\n* {r['name']}: {r.get('error') or r.get('fallbacks') or r}"
                                                  for r in bad)), ""]
    for key in ("matmul", "matmul tma"):
        mm = parts.get(key, {}).get("result")
        if not mm or "rows" not in mm:
            continue
        lines += [f"| {key} | layout | dtype | novaforge TFLOP/s | cuBLAS TFLOP/s | speedup | rel err nf | rel err "
                  "cuBLAS | schedule | predicted TFLOP/s | smem KiB / regs / spills | other form TFLOP/s (predicted); "
                  "TF32 rounded to nearest |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mm["rows"]:
            head = f"| {r['shape']} | {r['layout']} | {r['dtype']} |"
            if "skipped" in r or "error" in r:
                lines.append(f"{head} {r.get('skipped') or 'ERROR ' + r['error'][:100]} | | | | | | | | |")
                continue
            fb = r.get("nf_fallback")
            res = (f"{_fmt(r['nf_shared'] / 1024 if r.get('nf_shared') else None, '.0f')} / {_fmt(r.get('nf_n_regs'))}"
                   f" / {_fmt(r.get('nf_n_spills'))}")
            lines.append(f"{head} {'FALLBACK to torch' if fb else _fmt(r.get('nf_tflops'), '.1f')} | "
                         f"{_fmt(r.get('torch_tflops'), '.1f')} | {'-' if fb else _fmt(r.get('speedup'), '.3f')} | "
                         f"{_fmt(r.get('nf_rel_err'), '.2e')} | {_fmt(r.get('torch_rel_err'), '.2e')} | "
                         f"{('fallback: ' + fb[:120]) if fb else r.get('nf_schedule', '-')} | "
                         f"{_fmt(r.get('nf_predicted_tflops'), '.0f')} | {res} | "
                         f"{_other(r.get('other_form'))}{_rounded(r.get('rounded'))} |")
        for kind, s in mm["summary"].items():
            lines.append(f"| geomean {kind} ({s['generated']} generated, {s['fallbacks']} fallbacks, {s['errors']} "
                         f"errors) | | | | | {_fmt(s['geomean_speedup'], '.3f')} (target "
                         f"{'1.0' if kind == 'tf32' else '0.95'}) | max {_fmt(s['max_rel_err'], '.2e')} | | | | | |")
        lines.append("")
    models = [(k, v["result"]) for k, v in parts.items() if k.startswith("model") and v.get("result")
              and "model" in v["result"]]
    if models:
        lines += ["| model | runner | compile s | latency ms | peak GiB | rel diff vs eager | fallbacks to torch |",
                  "|---|---|---|---|---|---|---|"]
        for _, m in models:
            for runner in ("eager", "torch.compile", "novaforge"):
                r = m.get(runner)
                if not r:
                    continue
                if "skipped" in r or "error" in r:
                    lines.append(f"| {m['model']} {m['dtype']} | {runner} | {(r.get('skipped') or r['error'])[:80]}"
                                 " | | | | |")
                    continue
                lat = r.get("latency_s")
                label = runner + (" " + ",".join(f"{k}={v}" for k, v in m["nf_options"].items())
                                  if runner == "novaforge" and m.get("nf_options") else "")
                fbs = r.get("fallbacks") or []
                fb = f"{len(fbs)}: " + "; ".join(f"{f['title']} ({f['reason'][:60]})" for f in fbs[:3]) if fbs else (
                    "0" if runner == "novaforge" else "")
                lines.append(f"| {m['model']} {m['dtype']} | {label} | {_fmt(r.get('compile_s'), '.1f')} | "
                             f"{_fmt(lat * 1e3 if lat else None, '.2f')} | {_fmt(r.get('peak_gib'), '.2f')} | "
                             f"{_fmt(r.get('rel_diff'), '.2e')} | {fb} |")
            if m.get("ratios"):
                lines.append(f"| {m['model']} ratios | " + ", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in
                                                                   m["ratios"].items()) + " | | | | | |")
        lines.append("")
    train = parts.get("training", {}).get("result")
    if isinstance(train, dict) and "skipped" not in train:
        lines += gpu_training.markdown(train)
    errors = {k: v.get("error", "")[:160] for k, v in parts.items() if v.get("status") == "error"}
    skipped = [f"{k} ({v['result']['skipped']})" for k, v in parts.items()
               if isinstance(v.get("result"), dict) and "skipped" in v["result"]]
    skipped += [f"{k} ({v['reason']})" for k, v in parts.items() if v.get("status") == "skipped"]
    if errors:
        lines.append("errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    if skipped:
        lines.append("skipped: " + ", ".join(skipped))
    lines.append(f"total {results.get('total_s', 0):.0f} s")
    return "\n".join(lines)

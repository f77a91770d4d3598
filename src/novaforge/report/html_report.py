"""`novaforge report` / `novaforge.report(model, *inputs, path=...)`: the compile as one HTML page.

The model is compiled with `profile=True` (every launch timed) and `keep_graphs=True` (each
pass's output graph kept), run a few times, and compared with eager PyTorch (time per call,
measured peak of live tensors, largest output difference). The page (`page.py`) holds:

* summary cards and the profile sum (kernels + runtime overhead against the wall time of the
  same calls, `roofline.py`);
* the pass table (time, nodes and values before -> after, counters), each pass linked to the
  IR it produced, with source-line provenance;
* the fused-kernel table (ops, schedule, FLOPs, bytes, time per call, share, GFLOP/s, GB/s,
  roofline against the measured peaks), sortable, and a per-kernel time chart;
* the kernel graph (`graphview.py`), the memory timeline and the compile-time breakdown
  (`plots.py`), externs and fallbacks, and the training section (a hook: "no training
  program" until training programs exist).

Invariant: the page is self-contained (no URL is ever fetched); producing it does not change
the compiled program's results.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from html import escape
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import page
from .eager import eager_ms, eager_peak_bytes
from .explain import matrix_path_lines
from .graphview import kernel_graph_svg, legend_html
from .metrics import kernel_rows, metrics
from .plots import compile_time_svg, kernel_time_svg, memory_timeline, memory_timeline_svg
from .roofline import efficiency_text, profile_program


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _info(st: Any) -> dict[str, Any]:
    """The program's info dict (the CPU program's; other programs may have none)."""
    info = getattr(st.program, "info", None)
    return info if isinstance(info, dict) else {}


def _max_diff(a: Any, b: Any) -> float | None:
    la = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    lb = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    if not la or len(la) != len(lb):
        return None
    return max(((x.float() - y.float()).abs().max().item() if x.numel() else 0.0) for x, y in zip(la, lb, strict=True))


def collect(model: Any, args: tuple, kwargs: dict | None = None, *, freeze: bool = True, backend: str = "auto",
            runs: int = 5, eager: bool = True) -> dict[str, Any]:
    """Compile, profile and measure; everything the page needs: `stats`, `metrics`, `profile` (a
    `roofline.Profile` or None), `first_call_s`, `wall_ms`, and with `eager`: `eager_ms`,
    `eager_peak` (bytes), `max_diff` (`novaforge demo` builds the same dict from its own runs)."""
    from ..api import CompiledModule

    kwargs = kwargs or {}
    compiled = CompiledModule(model, freeze=freeze, backend=backend, options={"profile": True, "keep_graphs": True})
    t0 = time.perf_counter()
    with torch.no_grad():
        out = compiled(*args, **kwargs)
    first_call_s = time.perf_counter() - t0
    stats = compiled.stats()
    prof = profile_program(compiled, args, kwargs, runs=runs)
    data: dict[str, Any] = {"stats": stats, "metrics": metrics(stats), "profile": prof, "first_call_s": first_call_s}
    if prof is None:  # another backend: time the calls from outside
        with torch.no_grad():
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                compiled(*args, **kwargs)
                times.append(time.perf_counter() - t)
        data["wall_ms"] = statistics.median(times) * 1e3
    else:
        data["wall_ms"] = prof.wall_s * 1e3
    if eager:
        with torch.no_grad():
            ref = model(*args, **kwargs)
        data["max_diff"] = _max_diff(out, ref)
        data["eager_ms"] = eager_ms(model, args, kwargs, runs)
        data["eager_peak"] = eager_peak_bytes(model, args, kwargs)
    return data


# ------------------------------------------------------------------------------ sections
def _summary(d: dict[str, Any], title: str) -> str:
    st, m, prof = d["stats"], d["metrics"], d["profile"]
    items = [("compile (first call)", f"{d['first_call_s']:.2f} s"),
             ("novaforge per call", f"{d['wall_ms']:.2f} ms")]
    if "eager_ms" in d:
        items += [("eager per call", f"{d['eager_ms']:.2f} ms"),
                  ("speedup", f"x{d['eager_ms'] / max(d['wall_ms'], 1e-9):.2f}")]
    items += [("ATen ops -> launches", f"{m['aten_ops']} -> {m['launches']}"),
              ("fusion gain ratio", f"{m['fusion_gain_ratio']:.2f}"),
              ("kernels (distinct)", f"{m['kernels']} ({m['distinct_kernels']})"),
              ("arena", _fmt_bytes(m["arena_bytes"]))]
    if d.get("eager_peak"):
        items.append(("eager peak (measured)", _fmt_bytes(d["eager_peak"])))
    if d.get("max_diff") is not None:
        items.append(("max |novaforge - eager|", f"{d['max_diff']:.3g}"))
    body = page.cards(items)
    if prof is not None:
        body += (f'<p id="profile-sum">{escape(prof.summary())}</p>'
                 f'<p class="note">Peaks (measured on this machine): {escape(prof.peaks.describe())}. '
                 "Kernel times come from timers inside the generated code (and around library calls); the wall "
                 "time is measured outside each call; see docs/report.md.</p>")
    else:
        body += '<p class="note">This backend does not time its launches: no per-kernel profile.</p>'
    info = _info(st)
    body += (f'<p class="note">{escape(title)}; backend {escape(st.backend)}; '
             f"{escape(str(info.get('target', platform.processor() or platform.machine())))}; "
             f"torch {escape(torch.__version__)}, {torch.get_num_threads()} threads.</p>")
    paths = matrix_path_lines(st)[1:-1]  # (the CPU backend: each precision's nf_gemm path)
    if paths:
        body += f'<p class="note" id="matrix-paths">Matrix products: {escape("; ".join(p.strip() for p in paths))}.</p>'
    return page.section("summary", "Summary", body)


def _passes(st: Any) -> str:
    rows = []
    for i, r in enumerate(st.records, start=1):
        eff = ", ".join(f"{k} {_fmt_bytes(v) if k.endswith('_bytes') else v}" for k, v in r.counters.items() if v)
        link = f'<a href="#ir-{i}">IR after</a>' if r.graph is not None else "-"
        rows.append([i, page.cell(r.name, r.name), page.cell(f"{r.ms:.2f}", r.ms),
                     page.cell(f"{r.nodes_before} → {r.nodes_after}", r.nodes_after),
                     page.cell(f"{r.values_before} → {r.values_after}", r.values_after),
                     page.cell(escape(eff), eff, "ops", raw=True), page.cell(link, i, raw=True)])
    t = st.times
    head = (f"capture {t.get('capture_s', 0) * 1e3:.0f} ms (trace {t.get('export_s', 0) * 1e3:.0f}, functionalize "
            f"{t.get('functionalize_s', 0) * 1e3:.0f}, lower {t.get('lower_s', 0) * 1e3:.0f}); passes "
            f"{t.get('passes_s', 0) * 1e3:.0f} ms; codegen and build {t.get('codegen_s', 0) * 1e3:.0f} ms.")
    tab = page.table([("#", "num"), ("pass", "text"), ("ms", "num"), ("nodes", "num"), ("values", "num"),
                      ("counters", "text"), ("IR", "num")], rows, table_id="pass-table")
    return page.section("passes", "Passes", tab, escape(head))


def _kernels(d: dict[str, Any]) -> str:
    st, prof = d["stats"], d["profile"]
    rows_all = kernel_rows(st.graph)
    schedules = getattr(st.program, "schedules", {}) or {}
    by_key = {kt.key: kt for kt in prof.rows} if prof is not None else {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows_all:
        groups.setdefault(r["node"].attrs["kernel"].structural_key, []).append(r)
    total = prof.kernels_s if prof is not None else 0.0
    rows = []
    for key, rs in groups.items():
        r0 = rs[0]
        kt = by_key.get(key)
        sec = kt.seconds if kt is not None else None
        flops, nbytes = sum(r["flops"] for r in rs), sum(r["bytes"] for r in rs)
        first = rows_all.index(r0)
        rows.append([
            page.cell(f"#{first}", first),
            page.cell(r0["name"], r0["name"]),
            page.cell(f'<span class="chip" style="background:{_kind_color(r0["kind"])}">{r0["kind"]}</span>',
                      r0["kind"], raw=True),
            page.cell(len(rs), len(rs)),
            page.cell(" ".join(r0["ops"]), " ".join(r0["ops"]), "ops"),
            page.cell(schedules.get(key, "-"), schedules.get(key, ""), "sched"),
            page.cell(f"{flops / 1e6:.2f}", flops / 1e6),
            page.cell(f"{nbytes / 1024:.1f}", nbytes / 1024),
            page.cell(f"{sec * 1e3:.3f}" if sec is not None else "-", sec * 1e3 if sec is not None else -1),
            page.cell(f"{100 * sec / total:.1f}%" if sec is not None and total else "-",
                      100 * sec / total if sec is not None and total else -1),
            page.cell(f"{kt.gflops:.1f}" if kt else "-", kt.gflops if kt else -1),
            page.cell(f"{kt.gbs:.1f}" if kt else "-", kt.gbs if kt else -1),
            page.cell(efficiency_text(kt) if kt else "-", kt.efficiency * 100 if kt else -1),
        ])
    rows.sort(key=lambda r: -r[8][1])
    tab = page.table([("first", "num"), ("kernel", "text"), ("kind", "text"), ("x", "num"), ("ops", "text"),
                      ("schedule", "text"), ("MFLOP", "num"), ("KiB", "num"), ("ms/call", "num"), ("share", "num"),
                      ("GFLOP/s", "num"), ("GB/s", "num"), ("roofline", "num")], rows, table_id="kernel-table",
                     keys=["", "", "", "", "", "", "", "", "time", "", "", "", "roofline"])
    note = ("One row per distinct kernel (identical layers share one); x = launches per call; MFLOP, KiB and ms "
            "are per call over all its launches. KiB counts what the kernel must touch at least once. "
            "Roofline = max(FLOPs / peak FLOP/s, bytes / bandwidth) / time; <b>c</b> = cache-resident (its data "
            "fits in the last-level cache, so the cache bandwidth is the roof), <b>!</b> = above the roof "
            "(timer resolution). Click a header to sort.")
    body = f'<div class="scroll">{tab}</div>'
    if prof is not None:
        body += '<div class="plot">' + kernel_time_svg(prof.per_kernel, [r["kind"] for r in rows_all],
                                                      [r["name"] for r in rows_all]) + "</div>"
    return page.section("kernels", "Fused kernels", body, note)


def _kind_color(kind: str) -> str:
    from .graphview import KIND_COLORS

    return KIND_COLORS.get(kind, "#bab0ac")


def _graph(d: dict[str, Any]) -> str:
    st, prof = d["stats"], d["profile"]
    svg = kernel_graph_svg(st.graph, prof.per_kernel if prof is not None else None,
                           getattr(st.program, "schedules", {}) or {})
    note = ("Nodes are kernels in program order (coloured by kind, time per call below the name); edges are "
            "buffers one kernel writes and another reads. Hover for ops, schedule and source line. " + legend_html())
    return page.section("graph", "Kernel graph", f'<div class="scroll">{svg}</div>', note)


def _memory(d: dict[str, Any]) -> str:
    st = d["stats"]
    tl = memory_timeline(st.graph)
    if tl is None:
        return page.section("memory", "Memory timeline", "<p>No memory plan (this backend plans no arena).</p>")
    svg = memory_timeline_svg(tl, d.get("eager_peak"))
    alive = page.table([("buffer alive at the peak", "text"), ("bytes", "num")],
                       [[desc, page.cell(_fmt_bytes(b), b)] for desc, b in tl.alive_at_peak], table_id="peak-table")
    note = (f"Planned arena {_fmt_bytes(tl.arena_bytes)} for intermediates whose separate allocations would sum to "
            f"{_fmt_bytes(tl.sum_bytes)}; graph outputs are fresh tensors outside the arena. Eager's peak is measured "
            "(every tensor an ATen op returns, alive until its last view dies, outputs included).")
    return page.section("memory", "Memory timeline", f'<div class="plot">{svg}</div>{alive}', note)


def compile_bars(st: Any) -> list[tuple[str, float, str]]:
    """(label, seconds, category) of every compile stage; each stage's unattributed rest is its own bar."""
    t = st.times
    info = _info(st)
    hit = " (graph cache hit)" if t.get("graph_cache_hit") else ""
    parts = [("trace ATen graph", t.get("export_s", 0.0)), ("functionalize", t.get("functionalize_s", 0.0)),
             ("lower to IR", t.get("lower_s", 0.0))]
    bars = [(label, s, "capture") for label, s in parts if s > 0]
    bars.append((f"capture: rest{hit}", max(t.get("capture_s", 0.0) - sum(s for _, s in parts), 0.0), "capture"))
    bars += [(f"pass {r.name}", r.ms / 1e3, "pass") for r in st.records]
    bars.append(("pipeline set-up (backend, target)",
                 max(t.get("passes_s", 0.0) - sum(r.ms for r in st.records) / 1e3, 0.0), "other"))
    plan_s, lib_s = info.get("plan_s", 0.0), info.get("library_s", 0.0)
    if info:
        bars.append(("codegen (plan, render)", plan_s, "codegen"))
        bars.append((f"build library (cache: {info.get('cache', '?')})", lib_s, "build"))
    bars.append(("program assembly", max(t.get("codegen_s", 0.0) - plan_s - lib_s, 0.0), "other"))
    return bars


def _compile_time(d: dict[str, Any]) -> str:
    from ..cache.store import library_cache

    st = d["stats"]
    svg = compile_time_svg(compile_bars(st))
    cs = library_cache(st.backend).stats.as_dict() if st.backend == "cpu" else {}
    how = _info(st).get("cache", "-")
    note = (f"Total {st.times.get('total_s', 0):.2f} s. Kernel library of this program: {escape(str(how))}"
            + (f"; this process's library cache: {cs['memory_hits']} memory hits, {cs['disk_hits']} disk hits, "
               f"{cs['builds']} builds, {cs['rebuilt_corrupt']} corrupt entries rebuilt" if cs else "") + ".")
    return page.section("compile", "Compile time", f'<div class="plot">{svg}</div>', note)


def _training(d: dict[str, Any]) -> str:
    """The hook for training programs: `stats.extra["training"]`, when a training compile sets it, is
    a dict with `saved` and `recomputed` (lists of (value description, bytes)) and `forward_kernels`,
    `backward_kernels` (counts); until then the section says there is none."""
    tr = (getattr(d["stats"], "extra", None) or {}).get("training")
    if not tr:
        return page.section("training", "Training", '<p id="no-training">no training program</p>',
                            "Saved vs recomputed values and the forward/backward split appear here for programs "
                            "that compute gradients.")
    rows = [[desc, "saved", page.cell(_fmt_bytes(b), b)] for desc, b in tr.get("saved", [])]
    rows += [[desc, "recomputed", page.cell(_fmt_bytes(b), b)] for desc, b in tr.get("recomputed", [])]
    split = f"forward {tr.get('forward_kernels', '?')} kernels, backward {tr.get('backward_kernels', '?')} kernels"
    return page.section("training", "Training", page.table([("value", "text"), ("kept", "text"), ("bytes", "num")],
                                                           rows, table_id="training-table"), escape(split))


def _externs(d: dict[str, Any]) -> str:
    m, st = d["metrics"], d["stats"]
    counts: dict[tuple[str, str], int] = {}
    for target, reason in m["externs"]:
        counts[(target, reason)] = counts.get((target, reason), 0) + 1
    rows = [[c, t, r] for (t, r), c in counts.items()]
    fallbacks = _info(st).get("fallbacks", [])
    body = (page.table([("count", "num"), ("ATen op", "text"), ("reason", "text")], rows, table_id="extern-table")
            if rows else "<p>No extern ops: every ATen op was lowered to IR primitives.</p>")
    if fallbacks:
        body += "<p>Kernels run through torch (not generated):</p><ul>" + "".join(
            f"<li>{escape(f)}</li>" for f in fallbacks) + "</ul>"
    return page.section("externs", "Externs and fallbacks", body)


def _ir(st: Any) -> str:
    from ..ir.printer import format_graph

    parts = [f'<details id="ir-0"><summary>captured graph ({len(st.captured.graph.nodes)} nodes)</summary>'
             f"<pre>{escape(format_graph(st.captured.graph))}</pre></details>"]
    for i, r in enumerate(st.records, start=1):
        if r.graph is None:
            continue
        parts.append(f'<details id="ir-{i}"><summary>{i}. after {escape(r.name)}: {escape(r.effect())}</summary>'
                     f"<pre># after {escape(r.name)}: {escape(r.effect())}\n{escape(format_graph(r.graph))}</pre>"
                     "</details>")
    note = "The IR after each pass (click to open); `# file:line` comments give the user's source line of each node."
    return page.section("ir", "IR after each pass", "".join(parts), note)


def render(d: dict[str, Any], title: str) -> str:
    st = d["stats"]
    # the kernel graph is tall and narrow: the memory and compile-time plots sit beside it
    side = f'<div class="pair">{_graph(d)}<div class="stack">{_memory(d)}{_compile_time(d)}</div></div>'
    sections = [("summary", "Summary", _summary(d, title)), ("passes", "Passes", _passes(st)),
                ("kernels", "Kernels", _kernels(d)), ("graph", "Kernel graph", side),
                ("memory", "Memory", ""), ("compile", "Compile time", ""),
                ("training", "Training", _training(d)), ("externs", "Externs", _externs(d)),
                ("ir", "IR", _ir(st))]
    from ..version import __version__

    sub = (f"novaforge {__version__} · {st.backend} backend · "
           f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} · {platform.node()}")
    return page.document(f"novaforge report: {title}", sub, sections)


def report(model: Any, *inputs: Any, path: str | os.PathLike | None = None, freeze: bool = True,
           backend: str = "auto", runs: int = 5, title: str | None = None, eager: bool = True,
           **kwargs: Any) -> Path:
    """Compile `model` for `inputs` (and keyword inputs `kwargs`), profile it, compare it with
    eager, and write the HTML report to `path` (default `novaforge-report.html`); returns the path."""
    title = title or getattr(model, "__name__", None) or type(model).__name__
    d = collect(model, inputs, kwargs, freeze=freeze, backend=backend, runs=runs, eager=eager)
    out = Path(path or "novaforge-report.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(d, title), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="novaforge report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", help="gpt2, bert, llama (or their -tiny variants)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--backend", default="auto", help="auto, cpu, triton or interpret")
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--runs", type=int, default=5, help="profiled calls (and eager calls)")
    p.add_argument("--out", default=None, help="the HTML file (default novaforge-report-<model>.html)")
    args = p.parse_args(argv)

    from ..bench.workloads import build_inference_model, input_ids

    torch.set_num_threads(args.threads)
    model, vocab = build_inference_model(args.model)
    ids = input_ids(vocab, args.batch, args.seq)
    out = args.out or f"novaforge-report-{args.model}.html"
    t0 = time.perf_counter()
    with torch.inference_mode():
        path = report(model, ids, path=out, backend=args.backend, runs=args.runs,
                      title=f"{args.model}, batch {args.batch} x seq {args.seq}")
    size_kib = path.stat().st_size / 1024
    print(f"novaforge report: {path.resolve()} ({size_kib:.0f} KiB, {time.perf_counter() - t0:.1f} s)")
    return 0

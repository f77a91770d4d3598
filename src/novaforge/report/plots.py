"""The report's plots, drawn with matplotlib and returned as inline SVG text.

* memory timeline: live arena bytes at each kernel of the program (from the memory plan's
  intervals and offsets), the planned arena size, eager's measured peak, and the peak labelled
  with the largest buffers alive at it;
* per-kernel time: each kernel's measured time per call over the kernel order, by kind;
* compile time: capture, lowering, every pass, codegen and build as horizontal bars.

Only matplotlib's object API is used (`Figure`, never `pyplot`), so no global backend or
figure registry changes; text stays text (`svg.fonttype = none`), every id (and every
reference to it) gets a per-plot prefix so several inline SVGs never share one, and the XML
prologue is dropped for inlining.

Invariant: every function is a pure function of its arguments (no measurement here).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from ..ir import Graph
from .graphview import KIND_COLORS

MiB = 2**20


def _svg(fig: Any, salt: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = re.sub(r"^<\?xml[^>]*\?>\s*", "", text)
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # ids like "axes_1" repeat in every figure: make them unique within the page
    text = re.sub(r'\bid="([^"]+)"', rf'id="{salt}-\1"', text)
    return re.sub(r'(url\(#|href="#)([^)"]+)', rf"\g<1>{salt}-\2", text)


def _figure(w: float, h: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=96, layout="constrained")


@dataclass
class Timeline:
    live: list[int]  # live arena bytes at each kernel (ordinal)
    names: list[str]  # kernel names
    peak_at: int
    alive_at_peak: list[tuple[str, int]]  # (buffer description, bytes), largest first
    arena_bytes: int
    sum_bytes: int


def memory_timeline(graph: Graph) -> Timeline | None:
    plan = graph.meta.memory_plan
    if plan is None:
        return None
    kernel_nodes = [(i, n) for i, n in enumerate(graph.nodes) if n.op == "kernel"]
    producer = {o: n.attrs["kernel"].name for _, n in kernel_nodes for o in n.outputs}
    live, alive_lists = [], []
    for i, _n in kernel_nodes:
        by_offset: dict[int, tuple[int, Any]] = {}  # an in-place pair shares one offset: count it once
        for v, (a, b) in plan.intervals.items():
            if a <= i <= b and v in plan.offsets:
                size = plan.sizes[v]
                off = plan.offsets[v]
                if off not in by_offset or by_offset[off][0] < size:
                    by_offset[off] = (size, v)
        live.append(sum(s for s, _ in by_offset.values()))
        alive_lists.append(list(by_offset.values()))
    if not live:
        return None
    peak_at = max(range(len(live)), key=lambda k: live[k])
    alive = sorted(alive_lists[peak_at], key=lambda sv: -sv[0])
    desc = [(f"{producer.get(v, '?')} {str(v.type.dtype).removeprefix('torch.')}{list(v.type.shape)}", s)
            for s, v in alive]
    return Timeline(live, [n.attrs["kernel"].name for _, n in kernel_nodes], peak_at, desc, plan.arena_bytes,
                    plan.sum_bytes)


def memory_timeline_svg(tl: Timeline, eager_peak: int | None = None) -> str:
    fig = _figure(7.5, 3.6)
    ax = fig.add_subplot()
    xs = list(range(len(tl.live)))
    ys = [b / MiB for b in tl.live]
    ax.fill_between(xs, ys, step="mid", alpha=0.35, color="#4e79a7")
    ax.step(xs, ys, where="mid", color="#4e79a7", lw=1.2, label="live arena buffers")
    ax.axhline(tl.arena_bytes / MiB, color="#4e79a7", ls="--", lw=1, label=f"arena {tl.arena_bytes / MiB:.2f} MiB")
    if eager_peak:
        ax.axhline(eager_peak / MiB, color="#e15759", ls="-.", lw=1.2,
                   label=f"eager measured peak {eager_peak / MiB:.2f} MiB")
    top = tl.alive_at_peak[:4]
    more = len(tl.alive_at_peak) - len(top)
    note = "\n".join(f"{d} {s / MiB:.2f} MiB" for d, s in top) + (f"\n+ {more} more" if more > 0 else "")
    px, py = tl.peak_at, tl.live[tl.peak_at] / MiB
    ax.plot([px], [py], "o", color="#e15759")
    ax.annotate(f"peak {py:.2f} MiB at #{px} {tl.names[px]}\n{note}", (px, py), xytext=(10, -10),
                textcoords="offset points", fontsize=8, va="top",
                ha="left" if px < len(xs) * 0.6 else "right",
                bbox={"boxstyle": "round", "fc": "white", "ec": "#999", "alpha": 0.9})
    ax.set_xlabel("kernel (program order)")
    ax.set_ylabel("MiB")
    ax.set_xlim(-0.5, max(len(xs) - 0.5, 0.5))
    ax.set_ylim(0, max(max(ys), (eager_peak or 0) / MiB, tl.arena_bytes / MiB) * 1.25 or 1)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("memory timeline: live intermediate buffers", fontsize=10)
    return _svg(fig, "memory")


def kernel_time_svg(per_kernel_s: list[float], kinds: list[str], names: list[str]) -> str:
    fig = _figure(10, 3.0)
    ax = fig.add_subplot()
    xs = list(range(len(per_kernel_s)))
    ms = [s * 1e3 for s in per_kernel_s]
    ax.bar(xs, ms, width=0.85, color=[KIND_COLORS.get(k, "#bab0ac") for k in kinds])
    for kind, color in KIND_COLORS.items():
        if kind in kinds:
            ax.bar([0], [0], color=color, label=kind)
    ax.set_xlabel("kernel (program order)")
    ax.set_ylabel("ms per call")
    ax.set_xlim(-0.6, max(len(xs) - 0.4, 0.6))
    ax.legend(fontsize=8, ncols=5, loc="upper right")
    ax.set_title("measured time per kernel", fontsize=10)
    return _svg(fig, "kernels")


def compile_time_svg(bars: list[tuple[str, float, str]]) -> str:
    """`bars`: (label, seconds, category) top to bottom; category picks the colour."""
    colors = {"capture": "#76b7b2", "pass": "#59a14f", "codegen": "#f28e2b", "build": "#e15759", "other": "#bab0ac"}
    fig = _figure(7.5, 0.6 + 0.22 * len(bars))
    ax = fig.add_subplot()
    ys = list(range(len(bars)))[::-1]
    vals = [s * 1e3 for _, s, _ in bars]
    ax.barh(ys, vals, color=[colors.get(c, "#bab0ac") for _, _, c in bars], height=0.75)
    ax.set_yticks(ys, [label for label, _, _ in bars], fontsize=8)
    for y, v in zip(ys, vals, strict=True):
        ax.text(v, y, f" {v:.1f} ms", va="center", fontsize=7)
    ax.set_xlabel("ms")
    ax.set_xlim(0, max(vals, default=1) * 1.18 or 1)
    ax.set_title("compile time", fontsize=10)
    return _svg(fig, "compile")

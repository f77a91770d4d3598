"""The kernel graph as SVG, laid out by our own layered (Sugiyama-style) layout; no graphviz.

Nodes are the program's kernels in graph order, coloured by kind; an edge is a buffer that one
kernel writes and another reads (through any top-level views). Layout:

1. layer = longest path from a graph input (every edge points down);
2. within a layer, nodes are ordered by the mean position of their predecessors (barycenter),
   then one upward sweep by successors, which removes most crossings of transformer graphs;
3. edges are cubic curves from the bottom of the producer to the top of the consumer; an edge
   that skips layers (a residual) bows out sideways so it does not run through the boxes.

Each node's tooltip (`<title>`) gives its ops, schedule and time; each edge's its buffer.

Invariant: the output is a pure function of the graph and the given per-kernel data, so the
same program draws the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from ..ir import OPS, Graph

KIND_COLORS = {
    "matmul": "#4e79a7", "attention": "#b07aa1", "reduction": "#59a14f", "pointwise": "#f28e2b",
    "single": "#9c755f",
}
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 150, 34, 24, 30, 16


@dataclass
class _Node:
    index: int
    name: str
    kind: str
    tip: str
    layer: int = 0
    pos: float = 0.0
    x: float = 0.0
    y: float = 0.0


def kernel_edges(graph: Graph) -> list[tuple[int, int, str]]:
    """(producer ordinal, consumer ordinal, buffer description) for every buffer between kernels."""
    ordinal: dict[Any, int] = {}
    source: dict[Any, Any] = {}  # a top-level view's value -> the value it views
    edges: list[tuple[int, int, str]] = []
    seen: set[tuple[int, int]] = set()
    k = 0
    for n in graph.nodes:
        if n.op != "kernel":
            if OPS[n.op].has("view") and n.inputs:
                source[n.outputs[0]] = source.get(n.inputs[0], n.inputs[0])
            continue
        for v in n.inputs:
            v = source.get(v, v)
            if v in ordinal and (ordinal[v], k) not in seen:
                seen.add((ordinal[v], k))
                t = v.type
                edges.append((ordinal[v], k, f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}, "
                                             f"{t.nbytes / 1024:.1f} KiB"))
        for o in n.outputs:
            ordinal[o] = k
        k += 1
    return edges


def layout(nodes: list[_Node], edges: list[tuple[int, int, str]]) -> tuple[float, float]:
    preds: dict[int, list[int]] = {n.index: [] for n in nodes}
    succs: dict[int, list[int]] = {n.index: [] for n in nodes}
    for a, b, _ in edges:
        preds[b].append(a)
        succs[a].append(b)
    for n in nodes:  # graph order is topological
        n.layer = 1 + max((nodes[p].layer for p in preds[n.index]), default=-1)
    layers: dict[int, list[_Node]] = {}
    for n in nodes:
        layers.setdefault(n.layer, []).append(n)
    for i, n in enumerate(layers.get(0, [])):
        n.pos = i
    for lay in sorted(layers)[1:]:
        row = layers[lay]
        for n in row:
            ps = preds[n.index]
            n.pos = sum(nodes[p].pos for p in ps) / len(ps) if ps else n.index
        row.sort(key=lambda n: (n.pos, n.index))
        for i, n in enumerate(row):
            n.pos = i
    for lay in sorted(layers, reverse=True)[1:]:
        row = layers[lay]
        keyed = [(sum(nodes[s].pos for s in succs[n.index]) / len(succs[n.index]) if succs[n.index] else n.pos,
                  n.pos, n) for n in row]
        keyed.sort(key=lambda t: (t[0], t[1]))
        for i, (_, _, n) in enumerate(keyed):
            n.pos = i
    width = max((len(r) for r in layers.values()), default=1)
    total_w = 2 * MARGIN + width * BOX_W + (width - 1) * GAP_X + 2 * GAP_X  # room for bowed edges
    for r in layers.values():
        off = (width - len(r)) * (BOX_W + GAP_X) / 2 + MARGIN + GAP_X
        for n in r:
            n.x = off + n.pos * (BOX_W + GAP_X)
            n.y = MARGIN + n.layer * (BOX_H + GAP_Y)
    total_h = 2 * MARGIN + len(layers) * (BOX_H + GAP_Y)
    return total_w, total_h


def _fmt_ms(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s * 1e3:.2f} ms" if s >= 1e-4 else f"{s * 1e6:.0f} µs"


def kernel_graph_svg(graph: Graph, per_kernel_s: list[float] | None = None,
                     schedules: dict[str, str] | None = None) -> str:
    """An inline `<svg>` of the kernel graph (see the module docstring)."""
    from .metrics import kernel_rows

    rows = kernel_rows(graph)
    schedules = schedules or {}
    nodes = []
    for i, r in enumerate(rows):
        t = per_kernel_s[i] if per_kernel_s is not None and i < len(per_kernel_s) else None
        sched = schedules.get(r["node"].attrs["kernel"].structural_key, "")
        tip = (f"#{i} {r['name']} [{r['kind']}]\nops: {' '.join(r['ops'])}\n{sched}\n"
               f"{r['flops'] / 1e6:.2f} MFLOP, {r['bytes'] / 1024:.1f} KiB" + (f", {_fmt_ms(t)} per call" if t else "")
               + (f"\n{r['source']}" if r["source"] else ""))
        nodes.append(_Node(i, r["name"], r["kind"], tip))
    edges = kernel_edges(graph)
    w, h = layout(nodes, edges)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="kgraph" width="{w:.0f}" height="{h:.0f}" '
           f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="sans-serif" font-size="11">']
    out.append('<defs><marker id="kg-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" markerHeight="6" '
               'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>')
    for a, b, label in edges:
        na, nb = nodes[a], nodes[b]
        x1, y1 = na.x + BOX_W / 2, na.y + BOX_H
        x2, y2 = nb.x + BOX_W / 2, nb.y
        span = nb.layer - na.layer
        if span > 1:  # bow out to the side of the boxes in between
            centre = (na.x + nb.x) / 2 + BOX_W / 2
            side = (-1 if a % 2 == 0 else 1) if abs(centre - w / 2) < 1 else (-1 if centre < w / 2 else 1)
            bow = (BOX_W / 2 + GAP_X / 2 + 6 * min(span, 6)) * side
            c1, c2 = (x1 + bow, y1 + GAP_Y), (x2 + bow, y2 - GAP_Y)
        else:
            c1, c2 = (x1, (y1 + y2) / 2), (x2, (y1 + y2) / 2)
        out.append(f'<path class="kedge" d="M{x1:.1f},{y1:.1f} C{c1[0]:.1f},{c1[1]:.1f} {c2[0]:.1f},{c2[1]:.1f} '
                   f'{x2:.1f},{y2:.1f}" fill="none" stroke="#999" stroke-width="1.2" marker-end="url(#kg-arrow)">'
                   f'<title>{escape(f"#{a} {na.name} -> #{b} {nb.name}: {label}")}</title></path>')
    for n in nodes:
        color = KIND_COLORS.get(n.kind, "#bab0ac")
        t = per_kernel_s[n.index] if per_kernel_s is not None and n.index < len(per_kernel_s) else None
        label = n.name if len(n.name) <= 20 else n.name[:19] + "…"
        out.append(f'<g class="knode" data-kind="{n.kind}" transform="translate({n.x:.1f},{n.y:.1f})">'
                   f'<title>{escape(n.tip)}</title>'
                   f'<rect width="{BOX_W}" height="{BOX_H}" rx="5" fill="{color}" fill-opacity="0.9" stroke="#333"/>'
                   f'<text x="6" y="14" fill="#fff">#{n.index} {escape(label)}</text>'
                   f'<text x="6" y="28" fill="#fff" font-size="10">{escape(n.kind)} {escape(_fmt_ms(t))}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def legend_html() -> str:
    return " ".join(f'<span class="chip" style="background:{c}">{k}</span>' for k, c in KIND_COLORS.items())

"""The kernel graph's layered layout: edges point down, boxes never overlap, crossings are removed."""

from __future__ import annotations

import itertools

import torch
from torch import nn

import novaforge
from novaforge.report.graphview import BOX_H, BOX_W, _Node, kernel_edges, kernel_graph_svg, layout


def _nodes(n: int) -> list[_Node]:
    return [_Node(i, f"k{i}", "pointwise", "") for i in range(n)]


def test_layers_follow_edges_and_boxes_do_not_overlap():
    # 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3, 0 -> 3 (a diamond with a skip edge), 4 independent
    edges = [(0, 1, ""), (0, 2, ""), (1, 3, ""), (2, 3, ""), (0, 3, "")]
    nodes = _nodes(5)
    w, h = layout(nodes, edges)
    assert [n.layer for n in nodes] == [0, 1, 1, 2, 0]
    for a, b, _ in edges:
        assert nodes[b].y >= nodes[a].y + BOX_H
    for p, q in itertools.combinations(nodes, 2):
        assert abs(p.x - q.x) >= BOX_W or abs(p.y - q.y) >= BOX_H
        assert p.x >= 0 and p.x + BOX_W <= w and p.y + BOX_H <= h


def test_barycenter_uncrosses_two_chains():
    # layer 0: a0, b0; layer 1 listed crosswise in graph order: b1 (of b0) before a1 (of a0)
    edges = [(0, 3, ""), (1, 2, "")]
    nodes = _nodes(4)
    layout(nodes, edges)
    assert (nodes[0].x < nodes[1].x) == (nodes[3].x < nodes[2].x)


def test_svg_of_a_compiled_model():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16)).eval()
    c = novaforge.compile(model, backend="cpu", freeze=True)
    with torch.no_grad():
        c(torch.randn(4, 16))
    g = c.stats().graph
    n_kernels = sum(1 for n in g.nodes if n.op == "kernel")
    edges = kernel_edges(g)
    assert len(edges) >= n_kernels - 1 and all(a < b for a, b, _ in edges)
    svg = kernel_graph_svg(g, [1e-3] * n_kernels)
    assert svg.startswith("<svg") and svg.count('<g class="knode"') == n_kernels
    assert svg.count('<path class="kedge"') == len(edges) and "1.00 ms" in svg

"""The hot loops of generated kernels vectorize (GCC's vectorizer report, not timing)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import novaforge
from novaforge.codegen.cpu.backend import PRELUDE
from novaforge.codegen.cpu.build import vectorization_report
from novaforge.codegen.registry import get_backend


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_hot_loops_vectorize(tmp_path):
    ln = torch.nn.LayerNorm(96).eval()

    def f(x, y, m):
        h = ln(x) + y
        g = F.gelu(h) * torch.sigmoid(h) + torch.tanh(h) * torch.exp(-h * h)
        s = torch.softmax(g * 0.3, -1)
        r = (g * g).mean(-1, keepdim=True)
        b = (h.to(torch.bfloat16) * 2).float()
        return s, g * torch.rsqrt(r + 1e-6), b, torch.where(m, h, -h), g.sum(0)

    x, y, m = torch.randn(5, 7, 96), torch.randn(96), torch.rand(5, 7, 96) > 0.5
    c = novaforge.compile(f, backend="cpu", freeze=True)
    with torch.no_grad():
        c(x, y, m)
    be = get_backend("cpu")
    target = be.target()
    sources = []
    for n in c.stats().graph.nodes:
        if n.op == "kernel":
            plan = be.plan(n.attrs["kernel"], target)
            if plan.gen is not None:
                sources.append(plan.gen.render())
    assert len(sources) >= 2
    report = vectorization_report(PRELUDE + "".join(sources), target, tmp_path)
    assert len(report) >= 6
    missed = [line for line, ok in report.items() if not ok]
    assert not missed, f"omp simd loops not vectorized at lines {missed}"

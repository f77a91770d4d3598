"""The numerics checker on the Triton backend (CPU interpreter): every kernel is built as a
one-kernel program and checked against the reference interpreter (runtime/check_numerics.py)."""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.codegen.triton import exprs
from novaforge.runtime.check_numerics import CheckedProgram, NumericsMismatch


def f(x, w):
    h = torch.softmax(x @ w, -1)
    return torch.sin(h * 3 + x.sum(-1, keepdim=True))


def test_every_kernel_checked():
    c = novaforge.compile(f, backend="triton", check="numerics")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.no_grad():
        torch.testing.assert_close(c(x, w), f(x, w))
    prog = c.stats().program
    assert isinstance(prog, CheckedProgram)
    assert prog.checked == sum(1 for n in c.stats().graph.nodes if n.op == "kernel") >= 2


def test_planted_triton_bug_is_named(monkeypatch):
    monkeypatch.setitem(exprs.TRITON_EXPR, "sin", exprs.TRITON_EXPR["cos"])  # the planted miscompilation
    c = novaforge.compile(f, backend="triton", check="numerics")
    with torch.no_grad(), pytest.raises(NumericsMismatch) as e:
        c(torch.randn(3, 5), torch.randn(5, 5))  # shapes of their own: kernels not built before
    assert "sin" in e.value.report.ops
    assert any("torch.sin(h * 3" in s for s in e.value.report.sources)

"""novaforge.bisect: the fuel counters find the pass and the decision that introduce a planted
miscompilation; a clean model has nothing to bisect; a codegen bug is no pass's decision."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

import novaforge
from nf_planted import clobber_model, plant_inplace_bug, plant_pow_bug
from novaforge.bisect import bisect
from novaforge.passes.pipeline import default_pipeline


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.tanh(self.lin(x)) + 0
        z = y * 1 + x.sum(-1, keepdim=True)
        return torch.softmax(z ** 2, -1), (y - 0).exp()


def test_names_the_pass_and_the_rewrite(monkeypatch):
    plant_pow_bug(monkeypatch)
    r = bisect(Model(), torch.randn(4, 8), backend="cpu")
    simplify = r.passes.index("simplify")  # (its position in the pipeline, passes/pipeline.py)
    assert r.pass_name == "simplify" and r.pass_index == simplify
    assert r.decisions[simplify] >= 4  # x+0, x*1, x-0 and the pow are all decisions; only one is wrong
    assert "pow" in r.description and "z ** 2" in r.description, r.description
    assert "simplify" in str(r) and f"decision {r.decision}" in str(r)
    assert len(r.probes) <= 12


def test_names_plan_memory_and_the_inplace_decision(monkeypatch):
    """The planted memory-plan bug of test_check_numerics: the checker names the kernel, the
    bisector the pass and its decision."""
    plant_inplace_bug(monkeypatch)
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    r = bisect(clobber_model, x, w, backend="cpu")
    assert r.pass_name == "plan_memory", str(r)
    assert "in place of" in r.description and "tanh" in r.description, r.description


def test_clean_model_and_codegen_bug(monkeypatch, tmp_path):
    r = novaforge.bisect(Model(), torch.randn(4, 8), backend="cpu")  # the top-level API
    assert r.pass_index is None and not r.differs and "nothing to bisect" in r.verdict
    from novaforge.codegen.cpu import cexpr

    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(cexpr.UNARY_FLOAT_FN, "exp", "nf_tanh")
    r = bisect(lambda x: torch.exp(x * 3 - 1), torch.randn(5, 3), backend="cpu")
    assert r.pass_index is None and r.differs and "every pass at fuel 0" in r.verdict


def test_fuel_zero_everywhere_computes_the_same(monkeypatch):
    """Every pass with fuel 0 still gives a valid program with eager's values (the bisector's
    baseline), and its decision counts are those of the full compile."""
    m, x = Model(), torch.randn(4, 8)
    full = novaforge.compile(m, backend="cpu")
    zero = novaforge.compile(m, backend="cpu", pass_fuel={i: 0 for i in range(len(default_pipeline()))},
                             pass_trace=True)
    with torch.no_grad():
        want = m(x)
        for c in (full, zero):
            for g, w in zip(c(x), want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    f, z = full.stats(), zero.stats()
    assert sum(n.op == "kernel" for n in z.graph.nodes) > sum(n.op == "kernel" for n in f.graph.nodes)
    assert [r.decisions for r in f.records][:4] == [r.decisions for r in z.records][:4]
    assert all(r.trace == [] for r in z.records)  # no decision taken


def test_cli(tmp_path):
    src = tmp_path / "case.py"
    src.write_text(textwrap.dedent("""
        import torch
        model = lambda x: torch.tanh(x) * 2 + 1
        inputs = (torch.ones(3, 4),)
    """))
    p = subprocess.run([sys.executable, "-m", "novaforge", "bisect", f"{src}:model", "--backend", "interpret"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "nothing to bisect" in p.stdout

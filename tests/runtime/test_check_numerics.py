"""The numerics checker (runtime/check_numerics.py): NOVAFORGE_CHECK=numerics / check="numerics"
runs every kernel of a program against the reference interpreter on the inputs it received."""

from __future__ import annotations

import pytest
import torch

import novaforge
from nf_planted import clobber_model, plant_inplace_bug
from novaforge.runtime import check_numerics
from novaforge.runtime.check_numerics import CheckedProgram, KernelNumerics, NumericsMismatch, compare


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = torch.tanh(self.lin(x)) + 1
        z = y * 2 + x.sum(-1, keepdim=True)
        return torch.softmax(z, -1) @ y.t(), (y - 0.5).exp()


def test_every_kernel_is_checked_and_results_unchanged():
    m, x = TwoLayers(), torch.randn(4, 8)
    c = novaforge.compile(m, backend="cpu", check="numerics")
    with torch.no_grad():
        got, want = c(x), m(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    prog = c.stats().program
    kernels = sum(1 for n in c.stats().graph.nodes if n.op == "kernel")
    assert prog.observer is not None and prog.observer.checked == kernels >= 3
    assert all(st.kernel >= 0 for st in prog.steps)  # one entry point per kernel
    with torch.no_grad():
        c(x)
    assert prog.observer.checked == 2 * kernels


def test_environment_variable_turns_it_on(monkeypatch):
    monkeypatch.setenv("NOVAFORGE_CHECK", "numerics")
    c = novaforge.compile(lambda x: torch.sigmoid(x).sum(0), backend="cpu")
    x = torch.randn(3, 5)
    with torch.no_grad():
        torch.testing.assert_close(c(x), torch.sigmoid(x).sum(0))
    assert c.stats().program.observer is not None
    monkeypatch.setenv("NOVAFORGE_CHECK", "1")
    c = novaforge.compile(lambda x: torch.sigmoid(x).sum(0), backend="cpu")
    with torch.no_grad():
        c(torch.randn(3, 5))
    assert c.stats().program.observer is None
    with pytest.raises(ValueError, match="check="):
        check_numerics.enabled({"check": "values"})


def test_planted_codegen_bug_names_the_kernel_ops_and_source(monkeypatch, tmp_path):
    from novaforge.codegen.cpu import cexpr

    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))  # the planted library is never cached for others
    monkeypatch.setitem(cexpr.UNARY_FLOAT_FN, "tanh", "nf_sigmoid")  # the planted miscompilation

    def f(x, w):
        h = (x @ w).sum(-1, keepdim=True) * 3
        return torch.tanh(h + x) * 2  # the kernel the checker must name

    c = novaforge.compile(f, backend="cpu", check="numerics")
    with torch.no_grad(), pytest.raises(NumericsMismatch) as e:
        c(torch.randn(5, 7), torch.randn(7, 7))
    r = e.value.report
    assert "tanh" in r.ops and r.problem.startswith("output 0")
    assert any("test_check_numerics.py" in s and "torch.tanh(h + x)" in s for s in r.sources), r.sources
    assert "beyond tolerance" in str(e.value) and f"kernel {r.ordinal}" in str(e.value)
    assert any("kernel" in o for o in r.inputs)  # h comes from an earlier kernel


def test_planted_memory_plan_bug_names_the_kernel_that_overwrites(monkeypatch):
    plant_inplace_bug(monkeypatch)
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    c = novaforge.compile(clobber_model, backend="cpu", check="numerics")
    with torch.no_grad(), pytest.raises(NumericsMismatch) as e:
        c(x, w)
    r = e.value.report
    assert "overwrote" in r.problem and "memory-plan" in r.problem and r.ops == ["tanh"]
    assert any("torch.tanh(v)" in s for s in r.sources)
    # without the check the same program silently returns a wrong result
    with torch.no_grad():
        wrong = novaforge.compile(clobber_model, backend="cpu")(x, w)
        assert not torch.allclose(wrong, clobber_model(x, w), atol=1e-3)


def test_generic_checker_builds_one_program_per_kernel():
    """The path of backends without an observer hook, exercised with the CPU backend."""
    from novaforge.codegen.registry import get_backend

    m, x = TwoLayers(), torch.randn(4, 8)
    c = novaforge.compile(m, backend="cpu")
    with torch.no_grad():
        want = c(x)
    st = c.stats()
    wrapped = CheckedProgram(st.program, st.graph, get_backend("cpu"), {})
    params = [p for _, p in m.named_parameters()]
    bound = [x if gi.kind == "user" else params.pop(0) for gi in st.graph.inputs if gi.kind != "const"]
    with torch.no_grad():
        got = wrapped.run(bound)
    assert wrapped.checked == sum(1 for n in st.graph.nodes if n.op == "kernel")
    torch.testing.assert_close(got[0], want[0])


def test_tolerance_rounding_accepted_errors_rejected():
    num = KernelNumerics(2.0 ** -23, 3, 16)
    ref = torch.randn(64)
    r64 = ref.double()
    assert compare(ref.nextafter(ref + 1), ref, r64, num) == ""  # one ulp
    assert "beyond tolerance" in compare(ref * 1.001, ref, r64, num)
    nan = torch.tensor([float("nan"), 1.0])
    assert compare(nan.clone(), nan, nan.double(), num) == ""
    assert "non-finite" in compare(torch.tensor([0.0, 1.0]), nan, nan.double(), num)
    i = torch.arange(5)
    assert compare(i, i, i, num) == "" and "elements different" in compare(i + (i == 2), i, i, num)
    # a bfloat16 kernel with a reduction gets its unit and length
    from novaforge.frontend.capture import capture

    g = capture(lambda x: torch.softmax(x.float(), -1).to(torch.bfloat16),
                (torch.randn(2, 8, dtype=torch.bfloat16),)).graph
    k = KernelNumerics.of(g)
    assert k.eps == 2.0 ** -7 and k.red >= 8

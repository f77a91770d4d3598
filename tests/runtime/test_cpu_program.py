"""CpuProgram: one arena reused across calls, fresh outputs, input binding, views, mutations, plan checks."""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.passes.plan_memory import MemoryPlan, PlanError, verify_plan


def _compile(fn, *args, **kw):
    c = novaforge.compile(fn, backend="cpu", **kw)
    with torch.no_grad():
        out = c(*args)
    return c, out


def _chain(x, w):
    h = torch.tanh(x @ w)
    h = torch.softmax(h * 2, -1)
    h = (h @ w.t()).relu() + x
    return h.sum(-1, keepdim=True) * h


def test_arena_allocated_once_and_outputs_fresh():
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    c, out = _compile(_chain, x, w, freeze=True)
    prog = c.stats().program
    assert prog.info["torch"] == 0
    assert prog.arena.numel() >= c.stats().graph.meta["memory_plan"].arena_bytes
    arena_ptr = prog.arena.data_ptr()
    lo, hi = arena_ptr, arena_ptr + prog.arena.numel()
    outs = []
    for _k in range(3):
        xi = torch.randn(6, 16)
        with torch.no_grad():
            o = c(xi, w)
        torch.testing.assert_close(o, _chain(xi, w), atol=1e-5, rtol=1e-5)
        assert not (lo <= o.data_ptr() < hi), "output aliases the arena"
        outs.append((xi, o.clone(), o))
    assert prog.arena.data_ptr() == arena_ptr
    for _, snap, o in outs:
        assert torch.equal(snap, o)


def test_noncontiguous_inputs_and_signatures():
    w = torch.randn(16, 16)
    x = torch.randn(16, 6).t()
    c, out = _compile(_chain, x, w, freeze=True)
    torch.testing.assert_close(out, _chain(x, w), atol=1e-5, rtol=1e-5)


def test_outputs_that_are_inputs_views_and_constants():
    c_const = torch.arange(4.0)

    def f(x, y):
        return x, x.t(), y * 2, c_const

    x, y = torch.randn(3, 4), torch.randn(4)
    c, out = _compile(f, x, y, freeze=True)
    ref = f(x, y)
    assert out[0] is x or torch.equal(out[0], x)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2]) and torch.equal(out[3], ref[3])


def test_buffer_mutation_written_back():
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("acc", torch.zeros(5))

        def forward(self, x):
            self.acc.add_(x.sum(0))
            return x * 2

    m = M()
    c = novaforge.compile(m, backend="cpu")
    x = torch.randn(3, 5)
    with torch.no_grad():
        c(x)
        c(x)
    torch.testing.assert_close(m.acc, 2 * x.sum(0))


def test_gradients_go_through_the_interpreter():
    lin = torch.nn.Linear(4, 3)
    c = novaforge.compile(lin, backend="cpu")
    x = torch.randn(2, 4, requires_grad=True)
    c(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_verify_plan_catches_overlap():
    from novaforge.ir import TensorType, Value

    a, b = Value(TensorType((16,), torch.float32)), Value(TensorType((16,), torch.float32))
    ok = MemoryPlan(128, {a: 0, b: 64}, {a: 64, b: 64}, {a: (0, 1), b: (1, 2)})
    verify_plan(ok)
    bad = MemoryPlan(128, {a: 0, b: 0}, {a: 64, b: 64}, {a: (0, 1), b: (1, 2)})
    with pytest.raises(PlanError):
        verify_plan(bad)
    disjoint_in_time = MemoryPlan(64, {a: 0, b: 0}, {a: 64, b: 64}, {a: (0, 1), b: (2, 3)})
    verify_plan(disjoint_in_time)


def test_program_slots_never_overlap_while_live():
    """The runtime's own view: arena slots of buffers live at the same step do not overlap."""
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    c, _ = _compile(_chain, x, w, freeze=True)
    g = c.stats().graph
    plan = g.meta["memory_plan"]
    prog = c.stats().program
    spans = {}
    for s in prog.slots:
        if s.kind == "arena":
            spans.setdefault(s.index, []).append(s.type.nbytes)
    for v, off in plan.offsets.items():
        for u, off2 in plan.offsets.items():
            if u is v or frozenset((u, v)) in {frozenset(p) for p in plan.inplace.items()}:
                continue
            (a0, a1), (b0, b1) = plan.intervals[v], plan.intervals[u]
            if a0 <= b1 and b0 <= a1:
                assert off + v.type.nbytes <= off2 or off2 + u.type.nbytes <= off


def test_profile_option_times_every_launch():
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    c = novaforge.compile(_chain, backend="cpu", freeze=True, profile=True)
    with torch.no_grad():
        c(x, w)
        c(x, w)
    prof = c.stats().program.profile()
    n_kernels = sum(1 for n in c.stats().graph.nodes if n.op == "kernel")
    assert len(prof) >= n_kernels
    assert all(t >= 0 for _, t in prof) and sum(t for _, t in prof) > 0

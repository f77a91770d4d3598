"""Helpers for CPU backend tests: compile with backend='cpu', compare with eager, inspect the program."""

from __future__ import annotations

import torch

import novaforge
from novaforge.passes.plan_memory import verify_plan


def compile_cpu(fn, *args, freeze: bool = True, **options):
    c = novaforge.compile(fn, backend="cpu", freeze=freeze, **options)
    with torch.no_grad():
        c(*args)
    return c


def program(c):
    return c.stats().program


def check(fn, *args, atol: float = 1e-5, rtol: float = 1e-5, allow_torch: int = 0, freeze: bool = True,
          expect_kinds: dict[str, int] | None = None, **options):
    """Compile fn for args with the CPU backend; its outputs equal eager's; at most `allow_torch`
    kernels fall back to torch; outputs are fresh tensors (a second call does not change them)."""
    with torch.no_grad():
        ref = fn(*args)
        c = novaforge.compile(fn, backend="cpu", freeze=freeze, **options)
        got = c(*args)
    refs = ref if isinstance(ref, tuple | list) else (ref,)
    gots = got if isinstance(got, tuple | list) else (got,)
    assert len(refs) == len(gots)
    for r, g in zip(refs, gots, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape, (g.dtype, g.shape, r.dtype, r.shape)
        if r.dtype.is_floating_point:
            torch.testing.assert_close(g, r, atol=atol, rtol=rtol, equal_nan=True)
        else:
            assert torch.equal(g, r), (g, r)
    prog = program(c)
    info = prog.info
    assert info["torch"] <= allow_torch, info["fallbacks"]
    if expect_kinds:
        kinds = {}
        for n in c.stats().graph.nodes:
            if n.op == "kernel":
                k = n.attrs["kernel"].kind
                kinds[k] = kinds.get(k, 0) + 1
        for k, v in expect_kinds.items():
            assert kinds.get(k, 0) == v, kinds
    verify_plan(c.stats().graph.meta["memory_plan"])
    # outputs are fresh: calling again (with other inputs) leaves the first results intact
    snap = [g.clone() for g in gots]
    with torch.no_grad():
        other = [a + 1 if isinstance(a, torch.Tensor) and a.dtype.is_floating_point else a for a in args]
        c(*other)
    for s, g in zip(snap, gots, strict=True):
        assert torch.equal(s, g) or (s.isnan() == g.isnan()).all()
    return c, gots

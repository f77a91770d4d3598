"""Helpers for the Triton backend tests: compile with backend='triton' (CPU interpreter) and
compare with eager PyTorch on fresh random inputs."""

from __future__ import annotations

from collections import Counter

import torch

import novaforge
from novaforge.codegen.registry import get_backend


def backend():
    return get_backend("triton")


def compiled(fn, **options):
    return novaforge.compile(fn, backend="triton", **options)


def steps(c) -> Counter:
    """How many steps of each executor the last compiled program has."""
    return Counter(s.kind for s in c.stats().program.steps)


def kernel_kinds(c) -> Counter:
    return Counter(k.kind for k in c.stats().program.kernels)


def check(fn, *args, atol=1e-5, rtol=1e-5, all_triton=True, options=None, ref=None):
    """Compile `fn`, run it on args, compare with eager (or `ref`); return the compiled callable."""
    c = compiled(fn, **(options or {}))
    with torch.no_grad():
        want = fn(*args) if ref is None else ref(*args)
        got = c(*args)
    for g, w in zip(_flat(got), _flat(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, equal_nan=True)
    if all_triton:
        kinds = steps(c)
        assert kinds.get("torch", 0) == 0, f"some kernels ran through torch: {backend().reasons}"
        assert kinds.get("triton", 0) > 0
    return c


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in _flat(item)]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def step_like_eager_adamw(model: torch.nn.Module, batch: tuple[int, int, int], steps: int):
    """`compile_step(model, AdamW)` on the Triton backend against eager AdamW on a copy, for a
    model called as `model(x, y)` with the loss mean((out - y)^2) over random (rows, in, out)
    batches: losses at every step and the final parameters equal. Returns the compiled step."""
    import copy

    rows, n_in, n_out = batch
    ref = copy.deepcopy(model)
    opt, opt_ref = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step = novaforge.compile_step(model, opt, lambda out, x, y: ((out - y) ** 2).mean(), backend="triton")
    for _ in range(steps):
        x, y = torch.randn(rows, n_in), torch.randn(rows, n_out)
        got = step(x, y)
        opt_ref.zero_grad()
        want = ((ref(x, y) - y) ** 2).mean()
        want.backward()
        opt_ref.step()
        torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)
    return step

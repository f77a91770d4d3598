"""The training tier: every family of `families.py` (decoders, encoders, a ViT, CNNs) in its
default config, its forward and backward compiled through `torch.compile(backend="novaforge")`
with no graph running uncompiled (`fallback="raise"`), two steps of plain SGD: every
parameter's gradient within 1e-3 of eager's, relative to the largest gradient."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

from novaforge.frontend import pytrees

from .families import build, families


def _loss(out) -> torch.Tensor:
    first = next(t for t in pytrees.flatten(out).leaves if t.is_floating_point())
    return (first.float() ** 2).mean()


@pytest.mark.parametrize("name", list(families()))
def test_family_gradients_match_eager(name):
    model, x, _ = build(name)
    model.eval()  # dropout off; BatchNorm on its running statistics
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="novaforge", options={"fallback": "raise"})
    for step in range(2):
        for m, f in ((ref, ref), (model, compiled)):
            m.zero_grad(set_to_none=True)
            _loss(f(x)).backward()
        pairs = [(p, q) for p, q in zip(model.parameters(), ref.parameters(), strict=True) if q.grad is not None]
        assert pairs, "no parameter received a gradient"
        scale = max(q.grad.abs().max().item() for _, q in pairs)
        for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            if q.grad is None:
                assert p.grad is None or not p.grad.any(), n
                continue
            assert p.grad is not None, f"{n}: no gradient"
            err = (p.grad - q.grad).abs().max().item()
            assert err <= 1e-3 * scale, f"step {step}, {n}: gradient differs by {err:.2e} (largest {scale:.2e})"
        with torch.no_grad():
            for p, q in pairs:
                p -= 0.01 * p.grad / scale
                q -= 0.01 * q.grad / scale

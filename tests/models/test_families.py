"""The model tier: every family of `families.py` in its default config (KV cache on, default
attention) through both entry points, `torch.compile(backend="novaforge")` and
`novaforge.compile`, against eager: every output tensor (logits or hidden states and the
returned KV cache), and for decoders a second step that feeds the returned cache back with one
new token. No Dynamo graph may fall back to eager."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import novaforge
from novaforge import dynamo as nf_dynamo
from novaforge.frontend import pytrees

from .families import DECODERS, build, families


def _tensors(out) -> list[torch.Tensor]:
    return pytrees.flatten(out).leaves


def _assert_same(got, want) -> None:
    g, w = _tensors(got), _tensors(want)
    assert len(g) == len(w), (len(g), len(w))
    for a, b in zip(g, w, strict=True):
        scale = max(1.0, b.abs().max().item()) if b.numel() and b.is_floating_point() else 1.0
        torch.testing.assert_close(a, b, atol=2e-5 * scale, rtol=1e-4)


def _compiled(entry: str, model):
    if entry == "dynamo":
        torch._dynamo.reset()
        return torch.compile(model, backend="novaforge")
    return novaforge.compile(model)


@pytest.mark.parametrize("entry", ["dynamo", "novaforge"])
@pytest.mark.parametrize("name", list(families()))
def test_family_matches_eager(name, entry):
    model, x, _ = build(name)
    nf_dynamo.FALLBACKS.clear()
    compiled = _compiled(entry, model)
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
        _assert_same(got, want)
        if name in DECODERS:  # a decoding step on the cache each side returned
            assert got.past_key_values is not None and got.past_key_values is not want.past_key_values
            nxt = torch.randint(0, 256, (x.shape[0], 1), generator=torch.Generator().manual_seed(1))
            want2 = model(nxt, past_key_values=want.past_key_values)
            got2 = compiled(nxt, past_key_values=got.past_key_values)
            _assert_same(got2, want2)
            assert got2.past_key_values is got.past_key_values  # updated in place, as eager does
    assert nf_dynamo.FALLBACKS == []
    if entry == "novaforge":
        assert compiled.compilations == (2 if name in DECODERS else 1)
        assert compiled.stats().program is not None

"""The nanoGPT-style training model: parameter counts of the ANCHORS configs, tied head,
causality, initial loss, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from novaforge.bench.nanogpt import CONFIGS, GPT, build_gpt


@pytest.mark.parametrize(("name", "count"), [("gpt-42m", 42_128_384), ("gpt-124m", 124_475_904)])
def test_parameter_counts_match_anchors(name, count):
    model = build_gpt(name)
    assert model.num_params() == count
    assert round(count / 1e6, 1) == {"gpt-42m": 42.1, "gpt-124m": 124.5}[name]


def test_head_is_tied_and_linears_have_biases():
    model = build_gpt("gpt-tiny")
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.bias is None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            assert mod.bias is not None, name
    assert model.h[0].mlp.gelu.approximate == "tanh"


def test_same_seed_same_weights():
    a, b = build_gpt("gpt-tiny", seed=3), build_gpt("gpt-tiny", seed=3)
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    c = build_gpt("gpt-tiny", seed=4)
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_attention_is_causal():
    cfg = CONFIGS["gpt-tiny"]
    model = build_gpt("gpt-tiny").eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 17))
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 17, cfg.vocab_size)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_initial_loss_is_near_log_vocab_and_backward_reaches_every_parameter():
    cfg = CONFIGS["gpt-tiny"]
    model: GPT = build_gpt("gpt-tiny")
    idx = torch.randint(0, cfg.vocab_size, (2, 32))
    loss = model(idx, torch.roll(idx, -1, dims=1))
    assert loss.dim() == 0
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name

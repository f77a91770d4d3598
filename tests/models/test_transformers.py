"""End to end on transformers models (small configs, random weights, never from a hub):
outputs equal eager, one attention kernel per layer, and a fused kernel for every LayerNorm /
RMSNorm, GELU / SiLU gate and softmax, through both capture modes."""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.bench.workloads import build_inference_model, input_ids

LAYERS = 2


def _compile(name, capture, freeze, backend="interpret", attn="sdpa", batch=2, seq=16, mask=False):
    model, vocab = build_inference_model(f"{name}-tiny")
    if attn != "sdpa":
        model.config._attn_implementation = attn
    ids = input_ids(vocab, batch, seq)
    kwargs = {}
    if mask:
        m = torch.ones(batch, seq, dtype=torch.long)
        m[0, -5:] = 0
        kwargs["attention_mask"] = m
    compiled = novaforge.compile(model, freeze=freeze, backend=backend, capture=capture)
    with torch.no_grad():
        ref = model(ids, **kwargs).last_hidden_state
        out = compiled(ids, **kwargs).last_hidden_state
    return compiled.stats(), out, ref


def _kernels(stats):
    return [n.attrs["kernel"] for n in stats.graph.nodes if n.op == "kernel"]


def _ops_in_kernels(stats):
    return [bn.op for k in _kernels(stats) for bn in k.body.nodes]


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_outputs_match_eager_and_fusion_groups(name, capture):
    stats, out, ref = _compile(name, capture, freeze=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ks = _kernels(stats)
    names = [k.name for k in ks]
    assert _ops_in_kernels(stats).count("attention") == LAYERS
    norm = "rmsnorm" if name == "llama" else "layernorm"
    assert sum(n == norm for n in names) >= 2 * LAYERS, names
    ops = _ops_in_kernels(stats)
    for k in ks:  # every softmax / normalization reduction lives in a reduction kernel
        if k.kind != "reduction":
            assert not any(n.op in ("sum", "max") for n in k.body.nodes), (k.name, k.kind)
    if name == "gpt2":
        # GPT-2's GELU (tanh formula written out: recognize_activations) in the GEMM's epilogue
        assert any(k.kind == "matmul" and "gelu" in k.ops() for k in ks)
        assert "tanh" not in ops
    if name == "bert":
        assert any(k.kind == "matmul" and "gelu" in k.ops() for k in ks)
    if name == "llama":
        assert any("silu" in k.ops() and "mul" in k.ops() for k in ks)  # SiLU gate fused
    assert "softmax" not in names or ops.count("exp") <= LAYERS
    # the [B, H, L, D] -> [B, L, H, D] transpose after attention is stored by the attention kernel
    assert "copy" not in names, names


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_unfrozen_with_padding_mask(name):
    stats, out, ref = _compile(name, "fx", freeze=False, mask=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert _ops_in_kernels(stats).count("attention") == LAYERS


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eager_attention_implementation_is_fused(name):
    stats, out, ref = _compile(name, "fx", freeze=True, attn="eager")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert _ops_in_kernels(stats).count("attention") == LAYERS

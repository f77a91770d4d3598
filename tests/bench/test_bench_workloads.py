"""Workload definitions: the ANCHORS configs, determinism, shapes of the matmul sweep."""

from __future__ import annotations

import pytest
import torch

from novaforge.bench import workloads as wl


def test_anchor_configs():
    gpt2 = wl.transformers_config("gpt2")
    assert gpt2.use_cache is False and gpt2.n_layer == 12 and gpt2.n_embd == 768
    llama = wl.transformers_config("llama")
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads, llama.num_key_value_heads,
            llama.intermediate_size, llama.vocab_size, llama.use_cache) == (768, 12, 12, 4, 2048, 32000, False)
    bert = wl.transformers_config("bert")
    assert bert.hidden_size == 768 and bert.num_hidden_layers == 12


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "llama-tiny"])
def test_inference_models_are_deterministic_eval_float32(name):
    m1, vocab = wl.build_inference_model(name)
    m2, _ = wl.build_inference_model(name)
    assert not m1.training
    assert all(p.dtype == torch.float32 for p in m1.parameters())
    ids = wl.input_ids(vocab, 2, 16)
    assert torch.equal(ids, wl.input_ids(vocab, 2, 16)) and int(ids.max()) < vocab
    with torch.no_grad():
        assert torch.equal(m1(ids).last_hidden_state, m2(ids).last_hidden_state)


def test_training_batches_targets_are_next_tokens():
    batches = wl.training_batches(512, 2, 16, count=3)
    assert len(batches) == 3
    for ids, tgt in batches:
        assert ids.shape == tgt.shape == (2, 16)
        assert torch.equal(ids[:, 1:], tgt[:, :-1])
    again = wl.training_batches(512, 2, 16, count=3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    assert not torch.equal(batches[0][0], batches[1][0])


def test_matmul_shapes():
    cpu = wl.matmul_shapes("matmul", tokens=1024, max_size=2048)
    squares = [s for s in cpu if s.label.startswith("square")]
    assert [s.m for s in squares] == [1024, 2048]
    gpu = wl.matmul_shapes("matmul", tokens=16384, max_size=8192)
    assert [s.m for s in gpu if s.label.startswith("square")] == [1024, 2048, 4096, 8192]
    by = {s.label: s for s in gpu}
    assert (by["qkv fwd"].m, by["qkv fwd"].k, by["qkv fwd"].n) == (16384, 512, 1536)
    assert (by["lm head fwd"].k, by["lm head fwd"].n) == (512, 32000)
    assert by["square 1024"].flops == 2 * 1024**3
    a, b = wl.matmul_operands(by["attn proj fwd"], torch.float32, "cpu")
    assert a.shape == (16384, 512) and b.shape == (512, 512)


def test_defaults_follow_device():
    gpt2 = wl.get("gpt2")
    assert wl.default_shapes(gpt2, "cpu") == ([1], 128)
    assert wl.default_shapes(gpt2, "cuda") == ([16], 1024)
    assert wl.default_shapes(wl.get("bert"), "cuda") == ([16], 512)
    assert wl.default_shapes(wl.get("gpt-42m"), "cuda") == ([16], 1024)
    assert wl.default_dtype("cuda") == "bfloat16" and wl.default_dtype("cpu") == "float32"
    with pytest.raises(ValueError, match="unknown workload"):
        wl.get("gpt5")

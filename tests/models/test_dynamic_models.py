"""Dynamic shapes on real models: a tiny GPT2Model, BertModel and Llama-style model traced
once with a symbolic sequence length (both entry points, the models' default configs), run at
several lengths against eager."""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge import dynamo
from novaforge.bench.workloads import build_inference_model, input_ids

LENGTHS = (7, 16, 23)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_direct_entry_one_trace_for_every_length(name):
    model, vocab = build_inference_model(f"{name}-tiny")
    compiled = novaforge.compile(model, backend="cpu", dynamic={"input_ids": {1: (2, 128)}}, tiered=False)
    with torch.no_grad():
        for seq in LENGTHS:
            ids = input_ids(vocab, 2, seq)
            torch.testing.assert_close(compiled(ids).last_hidden_state, model(ids).last_hidden_state,
                                       atol=2e-5, rtol=1e-4)
    assert compiled.dynamic.traces == 1, compiled.dynamic.captures
    assert compiled.dynamic.specializations == len(LENGTHS)
    assert compiled.compilations == 1  # one program for every length
    assert compiled.stats().program.info["torch"] <= 6  # (transformers' mask helpers: cumsum, index)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_dynamo_dynamic_lowers_once_for_every_length(name):
    torch._dynamo.reset()
    model, vocab = build_inference_model(f"{name}-tiny")
    compiled = torch.compile(model, backend="novaforge", dynamic=True, options={"fallback": "raise", "tiered": False})
    retraced, built, shared = dynamo.STATIC_RETRACES[0], dynamo.PROGRAMS_BUILT[0], dynamo.SHARED_PROGRAMS[0]
    with torch.no_grad():
        for seq in LENGTHS:
            ids = input_ids(vocab, 2, seq)
            torch.testing.assert_close(compiled(ids).last_hidden_state, model(ids).last_hidden_state,
                                       atol=2e-5, rtol=1e-4)
    assert dynamo.STATIC_RETRACES[0] == retraced
    assert dynamo.PROGRAMS_BUILT[0] - built == 1 and dynamo.SHARED_PROGRAMS[0] - shared == 1


def test_generate_with_a_dynamic_cache_traces_prefill_and_decode_once():
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=256)).eval()
    ids = torch.randint(0, 500, (1, 8))
    compiled = novaforge.compile(model, dynamic=True, tiered=False)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=DynamicCache())
        got = compiled.generate(ids, max_new_tokens=10, do_sample=False, past_key_values=DynamicCache())
    assert torch.equal(got, want)
    assert compiled.dynamic.traces == 2  # the prefill and one decode step, whatever the cache length
    assert compiled.dynamic.specializations == 10
    assert compiled.compilations == 2  # and one program each


def test_dynamo_dynamic_gpt2_keeps_attention_fused():
    """Dynamo's dynamic graph of GPT-2 computes the attention scale through float64 tensors and
    `prims.convert_element_type`: every op lowers (no ATen call between kernels; the extern
    casts made that program 7x slower than the static one) and both attentions stay fused."""
    from torch._dynamo.backends.common import aot_autograd

    from novaforge.dynamo import _compile_aten, _decompositions

    torch._dynamo.reset()
    model, vocab = build_inference_model("gpt2-tiny")
    programs: list = []
    compiler = _compile_aten({"backend": "cpu", "fallback": "raise", "tiered": False}, programs)
    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=_decompositions())
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for seq in (9, 12):
            ids = input_ids(vocab, 1, seq)
            torch.testing.assert_close(compiled(ids).last_hidden_state, model(ids).last_hidden_state,
                                       atol=2e-5, rtol=1e-4)
    graphs = [s.graph for p in programs for s in p.stats]
    assert graphs
    for g in graphs:
        body_ops = [b.op for n in g.nodes if n.op == "kernel" for b in n.attrs["kernel"].body.nodes]
        assert body_ops.count("attention") == 2, body_ops
        assert "extern" not in body_ops, body_ops


def test_dynamo_training_at_several_lengths_builds_one_forward_and_one_backward():
    """Variable-length training through torch.compile: Dynamo makes the graphs dynamic at the
    second length; AOTAutograd's forward and backward (with sdpa's flash forward and backward
    kept as ATen calls of symbolic output sizes) are each built once for every later length, and
    the losses follow eager's."""
    import copy

    import transformers as tf

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=256)
    model = tf.LlamaForCausalLM(cfg)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="novaforge", options={"fallback": "raise", "tiered": False})
    opt, opt_ref = torch.optim.AdamW(model.parameters(), 1e-3), torch.optim.AdamW(ref.parameters(), 1e-3)
    built, shared = dynamo.PROGRAMS_BUILT[0], dynamo.SHARED_PROGRAMS[0]
    for n in (16, 24, 16, 31, 40):
        ids = torch.randint(1, 256, (2, n))
        loss = compiled(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        want = ref(ids, labels=ids).loss
        want.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item()), n
    # the first length static (forward, backward), then one shared forward and backward
    assert dynamo.SHARED_PROGRAMS[0] - shared == 2 and dynamo.PROGRAMS_BUILT[0] - built == 4

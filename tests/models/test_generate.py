"""`generate()` compiled, as users call it: `novaforge.compile(model).generate(...)` and
`model.forward = torch.compile(model.forward, backend="novaforge")`. Greedy tokens equal
eager's; the number of programs built is bounded whatever the number of new tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo
import transformers as tf

import novaforge
from novaforge import dynamo as nf_dynamo

from .families import build

PROMPT = 8


def _eager(model, ids, new, **kw):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, **kw)


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral"])
def test_generate_static_cache_two_programs_for_128_tokens(name):
    """(Mistral's default config slides a 4096-position window: its static cache layers carry a
    Python position counter that would make every step a new program; within a shorter cache
    they are plain static layers.)"""
    model, x, _ = build(name, batch=1, seq=PROMPT)
    want = _eager(model, x, 128)
    compiled = novaforge.compile(model)
    with torch.no_grad():
        got = compiled.generate(x, max_new_tokens=128, do_sample=False)
    assert torch.equal(got, want)
    assert compiled.compilations == 2  # the prefill and one decode step
    assert "forward" not in model.__dict__  # the replaced forward is gone again
    with torch.no_grad():
        again = compiled.generate(x, max_new_tokens=128, do_sample=False)
    assert torch.equal(again, want) and compiled.compilations == 2


def test_generate_dynamic_cache_when_asked_and_batch_of_two():
    model, x, _ = build("gpt2", batch=2, seq=PROMPT)
    want = _eager(model, x, 6)
    compiled = novaforge.compile(model, generate_cache="dynamic")
    with torch.no_grad():
        got = compiled.generate(x, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert compiled.compilations == 6  # one program per cache length until shapes are symbolic


def test_generate_explicit_static_cache_implementation():
    model, x, _ = build("llama", batch=1, seq=PROMPT)
    want = _eager(model, x, 10, cache_implementation="static")
    compiled = novaforge.compile(model)
    with torch.no_grad():
        got = compiled.generate(x, max_new_tokens=10, do_sample=False, cache_implementation="static")
    assert torch.equal(got, want) and compiled.compilations == 2


@pytest.mark.parametrize("cache", ["static", None])
def test_generate_through_torch_compile_forward(cache):
    torch._dynamo.reset()
    model, x, _ = build("gpt2", batch=1, seq=PROMPT)
    kw = {"cache_implementation": cache} if cache else {}
    want = _eager(model, x, 12, **kw)
    nf_dynamo.FALLBACKS.clear()
    before = nf_dynamo.PROGRAMS_BUILT[0]
    model.forward = torch.compile(model.forward, backend="novaforge")
    try:
        got = _eager(model, x, 12, **kw)
    finally:
        del model.forward
    assert torch.equal(got, want)
    assert nf_dynamo.FALLBACKS == []
    built = nf_dynamo.PROGRAMS_BUILT[0] - before
    assert built >= 2
    if cache == "static":
        assert built <= 3, built


def test_lengths_in_one_bucket_share_programs_and_the_cache_is_updated_in_place():
    model, x, _ = build("llama", batch=1, seq=PROMPT)
    compiled = novaforge.compile(model, freeze=True)
    for new in (5, 20, 40):
        want = _eager(model, x, new)
        with torch.no_grad():
            got = compiled.generate(x, max_new_tokens=new, do_sample=False)
        assert torch.equal(got, want), new
    assert compiled.compilations == 2  # 8 + 40 <= 128 positions: one static cache size
    entries = [*compiled._programs.values(),  # the decode step's program is novaforge's decode loop's
               *(e for step in compiled._decode_steps.values() for e in step._programs.values())]
    decode = max(entries, key=lambda e: e.stats.program.calls).stats.program
    # K and V of both layers: written into the caller's cache by generated kernels (no ATen step,
    # nothing copied back); the step's only torch step is the embedding lookup's multi-axis index
    assert not [st for st in decode.steps if st.attrs.get("inplace_target")]
    assert not [f for f in decode.info["fallbacks"] if "index_copy" in f or "extern" in f], decode.info["fallbacks"]
    sources = "".join(p.read_text() for p in Path(decode.info["source_dir"]).glob("*.c*"))
    assert sources.count("// the input's own buffer") in (1, 2)  # the K and V writes (one function when alike)


def test_generate_encoder_decoder_left_padded():
    """T5 (an encoder-decoder model), a left-padded batch: the static cache is transformers' own
    EncoderDecoderCache (a plain StaticCache broke the cross-attention's position bias), with
    the decoder's length bucketed, so new-token counts in one bucket share the two programs."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(tf.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                                                      vocab_size=128, decoder_start_token_id=0)).eval()
    ids = torch.randint(1, 120, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    compiled = novaforge.compile(model)
    for new in (10, 14):
        want = _eager(model, ids, new, attention_mask=mask, pad_token_id=0)
        with torch.no_grad():
            got = compiled.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
        assert torch.equal(got, want)
    assert compiled.compilations == 2


def _tiny_gptj():
    return tf.GPTJForCausalLM(tf.GPTJConfig(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                            rotary_dim=8))


def _tiny_gemma2():
    return tf.Gemma2ForCausalLM(tf.Gemma2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                                head_dim=16, max_position_embeddings=64, sliding_window=8))


@pytest.mark.parametrize("make", [_tiny_gptj, _tiny_gemma2], ids=["gptj", "gemma2"])
def test_forward_then_generate_through_torch_compile(make):
    """A plain forward call (logits for every position) and then generate() through one compiled
    forward: generate's integer arguments (GPT-J: `logits_to_keep`, which the graph never reads
    once traced) and Gemma 2's sliding window (`Max(0, s0 - 7)` in Dynamo's sizes) used to raise
    at the first decoding step."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        want_logits = model(ids).logits
    want = _eager(model, ids, 6)
    model.forward = torch.compile(model.forward, backend="novaforge", options={"fallback": "raise"})
    try:
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, want_logits, atol=1e-4, rtol=1e-4)
        got = _eager(model, ids, 6)
    finally:
        del model.forward
    assert torch.equal(got, want)


def test_dynamic_rope_generates_and_trains_through_novaforge_compile():
    """A Llama with dynamic RoPE scaling branches on a tensor value (`if seq_len >
    max_seq_len_cached`, transformers' modeling_rope_utils.py), which one captured graph cannot
    hold: `novaforge.compile(model)` goes through Dynamo for it (which splits the graph there)
    instead of refusing. generate() past max_position_embeddings (where the branch flips) gives
    eager's tokens with a bounded number of programs; training after generation (the rotary
    module now holds a plain tensor attribute) gives eager's losses."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, max_position_embeddings=32,
                            rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    model = tf.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 128, (2, 10))
    mask = torch.ones_like(ids)
    twin = copy.deepcopy(model)
    want = _eager(model, ids, 24, attention_mask=mask)
    compiled = novaforge.compile(twin)
    built = nf_dynamo.PROGRAMS_BUILT[0]
    with torch.no_grad():
        got = compiled.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)  # (34 > 32 positions)
    assert torch.equal(got, want)
    assert compiled._via_dynamo is not None
    assert nf_dynamo.PROGRAMS_BUILT[0] - built < 20  # Dynamo's pieces around the branch, not one per token (24)
    eager, trained = copy.deepcopy(model).train(), twin.train()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(trained.parameters(), lr=0.1)
    for length in (12, 40):
        x = torch.randint(0, 128, (2, length))
        for m, opt in ((eager, opt_e), (compiled, opt_c)):
            loss = m(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if m is eager:
                want_loss = loss.item()
        assert abs(loss.item() - want_loss) <= 1e-4 * abs(want_loss)


def test_recurrent_state_in_module_attributes_generates_eagers_tokens():
    """RecurrentGemma keeps its recurrent and convolution states in module attributes that its
    forward reassigns: a compiled program would drop them and decode from stale state (different
    tokens, silently, before). novaforge.compile goes through Dynamo for it."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = tf.RecurrentGemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, lru_width=64,
                                     attention_window_size=16, pad_token_id=0)
    model = tf.RecurrentGemmaForCausalLM(config).eval()
    ids = torch.randint(1, 128, (2, 10))
    want = _eager(model, ids, 12)
    compiled = novaforge.compile(model)
    with torch.no_grad():
        got = compiled.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want)
    assert compiled._via_dynamo is not None


def test_each_decoder_layer_compiled_generates_eagers_tokens():
    """Compiling each decoder layer and putting it back (a compiled module is an nn.Module): the
    layer updates the cache passed to it in place and returns only hidden states, which one
    program would drop (generate() gave other tokens than eager, silently); such a layer goes
    through Dynamo, which replays the update. A plain forward (no cache) and training match too."""
    model, x, _ = build("llama", batch=1, seq=PROMPT)
    want = _eager(model, x, 12)
    ref = [layer for layer in model.model.layers]
    for i, layer in enumerate(model.model.layers):
        model.model.layers[i] = novaforge.compile(layer)
    with torch.no_grad():
        got = model.generate(x, max_new_tokens=12, do_sample=False)
        assert torch.equal(got, want)
        plain = model(x, use_cache=False).logits
    for i, layer in enumerate(ref):
        model.model.layers[i] = layer
    with torch.no_grad():
        torch.testing.assert_close(plain, model(x, use_cache=False).logits, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def _tiny_lm(name):
    """A 2-layer, 64-wide causal LM with a 256-token vocabulary, weights from seed 0."""
    torch.manual_seed(0)
    if name == "gpt2":
        config = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256, bos_token_id=255,
                               eos_token_id=255)
        return tf.GPT2LMHeadModel(config).eval()
    config = tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=256, max_position_embeddings=256)
    return tf.LlamaForCausalLM(config).eval()


def _left_padded(batch, length=12):
    """Seeded prompts whose row i is left-padded by i positions (pad id 0, attention mask 0)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 255, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch):
        ids[i, :i] = 0
        mask[i, :i] = 0
    return ids, mask


def _padded_kwargs(mask, new=16, **kw):
    return dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, pad_token_id=0, **kw)


@pytest.mark.parametrize(("name", "batch"), [("gpt2", 4), ("gpt2", 8), ("llama", 4), ("llama", 8)])
def test_batched_left_padded_prompts_generate_eagers_tokens_per_row(name, batch):
    """Batch 4 and 8, prompts of different lengths left-padded with an attention mask, through
    novaforge.compile(model).generate: every row equals eager's, with two programs."""
    model = _tiny_lm(name)
    ids, mask = _left_padded(batch)
    kw = _padded_kwargs(mask, do_sample=False)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        compiled = novaforge.compile(model)
        got = compiled.generate(ids, **kw)
    assert [torch.equal(got[i], want[i]) for i in range(batch)] == [True] * batch
    assert compiled.compilations == 2


@pytest.mark.parametrize(("name", "batch"), [("gpt2", 8), ("llama", 4)])
def test_batched_left_padded_prompts_through_torch_compile_forward(name, batch):
    """The same through `model.forward = torch.compile(model.forward, backend="novaforge")` with
    transformers' static cache: every row equals eager's, no graph falls back."""
    torch._dynamo.reset()
    model = _tiny_lm(name)
    ids, mask = _left_padded(batch)
    kw = _padded_kwargs(mask, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
    nf_dynamo.FALLBACKS.clear()
    model.forward = torch.compile(model.forward, backend="novaforge")
    try:
        with torch.no_grad():
            got = model.generate(ids, **kw)
    finally:
        del model.forward
    assert [torch.equal(got[i], want[i]) for i in range(batch)] == [True] * batch
    assert nf_dynamo.FALLBACKS == []


SAMPLING = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_seeded_sampling_with_standard_processors_equals_eager(name):
    """Sampling (temperature, top-k, top-p, repetition penalty, min-length, EOS) on a left-padded
    batch of 4: with the same torch seed, novaforge.compile(model).generate draws eager's tokens
    (transformers' processors and torch.multinomial run on the compiled logits, which agree with
    eager's to rounding)."""
    model = _tiny_lm(name)
    ids, mask = _left_padded(4)
    kw = _padded_kwargs(mask, new=24, do_sample=True, **SAMPLING)
    compiled = novaforge.compile(model)
    with torch.no_grad():
        torch.manual_seed(7)
        want = model.generate(ids, **kw)
        torch.manual_seed(7)
        got = compiled.generate(ids, **kw)
    assert torch.equal(got, want)
    assert compiled.compilations == 2


def test_beam_search_generates_eagers_tokens():
    """Beam search (4 beams, a left-padded batch of 2) runs transformers' own loop over the
    compiled forward: eager's sequences."""
    model = _tiny_lm("llama")
    ids, mask = _left_padded(2)
    kw = _padded_kwargs(mask, new=10, do_sample=False, num_beams=4)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        got = novaforge.compile(model).generate(ids, **kw)
    assert torch.equal(got, want)

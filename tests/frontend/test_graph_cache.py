"""The captured-graph cache (frontend/graph_cache.py) and compiling without data."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

import novaforge
from novaforge.frontend import graph_cache, pytrees


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _gpt2(**kw):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64, bos_token_id=0,
                        eos_token_id=0, **kw)
    return tf.GPT2LMHeadModel(cfg).eval()


def _run(model, ids, **opts):
    c = novaforge.compile(model, freeze=True, **opts)
    with torch.no_grad():
        out = c(ids)
    return c, out


def _entries(root):
    return sorted((root / "graphs").rglob("*.json"))


def test_second_compile_hits_and_matches(cache_dir):
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        want = model(ids)
    c1, out1 = _run(model, ids)
    assert "graph_cache_hit" not in c1.stats().times and len(_entries(cache_dir)) == 1
    c2, out2 = _run(model, ids)
    assert c2.stats().times.get("graph_cache_hit") == 1.0
    for got in (out1, out2):
        for a, b in zip(pytrees.flatten(got).leaves, pytrees.flatten(want).leaves, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bookkeeping_generate_sets_on_the_config_does_not_change_the_key(cache_dir):
    """generate() sets `generation_config._original_object_hash` lazily: a key including it
    depended on whether some earlier call had run generate (a miss in one test order)."""
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    model.generation_config.__dict__.pop("_original_object_hash", None)
    _run(model, ids)
    model.generation_config._original_object_hash = 12345
    c2, _ = _run(model, ids)
    assert c2.stats().times.get("graph_cache_hit") == 1.0


def test_descriptions_of_freed_temporaries_are_not_reused():
    """The description memo is keyed by id: CPython gives the second temporary dict the first
    one's freed address, which returned the first description (so one config's private
    settings stood for another's, and keys depended on allocation order)."""
    memo: dict = {}
    first = graph_cache._describe({"x": 1}, memo)
    second = graph_cache._describe({"y": 2}, memo)
    assert (first, second) == ("{'x':1}", "{'y':2}")


def test_private_settings_of_every_config_enter_the_key():
    """Each transformers config's private settings are in the key, the second config's too (a
    description memo keyed by the id of a freed temporary gave it the first one's)."""
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    flat = pytrees.flatten(((ids,), {}))
    before = graph_cache.key_for(model, flat, True, {})
    model.generation_config._from_model_config = not model.generation_config._from_model_config
    assert graph_cache.key_for(model, flat, True, {}) != before


def test_new_weights_are_read_at_load_not_cached(cache_dir):
    ids = torch.randint(0, 64, (1, 10))
    _run(_gpt2(), ids)
    other = _gpt2()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5)
        want = other(ids).logits
    c, out = _run(other, ids)
    assert c.stats().times.get("graph_cache_hit") == 1.0  # same structure: the graph is reused
    torch.testing.assert_close(out.logits, want, atol=1e-5 * want.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("change", ["config", "attention", "shape", "kwarg", "training", "option"])
def test_key_changes_with_what_the_trace_depends_on(change, cache_dir):
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    base = graph_cache.key_for(model, pytrees.flatten(((ids,), {})), True, {})
    args, kwargs, opts = (ids,), {}, {}
    if change == "config":
        model = _gpt2(activation_function="relu")
    elif change == "attention":  # a private config setting that is not in the config's JSON
        model.config._attn_implementation = "eager" if model.config._attn_implementation != "eager" else "sdpa"
    elif change == "shape":
        args = (torch.randint(0, 64, (1, 11)),)
    elif change == "kwarg":
        kwargs = {"use_cache": False}
    elif change == "training":
        model.train()
    else:
        opts = {"capture": "export"}
    assert graph_cache.key_for(model, pytrees.flatten((args, kwargs)), True, opts) != base


def test_plain_functions_are_not_cached(cache_dir):
    assert graph_cache.key_for(lambda x: x + 1, pytrees.flatten(((torch.ones(2),), {})), False, {}) is None


@pytest.mark.parametrize("damage", ["garbage", "truncate", "other_key", "bad_utf8"])
def test_a_damaged_entry_is_a_miss_and_is_rewritten(damage, cache_dir):
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    _run(model, ids)
    (path,) = _entries(cache_dir)
    text = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x00" * 100)
    elif damage == "truncate":
        path.write_bytes(text[: len(text) // 2])
    elif damage == "bad_utf8":
        path.write_bytes(b"\xff\xfe" + text)
    else:
        entry = json.loads(text)
        entry["key"] = "0" * 64
        path.write_text(json.dumps(entry))
    c, out = _run(model, ids)
    assert "graph_cache_hit" not in c.stats().times
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    assert _run(model, ids)[0].stats().times.get("graph_cache_hit") == 1.0  # rewritten


def test_cache_can_be_turned_off(cache_dir, monkeypatch):
    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    _run(model, ids, graph_cache=False)
    monkeypatch.setenv("NOVAFORGE_GRAPH_CACHE", "0")
    _run(model, ids)
    assert _entries(cache_dir) == []


def test_compile_only_on_meta_parameters():
    cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=128, use_cache=False)
    with torch.device("meta"):
        model = tf.LlamaModel(cfg).eval()
    ids = torch.randint(0, 128, (1, 16))
    c = novaforge.compile(model)
    stats = c.compile_only(ids)
    kernels = [n for n in stats.graph.nodes if n.op == "kernel"]
    assert stats.program is not None and len(kernels) > 10
    assert all(gi.value.type.device == "cpu" for gi in stats.graph.inputs)
    with pytest.raises(RuntimeError, match="meta device"):
        c(ids)
    report = novaforge.explain(model, ids)
    assert report.metrics["kernels"] == len(kernels)


def test_a_compile_without_data_is_cached_apart_from_one_with_data(cache_dir):
    """A meta model's capture (a warm compile of a large architecture is a lookup), and a
    compile_only of a model with weights, whose graph binds the weights as inputs, never the
    frozen graph of a compile with data."""
    cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=128, use_cache=False)
    with torch.device("meta"):
        meta = tf.LlamaModel(cfg).eval()
    ids = torch.randint(0, 128, (1, 16))
    first = novaforge.compile(meta).compile_only(ids)
    second = novaforge.compile(meta).compile_only(ids)
    assert "graph_cache_hit" not in first.times and second.times.get("graph_cache_hit") == 1.0
    assert [gi.kind for gi in second.graph.inputs] == [gi.kind for gi in first.graph.inputs]
    assert all(p.device.type == "meta" for p in meta.parameters())

    model, ids = _gpt2(), torch.randint(0, 64, (1, 10))
    only = novaforge.compile(model, freeze=True).compile_only(ids)
    assert not any(gi.kind == "const" and gi.name.startswith("transformer.") for gi in only.graph.inputs)
    c, out = _run(model, ids)  # with data: its own entry, with frozen weights
    assert "graph_cache_hit" not in c.stats().times
    with torch.no_grad():
        torch.testing.assert_close(out.logits, model(ids).logits, atol=1e-5, rtol=1e-5)
    assert novaforge.compile(model, freeze=True).compile_only(ids).times.get("graph_cache_hit") == 1.0

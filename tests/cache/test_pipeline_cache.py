"""The optimized-graph cache (cache/pipeline_cache.py): a warm compile loads the pipeline's
result; equal to the pipeline's own, keyed by options, never for frozen module state, and a
damaged entry is a miss."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import novaforge
from novaforge.frontend import pytrees
from novaforge.ir.structural import graph_key


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _meta_llama():
    cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=128, use_cache=False)
    with torch.device("meta"):
        return tf.LlamaModel(cfg).eval()


def _entries(root):
    return sorted((root / "optimized").rglob("*.json"))


def test_a_warm_compile_loads_the_pipelines_result(cache_dir):
    model, ids = _meta_llama(), torch.randint(0, 128, (1, 16))
    first = novaforge.compile(model).compile_only(ids)
    second = novaforge.compile(model).compile_only(ids)
    assert "optimized_cache_hit" not in first.times and second.times.get("optimized_cache_hit") == 1.0
    assert len(_entries(cache_dir)) == 1
    assert graph_key(second.graph) == graph_key(first.graph)
    assert [n.op for n in second.graph.nodes] == [n.op for n in first.graph.nodes]
    assert [n.attrs["kernel"].structural_key for n in second.graph.nodes if n.op == "kernel"] == \
        [n.attrs["kernel"].structural_key for n in first.graph.nodes if n.op == "kernel"]
    p1, p2 = first.graph.meta["memory_plan"], second.graph.meta["memory_plan"]
    assert p2.arena_bytes == p1.arena_bytes and sorted(p2.offsets.values()) == sorted(p1.offsets.values())
    assert sorted(second.graph.meta["placement"].values()) == sorted(first.graph.meta["placement"].values())
    assert [(r.name, r.nodes_after, r.counters) for r in second.records] == \
        [(r.name, r.nodes_after, r.counters) for r in first.records]
    assert novaforge.explain(model, ids).metrics["kernels"] == sum(n.op == "kernel" for n in first.graph.nodes)


def test_an_unfrozen_model_runs_from_the_cached_graph(cache_dir):
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)).eval()
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        want = model(ids)
        outs = []
        for _ in range(2):
            c = novaforge.compile(model)
            outs.append(c(ids))
    assert c.stats().times.get("optimized_cache_hit") == 1.0
    for got in outs:
        for a, b in zip(pytrees.flatten(got).leaves, pytrees.flatten(want).leaves, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_frozen_module_state_is_never_cached(cache_dir):
    torch.manual_seed(0)
    model = tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)).eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        novaforge.compile(model, freeze=True)(ids)
        c = novaforge.compile(model, freeze=True)
        c(ids)
    assert "optimized_cache_hit" not in c.stats().times and not _entries(cache_dir)


def test_options_enter_the_key(cache_dir):
    model, ids = _meta_llama(), torch.randint(0, 128, (1, 16))
    novaforge.compile(model).compile_only(ids)
    other = novaforge.compile(model, inplace=False).compile_only(ids)
    assert "optimized_cache_hit" not in other.times and len(_entries(cache_dir)) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncate", "checksum"])
def test_a_damaged_entry_is_a_miss_and_is_rewritten(damage, cache_dir):
    model, ids = _meta_llama(), torch.randint(0, 128, (1, 16))
    novaforge.compile(model).compile_only(ids)
    (path,) = _entries(cache_dir)
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x00" * 64)
    elif damage == "truncate":
        path.write_text(text[: len(text) // 2])
    else:
        path.write_text(text.replace('"arena_bytes\\": ', '"arena_bytes\\": 1', 1))
    assert "optimized_cache_hit" not in novaforge.compile(model).compile_only(ids).times
    assert novaforge.compile(model).compile_only(ids).times.get("optimized_cache_hit") == 1.0

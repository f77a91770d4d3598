"""Whole small transformers (random weights) compiled with backend='cpu' against eager."""

from __future__ import annotations

import pytest
import torch
from cpu_check import program

import novaforge
from novaforge.passes.plan_memory import verify_plan

transformers = pytest.importorskip("transformers")


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=64, use_cache=False)
    return transformers.GPT2Model(cfg).eval()


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96, vocab_size=101, use_cache=False)
    return transformers.LlamaModel(cfg).eval()


def _bert():
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                                  vocab_size=101)
    return transformers.BertModel(cfg).eval()


@pytest.mark.parametrize("make", [_gpt2, _llama, _bert], ids=["gpt2", "llama", "bert"])
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "params"])
def test_tiny_transformer(make, freeze):
    m = make()
    ids = torch.randint(0, 101, (2, 17))
    with torch.no_grad():
        ref = m(ids).last_hidden_state
        c = novaforge.compile(m, backend="cpu", freeze=freeze)
        out = c(ids).last_hidden_state
        scale = ref.abs().max()
        assert (out - ref).abs().max() <= 1e-4 * scale
        prog = program(c)
        assert prog.info["torch"] == 0, prog.info["fallbacks"]
        verify_plan(c.stats().graph.meta["memory_plan"])
        # identical layers share generated functions
        assert prog.info["unique_functions"] < prog.info["generated"]
        first = out.clone()
        ids2 = torch.randint(0, 101, (2, 17))
        out2 = c(ids2).last_hidden_state
        assert torch.equal(out, first)
        assert (out2 - m(ids2).last_hidden_state).abs().max() <= 1e-4 * scale

"""Layer-replicated capture (frontend/replicate_layers.py) against a full trace: the same IR
structure on every family of the model tier, eager's results, and the cases that must be
traced layer by layer (a layer that reads its index, one that reads a tensor it was not
passed, random ops, grad mode)."""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.frontend.capture import capture
from novaforge.ir.structural import graph_key

from models.families import build, families

# families whose layers replay in the tiny configs (with use_cache=False where they have a
# cache: a cache object passed to the layers is updated in Python, so those trace each layer)
REPLAYED = {"gpt2", "llama", "opt", "bloom", "gpt_neox", "mistral", "qwen2", "phi", "gemma", "mamba", "bert",
            "roberta", "distilbert", "electra", "vit"}


def _capture(model, args, monkeypatch, replicate: bool, **kw):
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1" if replicate else "0")
    with torch.no_grad():
        return capture(model, args, {}, **kw)


@pytest.mark.parametrize("use_cache", [None, False], ids=["default", "no_cache"])
@pytest.mark.parametrize("name", sorted(families()))
def test_replicated_capture_has_the_full_traces_structure(name, use_cache, monkeypatch):
    model, x, _ = build(name)
    if use_cache is False:
        if not hasattr(model.config, "use_cache"):
            pytest.skip("the family has no cache")
        model.config.use_cache = False
    full = _capture(model, (x,), monkeypatch, replicate=False)
    rep = _capture(model, (x,), monkeypatch, replicate=True)
    assert full.times["layers_replayed"] == 0
    assert graph_key(rep.graph) == graph_key(full.graph)
    assert len(rep.graph.nodes) == len(full.graph.nodes)
    if use_cache is False or not hasattr(model.config, "use_cache") or not model.config.use_cache:
        if name in REPLAYED:
            assert rep.times["layers_replayed"] >= 1


class _Block(torch.nn.Module):
    def __init__(self, idx: int, uses_index: bool = False) -> None:
        super().__init__()
        self.layer_idx = idx
        self.uses_index = uses_index
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, scale=None):
        y = torch.nn.functional.gelu(self.lin(x)) + x
        if self.uses_index:
            y = y / (self.layer_idx + 1)
        if scale is not None:
            y = y * scale
        return y


class _Stack(torch.nn.Module):
    def __init__(self, n: int = 4, uses_index: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(i, uses_index) for i in range(n))

    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x, scale=2.0 if i == 2 else None)
        return x


def test_identical_layers_replay_and_match_eager(monkeypatch):
    torch.manual_seed(0)
    model = _Stack().eval()
    x = torch.randn(3, 16)
    rep = _capture(model, (x,), monkeypatch, replicate=True)
    full = _capture(model, (x,), monkeypatch, replicate=False)
    # blocks 1 and 3 replay block 0; block 2 is called with another argument (its own recording)
    assert rep.times["layers_replayed"] == 2
    assert graph_key(rep.graph) == graph_key(full.graph)
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    with torch.no_grad():
        torch.testing.assert_close(novaforge.compile(model)(x), model(x))


def test_a_layer_that_reads_its_index_is_traced_layer_by_layer(monkeypatch):
    torch.manual_seed(0)
    model = _Stack(uses_index=True).eval()
    x = torch.randn(3, 16)
    rep = _capture(model, (x,), monkeypatch, replicate=True)
    assert rep.times["layers_replayed"] == 0
    full = _capture(model, (x,), monkeypatch, replicate=False)
    assert graph_key(rep.graph) == graph_key(full.graph)
    with torch.no_grad():
        torch.testing.assert_close(novaforge.compile(model)(x), model(x))
    # the watched attribute is back on the modules after the capture
    assert [b.__dict__["layer_idx"] for b in model.blocks] == [0, 1, 2, 3]
    assert all(type(b) is _Block for b in model.blocks)


class _ReadsOutside(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) + _SHARED["t"]


_SHARED: dict = {}


def test_a_layer_reading_a_traced_tensor_it_was_not_passed_is_traced_layer_by_layer(monkeypatch):
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(_ReadsOutside() for _ in range(3))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                _SHARED["t"] = x * (i + 1)  # a value of the trace, different for each layer
                x = layer(x)
            return x

    model = M().eval()
    x = torch.randn(2, 8)
    rep = _capture(model, (x,), monkeypatch, replicate=True)
    assert rep.times["layers_replayed"] == 0
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    with torch.no_grad():
        torch.testing.assert_close(novaforge.compile(model)(x), model(x))


def test_dropout_in_training_mode_is_traced_layer_by_layer(monkeypatch):
    torch.manual_seed(0)

    class Drop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.lin(x))

    model = torch.nn.Sequential(Drop(), Drop(), Drop()).train()
    rep = _capture(model, (torch.randn(2, 8),), monkeypatch, replicate=True)
    assert rep.times["layers_replayed"] == 0


def test_meta_llama_compiles_with_replayed_layers(monkeypatch):
    import transformers as tf

    cfg = tf.LlamaConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=256, use_cache=False)
    with torch.device("meta"):
        model = tf.LlamaModel(cfg).eval()
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    stats = novaforge.compile(model).compile_only(torch.randint(0, 256, (1, 16)))
    assert stats.times["layers_replayed"] == 5
    assert all(p.device.type == "meta" for p in model.parameters())

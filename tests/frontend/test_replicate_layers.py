"""Layer-replicated capture (frontend/replicate_layers.py) against a full trace: the same IR
structure on every family of the model tier, eager's results, and the cases that must be
traced layer by layer (a layer that reads its index, one that reads a tensor it was not
passed, random ops, grad mode)."""

from __future__ import annotations

import pytest
import torch

import novaforge
from models.families import build, families
from novaforge.frontend.capture import capture
from novaforge.ir.structural import graph_key

# families whose layers replay in the tiny configs, in their default configs (the cache's
# update() replayed between the recorded segments) and with use_cache=False; Mamba's layers read
# their cache otherwise (its convolution state): with a cache they are traced one by one
REPLAYED = {"gpt2", "llama", "opt", "bloom", "gpt_neox", "mistral", "qwen2", "phi", "gemma", "mamba", "bert",
            "roberta", "distilbert", "electra", "vit"}


@pytest.fixture(autouse=True)
def _no_graph_cache(monkeypatch):
    monkeypatch.setenv("NOVAFORGE_GRAPH_CACHE", "0")  # (every compile here traces: the counts are asserted)


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
    if name in REPLAYED and (name != "mamba" or use_cache is False):
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


class _CachedBlock(torch.nn.Module):
    def __init__(self, idx: int) -> None:
        super().__init__()
        self.layer_idx = idx
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, cache):
        h = self.lin(x)
        k, v = cache.update(h[:, None, None], h[:, None, None] * 2, self.layer_idx)
        return torch.tanh(h + k.sum(2)[:, 0] - v.mean(2)[:, 0])


class _CachedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_CachedBlock(i) for i in range(4))

    def forward(self, x, cache):
        for b in self.blocks:
            x = b(x, cache)
        return x, cache


def _prefilled(lengths):
    import transformers as tf

    cache = tf.DynamicCache()
    g = torch.Generator().manual_seed(1)
    for i, n in enumerate(lengths):
        if n:
            cache.update(torch.randn(2, 1, n, 8, generator=g), torch.randn(2, 1, n, 8, generator=g), i)
    return cache


@pytest.mark.parametrize("lengths", [(0, 0, 0, 0), (3, 3, 3, 3), (3, 3, 5, 3)], ids=["empty", "even", "uneven"])
def test_cache_updates_replay_between_segments(lengths, monkeypatch):
    """Each layer's update runs for real with its own index: the cache returned holds every
    layer's states as eager's; layers whose caches hold other lengths than the first's trace
    again layer by layer (ReplayMismatch), with the same result."""
    torch.manual_seed(0)
    model = _CachedStack().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        want, want_cache = model(x, _prefilled(lengths))
    full = _capture(model, (x, _prefilled(lengths)), monkeypatch, replicate=False)
    rep = _capture(model, (x, _prefilled(lengths)), monkeypatch, replicate=True)
    assert rep.times["layers_replayed"] == (0 if len(set(lengths)) > 1 else 3)
    assert graph_key(rep.graph) == graph_key(full.graph)
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    with torch.no_grad():
        got, got_cache = novaforge.compile(model)(x, _prefilled(lengths))
    torch.testing.assert_close(got, want)
    for i in range(4):
        torch.testing.assert_close(got_cache.layers[i].keys, want_cache.layers[i].keys)
        torch.testing.assert_close(got_cache.layers[i].values, want_cache.layers[i].values)


def test_a_layer_using_its_index_beside_the_cache_update_is_traced_layer_by_layer(monkeypatch):
    class Block(_CachedBlock):
        def forward(self, x, cache):
            k, _ = cache.update(x[:, None, None], x[:, None, None], self.layer_idx)
            return x * (self.layer_idx + 1) + k.sum()

    torch.manual_seed(0)
    model = _CachedStack()
    model.blocks = torch.nn.ModuleList(Block(i) for i in range(4))
    x = torch.randn(2, 8)
    rep = _capture(model.eval(), (x, _prefilled((0, 0, 0, 0))), monkeypatch, replicate=True)
    assert rep.times["layers_replayed"] == 0


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_default_config_decoder_replays_and_continues_from_its_cache(name, monkeypatch):
    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    import transformers as tf

    model, x, _ = build(name, seq=10)
    if name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                                   num_key_value_heads=2, intermediate_size=128,
                                                   vocab_size=256)).eval()
    nxt = torch.randint(0, 256, (x.shape[0], 1))
    c = novaforge.compile(model)
    with torch.no_grad():
        want = model(x)
        want2 = model(nxt, past_key_values=want.past_key_values)
        got = c(x)
        assert c.stats().times["layers_replayed"] >= 1
        got2 = c(nxt, past_key_values=got.past_key_values)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got2.logits, want2.logits, atol=1e-5, rtol=1e-5)


def test_hooks_installed_during_the_call_and_attribute_writes_trace_every_layer(monkeypatch):
    """transformers' output capturing installs hooks on the shadow module during the traced call
    (output_attentions=True): every layer runs its hooks, so every layer is traced; a layer that
    sets an attribute of its modules is traced at every call too."""
    import transformers as tf

    monkeypatch.setenv("NOVAFORGE_REPLICATE_LAYERS", "1")
    torch.manual_seed(0)
    model = tf.LlamaModel(tf.LlamaConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                         attn_implementation="eager")).eval()
    ids = torch.randint(0, 256, (1, 8))
    c = novaforge.compile(model)
    with torch.no_grad():
        got = c(ids, output_attentions=True)
        want = model(ids, output_attentions=True)
    assert len(got.attentions) == 4
    for a, b in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    class Counting(_Block):
        def forward(self, x, scale=None):
            self.calls = getattr(self, "calls", 0) + 1
            return super().forward(x, scale)

    stack = _Stack().eval()
    stack.blocks = torch.nn.ModuleList(Counting(i) for i in range(4))
    assert _capture(stack, (torch.randn(2, 16),), monkeypatch, replicate=True).times["layers_replayed"] == 0

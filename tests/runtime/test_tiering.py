"""Tiered execution of dynamic graphs (runtime/tiering.py): a size without a program runs
eagerly until its eager calls have cost one build, on both entry points; a size seen once
never builds, a hot size does, and `tiered=False` (or NOVAFORGE_TIERED=0) builds every size
at once. The build estimate is process-wide, so each test starts it empty.

Tiering is the path of graphs compiled per size: `symbolic_programs=False`, a backend without
programs for a range of sizes, or a graph whose symbolic build failed. By default the CPU
backend builds one program for every size of a dynamic graph at its first call; tests here
check both where they differ."""

from __future__ import annotations

import threading
from collections import deque

import pytest
import torch
import torch._dynamo

import novaforge
from novaforge import dynamo as nf_dynamo
from novaforge.runtime import tiering


@pytest.fixture(autouse=True)
def _fresh_estimate(monkeypatch):
    monkeypatch.setenv("NOVAFORGE_TIERED", "1")  # the suite turns tiering off elsewhere (conftest.py)
    monkeypatch.setattr(tiering, "_BUILD_TIMES", deque(maxlen=8))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()


def test_rent_reaches_the_estimate_then_builds(monkeypatch):
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1.0)
    t = tiering.Tiering()
    assert not t.should_build("a")
    t.charge("a", 0.6)
    assert not t.should_build("a") and not t.should_build("b")
    t.charge("a", 0.6)
    assert t.should_build("a") and not t.should_build("b")
    t.built("a")
    assert t.builds == 1 and t.eager_calls == 2 and "a" not in t.rent
    tiering.record_build(0.1)
    tiering.record_build(0.3)
    tiering.record_build(5.0)
    assert tiering.build_estimate() == 0.3  # the median of the builds measured
    assert tiering.Tiering(enabled=False).should_build("x")
    capped = tiering.Tiering()
    for i in range(tiering.MAX_PROGRAMS):
        capped.built(i)
    capped.charge("late", 1e9)
    assert not capped.should_build("late") and capped.capped  # at most MAX_PROGRAMS per graph


def test_direct_entry_sizes_seen_once_run_eagerly_and_a_hot_size_builds(monkeypatch):
    mod = _model()
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e9)  # no build pays off
    f = novaforge.compile(mod, backend="cpu", dynamic={"input": {0: (2, 256)}}, symbolic_programs=False)
    with torch.no_grad():
        for n in (4, 7, 33, 9):
            x = torch.randn(n, 8)
            assert torch.equal(f(x), mod(x))  # the eager tier is eager
    assert f.compilations == 0 and f.tiering.eager_calls == 4 and f.dynamic.traces == 0

    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e-9)  # any eager call pays for a build
    g = novaforge.compile(mod, backend="cpu", dynamic={"input": {0: (2, 256)}}, symbolic_programs=False)
    with torch.no_grad():
        x = torch.randn(12, 8)
        for _ in range(3):
            torch.testing.assert_close(g(x), mod(x), atol=1e-5, rtol=1e-5)
    assert g.tiering.eager_calls == 1 and g.compilations == 1 and g.dynamic.traces == 1
    assert tiering.build_estimate() > 1e-9  # the build's own time now informs the estimate


def test_tiered_false_builds_every_size_at_once(monkeypatch):
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e9)
    mod = _model()
    f = novaforge.compile(mod, backend="interpret", dynamic=True, tiered=False)
    with torch.no_grad():
        for n in (4, 7):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x), mod(x))
    assert f.compilations == 2 and f.tiering.eager_calls == 0
    monkeypatch.setenv("NOVAFORGE_TIERED", "0")
    off = novaforge.compile(mod, backend="interpret", dynamic=True)
    with torch.no_grad():
        off(torch.randn(6, 8))
    assert off.compilations == 1 and not off.tiering.enabled
    static = novaforge.compile(mod, backend="interpret")  # without dynamic= nothing is tiered
    with torch.no_grad():
        static(torch.randn(5, 8))
    assert static.compilations == 1


def test_dynamo_dynamic_graph_runs_its_aten_graph_until_a_size_pays(monkeypatch):
    torch._dynamo.reset()
    mod = _model()
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e9)
    cf = torch.compile(mod, backend="novaforge", dynamic=True, options={"symbolic_programs": False})
    built, eager = nf_dynamo.PROGRAMS_BUILT[0], nf_dynamo.TIERED_EAGER_CALLS[0]
    with torch.no_grad():
        for n in (3, 5, 9):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cf(x), mod(x))
    assert nf_dynamo.PROGRAMS_BUILT[0] == built and nf_dynamo.TIERED_EAGER_CALLS[0] - eager == 3
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e-9)
    with torch.no_grad():
        x = torch.randn(6, 8)
        for _ in range(3):
            torch.testing.assert_close(cf(x), mod(x), atol=1e-5, rtol=1e-5)
    assert nf_dynamo.PROGRAMS_BUILT[0] - built == 1 and nf_dynamo.TIERED_EAGER_CALLS[0] - eager == 4


@pytest.mark.parametrize("shared", [True, False])
def test_generate_with_the_default_dynamic_cache_builds_no_program_per_token(shared):
    """`model.forward = torch.compile(model.forward, backend="novaforge")`, then `generate()`
    with transformers' default DynamicCache: Dynamo makes the decode graph dynamic at the second
    cache length. By default that graph is built once for every cache length (one shared
    program), and the first decode step (a static recompile) runs eagerly: two programs. With
    symbolic_programs=False every later length is seen once, so it runs in the
    eager tier instead of building (it built one program per token before: 29 s against eager's
    0.3 s for 16 tokens), with the graph's static parts compiled once."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=256)).eval()
    ids = torch.randint(0, 500, (1, 8))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    built, eager, parts = nf_dynamo.PROGRAMS_BUILT[0], nf_dynamo.TIERED_EAGER_CALLS[0], nf_dynamo.STATIC_PARTS[0]
    fallbacks = len(nf_dynamo.FALLBACKS)
    shared0 = nf_dynamo.SHARED_PROGRAMS[0]
    model.forward = torch.compile(model.forward, backend="novaforge", options={"symbolic_programs": shared})
    try:
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    finally:
        del model.forward
    assert torch.equal(got, want)
    # the first decode step is a static recompile (Dynamo specializes its one new token): it
    # runs eagerly (called once, it never pays for a build)
    if shared:  # the prefill (static), then every later cache length's program: two programs
        assert nf_dynamo.PROGRAMS_BUILT[0] - built == 2 and nf_dynamo.SHARED_PROGRAMS[0] - shared0 == 1
        assert nf_dynamo.TIERED_EAGER_CALLS[0] - eager == 1 and len(nf_dynamo.FALLBACKS) == fallbacks
        return
    assert nf_dynamo.PROGRAMS_BUILT[0] - built == 1  # the prefill
    assert nf_dynamo.TIERED_EAGER_CALLS[0] - eager >= 10
    # the eager tier runs the decode graph's static parts compiled (projections, MLP, LM head),
    # built once for every cache length; only the cache concatenation and attention are ATen ops
    assert nf_dynamo.STATIC_PARTS[0] - parts >= 3
    assert len(nf_dynamo.FALLBACKS) == fallbacks


@pytest.mark.parametrize("shared", [True, False])
def test_concurrent_calls_at_new_sizes_are_eager_or_compiled_and_always_right(monkeypatch, shared):
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e-9)
    mod = _model()
    f = novaforge.compile(mod, backend="cpu", dynamic={"input": {0: (2, 256)}}, symbolic_programs=shared)
    xs = [torch.randn(n, 8) for n in (5, 6, 5, 6, 5, 6)]
    with torch.no_grad():
        want = [mod(x) for x in xs]
    errors: list[BaseException] = []

    def work(i):
        try:
            with torch.no_grad():
                for _ in range(3):
                    torch.testing.assert_close(f(xs[i]), want[i], atol=1e-5, rtol=1e-5)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert f.compilations == (1 if shared else 2)  # one program for both sizes, or one per size once it paid


def test_direct_entry_without_dynamic_becomes_dynamic_at_a_third_size(monkeypatch):
    monkeypatch.setattr(tiering, "build_estimate", lambda: 1e9)
    mod = _model()
    shared = novaforge.compile(mod, backend="cpu")
    with torch.no_grad():
        for n in (4, 7, 9, 12, 30):  # the third size builds one program for every later size
            x = torch.randn(n, 8)
            torch.testing.assert_close(shared(x), mod(x), atol=1e-5, rtol=1e-5)
    assert shared.compilations == 3 and shared.tiering.eager_calls == 0 and shared.dynamic.traces == 1
    f = novaforge.compile(mod, backend="cpu", symbolic_programs=False)
    with torch.no_grad():
        for n in (4, 7):  # two sizes: two programs, as generate()'s prefill and decode step need
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x), mod(x), atol=1e-5, rtol=1e-5)
        assert f.compilations == 2 and f.dynamic is None
        for n in (9, 12, 4):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x), mod(x), atol=1e-5, rtol=1e-5)
    assert f.compilations == 2 and f.tiering.eager_calls == 2  # 9 and 12 eagerly; 4 has its program
    assert f.dynamic is not None and f.dynamic.option == {0: {0: None}}
    monkeypatch.setattr(tiering, "build_estimate", lambda: 1e-9)  # now any eager call pays for a build
    with torch.no_grad():
        x = torch.randn(12, 8)
        torch.testing.assert_close(f(x), mod(x), atol=1e-5, rtol=1e-5)
    assert f.compilations == 3 and f.dynamic.traces == 1
    g = novaforge.compile(mod, backend="cpu", tiered=False)
    with torch.no_grad():
        for n in (4, 7, 9):
            g(torch.randn(n, 8))
    assert g.compilations == 3 and g.dynamic is None


@pytest.mark.parametrize("shared", [True, False])
def test_compiled_generate_keeps_its_two_programs_with_tiering_on(shared):
    """`novaforge.compile(model).generate()` (a static cache): the prefill and the decode step
    are two input structures (the cache is filled or not), so both compile at once; a second
    prompt length is a second size of the prefill's structure and compiles too; a third makes
    the prompt length dynamic: one program for every later prompt length, or (per-size
    programs) the eager tier. Tokens are eager's throughout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=256)).eval()
    compiled = novaforge.compile(model, symbolic_programs=shared)
    for prompt, programs in ((8, 2), (5, 3), (6, 4 if shared else 3), (7, 4 if shared else 3)):
        ids = torch.randint(0, 500, (1, prompt))
        with torch.no_grad():
            want = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
            got = compiled.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
        assert torch.equal(got, want)
        assert compiled.compilations == programs
    assert compiled.tiering.eager_calls == (0 if shared else 2)  # (the third and fourth prefills)

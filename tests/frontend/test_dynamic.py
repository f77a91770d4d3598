"""Dynamic shapes on the capture side: one symbolic trace, specialized for every size.

Every case is traced once with its dynamic dims as symbols; the symbolic graph is then
specialized at several sizes and run by the interpreter against eager (values, shapes and
dtypes), which checks each op's lowering and shape rule on symbols. Then both entry points:
`novaforge.compile(..., dynamic=...)` and `torch.compile(..., dynamic=True)` trace or lower
once and build one program per size from that trace, with eager's results.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import novaforge
from novaforge.frontend.capture import capture
from novaforge.frontend.dynamic import specialize, symbol_values
from novaforge.ir.symbolic import is_symbolic
from novaforge.runtime.interpret import interpret


def _softmax_mm(x, w):
    return torch.softmax(x @ w, -1).sum(0) * 2


def _views(x):
    b, n, d = x.shape
    y = x.reshape(b * n, d).t().contiguous()
    return y[:, 1:].sum(1), x.transpose(1, 2).flatten(1), x[:, -1] * 1, x.unsqueeze(0).expand(2, b, n, d) * 1


def _index_and_arange(x, table):
    pos = torch.arange(x.shape[1])
    return table[pos] + x.mean(-1, keepdim=True), x[:, pos.flip(0)], x.new_zeros(x.shape[1])


def _norms_and_attention(x, ln_w):
    h = F.layer_norm(x, (x.shape[-1],), ln_w)
    q = h.view(h.shape[0], h.shape[1], 2, -1).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    return a.transpose(1, 2).reshape(h.shape), torch.cumsum(x, 1), torch.cat([x, h], 1)


def _size_as_number(x):
    return x / x.shape[0] + x.shape[0], torch.full((x.shape[0],), 2.0) * x.sum(1)


CASES = [
    ("softmax_mm", _softmax_mm, lambda n: (torch.randn(n, 8), torch.randn(8, 5)), [{0: (2, 512)}, {}]),
    ("views", _views, lambda n: (torch.randn(2, n, 6),), [{1: (2, 512)}]),
    ("index_arange", _index_and_arange, lambda n: (torch.randn(3, n, 4), torch.randn(64, 1)), [{1: (2, 64)}, {}]),
    ("norm_attention", _norms_and_attention, lambda n: (torch.randn(2, n, 8), torch.randn(8)), [{1: (2, 512)}, {}]),
    ("size_as_number", _size_as_number, lambda n: (torch.randn(n, 3),), [{0: (2, 512)}]),
]


@pytest.mark.parametrize("name,fn,make,dims", CASES, ids=[c[0] for c in CASES])
def test_one_symbolic_trace_specializes_to_eager_at_every_size(name, fn, make, dims):
    torch.manual_seed(0)
    cap = capture(fn, make(16), {}, dynamic=dims)
    assert is_symbolic([v.type for v in cap.graph.values()]), cap.graph
    assert cap.symbols.symbols, cap.symbols.describe()
    for n in (2, 3, 5, 16, 31, 64):
        args = make(n)
        values = symbol_values(cap.symbols, cap.graph, list(args))
        assert isinstance(values, dict), values
        graph = specialize(cap.graph, values)
        assert not is_symbolic([v.type for v in graph.values()])
        got = interpret(graph, list(args), check=True)
        want = fn(*args)
        want = list(want) if isinstance(want, tuple) else [want]
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape)
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _symbolic_gpt2(n):
    from novaforge.bench.workloads import build_inference_model

    model, vocab = build_inference_model("gpt2-tiny")
    return model, torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("name", [c[0] for c in CASES] + ["gpt2-tiny"])
def test_graph_passes_on_a_symbolic_graph_keep_every_size(name):
    """The graph passes (CSE, folding, simplification, layout, attention fusion) run on the
    symbolic graph itself; its specializations then still compute eager's values at every
    size (a pass that decided anything from the captured size would break another size)."""
    from novaforge.ir.verify import verify
    from novaforge.passes.pipeline import graph_passes, run_pipeline

    if name == "gpt2-tiny":
        model, _ = _symbolic_gpt2(16)
        fn, make, dims = model, lambda n: (_symbolic_gpt2(n)[1],), [{1: (2, 128)}]
    else:
        _, fn, make, dims = next(c for c in CASES if c[0] == name)
    torch.manual_seed(0)
    with torch.no_grad():
        cap = capture(fn, make(16), {}, dynamic=dims, freeze=name == "gpt2-tiny")
        with cap.symbols.ranges_context():
            graph, _ = run_pipeline(cap.graph, graph_passes(), check=False)
        verify(graph, "graph passes")
        assert is_symbolic([v.type for v in graph.values()])
        for n in (3, 16, 37):
            args = make(n)
            values = symbol_values(cap.symbols, graph, list(args))
            assert isinstance(values, dict), values
            got = interpret(specialize(graph, values), list(args), check=True)
            want = fn(*args)
            if name == "gpt2-tiny":
                want = want.last_hidden_state
            want = list(want) if isinstance(want, tuple) else [want]
            for g, w in zip(got, want, strict=False):
                assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape)
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_sizes_outside_the_range_are_not_admitted():
    cap = capture(_softmax_mm, (torch.randn(16, 8), torch.randn(8, 5)), {}, dynamic=[{0: (4, 32)}, {}])
    assert isinstance(symbol_values(cap.symbols, cap.graph, [torch.randn(33, 8), torch.randn(8, 5)]), str)
    assert isinstance(symbol_values(cap.symbols, cap.graph, [torch.randn(8, 8), torch.randn(7, 5)]), str)


def test_a_branch_on_a_size_is_a_guard():
    def f(x):
        return x * 2 if x.shape[0] > 8 else x - 1

    cap = capture(f, (torch.randn(16, 3),), {}, dynamic=[{0: (2, 512)}])
    assert cap.symbols.guards, "the branch the trace took must be recorded"
    assert symbol_values(cap.symbols, cap.graph, [torch.randn(20, 3)]) is not None
    assert isinstance(symbol_values(cap.symbols, cap.graph, [torch.randn(4, 3)]), str)


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_direct_entry_traces_once_for_many_sizes(backend):
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()
    f = novaforge.compile(mod, backend=backend, dynamic={"input": {0: (2, 256)}}, tiered=False)
    with torch.no_grad():
        for n in (4, 7, 33, 4):
            x = torch.randn(n, 8)
            torch.testing.assert_close(f(x), mod(x), atol=1e-5, rtol=1e-5)
        # the CPU backend builds one program for the range; the interpreter specializes per size
        builds = 1 if backend == "cpu" else 3
        assert f.dynamic.traces == 1 and f.dynamic.specializations == 3 and f.compilations == builds
        f(torch.randn(300, 8))  # outside the range: captured on its own, still correct
        assert f.dynamic.traces == 1 and f.compilations == builds + 1


def test_direct_entry_branches_and_fallbacks_stay_correct():
    def f(x):
        return x.sum() if x.shape[0] > 8 else x * 3

    cf = novaforge.compile(f, backend="interpret", dynamic=True, tiered=False)
    for n in (16, 12, 4, 3):
        x = torch.randn(n, 2)
        torch.testing.assert_close(cf(x), f(x))
    assert cf.dynamic.traces == 1  # 16 and 12 share the trace; 4 and 3 fail its guard


def test_a_trace_that_specializes_falls_back_per_size():
    def f(x):
        return x[:, -1], x * 2  # a returned view of the input: its layout pins the sizes

    cf = novaforge.compile(f, backend="cpu", dynamic=True, tiered=False)
    for n in (5, 6):
        x = torch.randn(3, n)
        got, want = cf(x), f(x)
        torch.testing.assert_close(got[1], want[1])
        assert got[0].data_ptr() == want[0].data_ptr()
    assert cf.dynamic.specializations == 0 and cf.compilations == 2
    with pytest.raises(ValueError):
        novaforge.compile(f, dynamic={"nope": {0: None}})(torch.randn(3))


@pytest.mark.parametrize("shared", [True, False])
def test_dynamo_dynamic_graph_is_lowered_once(shared):
    """Lowered once; built once for every size (a shared program, instantiated per size), or,
    with symbolic_programs=False, specialized and built per size."""
    from novaforge import dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.LayerNorm(8)).eval()
    cf = torch.compile(mod, backend="novaforge", dynamic=True,
                       options={"tiered": False, "symbolic_programs": shared})
    lowered, retraced, built = dynamo.SYMBOLIC_LOWERINGS[0], dynamo.STATIC_RETRACES[0], dynamo.PROGRAMS_BUILT[0]
    made = dynamo.SHARED_INSTANCES_MADE[0]
    with torch.no_grad():
        for n in (3, 5, 9, 5):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cf(x), mod(x))
    assert dynamo.SYMBOLIC_LOWERINGS[0] - lowered == 1
    assert dynamo.STATIC_RETRACES[0] - retraced == 0
    assert dynamo.PROGRAMS_BUILT[0] - built == (1 if shared else 3)
    assert dynamo.SHARED_INSTANCES_MADE[0] - made == (3 if shared else 0)


def _unused_int(x, n):
    return x * 2 + (n - n)  # n: an input of Dynamo's graph that no op reads (GPT-J's forward in generate())


def _int_shapes_an_inner_value(x, n):
    return (x[:, -n:] * 2).sum(-1)  # n shapes a value inside the graph, not an input or output


def _sliding_window(x, n):
    return x[:, torch.sym_max(0, n - 3):].sum(-1) + n  # Max(0, n - 3): a sliding window (Gemma 2)


@pytest.mark.parametrize("fn", [_unused_int, _int_shapes_an_inner_value, _sliding_window])
@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_dynamo_integer_arguments_that_change(fn, backend):
    """An integer argument whose value changes becomes a SymInt input of Dynamo's graph. The
    program for all sizes serves it when the size appears nowhere in the graph (the program is
    then static) or only in the shape of a value inside it: both raised at the second value
    before (`at(): this program was built for static sizes`). torch's own `Max` in a size:
    test_generate.py's Gemma 2 case."""
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="novaforge", options={"backend": backend, "tiered": False, "fallback": "raise"})
    x = torch.randn(3, 10)
    for n in (4, 5, 7, 2, 5):
        torch.testing.assert_close(cf(x, n), fn(x, n))

"""Static parts of dynamic ATen graphs (frontend/static_parts.py): the regions with static
sizes are compiled once and reused at every size, the symbolic remainder runs as ATen ops, and
the result is the graph's at every size, through `split` itself and through torch.compile."""

from __future__ import annotations

from collections import deque

import pytest
import torch
import torch._dynamo

from novaforge import dynamo as nf_dynamo
from novaforge.frontend import static_parts
from novaforge.runtime import tiering


def _decode_step(x, w_in, cache, w_out):
    """A decode step's shape: a static projection, a cache of dynamic length, a static output."""
    q = torch.relu(x @ w_in)  # [1, d], static
    keys = torch.cat([cache, q], dim=0)  # [n + 1, d], dynamic
    att = torch.softmax(q @ keys.t(), dim=-1) @ keys  # [1, d], static again
    return torch.tanh(att @ w_out) + x, keys


def _inputs(n, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, d, generator=g), torch.randn(d, d, generator=g) / 4, torch.randn(n, d, generator=g),
            torch.randn(d, d, generator=g) / 4)


def _aten_graph(f, args, dynamic: dict[int, int]) -> torch.fx.GraphModule:
    """The ATen graph AOTAutograd gives a Dynamo backend for `f`, with dims `dynamic`
    ({argument: dim}) marked dynamic and every other size static."""
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm

    for i, d in dynamic.items():
        torch._dynamo.mark_dynamic(args[i], d)
    with torch.no_grad():
        torch.compile(f, backend=aot_autograd(fw_compiler=grab))(*args)
    torch._dynamo.reset()
    (gm,) = graphs
    return gm


def _call(gm: torch.fx.GraphModule, tensors) -> list:
    """Call an ATen graph as AOTAutograd does: its SymInt placeholders get the sizes they
    stand for (read off the tensor placeholder whose fake size is that symbol)."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    it = iter(tensors)
    real = {n: next(it) for n in phs if isinstance(n.meta["val"], torch.Tensor)}
    args = []
    for n in phs:
        if n in real:
            args.append(real[n])
            continue
        sym = str(n.meta["val"])
        args.append(next(t.shape[d] for m, t in real.items() for d, size in enumerate(m.meta["val"].shape)
                         if str(size) == sym))
    return list(gm(*args))


def test_split_compiles_the_static_regions_and_keeps_the_symbolic_ops():
    gm = _aten_graph(_decode_step, _inputs(5), {2: 0})
    built: list[torch.fx.GraphModule] = []
    calls = [0]

    def build_part(part, examples):
        assert all(static_parts._static_value(e) for e in examples)  # a part reads static tensors only
        built.append(part)

        def run(args):
            calls[0] += 1
            return list(part(*args))

        return run

    result = static_parts.split(gm, build_part)
    assert result is not None
    split_gm, count = result
    assert count == len(built) == 2  # x @ w_in (+ relu); att @ w_out (+ tanh, + x)
    part_ops = {str(n.target) for p in built for n in p.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in part_ops and "aten.cat.default" not in part_ops
    outer_ops = {str(n.target) for n in split_gm.graph.nodes if n.op == "call_function"}
    assert "aten.cat.default" in outer_ops  # the symbolic remainder stays in the outer graph
    assert any(n.op != "call_module" for n in gm.graph.nodes)  # the graph given is untouched
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    for n in (3, 5, 17):
        args = _inputs(n, seed=n)
        want = _decode_step(*args)
        got = _call(split_gm, args)
        assert len(_call(gm, args)) == len(got)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
    assert calls[0] == 3 * count


def test_a_graph_without_a_static_matmul_has_no_parts():
    def all_dynamic(a, b):
        return torch.relu(a @ b).sum(0) * 2

    gm = _aten_graph(all_dynamic, (torch.randn(6, 4), torch.randn(4, 3)), {0: 0})
    assert static_parts.split(gm, lambda part, examples: pytest.fail("nothing to build")) is None


@pytest.fixture
def _tiered(monkeypatch):
    monkeypatch.setenv("NOVAFORGE_TIERED", "1")  # the suite turns tiering off (conftest.py)
    monkeypatch.setattr(tiering, "_BUILD_TIMES", deque(maxlen=8))
    monkeypatch.setattr(tiering, "FIRST_BUILD_S", 1e9)  # no size pays for a program of its own


@pytest.mark.parametrize("static_parts_on", [True, False])
def test_torch_compile_eager_tier_runs_the_static_parts_compiled(_tiered, static_parts_on):
    torch._dynamo.reset()
    # (the per-size path: by default the CPU backend builds the dynamic graph once for every size)
    f = torch.compile(_decode_step, backend="novaforge",
                      options={"static_parts": static_parts_on, "symbolic_programs": False})
    built, parts, eager = nf_dynamo.PROGRAMS_BUILT[0], nf_dynamo.STATIC_PARTS[0], nf_dynamo.TIERED_EAGER_CALLS[0]
    fallbacks = len(nf_dynamo.FALLBACKS)
    with torch.no_grad():
        for n in (3, 4, 9, 30):
            args = _inputs(n, seed=n)
            want = _decode_step(*args)
            torch._dynamo.mark_dynamic(args[2], 0)  # the cache length, as a decode step's
            got = f(*args)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert nf_dynamo.PROGRAMS_BUILT[0] == built  # no program per size
    assert nf_dynamo.TIERED_EAGER_CALLS[0] - eager == 4
    assert nf_dynamo.STATIC_PARTS[0] - parts == (2 if static_parts_on else 0)  # built once, for every size
    assert len(nf_dynamo.FALLBACKS) == fallbacks  # the parts compiled (none fell back to eager)

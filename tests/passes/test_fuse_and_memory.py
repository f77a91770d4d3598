"""Fusion groups and the memory plan: kernel kinds and counts for the patterns that matter,
results unchanged (interpreter before/after), and a verifier for the memory plan."""

from __future__ import annotations

import pytest
import torch

import novaforge
from nf_testing import captured_graph, check_pass, cross_entropy_in_place_case
from novaforge.ir import verify
from novaforge.passes.context import PassContext
from novaforge.passes.fuse import fuse
from novaforge.passes.pipeline import graph_passes, run_pipeline
from novaforge.passes.plan_memory import MemoryPlan, PlanError, plan_memory, verify_plan
from novaforge.runtime.interpret import interpret


def optimized(fn, *args, freeze=False):
    g = captured_graph(fn, *args, freeze=freeze)
    g, _ = run_pipeline(g, graph_passes())
    return g


def kernels(g):
    return [n.attrs["kernel"] for n in g.nodes if n.op == "kernel"]


def test_layernorm_softmax_gelu_are_one_kernel_each():
    ln = torch.nn.LayerNorm(32)
    lin = torch.nn.Linear(32, 32)

    def fn(x):
        h = lin(ln(x))                           # layernorm | matmul
        s = torch.softmax(h, -1)                 # softmax (reads the matmul output)
        return torch.nn.functional.gelu(s @ h.transpose(-1, -2), approximate="tanh")

    x = torch.randn(4, 8, 32)
    g = optimized(fn, x)
    out = check_pass(fuse, g, _bind(g, [x], torch.nn.ModuleList([ln, lin])), atol=1e-6)
    names = [k.name for k in kernels(out)]
    assert names == ["layernorm", "matmul_add", "softmax", "matmul_gelu"], names


def test_reductions_over_the_same_rows_share_a_kernel():
    def fn(x):
        h = torch.nn.functional.layer_norm(x, (32,))
        return torch.softmax(h, -1)

    x = torch.randn(4, 8, 32)
    g = optimized(fn, x)
    out = check_pass(fuse, g, [x])
    ks = kernels(out)
    assert len(ks) == 1 and ks[0].kind == "reduction"
    assert [n.op for n in ks[0].body.nodes].count("sum") == 3


def _bind(g, users, module):
    params = iter([p.detach() for p in module.parameters()])
    it = iter(users)
    return [next(it) if gi.kind == "user" else next(params) for gi in g.inputs if gi.kind != "const"]


def test_matmul_epilogue_bias_gelu_residual():
    lin = torch.nn.Linear(16, 24)

    def fn(x, r):
        return torch.nn.functional.gelu(lin(x)) + r

    x, r = torch.randn(3, 5, 16), torch.randn(3, 5, 24)
    g = optimized(fn, x, r)
    out = check_pass(fuse, g, _bind(g, [x, r], lin))
    ks = kernels(out)
    assert len(ks) == 1 and ks[0].kind == "matmul"
    skip = ("permute", "scalar", "reshape", "expand")
    assert [n.op for n in ks[0].body.nodes if n.op not in skip] == ["matmul", "add", "gelu", "add"]


def test_epilogue_through_reshape_of_the_matmul_output():
    def fn(x, w, b, r):
        y = torch.addmm(b, x.view(-1, 16), w).view(2, 3, 8)  # GPT-2 Conv1D style
        return y + r

    x, w, b, r = torch.randn(2, 3, 16), torch.randn(16, 8), torch.randn(8), torch.randn(2, 3, 8)
    g = optimized(fn, x, w, b, r)
    out = check_pass(fuse, g, [x, w, b, r])
    ks = kernels(out)
    assert len(ks) == 1 and ks[0].kind == "matmul"


@pytest.mark.parametrize("reshaped", [False, True])
def test_a_pointwise_chain_moves_whole_into_the_gemm_that_reads_it(reshaped):
    """GELU's derivative recomputed from the pre-activation h and multiplied into the dX GEMM's
    output (the backward of an MLP): the chain reads only h, so the GEMM's epilogue computes it
    and reads h instead of storing and reloading the derivative. Its last node adds two of its
    own values, where moving node by node (sink_tails) stops."""
    def fn(h, dy, w):
        t = torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h))
        deriv = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * 0.7978845608 * (1 + 0.134145 * h * h)
        d = dy @ w
        return (d.view(2, 6, 24) if reshaped else d) * deriv

    h = torch.randn(2, 6, 24) if reshaped else torch.randn(12, 24)
    dy, w = torch.randn(12, 16), torch.randn(16, 24)
    g = optimized(fn, h, dy, w)
    out = check_pass(fuse, g, [h, dy, w], atol=1e-5)
    ks = kernels(out)
    assert len(ks) == 1 and ks[0].kind == "matmul", [k.name for k in ks]


def test_a_pointwise_group_stays_when_moving_it_reads_more():
    """The chain reads two tensors to produce one: moving it into the GEMM would read both
    instead of its product."""
    def fn(a, b, dy, w):
        return (dy @ w) * (torch.tanh(a) * torch.sigmoid(b))

    a, b, dy, w = torch.randn(12, 24), torch.randn(12, 24), torch.randn(12, 16), torch.randn(16, 24)
    g = optimized(fn, a, b, dy, w)
    out = check_pass(fuse, g, [a, b, dy, w], atol=1e-5)
    assert sorted(k.kind for k in kernels(out)) == ["matmul", "pointwise"]


@pytest.mark.parametrize("anchor", [True, False])
def test_a_value_read_transposed_stays_out_of_its_producers_kernel(anchor):
    """`y ^ y.transpose(-1, -2)` where the group computing y (a matmul epilogue, or pointwise)
    would have to read another lane's element of y: the xor is a kernel of its own (fuzz seed
    707209 crashed building the fused body)."""
    def fn(x, t):
        y = (x @ x.transpose(-1, -2) if anchor else x.exp()[..., :7] * 2) <= t
        return y.transpose(-1, -2).contiguous() ^ y

    x, t = torch.randn(7, 2, 7, 4 if anchor else 7), torch.randn(7)
    g = optimized(fn, x, t)
    out = check_pass(fuse, g, [x, t])
    assert len(kernels(out)) == 2


def test_rmsnorm_and_silu_gate():
    def fn(x, w, a, b):
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return rms, torch.nn.functional.silu(a) * b

    x, w, a, b = torch.randn(4, 16), torch.randn(16), torch.randn(4, 32), torch.randn(4, 32)
    g = optimized(fn, x, w, a, b)
    out = check_pass(fuse, g, [x, w, a, b])
    names = sorted(k.name for k in kernels(out))
    assert names == ["rmsnorm", "silu_mul"], names


def test_no_cycles_and_non_strided_views_are_copied():
    def fn(x, y):
        a = x.exp()
        t = a.transpose(0, 1).reshape(-1)      # not expressible with strides -> copy
        s = a.sum(-1, keepdim=True)            # reduction of a
        return t, a + s * y

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    g = optimized(fn, x, y)
    ctx = PassContext()
    out = check_pass(fuse, g, [x, y], ctx)
    verify(out)
    assert ctx.counters.get("copies_inserted", 0) >= 1


def test_memory_plan_never_overlaps_live_buffers():
    lin1, lin2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def fn(x):
        h = torch.relu(lin1(x))
        h2 = torch.softmax(lin2(h) + x, -1)
        return torch.nn.functional.layer_norm(h2 * 2 + 1, (32,)) * h2

    x = torch.randn(8, 32)
    g = captured_graph(fn, x)
    g, _ = run_pipeline(g)
    plan: MemoryPlan = g.meta["memory_plan"]
    verify_plan(plan)
    assert plan.arena_bytes <= plan.sum_bytes
    # corrupt the plan: put two live buffers at the same offset -> the verifier must catch it
    vals = sorted(plan.offsets, key=lambda v: plan.intervals[v])
    for a in vals:
        for b in vals:
            ia, ib = plan.intervals[a], plan.intervals[b]
            paired = plan.inplace.get(a) is b or plan.inplace.get(b) is a
            if a is not b and ia[0] <= ib[1] and ib[0] <= ia[1] and not paired:
                bad = MemoryPlan(plan.arena_bytes, dict(plan.offsets), plan.sizes, plan.intervals, plan.fresh,
                                 plan.inplace)
                bad.offsets[b] = bad.offsets[a]
                with pytest.raises(PlanError):
                    verify_plan(bad)
                return
    pytest.skip("no two buffers live at once")


def test_full_pipeline_keeps_results_on_a_small_model():
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 5, 32)
    g = captured_graph(model, x, freeze=True)
    g2, records = run_pipeline(g, options={}, check=True)
    assert [r.name for r in records][-5:] == ["fuse", "place", "order", "overlap_collectives", "plan_memory"]
    with torch.no_grad():
        ref = model(x)
    (out,) = interpret(g2, [x])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(g2.nodes) < len(g.nodes) / 3
    _ = plan_memory


def test_cross_entropy_rows_are_computed_in_place():
    cross_entropy_in_place_case("cpu")


def test_reduction_in_place_only_for_rows_read_elementwise():
    """A reduction kernel may write over an input it reads only along its own rows; not over one
    it reads transposed (another row's elements would be overwritten before they are read)."""
    def fn(x):
        y = x @ x                                      # a buffer that dies in the next kernel
        return torch.softmax(y, -1) + y.t()            # read in rows and transposed

    x = torch.randn(8, 8)
    g = captured_graph(fn, x)
    g, _ = run_pipeline(g)
    plan = g.meta.memory_plan
    (y,) = [n.outputs[0] for n in g.nodes if n.op == "kernel" and n.attrs["kernel"].kind == "matmul"]
    readers = [n for n in g.nodes if y in n.inputs]
    assert readers and all(n.attrs["kernel"].kind == "reduction" for n in readers)
    assert y not in plan.inplace.values()
    (out,) = interpret(g, [x])
    torch.testing.assert_close(out, fn(x))
    c = novaforge.compile(fn, backend="cpu")
    torch.testing.assert_close(c(x), fn(x))


def test_an_intermediate_read_last_by_an_outputs_kernel_lives_in_the_output():
    """A buffer that the kernel computing a graph output of its size reads last, along its rows,
    lives in that output's memory on the CPU backend (which allocates fresh outputs before the
    program runs): the logits of a log_softmax take no arena bytes. Not when the buffer is read
    again later, nor on a backend that does not place intermediates in outputs."""
    w = torch.randn(24, 40)

    def fn(x):
        return torch.log_softmax(x @ w, -1)

    def read_later(x):
        y = x @ w
        return torch.log_softmax(y, -1), y.sum(-1)

    x = torch.randn(16, 24)
    for f, paired in ((fn, True), (read_later, False)):
        c = novaforge.compile(f, backend="cpu")
        torch.testing.assert_close(c(x), f(x), atol=1e-5, rtol=1e-5)
        plan = c.stats().graph.meta.memory_plan
        (y,) = [n.outputs[0] for n in c.stats().graph.nodes if n.op == "kernel"
                and n.attrs["kernel"].kind == "matmul"]
        assert (y in plan.into_output) == paired, plan.summary()
        assert (y in plan.offsets) != paired
        again = c(x + 1)  # the next call's output is its own memory
        torch.testing.assert_close(again, f(x + 1), atol=1e-5, rtol=1e-5)
    interpreted = novaforge.compile(fn, backend="interpret")
    interpreted(x)
    assert not interpreted.stats().graph.meta.memory_plan.into_output

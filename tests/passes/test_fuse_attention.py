"""fuse_attention: each recognized form becomes one `attention` node that computes what the
chain computed (interpreter before/after, eager PyTorch for models), the counters say which
rule fired, and forms that are not provably the same computation are left alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nf_testing import check_pass
from novaforge.frontend.lower import InputSpec, lower_fx
from novaforge.ir import Graph, GraphInput, TensorType, Value, make_node, verify
from novaforge.passes.context import PassContext
from novaforge.passes.dce import dce
from novaforge.passes.fuse_attention import fuse_attention
from novaforge.passes.pipeline import graph_passes, run_pipeline
from novaforge.runtime.interpret import interpret

F32 = torch.float32
NEG_INF = float("-inf")
F32_MIN = torch.finfo(F32).min


# ----------------------------------------------------------------------- graph builder
class IRBuilder:
    """Hand-built IR graphs: inputs, consts and nodes in order."""

    def __init__(self) -> None:
        self.inputs: list[GraphInput] = []
        self.nodes = []

    def input(self, *shape: int, dtype=F32, name: str = "x") -> Value:
        v = Value(TensorType(tuple(shape), dtype), name)
        self.inputs.append(GraphInput(v, "user", name))
        return v

    def const(self, t: torch.Tensor, name: str = "c") -> Value:
        v = Value(TensorType.of(t), name)
        self.inputs.append(GraphInput(v, "const", name, t))
        return v

    def op(self, op: str, *ins: Value, **attrs) -> Value:
        n = make_node(op, list(ins), attrs)
        self.nodes.append(n)
        return n.out

    def scalar(self, value: float, dtype=F32) -> Value:
        return self.op("scalar", value=value, dtype=dtype)

    def graph(self, *outs: Value) -> Graph:
        return Graph(self.inputs, self.nodes, outs)


def softmax(b: IRBuilder, x: Value, axis: int = -1) -> Value:
    """As lower_nn.softmax lowers torch.softmax."""
    ax = axis % x.type.rank
    m = b.op("max", x, axes=(ax,), keepdim=True)
    e = b.op("exp", b.op("sub", x, m))
    return b.op("div", e, b.op("sum", e, axes=(ax,), keepdim=True))


def safe_softmax_min(b: IRBuilder, x: Value) -> Value:
    """As lower_nn lowers aten._safe_softmax."""
    ax = x.type.rank - 1
    allm = b.op("min", b.op("eq", x, b.scalar(NEG_INF)), axes=(ax,), keepdim=True)
    return b.op("where", allm, b.scalar(0.0), softmax(b, x))


def safe_softmax_any(b: IRBuilder, x: Value) -> Value:
    """The core-ATen decomposition's form: logical_not(any(logical_not(x == -inf)))."""
    ax = x.type.rank - 1
    sm = softmax(b, x)
    anyv = b.op("max", b.op("logical_not", b.op("eq", x, b.scalar(NEG_INF))), axes=(ax,), keepdim=True)
    zero = b.op("expand", b.scalar(0.0), shape=x.type.shape)
    return b.op("where", b.op("logical_not", anyv), zero, sm)


def transpose(b: IRBuilder, k: Value) -> Value:
    r = k.type.rank
    return b.op("permute", k, perm=tuple(range(r - 2)) + (r - 1, r - 2))


def repeat_kv(b: IRBuilder, k: Value, n: int) -> Value:
    """HF's repeat_kv after lowering: reshape(expand(reshape(k)))."""
    bsz, h, s, d = k.type.shape
    u = b.op("reshape", k, shape=(bsz, h, 1, s, d))
    e = b.op("expand", u, shape=(bsz, h, n, s, d))
    return b.op("reshape", e, shape=(bsz, h * n, s, d))


def fuse_then_dce(g: Graph, ctx: PassContext) -> Graph:
    return dce(fuse_attention(g, ctx), PassContext())


def run_fusion(g: Graph, inputs, atol=1e-5) -> tuple[Graph, PassContext]:
    ctx = PassContext()
    out = check_pass(fuse_then_dce, g, inputs, ctx, atol=atol, rtol=1e-5)
    return out, ctx


def attention_nodes(g: Graph):
    found = []
    for n in g.nodes:
        if n.op == "attention":
            found.append(n)
        elif n.op == "kernel":
            found += attention_nodes(n.attrs["kernel"].body)
    return found


def op_count(g: Graph, op: str) -> int:
    c = 0
    for n in g.nodes:
        c += n.op == op
        if n.op == "kernel":
            c += op_count(n.attrs["kernel"].body, op)
    return c


def qkv(b: IRBuilder, bsz=2, h=3, q_len=5, k_len=7, e=4, ev=6, hk=None):
    hk = h if hk is None else hk
    q = b.input(bsz, h, q_len, e, name="q")
    k = b.input(bsz, hk, k_len, e, name="k")
    v = b.input(bsz, hk, k_len, ev, name="v")
    return q, k, v


def rand_for(g: Graph):
    out = []
    for gi in g.inputs:
        if gi.kind == "const":
            continue
        t = gi.value.type
        if t.dtype == torch.bool:
            out.append(torch.rand(t.shape) > 0.3)
        elif t.dtype.is_floating_point:
            out.append(torch.randn(t.shape, dtype=t.dtype))
        else:
            out.append(torch.randint(0, 2, t.shape, dtype=t.dtype))
    return out


# ------------------------------------------------------------------------ eager chains
@pytest.mark.parametrize("scale_form", ["scores_mul", "scores_div", "on_q", "on_q_and_kt", "none", "full_div"])
def test_eager_chain_scale_forms(scale_form):
    b = IRBuilder()
    q, k, v = qkv(b)
    kt = transpose(b, k)
    want = 0.37
    if scale_form == "on_q":
        q = b.op("mul", q, b.scalar(want))
    if scale_form == "on_q_and_kt":
        q = b.op("mul", b.scalar(math.sqrt(want)), q)
        kt = b.op("mul", kt, b.scalar(math.sqrt(want)))
    s = b.op("matmul", q, kt)
    if scale_form == "scores_mul":
        s = b.op("mul", s, b.scalar(want))
    elif scale_form == "scores_div":
        s = b.op("div", s, b.scalar(1 / want))
    elif scale_form == "full_div":
        s = b.op("div", s, b.op("full", shape=(), value=1 / want, dtype=F32))
    out = b.op("matmul", softmax(b, s), v)
    g = b.graph(out)
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert ctx.counters == {"eager_softmax_chain": 1}
    assert att.attrs["scale"] == pytest.approx(1.0 if scale_form == "none" else want, rel=1e-6)
    assert op_count(fused, "exp") == 0 and op_count(fused, "matmul") == 0


def test_eager_chain_without_batch_axes():
    """Single-head 2-D attention: the attention node gets a unit batch axis, the output a view."""
    b = IRBuilder()
    q, k, v = b.input(5, 4, name="q"), b.input(7, 4, name="k"), b.input(7, 3, name="v")
    m = b.const(torch.zeros(5, 7).masked_fill(torch.rand(5, 7) > 0.7, NEG_INF).index_fill(1, torch.tensor([0]), 0.0))
    s = b.op("add", b.op("matmul", q, transpose(b, k)), m)
    g = b.graph(b.op("matmul", softmax(b, s), v))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.inputs[0].type.shape == (1, 5, 4) and fused.outputs[0].type.shape == (5, 3)
    assert ctx.counters == {"eager_softmax_chain": 1}


def test_eager_chain_kt_from_head_split_permute():
    """GPT-2: K^T is permute([B,S,H,D] -> [B,H,D,S]); the key becomes the [0,2,1,3] permute."""
    b = IRBuilder()
    x = b.input(2, 7, 3, 4, name="k_heads_last")
    q = b.input(2, 3, 7, 4, name="q")
    v = b.input(2, 3, 7, 5, name="v")
    kt = b.op("permute", x, perm=(0, 2, 3, 1))
    out = b.op("matmul", softmax(b, b.op("mul", b.op("matmul", q, kt), b.scalar(0.5))), v)
    g = b.graph(out)
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    perm = [n for n in fused.nodes if n.op == "permute"]
    assert len(perm) == 1 and tuple(perm[0].attrs["perm"]) == (0, 2, 1, 3)
    assert att.inputs[1] is perm[0].out


def test_eager_chain_flattened_batch_and_upcast():
    """Batch axes flattened around the matmuls (bmm form), softmax in float32 around bf16."""
    b = IRBuilder()
    q, k, v = qkv(b, bsz=2, h=3, q_len=4, k_len=4, e=8, ev=8)
    q, k, v = (b.op("cast", t, dtype=torch.bfloat16) for t in (q, k, v))
    q3 = b.op("reshape", q, shape=(6, 4, 8))
    kt3 = b.op("reshape", transpose(b, k), shape=(6, 8, 4))
    s = b.op("reshape", b.op("matmul", q3, kt3), shape=(2, 3, 4, 4))
    s = b.op("mul", s, b.scalar(0.25, torch.bfloat16))
    p = b.op("cast", softmax(b, b.op("cast", s, dtype=F32)), dtype=torch.bfloat16)
    out = b.op("matmul", b.op("reshape", p, shape=(6, 4, 4)), b.op("reshape", v, shape=(6, 4, 8)))
    g = b.graph(b.op("cast", out, dtype=F32))
    fused, ctx = run_fusion(g, rand_for(g), atol=2e-2)
    (att,) = attention_nodes(fused)
    assert att.inputs[0].type == TensorType((2, 3, 4, 8), torch.bfloat16)
    assert ctx.counters["eager_softmax_chain"] == 1 and op_count(fused, "exp") == 0


@pytest.mark.parametrize("form", ["where_keep", "masked_fill", "additive"])
def test_const_causal_masks_become_causal(form):
    b = IRBuilder()
    q, k, v = qkv(b, q_len=6, k_len=6)
    s = b.op("mul", b.op("matmul", q, transpose(b, k)), b.scalar(0.5))
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    if form == "where_keep":
        s = b.op("where", b.const(tril.reshape(1, 1, 6, 6)), s, b.scalar(NEG_INF))
    elif form == "masked_fill":
        s = b.op("where", b.const(~tril), b.scalar(NEG_INF), s)
    else:  # HF's float mask: 0 where kept, finfo.min elsewhere, already broadcast over batch
        m = torch.zeros(2, 1, 6, 6).masked_fill(~tril, F32_MIN)
        s = b.op("add", b.const(m), s)
    g = b.graph(b.op("matmul", softmax(b, s), v))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.attrs["causal"] is True and len(att.inputs) == 3
    assert ctx.counters["mask_to_causal"] == 1


def test_bottom_right_causal_and_other_const_masks_stay_masks():
    b = IRBuilder()
    q, k, v = qkv(b, q_len=3, k_len=5)
    # bottom-right aligned triangle (KV-cache style): not torch's top-left is_causal
    keep = torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2)
    s = b.op("matmul", q, transpose(b, k))
    s = b.op("where", b.const(keep), s, b.scalar(NEG_INF))
    g = b.graph(b.op("matmul", softmax(b, s), v))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.attrs["causal"] is False and att.inputs[3].type.dtype == torch.bool
    assert "mask_to_causal" not in ctx.counters


def test_hf_padding_mask_stays_additive_input():
    """where(keep, 0, finfo.min) from a runtime bool mask: finite, so plain softmax is safe."""
    b = IRBuilder()
    q, k, v = qkv(b)
    keep = b.input(2, 1, 5, 7, dtype=torch.bool, name="keep")
    m = b.op("where", keep, b.scalar(0.0), b.scalar(F32_MIN))
    s = b.op("add", b.op("mul", b.op("matmul", q, transpose(b, k)), b.scalar(0.5)), m)
    g = b.graph(b.op("matmul", softmax(b, s), v))
    inputs = rand_for(g)
    inputs[3][1, 0, 2] = False  # one row keeps nothing: eager and attention both average it
    fused, ctx = run_fusion(g, inputs)
    (att,) = attention_nodes(fused)
    assert att.inputs[3] is m and ctx.counters == {"eager_softmax_chain": 1}


def test_old_style_integer_padding_mask_is_provably_finite():
    """(1 - mask.float()) * -10000 from an int64 mask: bounded, so plain softmax is safe."""
    b = IRBuilder()
    q, k, v = qkv(b)
    am = b.input(2, 1, 1, 7, dtype=torch.int64, name="attention_mask")
    m = b.op("mul", b.op("sub", b.scalar(1.0), b.op("cast", am, dtype=F32)), b.scalar(-10000.0))
    s = b.op("add", b.op("div", b.op("matmul", q, transpose(b, k)), b.scalar(3.0)), m)
    g = b.graph(b.op("matmul", softmax(b, s), v))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.inputs[3] is m and att.attrs["scale"] == pytest.approx(1 / 3)
    assert ctx.counters == {"eager_softmax_chain": 1}


def test_finite_fill_becomes_additive_mask():
    b = IRBuilder()
    q, k, v = qkv(b)
    keep = b.input(2, 1, 5, 7, dtype=torch.bool, name="keep")
    s = b.op("where", keep, b.op("matmul", q, transpose(b, k)), b.scalar(F32_MIN))
    g = b.graph(b.op("matmul", softmax(b, s), v))
    inputs = rand_for(g)
    inputs[3][0, 0, 1] = False
    fused, ctx = run_fusion(g, inputs)
    (att,) = attention_nodes(fused)
    assert att.inputs[3].type.dtype == F32 and ctx.counters == {"eager_softmax_chain": 1}


@pytest.mark.parametrize("fixup", [safe_softmax_min, safe_softmax_any])
@pytest.mark.parametrize("mask_form", ["where_bool_additive", "masked_fill"])
def test_safe_softmax_chains_with_runtime_masks(fixup, mask_form):
    """With the full-row fix-up the chain is exactly SDPA, fully masked rows included."""
    b = IRBuilder()
    q, k, v = qkv(b)
    keep = b.input(2, 3, 5, 7, dtype=torch.bool, name="keep")
    s = b.op("mul", b.op("matmul", q, transpose(b, k)), b.scalar(0.5))
    if mask_form == "where_bool_additive":
        s = b.op("add", s, b.op("where", keep, b.scalar(0.0), b.scalar(NEG_INF)))
    else:
        s = b.op("where", b.op("logical_not", keep), b.scalar(NEG_INF), s)
    g = b.graph(b.op("matmul", fixup(b, s), v))
    inputs = rand_for(g)
    inputs[3][0, 1, 2] = False  # a row that keeps nothing: 0 in both
    fused, ctx = run_fusion(g, inputs)
    (att,) = attention_nodes(fused)
    assert ctx.counters["decomposed_sdpa_chain"] == 1 and op_count(fused, "exp") == 0
    assert att.inputs[3].type.dtype == torch.bool
    assert (interpret(fused, inputs)[0][0, 1, 2] == 0).all()


def test_gqa_repeat_in_eager_chain_ratio_3():
    b = IRBuilder()
    q, k, v = qkv(b, h=6, hk=2, q_len=5, k_len=5)
    kr, vr = repeat_kv(b, k, 3), repeat_kv(b, v, 3)
    s = b.op("mul", b.op("matmul", q, transpose(b, kr)), b.scalar(0.5))
    g = b.graph(b.op("matmul", softmax(b, s), vr))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.inputs[1] is k and att.inputs[2] is v
    assert ctx.counters == {"eager_softmax_chain": 1, "eager_gqa_unrepeated": 1}
    assert op_count(fused, "expand") == 0


# --------------------------------------------------------------- must not fuse (negative)
def _assert_unfused(g: Graph, ctx_counter: str | None, inputs=None):
    ctx = PassContext()
    out = check_pass(fuse_then_dce, g, inputs if inputs is not None else rand_for(g), ctx)
    assert not attention_nodes(out)
    assert op_count(out, "exp") == 1
    if ctx_counter is not None:
        assert ctx.counters.get(ctx_counter) == 1, ctx.counters


def test_softmax_over_query_axis_is_not_attention():
    b = IRBuilder()
    q, k, v = qkv(b, q_len=7, k_len=7)
    s = b.op("matmul", q, transpose(b, k))
    _assert_unfused(b.graph(b.op("matmul", softmax(b, s, axis=-2), v)), "skipped_softmax_axis")


def test_probs_also_returned_are_not_fused():
    b = IRBuilder()
    q, k, v = qkv(b)
    p = softmax(b, b.op("matmul", q, transpose(b, k)))
    _assert_unfused(b.graph(b.op("matmul", p, v), p), "skipped_intermediate_used")


def test_scores_used_elsewhere_are_not_fused():
    b = IRBuilder()
    q, k, v = qkv(b)
    s = b.op("mul", b.op("matmul", q, transpose(b, k)), b.scalar(0.5))
    out = b.op("matmul", softmax(b, s), v)
    _assert_unfused(b.graph(out, b.op("sum", s, axes=(3,), keepdim=False)), "skipped_intermediate_used")


def test_non_scalar_scale_is_not_fused():
    b = IRBuilder()
    q, k, v = qkv(b)
    per_head = b.input(1, 3, 1, 1, name="per_head_scale")
    s = b.op("mul", b.op("matmul", q, transpose(b, k)), per_head)
    _assert_unfused(b.graph(b.op("matmul", softmax(b, s), v)), "skipped_nonscalar_scale")


def test_runtime_neg_inf_mask_with_plain_softmax_is_not_fused():
    """Eager softmax gives NaN on a fully masked row, attention gives 0: not the same."""
    b = IRBuilder()
    q, k, v = qkv(b)
    masked = b.input(2, 1, 5, 7, dtype=torch.bool, name="masked")
    s = b.op("where", masked, b.scalar(NEG_INF), b.op("matmul", q, transpose(b, k)))
    g = b.graph(b.op("matmul", softmax(b, s), v))
    inputs = rand_for(g)
    inputs[3][:] = False
    _assert_unfused(g, "skipped_full_row_mask", inputs)


def test_broadcast_batch_matmul_is_not_fused():
    b = IRBuilder()
    q = b.input(2, 3, 5, 4, name="q")
    k = b.input(1, 3, 7, 4, name="k")
    v = b.input(2, 3, 7, 4, name="v")
    s = b.op("matmul", q, transpose(b, k))
    _assert_unfused(b.graph(b.op("matmul", softmax(b, s), v)), "skipped_batch_broadcast")


def test_unbounded_runtime_float_mask_with_plain_softmax_is_not_fused():
    """A float mask input may hold -inf on a whole row (NaN in eager, 0 in attention)."""
    b = IRBuilder()
    q, k, v = qkv(b)
    m = b.input(2, 1, 5, 7, name="float_mask")
    s = b.op("add", b.op("matmul", q, transpose(b, k)), m)
    _assert_unfused(b.graph(b.op("matmul", softmax(b, s), v)), "skipped_full_row_mask")


# ----------------------------------------------------------------- existing attention nodes
def test_sdpa_node_gqa_unrepeated_ratio_3_and_zero_batch():
    for bsz in (2, 0):
        b = IRBuilder()
        q, k, v = qkv(b, bsz=bsz, h=6, hk=2, q_len=5, k_len=5)
        out = b.op("attention", q, repeat_kv(b, k, 3), repeat_kv(b, v, 3), scale=0.4, causal=True)
        g = b.graph(out)
        fused, ctx = run_fusion(g, rand_for(g))
        (att,) = attention_nodes(fused)
        assert att.inputs[1] is k and att.inputs[2] is v and att.attrs["causal"] is True
        assert ctx.counters == {"sdpa_gqa_unrepeated": 1}
        assert len(fused.nodes) == 1


@pytest.mark.parametrize("mask", ["all_true", "causal_bool", "causal_float_inf", "neg_inf_where"])
def test_sdpa_node_masks(mask):
    b = IRBuilder()
    q, k, v = qkv(b, q_len=6, k_len=6)
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    if mask == "all_true":
        m = b.op("expand", b.const(torch.ones(1, 1, 1, 6, dtype=torch.bool)), shape=(2, 1, 6, 6))
        want = ({"mask_dropped": 1}, False, 3)
    elif mask == "causal_bool":
        m = b.const(tril.expand(2, 1, 6, 6).contiguous())
        want = ({"mask_to_causal": 1}, True, 3)
    elif mask == "causal_float_inf":
        m = b.const(torch.zeros(6, 6).masked_fill(~tril, NEG_INF))
        want = ({"mask_to_causal": 1}, True, 3)
    else:
        keep = b.input(2, 1, 6, 6, dtype=torch.bool, name="keep")
        m = b.op("where", keep, b.scalar(0.0), b.scalar(NEG_INF))
        want = ({"mask_to_bool": 1}, False, 4)
    g = b.graph(b.op("attention", q, k, v, m, scale=0.5, causal=False))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert (ctx.counters, att.attrs["causal"], len(att.inputs)) == want


def test_sdpa_node_mask_and_all_true_is_narrowed():
    """BERT's padding mask: and(all-true [1,1,L,1], pad [B,1,1,S]) -> pad."""
    b = IRBuilder()
    q, k, v = qkv(b)
    pad = b.input(2, 1, 1, 7, dtype=torch.bool, name="pad")
    m = b.op("logical_and", b.const(torch.ones(1, 1, 5, 1, dtype=torch.bool)), pad)
    g = b.graph(b.op("attention", q, k, v, m, scale=0.5, causal=False))
    fused, ctx = run_fusion(g, rand_for(g))
    (att,) = attention_nodes(fused)
    assert att.inputs[3] is pad and ctx.counters == {"mask_narrowed": 1}


def test_sdpa_node_padding_mask_untouched():
    b = IRBuilder()
    q, k, v = qkv(b)
    keep = b.input(2, 1, 1, 7, dtype=torch.bool, name="keep")
    g = b.graph(b.op("attention", q, k, v, keep, scale=0.5, causal=False))
    ctx = PassContext()
    assert fuse_attention(g, ctx) is g and ctx.counters == {}


# ------------------------------------------------------------------ user code, captured
def test_user_sdpa_enable_gqa_and_repeat_interleave():
    q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)

    def native(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def repeated(q, k, v):
        k, v = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=-3)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    ref = native(q, k, v)
    for fn, counters in ((native, {}), (repeated, {"sdpa_gqa_unrepeated": 1})):
        g, records = run_pipeline(_lower_export(fn, (q, k, v)), graph_passes(), check=True)
        assert next(r for r in records if r.name == "fuse_attention").counters == counters
        (att,) = attention_nodes(g)
        assert att.inputs[1].type.shape == (2, 2, 5, 8) and att.attrs["causal"] is True
        assert not any(n.op == "extern" for n in g.nodes)
        torch.testing.assert_close(interpret(g, [q, k, v])[0], ref, atol=1e-5, rtol=1e-5)


class _Fn(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _lower_export(fn, args: tuple, decompose: bool = False) -> Graph:
    """torch.export (optionally with the core-ATen decompositions) and lowering, inputs only."""
    module = fn if isinstance(fn, torch.nn.Module) else _Fn(fn)
    ep = torch.export.export(module, args, strict=False)
    if decompose:
        ep = ep.run_decompositions()
    graph, _ = lower_fx(ep.graph_module, [InputSpec("user", f"in{i}") for i in range(len(args))])
    return graph


class _SDPA(torch.nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, q, k, v, m=None):
        if self.mode == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.mode == "gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if self.mode == "bool":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        if self.mode == "float":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("mode", ["plain", "causal", "gqa", "bool", "float"])
def test_core_aten_decomposition_of_sdpa(mode):
    """run_decompositions() turns SDPA into matmuls + _safe_softmax (with flattened batch
    axes, sqrt(scale) on q and on K^T, repeat for GQA); it becomes one attention again."""
    q = torch.randn(2, 6, 5, 8)
    k = torch.randn(2, 2 if mode == "gqa" else 6, 7 if mode != "causal" and mode != "gqa" else 5, 8)
    v = torch.randn(*k.shape[:-1], 3)
    args: tuple = (q, k, v)
    if mode == "bool":
        m = torch.rand(2, 1, 5, 7) > 0.4
        m[0, 0, 1] = False  # a fully masked row
        args += (m,)
    if mode == "float":
        args += (torch.randn(2, 1, 5, 7),)
    graph = _lower_export(_SDPA(mode), args, decompose=True)
    assert op_count(graph, "attention") == 0
    g, records = run_pipeline(graph, graph_passes(), check=True)
    counters = next(r for r in records if r.name == "fuse_attention").counters
    assert counters["decomposed_sdpa_chain"] == 1
    (att,) = attention_nodes(g)
    assert op_count(g, "exp") == 0 and op_count(g, "matmul") == 0
    assert att.attrs["causal"] is (mode in ("causal", "gqa"))
    if mode == "gqa":
        assert att.inputs[1].type.shape[-3] == 2 and counters["eager_gqa_unrepeated"] == 1
    if mode == "bool":
        assert att.inputs[3].type.dtype == torch.bool
    torch.testing.assert_close(interpret(g, list(args))[0], _SDPA(mode)(*args), atol=1e-5, rtol=1e-5)


class _MHA(torch.nn.Module):
    def __init__(self, return_weights: bool) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.return_weights = return_weights

    def forward(self, x):
        out, weights = self.mha(x, x, x, need_weights=True)
        return (out, weights) if self.return_weights else out


@pytest.mark.parametrize("return_weights", [False, True])
def test_multihead_attention_fused_unless_weights_are_returned(return_weights):
    module = _MHA(return_weights).eval()
    x = torch.randn(2, 5, 32)
    ep = torch.export.export(module, (x,), strict=False)
    params = dict(module.named_parameters())
    specs, inputs = [], []
    for s in ep.graph_signature.input_specs:
        is_param = s.kind.name == "PARAMETER"
        specs.append(InputSpec("param", s.target) if is_param else InputSpec("user", "x"))
        inputs.append(params[s.target].detach() if is_param else x)
    graph, _ = lower_fx(ep.graph_module, specs)
    g, records = run_pipeline(graph, graph_passes(), check=True)
    counters = next(r for r in records if r.name == "fuse_attention").counters
    assert len(attention_nodes(g)) == int(not return_weights)
    assert counters == ({"skipped_intermediate_used": 1} if return_weights else {"eager_softmax_chain": 1})
    with torch.no_grad():
        ref = module(x)
    got = interpret(g, inputs)
    for a, r in zip(got, ref if return_weights else (ref,), strict=True):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------- transformers models
transformers = pytest.importorskip("transformers")
LAYERS = 2


def _model(name: str, impl: str, heads: int = 4, kv_heads: int = 2, hidden: int = 64):
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=hidden, n_layer=LAYERS, n_head=heads, vocab_size=100, n_positions=32,
                                      use_cache=False, attn_implementation=impl, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(cfg).eval()
    if name == "bert":
        cfg = transformers.BertConfig(hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=heads,
                                      intermediate_size=2 * hidden, vocab_size=100, max_position_embeddings=32,
                                      attn_implementation=impl)
        return transformers.BertModel(cfg).eval()
    cfg = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=LAYERS, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, intermediate_size=2 * hidden, vocab_size=100,
                                   max_position_embeddings=32, use_cache=False, attn_implementation=impl)
    return transformers.LlamaModel(cfg).eval()


def _inputs(pad: bool):
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    if not pad:
        return (ids,), {}
    am = torch.ones(2, 16, dtype=torch.long)
    am[1, 11:] = 0
    return (ids,), {"attention_mask": am}


def _compile_and_check(model, args, kwargs, *, freeze: bool, capture_mode: str = "fx", **extra):
    import novaforge

    compiled = novaforge.compile(model, backend="interpret", freeze=freeze, capture=capture_mode)
    with torch.no_grad():
        got = compiled(*args, **kwargs, **extra)
        ref = model(*args, **kwargs, **extra)
    torch.testing.assert_close(got.last_hidden_state, ref.last_hidden_state, atol=1e-5, rtol=1e-5)
    stats = compiled.stats()
    verify(stats.graph)
    counters = next(r for r in stats.records if r.name == "fuse_attention").counters
    return stats.graph, counters, got, ref


# capture "fx" (the default) on every case, "export" on two: the graphs differ in how masks and
# repeat_kv arrive (e.g. fx hands SDPA a float where(mask, 0, -inf), export a bool mask)
MODEL_CASES = [(mode, freeze, pad) for mode in ("fx", "export") for freeze in (False, True)
               for pad in (False, True) if mode == "fx" or freeze == pad]


MODEL_IDS = [f"{m}-{'frozen' if f else 'params'}-{'pad' if p else 'nopad'}" for m, f, p in MODEL_CASES]


@pytest.mark.parametrize("capture_mode,freeze,pad", MODEL_CASES, ids=MODEL_IDS)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_transformers_models_one_attention_per_layer(name, impl, capture_mode, freeze, pad):
    model = _model(name, impl)
    args, kwargs = _inputs(pad)
    g, counters, _, _ = _compile_and_check(model, args, kwargs, freeze=freeze, capture_mode=capture_mode)
    atts = attention_nodes(g)
    assert len(atts) == LAYERS, counters
    assert op_count(g, "exp") == 0, "a softmax chain is left"
    if impl == "eager":
        assert counters["eager_softmax_chain"] == LAYERS
    for att in atts:
        if name == "llama":  # GQA: the repeated k, v are gone
            assert att.inputs[1].type.shape[-3] == 2 and att.inputs[0].type.shape[-3] == 4
        if pad:
            assert len(att.inputs) == 4 and not att.attrs["causal"]
            if name == "bert" and impl == "sdpa":  # and(all-true, padding) narrowed to padding
                assert att.inputs[3].type.shape == (2, 1, 1, 16)
        else:  # constant masks: causal for the decoders, nothing at all for BERT
            assert len(att.inputs) == 3 and att.attrs["causal"] is (name != "bert")
    if name == "llama":
        assert counters.get("sdpa_gqa_unrepeated", 0) + counters.get("eager_gqa_unrepeated", 0) == LAYERS


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llama_gqa_ratio_3(impl):
    model = _model("llama", impl, heads=6, kv_heads=2, hidden=48)
    args, kwargs = _inputs(pad=True)
    g, counters, _, _ = _compile_and_check(model, args, kwargs, freeze=True)
    atts = attention_nodes(g)
    assert len(atts) == LAYERS
    assert all(a.inputs[0].type.shape[-3] == 6 and a.inputs[1].type.shape[-3] == 2 for a in atts)


def test_output_attentions_keeps_the_eager_chain():
    model = _model("gpt2", "eager")
    args, kwargs = _inputs(pad=False)
    g, counters, got, ref = _compile_and_check(model, args, kwargs, freeze=True, output_attentions=True)
    assert not attention_nodes(g)
    assert counters == {"skipped_intermediate_used": LAYERS}
    for a, r in zip(got.attentions, ref.attentions, strict=True):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)

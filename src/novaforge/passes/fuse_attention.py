"""Attention fusion: softmax(Q K^T * scale + mask) V  ->  one `attention` node.

Runs after dce, cse, fold_constants, simplify and layout, so constant masks are folded and
view chains are canonical. Two kinds of anchors are rewritten:

1. `attention` nodes (lowered scaled_dot_product_attention: transformers' default "sdpa"
   path and user code) are canonicalized:
   * GQA: k and v repeated per head (HF's repeat_kv and the lowering of repeat_interleave:
     reshape(expand(reshape(k0)))) are replaced by k0, v0; the op groups query heads itself,
     and the repetition is a view strides cannot express, which fusion would otherwise copy.
   * masks: where(c, 0, -inf) (SDPA's own reading of a bool mask) becomes c; and(all-true
     constant, m) becomes m; a constant mask that keeps everything is dropped; one equal to the
     top-left causal triangle on every batch and head becomes causal=True. Other masks
     (padding, bottom-right causal) stay inputs.
2. Eager chains, read back from matmul(P, V) (the table `EAGER_CHAIN` below lists the layers):
   transformers' attn_implementation="eager", user code, and the core-ATen decomposition of
   scaled_dot_product_attention. One attention node replaces the chain when it computes the
   same thing: the softmax is over the key axis, every scale is one number, no intermediate
   (scores, probabilities) is used elsewhere (output_attentions), and no row can be masked
   entirely unless the chain already maps such rows to 0 as the op does (torch's
   _safe_softmax fix-up), since eager softmax gives NaN there. Its masks are canonicalized
   as above.

Replaced chains are left for the following dce. Counters (PassContext.count):
sdpa_gqa_unrepeated, eager_gqa_unrepeated, eager_softmax_chain, decomposed_sdpa_chain,
mask_to_bool, mask_dropped, mask_to_causal, mask_narrowed, and skipped_<reason> for chains
that looked like attention but were kept (softmax_axis, intermediate_used, nonscalar_scale,
full_row_mask, batch_broadcast, types).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir import OPS, Graph, Node, Rewriter, Value
from ..ir.types import is_float
from .attention_patterns import (
    Expr,
    Facts,
    MaskMatch,
    additive_mask,
    classify_const_mask,
    emit_expr,
    eval_expr,
    full_row_masked,
    keeps_matrix,
    mask_candidates,
    match_softmax,
    peel_operand,
    scaled_operand,
    unrepeat_heads,
    untranspose,
    view_as,
)
from .context import PassContext, describe

# The eager chain, from the output back to the inputs; each layer is matched by one helper.
EAGER_CHAIN = (
    ("out", "matmul(P, V), P and V with the output's batch shape (no broadcasting)"),
    ("probs_views", "reshapes regrouping batch axes; a float cast (Llama's .to(q.dtype))"),
    ("softmax", "match_softmax: max/sub/exp/sum/div over the last axis, optional full-row fix-up"),
    ("upcast", "optional float cast of the scores (softmax(..., dtype=float32))"),
    ("mask", "mask_candidates: add(scores, m), where(c, scores, -inf), masked_fill(c, -inf), none"),
    ("scale", "scalar mul/div of the scores and batch-regrouping reshapes"),
    ("qk", "matmul(Q, K^T); Q and K^T peeled of scalar scales and reshapes, K^T untransposed"),
    ("gqa", "unrepeat_heads on K and V"),
)


@dataclass
class Plan:
    anchor: Node
    q: Expr
    k: Expr
    v: Expr
    mask: Expr | None
    scale: float
    causal: bool
    counters: list[str] = field(default_factory=list)


def fuse_attention(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    facts = Facts(graph)
    plans: dict[Node, Plan] = {}
    for n in graph.nodes:
        plan = None
        if n.op == "attention":
            plan = plan_sdpa(facts, n)
        elif n.op == "matmul":
            plan = plan_eager(facts, n, ctx)
        if plan is not None and ctx.take_fuel(lambda n=n: f"fuse_attention: replaced the chain ending at "
                                                          f"{describe(n)}"):
            plans[n] = plan
    if not plans:
        return graph
    rw = Rewriter(graph)
    regrouped: dict[Value, Value] = {}  # reshape of a new attention output -> that output
    for n in graph.nodes:
        plan = plans.get(n)
        if plan is not None:
            att, out = commit(rw, plan)
            if out is not att:
                regrouped[out] = att
            rw.replace(n.outputs[0], out)
            for name in plan.counters:
                ctx.count(name)
            continue
        if n.op == "reshape" and rw.get(n.inputs[0]) in regrouped:
            # reshape(reshape(attention)): view the attention output directly
            att = regrouped[rw.get(n.inputs[0])]
            shape = n.outputs[0].type.shape
            rw.replace(n.outputs[0], att if att.type.shape == shape else
                       rw.emit("reshape", [att], meta=n.meta, shape=shape).out)
            continue
        rw.keep(n)
    return rw.finish()


def commit(rw: Rewriter, plan: Plan) -> tuple[Value, Value]:
    """Emit the planned attention node: (its output, that output viewed as the anchor's)."""
    meta = dict(plan.anchor.meta)
    ins = [emit_expr(rw, e, meta) for e in (plan.q, plan.k, plan.v)]
    if plan.mask is not None:
        ins.append(emit_expr(rw, plan.mask, meta))
    att = rw.emit("attention", ins, meta=meta, scale=plan.scale, causal=plan.causal).out
    shape = plan.anchor.outputs[0].type.shape
    out = att if att.type.shape == shape else rw.emit("reshape", [att], meta=meta, shape=shape).out
    return att, out


def _valid(plan: Plan) -> bool:
    """The planned attention node type-checks and gives the anchor's dtype and element count."""
    ins = [plan.q, plan.k, plan.v] + ([plan.mask] if plan.mask is not None else [])
    opdef = OPS["attention"]
    try:
        (out,) = opdef.infer([e.type for e in ins], opdef.check_attrs({"scale": plan.scale, "causal": plan.causal}))
    except (TypeError, ValueError):
        return False
    want = plan.anchor.outputs[0].type
    return out.dtype == want.dtype and out.numel == want.numel and out.device == want.device


# -------------------------------------------------------------------------------- masks
def canonical_mask(facts: Facts, mask: Expr | None, q_len: int, k_len: int) -> tuple[Expr | None, bool, list[str]]:
    """(mask, causal, counters): a constant mask that keeps everything is dropped, one equal to
    the top-left causal triangle becomes causal=True; an `and` with an all-true constant is
    narrowed to its other operand (BERT's padding mask: [B,1,1,S] instead of [B,1,L,S]);
    anything else stays."""
    if mask is None:
        return None, False, []
    notes: list[str] = []
    while (and_ := facts.producer(mask, "logical_and")) is not None:
        # and(all-true constant, m) == m broadcast; the attention op broadcasts masks itself
        keep = [v for v in and_.inputs if not _all_true(facts, v)]
        if len(keep) != 1:
            break
        mask = keep[0]
        notes.append("mask_narrowed")
    key = ("mask_kind", mask, q_len, k_len)
    if key not in facts.memo:
        t = eval_expr(facts, mask)
        facts.memo[key] = None if t is None else classify_const_mask(t, q_len, k_len)
    kind = facts.memo[key]
    if kind is not None:
        if kind == "keep_all":
            return None, False, ["mask_dropped"]
        if kind == "causal":
            return None, True, ["mask_to_causal"]
    return mask, False, notes


def _all_true(facts: Facts, v: Value) -> bool:
    t = facts.const_value(v)
    return t is not None and t.dtype == torch.bool and bool(t.all())


def _kv_pair(facts: Facts, k: Expr, v: Expr, batch: tuple[int, ...]) -> tuple[Expr, Expr, bool] | None:
    """k and v viewed in `batch` (+ their matrix axes), both un-repeated when both repeat their
    heads by the same factor."""
    uk, uv = unrepeat_heads(facts, k, batch), unrepeat_heads(facts, v, batch)
    if uk is None or uv is None:
        return None
    if uk[1] == uv[1] > 1:
        return uk[0], uv[0], True
    s, e = k.type.shape[-2:]
    sv, ev = v.type.shape[-2:]
    return view_as(facts, k, batch + (s, e)), view_as(facts, v, batch + (sv, ev)), False


def plan_sdpa(facts: Facts, node: Node) -> Plan | None:
    """Canonicalize an existing attention node (GQA repetition, constant masks)."""
    q, k, v = node.inputs[:3]
    mask: Expr | None = node.inputs[3] if len(node.inputs) == 4 else None
    counters: list[str] = []
    k_e: Expr = k
    v_e: Expr = v
    if k.type.shape[:-2] == v.type.shape[:-2]:
        pair = _kv_pair(facts, k, v, k.type.shape[:-2])
        if pair is not None and pair[2]:
            k_e, v_e = pair[0], pair[1]
            counters.append("sdpa_gqa_unrepeated")
    if isinstance(mask, Value) and is_float(mask.type.dtype):
        m, form, _ = additive_mask(facts, mask)
        if form == "where_bool_additive":
            mask = m
            counters.append("mask_to_bool")
    mask, causal, notes = canonical_mask(facts, mask, q.type.shape[-2], k.type.shape[-2])
    counters += notes
    if not counters:
        return None
    plan = Plan(node, q, k_e, v_e, mask, node.attrs["scale"], causal or node.attrs["causal"], counters)
    return plan if _valid(plan) else None


# --------------------------------------------------------------------------- eager chain
def match_scores(facts: Facts, s: Value) -> tuple[Node, float, list[Node]] | str:
    """Q K^T times a scale: (matmul node, scale, nodes from s down to the matmul), or the
    reason it is not ('nonscalar_scale' when a non-uniform factor multiplies Q K^T)."""
    nodes: list[Node] = []
    scale = 1.0
    while True:
        n = facts.producer(s)
        if n is None:
            return "no_qk"
        if n.op == "matmul":
            return n, scale, nodes + [n]
        if n.op == "reshape" and keeps_matrix(n):
            nodes.append(n)
            s = n.inputs[0]
            continue
        if n.op in ("mul", "div"):
            sc = scaled_operand(facts, n)
            if sc is None:
                reaches = any(not isinstance(match_scores(facts, x), str) for x in n.inputs)
                return "nonscalar_scale" if reaches else "no_qk"
            nodes.append(n)
            s, f = sc
            scale *= f
            continue
        return "no_qk"


def _probs_source(facts: Facts, p: Value) -> tuple[Value, list[Node]]:
    """Strip batch-regrouping reshapes and float casts between softmax and matmul(P, V)."""
    nodes: list[Node] = []
    while True:
        n = facts.producer(p, "reshape", "cast")
        if n is None:
            return p, nodes
        if n.op == "reshape" and not keeps_matrix(n):
            return p, nodes
        if n.op == "cast" and not (is_float(n.inputs[0].type.dtype) and is_float(n.outputs[0].type.dtype)):
            return p, nodes
        nodes.append(n)
        p = n.inputs[0]


def plan_eager(facts: Facts, pv: Node, ctx: PassContext) -> Plan | None:
    """Match the eager chain ending in matmul(P, V) (see EAGER_CHAIN)."""
    p3, v3 = pv.inputs
    ob = pv.outputs[0].type.shape[:-2]
    p, chain = _probs_source(facts, p3)
    sm = match_softmax(facts, p)
    if sm is None:
        return None
    if p3.type.shape[:-2] != ob or v3.type.shape[:-2] != ob:
        ctx.count("skipped_batch_broadcast")
        return None
    x = sm.x
    if sm.axis != x.type.rank - 1 or x.type.rank < 2:
        ctx.count("skipped_softmax_axis")
        return None
    chain += sm.nodes
    up = facts.producer(x, "cast")
    if up is not None and is_float(up.inputs[0].type.dtype):
        chain.append(up)
        x = up.inputs[0]

    found: tuple[Node, float, list[Node]] | None = None
    mask_match: MaskMatch | None = None
    reasons: set[str] = set()
    for scores, mm in mask_candidates(facts, x):
        got = match_scores(facts, scores)
        if isinstance(got, str):
            reasons.add(got)
            continue
        found, mask_match = got, mm
        break
    if found is None:
        if "nonscalar_scale" in reasons:
            ctx.count("skipped_nonscalar_scale")
        return None
    qk, scale, score_nodes = found
    chain += score_nodes
    if mask_match is not None:
        chain.append(mask_match.node)

    allowed = set(chain) | {pv}
    if any(not facts.used_only_by(o, allowed) for n in chain for o in n.outputs):
        ctx.count("skipped_intermediate_used")
        return None

    sb = x.type.shape[:-2] or (1,)
    q_len, k_len = x.type.shape[-2:]
    if mask_match is not None and mask_match.may_mask_full_row and not sm.safe:
        t = eval_expr(facts, mask_match.mask)
        keep = None if t is None else (t if t.dtype == torch.bool else t != float("-inf"))
        if keep is None or full_row_masked(keep, k_len):
            ctx.count("skipped_full_row_mask")
            return None

    qx, ktx = qk.inputs
    mb = qk.outputs[0].type.shape[:-2]
    if qx.type.shape[:-2] != mb or ktx.type.shape[:-2] != mb:
        ctx.count("skipped_batch_broadcast")
        return None
    q_base, fq = peel_operand(facts, qx)
    kt_base, fk = peel_operand(facts, ktx)
    k_e = untranspose(facts, kt_base)
    if isinstance(k_e, Value):
        k_e, fk2 = peel_operand(facts, k_e)
        fk *= fk2
    q_e = view_as(facts, q_base, sb + q_base.type.shape[-2:])
    pair = _kv_pair(facts, k_e, v3, sb)
    if pair is None:
        ctx.count("skipped_types")
        return None
    k_v, v_v, unrepeated = pair

    mask = mask_match.mask if mask_match is not None else None
    mask, causal, notes = canonical_mask(facts, mask, q_len, k_len)
    counters = ["decomposed_sdpa_chain" if sm.safe else "eager_softmax_chain"] + notes
    if mask_match is not None and mask_match.form == "where_bool_additive":
        counters.append("mask_to_bool")
    if unrepeated:
        counters.append("eager_gqa_unrepeated")
    plan = Plan(pv, q_e, k_v, v_v, mask, float(scale * fq * fk), causal, counters)
    if not _valid(plan):
        ctx.count("skipped_types")
        return None
    return plan

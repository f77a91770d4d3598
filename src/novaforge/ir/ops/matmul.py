"""Anchors: `matmul` (batched) and `attention` (fused scaled-dot-product attention).

Fusion builds kernels around anchors: a prologue of views (as strides) and an epilogue of
elementwise ops (bias, activation, residual add, cast) on the anchor's output.

Invariant: operands share one float or integer dtype (matmul), except a weight-only quantized
product: a float A times an int8 B computes A @ B.to(A's dtype) in A's dtype (only the pass
recognize_int8_weights builds it; lowering keeps eager's same-dtype rule); int8 A and int8 B with
`out_dtype=torch.int32` sum the products exactly in int32 (`aten._int_mm`; the CPU backend runs
nf_gemm's int8 kernel, other backends the float32 form of passes/expand_int_matmul.py) / one float dtype
(attention); batch dimensions broadcast; attention's key/value heads divide the query heads (GQA).
"""

from __future__ import annotations

import math

import torch

from ..types import TensorType, broadcast_shapes, is_float
from .core import REQUIRED, define, device_of, same_dtype

aten = torch.ops.aten
FAMILY = "matmul"


def _matmul_infer(ts, a):
    x, y = ts
    if a.get("out_dtype") is not None:
        if (x.dtype, y.dtype, a["out_dtype"]) != (torch.int8, torch.int8, torch.int32):
            raise TypeError(f"matmul: out_dtype={a['out_dtype']} needs int8 operands and int32 (got {x} and {y})")
        dt = torch.int32
    else:
        dt = x.dtype if is_int8_weight_product(x.dtype, y.dtype) else same_dtype("matmul", ts)
    if x.rank < 2 or y.rank < 2:
        raise ValueError(f"matmul: operands need rank >= 2, got {x} and {y}")
    if x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {x} @ {y}")
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return [TensorType(batch + (x.shape[-2], y.shape[-1]), dt, device_of("matmul", ts))]


def is_int8_weight_product(a: torch.dtype, b: torch.dtype) -> bool:
    """float A @ int8 B: B is a weight-only quantized operand, converted to A's dtype in registers."""
    return b == torch.int8 and is_float(a)


def _matmul_eval(xs, a):
    x, y = xs
    if a.get("out_dtype") is not None:
        return exact_int_matmul(x, y)
    return torch.matmul(x, y.to(x.dtype) if is_int8_weight_product(x.dtype, y.dtype) else y)


INT_MM_EXACT_K = 1024  # K per float32 product of int8 operands: |partial sums| <= 1024 * 128 * 128 = 2^24


def exact_int_matmul(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int8 x @ int8 y summed exactly in int32, as `aten._int_mm` (batched operands broadcast): float32
    products over chunks of K of at most INT_MM_EXACT_K, each exact (every partial sum is an integer of
    magnitude <= 2^24, exactly representable in any summation order), converted to int32 and added in
    int32 (wrapping as eager's int32 accumulator would)."""
    K = x.shape[-1]
    acc = None
    for k0 in range(0, max(K, 1), INT_MM_EXACT_K):
        part = torch.matmul(x[..., k0:k0 + INT_MM_EXACT_K].float(), y[..., k0:k0 + INT_MM_EXACT_K, :].float())
        part = part.to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    if out is not None:
        out.copy_(acc)
        return out
    return acc


def _matmul_flops(ins, outs, attrs) -> float:
    return 2.0 * outs[0].numel * ins[0].shape[-1]


matmul_ = define("matmul", 2, _matmul_infer, _matmul_eval, flags={"anchor"}, attrs={"out_dtype": None},
                 doc="batched matmul [..., M, K] @ [..., K, N] with broadcast batch dimensions; int8 operands with "
                     "out_dtype=torch.int32 sum exactly in int32 (aten._int_mm)", family=FAMILY,
                 cost=_matmul_flops)


def matmul(ctx, a, b):
    """torch.matmul semantics, including 1-D operands."""
    squeeze_m = squeeze_n = False
    if a.type.rank == 1:
        a, squeeze_m = ctx.reshape(a, (1, a.type.shape[0])), True
    if b.type.rank == 1:
        b, squeeze_n = ctx.reshape(b, (b.type.shape[0], 1)), True
    out = ctx.emit("matmul", [a, b])
    shape = out.type.shape
    if squeeze_n:
        shape = shape[:-1]
    if squeeze_m:
        shape = shape[:-2] + shape[-1:] if not squeeze_n else shape[:-1]
    return ctx.reshape(out, shape)


def operands(ctx, *args):
    """The tensor arguments (None skipped) in the result dtype."""
    vals = [ctx.val(a) for a in args if a is not None]
    dt = ctx.out_type.dtype
    return [ctx.cast(v, dt) for v in vals]


def same_dtype_check(ctx, *args, **_kwargs) -> None:
    """Eager's matrix products require one dtype for all tensor operands (a float64 or int64 input
    to a float32 nn.Linear raises there, zero-size or not), so they raise here too, as RuntimeError.
    The frontend runs it before lowering (frontend/lower_ctx.py ARG_CHECKS)."""
    args = [a for a in args if isinstance(a, torch.fx.Node)]
    dtypes = {ctx.val(a).type.dtype for a in args if a is not None}
    if len(dtypes) > 1:
        a, b = sorted(dtypes, key=str)[:2]
        raise RuntimeError(ctx.describe(f"expected all operands to have the same dtype, but got {a} and {b}"))


@matmul_.lowers(aten.mm.default, aten.bmm.default, aten.matmul.default, aten.mv.default, aten.dot.default)
def _lower_mm(ctx, a, b):
    x, y = operands(ctx, a, b)
    return matmul(ctx, x, y)


def _scaled(ctx, v, s):
    return v if s == 1 else ctx.emit("mul", [v, ctx.scalar(s, v.type.dtype)])


@matmul_.lowers(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _lower_addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    x, y = operands(ctx, a, b)
    out = _scaled(ctx, matmul(ctx, x, y), alpha)
    if beta == 0:
        return out
    c = _scaled(ctx, ctx.cast(ctx.val(bias), out.type.dtype), beta)
    return ctx.emit("add", [out, c])


@matmul_.lowers(aten.linear.default)
def _lower_linear(ctx, x, weight, bias=None):
    v, w = operands(ctx, x, weight)
    wt = ctx.permute(w, (1, 0)) if w.type.rank == 2 else w
    out = matmul(ctx, v, wt)
    if bias is not None:
        out = ctx.emit("add", [out, ctx.cast(ctx.val(bias), out.type.dtype)])
    return out


@matmul_.lowers(aten._weight_int8pack_mm.default)
def _lower_weight_int8pack_mm(ctx, x, weight, scales):
    """(x @ W_int8^T) * scales[N] (torchao's CPU int8 weight-only kernel): the dequantize pattern,
    which passes/recognize_int8_weights.py turns into nf_gemm's int8 product on the CPU."""
    v = ctx.val(x)
    wt = ctx.permute(ctx.cast(ctx.val(weight), v.type.dtype), (1, 0))
    out = matmul(ctx, v, wt)
    return ctx.emit("mul", [out, ctx.cast(ctx.val(scales), out.type.dtype)])


@matmul_.lowers(aten._int_mm.default)
def _lower_int_mm(ctx, a, b):
    """int8 [M, K] x int8 [K, N] -> int32 (torchao's dynamic int8 activations x int8 weights): one
    exact int32 product. ATen's CPU kernel for it is a scalar loop on a CPU without VNNI/AMX (3.8 s
    for GPT-2's prefill on a Zen 3); the CPU backend runs nf_gemm's int8 x int8 kernel (a constant
    weight packed once, int8), the Triton backend the exact float32 form (passes/expand_int_matmul.py)."""
    return ctx.emit("matmul", [ctx.val(a), ctx.val(b)], out_dtype=torch.int32)


# --------------------------------------------------------------------------- attention
def _attention_infer(ts, a):
    q, k, v = ts[:3]
    dt = same_dtype("attention", [q, k, v])
    if not is_float(dt) or q.rank < 3 or k.rank != q.rank or v.rank != q.rank:
        raise TypeError(f"attention: q, k, v must be float tensors of equal rank >= 3: {q}, {k}, {v}")
    hq, hk = q.shape[-3], k.shape[-3]
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or hk != v.shape[-3] or hk == 0 or hq % hk:
        raise ValueError(f"attention: incompatible shapes q={q} k={k} v={v}")
    out = TensorType(q.shape[:-1] + (v.shape[-1],), dt, q.device)
    if len(ts) == 4:
        m = ts[3]
        if m.dtype != torch.bool and m.dtype != dt:
            raise TypeError(f"attention: mask must be bool or {dt}, got {m}")
        broadcast_shapes(m.shape, q.shape[:-1] + (k.shape[-2],))
    if a["causal"] and len(ts) == 4:
        raise ValueError("attention: causal and an explicit mask are exclusive")
    return [out]


def _attention_impl(xs, a):
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) == 4 else None
    gqa = q.shape[-3] != k.shape[-3]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=a["causal"], scale=a["scale"], enable_gqa=gqa)


def attention_flops(ins, outs, causal: bool) -> float:
    q, k, v = ins[:3]
    f = 2.0 * q.numel * k.shape[-2] + 2.0 * outs[0].numel * k.shape[-2]
    return f / 2 if causal else f


attention_ = define("attention", (3, 4), _attention_infer, _attention_impl,
                    attrs={"scale": REQUIRED, "causal": False}, flags={"anchor"},
                    doc="softmax(q k^T * scale + mask) v; q [..., Hq, L, E], k [..., Hk, S, E], v [..., Hk, S, Ev], "
                        "Hq % Hk == 0 (grouped-query heads); mask bool (True keeps) or additive float, broadcast to "
                        "[..., Hq, L, S]; causal uses the top-left aligned lower triangle", family=FAMILY,
                    cost=lambda ins, outs, a: attention_flops(ins, outs, a["causal"]))


def attention(ctx, q, k, v, mask, is_causal: bool, scale):
    """One `attention` node; rank-2 q/k/v (no head axis) get a unit head axis around it."""
    qv, kv, vv = (ctx.val(a) for a in (q, k, v))
    dt = qv.type.dtype
    if not is_float(dt):
        raise ctx.unsupported("attention on non-float tensors")
    scale = 1.0 / math.sqrt(qv.type.shape[-1]) if scale is None else float(scale)
    ins = [qv, ctx.cast(kv, dt), ctx.cast(vv, dt)]
    if mask is not None:
        m = ctx.val(mask)
        ins.append(m if m.type.dtype == torch.bool else ctx.cast(m, dt))
    if qv.type.rank == 2:
        ins = [ctx.reshape(a, (1,) + a.type.shape) for a in ins]
    out = ctx.emit("attention", ins, scale=scale, causal=bool(is_causal))
    return ctx.reshape(out, ctx.out_types[0].shape)


@attention_.lowers(aten.scaled_dot_product_attention.default)
def _lower_sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if dropout_p:
        return ctx.extern("attention dropout")
    return attention(ctx, q, k, v, attn_mask, is_causal, scale)


@attention_.lowers(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _lower_sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        return ctx.extern("attention dropout")
    if ctx.used_outputs() - {0}:
        return _lower_attention_lse(ctx, q, k, v, attn_mask, is_causal, scale)
    out = attention(ctx, q, k, v, attn_mask, is_causal, scale)
    return (out,) + (None,) * (len(ctx.fx_node.meta["val"]) - 1)


def _heads_first(ctx, v):
    """A heads-last value [..., L, H, E] seen as [..., H, L, E]."""
    r = v.type.rank
    return ctx.permute(v, tuple(range(r - 3)) + (r - 2, r - 3, r - 1))


def _lower_attention_lse(ctx, q, k, v, mask, is_causal: bool, scale):
    """Training's forward (autograd saves the logsumexp for the backward): one `attention_lse` node."""
    ins = [ctx.val(a) for a in (q, k, v)] + ([ctx.val(mask)] if mask is not None else [])
    if ins[0].type.rank < 3:
        return ctx.extern("attention without a head axis")
    if mask is not None and is_causal:
        return ctx.extern("attention with both a mask and is_causal")
    scale = 1.0 / math.sqrt(ins[0].type.shape[-1]) if scale is None else float(scale)
    node = ctx.emit_node("attention_lse", ins, {"scale": scale, "causal": bool(is_causal)})
    return (_heads_first(ctx, node.outputs[0]), node.outputs[1])


# ------------------------------------------------------- attention for training (forward, backward)
def _heads_last(t: TensorType) -> TensorType:
    """[..., H, L, E] -> the type of the same tensor stored as [..., L, H, E]."""
    return TensorType(t.shape[:-3] + (t.shape[-2], t.shape[-3], t.shape[-1]), t.dtype, t.device)


def _attention_lse_infer(ts, a):
    (out,) = _attention_infer(ts, a)
    return [_heads_last(out), TensorType(out.shape[:-1], torch.float32, out.device)]


def _aten_flash(op, xs, n: int, a):
    """ATen's CPU flash `op` on the tensors xs[:n] and the optional mask xs[n] (no dropout)."""
    return op(*xs[:n], 0.0, a["causal"], attn_mask=xs[n] if len(xs) > n else None, scale=a["scale"])


def _attention_lse_impl(xs, a):
    if xs[0].is_cuda:
        from .attention_cuda_impl import attention_lse_cuda

        return attention_lse_cuda(xs, a)
    out, lse = _aten_flash(aten._scaled_dot_product_flash_attention_for_cpu, xs, 3, a)
    return out.transpose(-3, -2).contiguous(), lse.contiguous()


attention_lse_ = define(
    "attention_lse", (3, 4), _attention_lse_infer, _attention_lse_impl,
    attrs={"scale": REQUIRED, "causal": False}, family=FAMILY,
    doc="attention's output stored heads-last ([..., L, Hq, Ev]) and its float32 row logsumexp [..., Hq, L] "
        "(log sum exp of q k^T * scale + mask; 0 for a row without keys): the forward that training saves for "
        "attention_backward, as ATen's CPU flash forward does",
    cost=lambda ins, outs, a: attention_flops(ins, [_attention_infer(ins, a)[0]], a["causal"]))


def _attention_backward_infer(ts, a):
    g, q, k, v, o, lse = ts[:6]
    _attention_infer([q, k, v] + list(ts[6:]), a)
    if g.shape != o.shape or o.shape != q.shape[:-1] + (v.shape[-1],) or g.dtype != q.dtype or o.dtype != q.dtype:
        raise ValueError(f"attention_backward: grad_out {g} and out {o} must match the attention's output")
    if lse.dtype != torch.float32 or lse.shape != q.shape[:-1]:
        raise ValueError(f"attention_backward: logsumexp must be float32 of shape {q.shape[:-1]}, got {lse}")
    return [_heads_last(q), _heads_last(k), _heads_last(v)]


def _attention_backward_impl(xs, a):
    if xs[0].is_cuda:
        from .attention_cuda_impl import attention_backward_cuda

        return attention_backward_cuda(xs, a)
    grads = _aten_flash(aten._scaled_dot_product_flash_attention_for_cpu_backward, xs, 6, a)
    return tuple(t.transpose(-3, -2).contiguous() for t in grads)


attention_backward_ = define(
    "attention_backward", (6, 7), _attention_backward_infer, _attention_backward_impl,
    attrs={"scale": REQUIRED, "causal": False}, family=FAMILY,
    doc="(dq, dk, dv) of attention(q, k, v[, mask]) from (grad_out, q, k, v, out, logsumexp[, mask]), "
        "each gradient stored heads-last ([..., L, H, E], the layout of ATen's CPU flash backward); "
        "the mask is additive, of q's dtype",
    cost=lambda ins, outs, a: 2.5 * attention_flops(ins[1:4], ins[4:5], a["causal"]))


@attention_backward_.lowers(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _lower_sdpa_flash_cpu_backward(ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
                                   attn_mask=None, scale=None):
    """The backward of `_scaled_dot_product_flash_attention_for_cpu` (what autograd records for
    SDPA on the CPU): one `attention_backward` node, its heads-last gradients seen as [..., H, L, E]."""
    if dropout_p:
        return ctx.extern("attention dropout")
    ins = [ctx.val(t) for t in (grad_out, query, key, value, out, logsumexp)]
    if attn_mask is not None:
        ins.append(ctx.val(attn_mask))
    if ins[1].type.rank < 3:
        return ctx.extern("attention without a head axis")
    scale = 1.0 / math.sqrt(ins[1].type.shape[-1]) if scale is None else float(scale)
    node = ctx.emit_node("attention_backward", ins, {"scale": scale, "causal": bool(is_causal)})
    return tuple(_heads_first(ctx, o) for o in node.outputs)


# ---------------------------------------------------------------------------- VJP rules
@matmul_.defvjp
def _matmul_vjp(b, n, cts):  # dA = G B^T, dB = A^T G (broadcast batch dims summed back by autodiff)
    a, c = n.inputs
    (g,) = cts
    return [b.emit("matmul", [g, b.transpose_last(c)]), b.emit("matmul", [b.transpose_last(a), g])]


def _heads(b, v, hq: int):
    """[..., Hk, S, D] -> [..., Hq, S, D]: key/value head h // (Hq / Hk) serves query head h."""
    *batch, hk, s, d = v.type.shape
    if hk == hq:
        return v
    rep = hq // hk
    v = b.expand(b.reshape(v, (*batch, hk, 1, s, d)), (*batch, hk, rep, s, d))
    return b.reshape(v, (*batch, hq, s, d))


def _heads_back(b, g, hk: int):
    """The cotangent of `_heads`: the query heads of one key/value head summed."""
    *batch, hq, s, d = g.type.shape
    if hk == hq:
        return g
    r = len(batch)
    return b.reshape(b.sum(b.reshape(g, (*batch, hk, hq // hk, s, d)), (r + 1,), keepdim=True), (*batch, hk, s, d))


@attention_.defvjp
def _attention_vjp(b, n, cts):
    """Recompute P = softmax(q k^T scale + mask) in float32, then dV = P^T G, dP = G V^T,
    dS = P (dP - rowsum(dP P)), dQ = dS K scale, dK = dS^T Q scale (GQA heads summed back);
    an additive float mask gets dS."""
    q, k, v = n.inputs[:3]
    mask = n.inputs[3] if len(n.inputs) == 4 else None
    hq, hk = q.type.shape[-3], k.type.shape[-3]
    qf, kf, vf, gf = (b.opmath(t) for t in (q, _heads(b, k, hq), _heads(b, v, hq), cts[0]))
    scale = n.attrs["scale"]
    s = b.mul(b.emit("matmul", [qf, b.transpose_last(kf)]), scale)
    last = s.type.rank - 1
    length, keys = s.type.shape[-2], s.type.shape[-1]
    if n.attrs["causal"]:
        dev = s.type.device
        rows = b.reshape(b.emit("iota", [], length=length, dtype=torch.int64, device=dev), (length, 1))
        cols = b.reshape(b.emit("iota", [], length=keys, dtype=torch.int64, device=dev), (1, keys))
        s = b.where(b.emit("le", [cols, rows]), s, -math.inf)
    elif mask is not None and mask.type.dtype == torch.bool:
        s = b.where(mask, s, -math.inf)
    elif mask is not None:
        s = b.add(s, b.opmath(mask))
    e = b.emit("exp", [b.sub(s, b.emit("max", [s], axes=(last,), keepdim=True))])
    p = b.div(e, b.sum(e, (last,), keepdim=True))
    dv = b.emit("matmul", [b.transpose_last(p), gf])
    dp = b.emit("matmul", [gf, b.transpose_last(vf)])
    ds = b.mul(p, b.sub(dp, b.sum(b.mul(dp, p), (last,), keepdim=True)))
    dq = b.mul(b.emit("matmul", [ds, kf]), scale)
    dk = b.mul(b.emit("matmul", [b.transpose_last(ds), qf]), scale)
    out = [b.cast(dq, q.type.dtype), b.cast(_heads_back(b, dk, hk), k.type.dtype),
           b.cast(_heads_back(b, dv, hk), v.type.dtype)]
    if mask is not None:
        out.append(None if mask.type.dtype == torch.bool else b.cast(b.unbroadcast(ds, mask.type.shape),
                                                                     mask.type.dtype))
    return out

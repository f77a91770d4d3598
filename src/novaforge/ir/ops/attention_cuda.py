"""CUDA's SDPA forms, lowered to the attention records of matmul.py.

On a CUDA tensor, `F.scaled_dot_product_attention` dispatches (while any capture traces) to one
of three ATen ops, chosen by dtype, hardware and flags: `_scaled_dot_product_cudnn_attention`
(bf16/fp16 on Hopper), `_scaled_dot_product_flash_attention` (bf16/fp16 elsewhere) and
`_scaled_dot_product_efficient_attention` (float32, masks), each with its backward. All six lower
here: a forward whose logsumexp nothing reads becomes one `attention` node; a training forward an
`attention_lse` node; a backward an `attention_backward` node.

The ops differ in their logsumexp's shape: flash [B, H, L], cuDNN [B, H, L, 1], efficient
[B, H, ceil(L / 32) * 32] (zero padded). The lowered forward returns it in its op's shape (so a
saved tensor between separately compiled forward and backward programs has the shape ATen
declared) and the backward takes it back to [B, H, L]. Their seed/offset outputs (dropout state)
are zeros: dropout is an extern, never lowered here.

Invariant: lowered or not, a CUDA attention computes softmax(q k^T * scale + mask) v with the
top-left causal triangle, and its backward the gradients of that, as eager's op does.
"""

from __future__ import annotations

import math

import torch

from .matmul import _heads_first, attention_, attention_backward_

aten = torch.ops.aten


def _out_types(ctx):
    """(shape, dtype) per output of the node (None for a non-tensor output), without
    LowerCtx.out_types, which refuses the ints and undefined tensors these ops also return."""
    vals = ctx.fx_node.meta.get("val")
    return [(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None for v in vals]


def _zeros_like_output(ctx, i: int, device: str):
    shape, dtype = _out_types(ctx)[i]
    return ctx.emit("full", (), shape=shape, value=0, dtype=dtype, device=device)


def _lse_as(ctx, lse, shape: tuple):
    """A logsumexp between our [B, H, L] and an ATen op's shape, either way: a trailing unit axis
    (cuDNN [B, H, L, 1]) reshaped, a longer or shorter last axis (efficient, zero padded to
    [B, H, P]) padded or cropped."""
    have = lse.type.shape
    if shape == have:
        return lse
    if shape == have + (1,) or have == shape + (1,):
        return ctx.reshape(lse, shape)
    if len(shape) == len(have) and shape[:-1] == have[:-1]:
        pads = ((0, 0),) * (len(have) - 1) + ((0, shape[-1] - have[-1]),)  # (negative: crop)
        return ctx.emit("pad", [lse], pads=pads, value=0.0)
    raise ctx.unsupported(f"a logsumexp of shape {have} where {shape} is expected")


def _forward(ctx, q, k, v, mask, dropout_p: float, is_causal: bool, scale):
    """Any of the three forwards: (out, lse in the op's shape, zeros for the other tensors)."""
    if dropout_p:
        return ctx.extern("attention dropout")
    if mask is not None and is_causal:
        return ctx.extern("attention with both a mask and is_causal")
    qv, kv, vv = (ctx.val(a) for a in (q, k, v))
    if qv.type.rank < 3:
        return ctx.extern("attention without a head axis")
    scale = 1.0 / math.sqrt(qv.type.shape[-1]) if scale is None else float(scale)
    ins = [qv, kv, vv] + ([ctx.val(mask)] if mask is not None else [])
    types = _out_types(ctx)
    device = qv.type.device
    results: list = [None] * len(types)
    used = {i for i in ctx.used_outputs() if i < len(types) and types[i] is not None}
    if used <= {0}:  # inference: no logsumexp
        out = ctx.emit("attention", ins, scale=scale, causal=bool(is_causal))
        results[0] = ctx.reshape(out, types[0][0])
        return tuple(results)
    node = ctx.emit_node("attention_lse", ins, {"scale": scale, "causal": bool(is_causal)})
    results[0] = _heads_first(ctx, node.outputs[0])
    results[1] = _lse_as(ctx, node.outputs[1], types[1][0])
    for i in used - {0, 1}:
        results[i] = _zeros_like_output(ctx, i, device)
    return tuple(results)


def _backward(ctx, grad_out, query, key, value, out, logsumexp, mask, dropout_p: float, is_causal: bool, scale):
    if dropout_p:
        return ctx.extern("attention dropout")
    ins = [ctx.val(t) for t in (grad_out, query, key, value, out)]
    if ins[1].type.rank < 3:
        return ctx.extern("attention without a head axis")
    rows = ins[1].type.shape[:-1]
    ins.append(_lse_as(ctx, ctx.val(logsumexp), rows))
    if mask is not None:
        m = ctx.val(mask)
        if m.type.dtype != ins[1].type.dtype:
            return ctx.extern("attention backward with a mask of another dtype")
        ins.append(m)
    scale = 1.0 / math.sqrt(ins[1].type.shape[-1]) if scale is None else float(scale)
    node = ctx.emit_node("attention_backward", ins, {"scale": scale, "causal": bool(is_causal)})
    return tuple(_heads_first(ctx, o) for o in node.outputs)


@attention_.lowers(aten._scaled_dot_product_cudnn_attention.default)
def _lower_cudnn(ctx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                 return_debug_mask=False, *, scale=None):
    return _forward(ctx, q, k, v, attn_bias, dropout_p, is_causal, scale)


@attention_.lowers(aten._scaled_dot_product_efficient_attention.default)
def _lower_efficient(ctx, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    return _forward(ctx, q, k, v, attn_bias, dropout_p, is_causal, scale)


@attention_.lowers(aten._scaled_dot_product_flash_attention.default)
def _lower_flash(ctx, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    return _forward(ctx, q, k, v, None, dropout_p, is_causal, scale)


@attention_backward_.lowers(aten._scaled_dot_product_cudnn_attention_backward.default)
def _lower_cudnn_backward(ctx, grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
                          cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    return _backward(ctx, grad_out, query, key, value, out, logsumexp, attn_bias, dropout_p, is_causal, scale)


@attention_backward_.lowers(aten._scaled_dot_product_efficient_attention_backward.default)
def _lower_efficient_backward(ctx, grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
                              philox_offset, dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    if attn_bias is not None and len(grad_input_mask) > 3 and grad_input_mask[3]:
        return ctx.extern("the gradient of an attention bias")
    grads = _backward(ctx, grad_out, query, key, value, out, logsumexp, attn_bias, dropout_p, is_causal, scale)
    return tuple(grads) + (None,) if isinstance(grads, tuple) else grads


@attention_backward_.lowers(aten._scaled_dot_product_flash_attention_backward.default)
def _lower_flash_backward(ctx, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                          dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    return _backward(ctx, grad_out, query, key, value, out, logsumexp, None, dropout_p, is_causal, scale)


# ------------------------------------------------ reference implementations on CUDA tensors


def _as4(t: torch.Tensor) -> torch.Tensor:
    """[..., H, L, E] as [B, H, L, E] (a view where the leading dims allow it)."""
    if t.dim() == 3:
        return t.unsqueeze(0)
    return t.reshape((-1,) + tuple(t.shape[-3:])) if t.dim() > 4 else t


def _tf32() -> bool:
    """Float32 attention on TF32 tensor cores when the user allowed it for matmuls, as eager's would."""
    return torch.get_float32_matmul_precision() != "highest"


def _bias(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A mask as the additive bias [B, H, L, S] the efficient kernels take: rows 16-element
    aligned (the kernels refuse other row strides; SDPA pads the same way), S columns of them."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    s = k.shape[-2]
    shape = q.shape[:-1] + (s,)
    rows = torch.zeros(q.shape[:-1] + (s + -s % 16,), dtype=q.dtype, device=q.device)
    rows[..., :s] = mask.expand(shape)
    return _as4(rows[..., :s])


def _repeat_heads(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-3] == q.shape[-3] else t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)


def attention_lse_cuda(xs, a):
    """attention_lse on CUDA: novaforge's Triton flash kernels (attention_train.py) without a
    mask, ATen's memory-efficient kernels with one."""
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) > 3 else None
    lead = q.shape[:-3]
    if mask is None:
        from ...codegen.triton.attention_train import flash_attention_forward

        out, lse = flash_attention_forward(_as4(q), _as4(k), _as4(v), causal=a["causal"], scale=a["scale"],
                                           tf32=_tf32())
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # the record: 0 for a row without keys
    else:
        q4, k4, v4 = _as4(q), _as4(_repeat_heads(q, k)), _as4(_repeat_heads(q, v))
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q4, k4, v4, _bias(q, k, mask), True, 0.0,
                                                                      a["causal"], scale=a["scale"])
        lse = lse[..., :q.shape[-2]]
    out = out.reshape(lead + out.shape[-3:])
    return out.transpose(-3, -2).contiguous(), lse.reshape(q.shape[:-1]).contiguous()


def attention_backward_cuda(xs, a):
    """attention_backward on CUDA (the same kernels as attention_lse_cuda), gradients heads-last."""
    g, q, k, v, o, lse = xs[:6]
    mask = xs[6] if len(xs) > 6 else None
    if mask is None:
        from ...codegen.triton.attention_train import flash_attention_backward

        dq, dk, dv = flash_attention_backward(_as4(q), _as4(k), _as4(v), _as4(o), _as4(lse.unsqueeze(-1))[..., 0],
                                              _as4(g), causal=a["causal"], scale=a["scale"], tf32=_tf32())
    else:
        k4, v4 = _as4(_repeat_heads(q, k)), _as4(_repeat_heads(q, v))
        rows = lse.shape[-1]
        padded = torch.nn.functional.pad(_as4(lse.unsqueeze(-1))[..., 0], (0, -rows % 32))
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            _as4(g), _as4(q), k4, v4, _bias(q, k, mask), _as4(o), padded, zero, zero, 0.0,
            [True, True, True, False], a["causal"], scale=a["scale"])
        hk, hq = k.shape[-3], q.shape[-3]
        if hk != hq:
            dk = dk.reshape(dk.shape[0], hk, hq // hk, *dk.shape[2:]).sum(2)
            dv = dv.reshape(dv.shape[0], hk, hq // hk, *dv.shape[2:]).sum(2)
    out = []
    for grad, like in ((dq, q), (dk, k), (dv, v)):
        out.append(grad.reshape(like.shape).transpose(-3, -2).contiguous())
    return tuple(out)

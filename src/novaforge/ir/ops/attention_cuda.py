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
are zeros: dropout is an extern, never lowered here. The records' implementations on CUDA tensors
(what the interpreter runs there) are in attention_cuda_impl.py.

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

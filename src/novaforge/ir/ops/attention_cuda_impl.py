"""The reference implementations of the attention records on CUDA tensors (matmul.py's
`attention_lse` and `attention_backward` call these for CUDA inputs).

Without a mask they run the flash kernels in `FLASH` ("forward": (q, k, v, *, causal, scale,
tf32) -> (out, lse); "backward": (q, k, v, o, lse, do, *, causal, scale, tf32) -> (dq, dk, dv),
with [B, H, L, E] operands and GQA heads): novaforge's Triton kernels
(codegen/triton/attention_train.py), which the codegen package installs when it is imported
(codegen/__init__.py; novaforge/__init__ imports it). The IR names no backend, so it is given
them. With a mask, or where none are installed, ATen's memory-efficient kernels run.

Invariant: the forward returns softmax(q k^T * scale + mask) v heads-last with the top-left causal
triangle and the [B, H, L] float32 logsumexp (0 for a row without keys), and the backward the
gradients of that, heads-last, as the records' CPU implementation does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

FLASH: dict[str, Callable[..., Any]] = {}  # "forward" / "backward": filled by codegen (see the module doc)


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
    """attention_lse on CUDA: the flash kernels in `FLASH` (novaforge's Triton kernels) without a
    mask, ATen's memory-efficient kernels with one (or where none are installed)."""
    q, k, v = xs[:3]
    mask = xs[3] if len(xs) > 3 else None
    lead = q.shape[:-3]
    flash = FLASH.get("forward") if mask is None else None
    if flash is not None:
        out, lse = flash(_as4(q), _as4(k), _as4(v), causal=a["causal"], scale=a["scale"], tf32=_tf32())
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # the record: 0 for a row without keys
    else:
        q4, k4, v4 = _as4(q), _as4(_repeat_heads(q, k)), _as4(_repeat_heads(q, v))
        bias = _bias(q, k, mask) if mask is not None else None
        out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q4, k4, v4, bias, True, 0.0, a["causal"],
                                                                      scale=a["scale"])
        lse = lse[..., :q.shape[-2]]
    out = out.reshape(lead + out.shape[-3:])
    return out.transpose(-3, -2).contiguous(), lse.reshape(q.shape[:-1]).contiguous()


def attention_backward_cuda(xs, a):
    """attention_backward on CUDA (the same kernels as attention_lse_cuda), gradients heads-last."""
    g, q, k, v, o, lse = xs[:6]
    mask = xs[6] if len(xs) > 6 else None
    flash = FLASH.get("backward") if mask is None else None
    if flash is not None:
        dq, dk, dv = flash(_as4(q), _as4(k), _as4(v), _as4(o), _as4(lse.unsqueeze(-1))[..., 0], _as4(g),
                           causal=a["causal"], scale=a["scale"], tf32=_tf32())
    else:
        k4, v4 = _as4(_repeat_heads(q, k)), _as4(_repeat_heads(q, v))
        rows = lse.shape[-1]
        padded = torch.nn.functional.pad(_as4(lse.unsqueeze(-1))[..., 0], (0, -rows % 32))
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        bias = _bias(q, k, mask) if mask is not None else None
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            _as4(g), _as4(q), k4, v4, bias, _as4(o), padded, zero, zero, 0.0,
            [True, True, True, False], a["causal"], scale=a["scale"])
        hk, hq = k.shape[-3], q.shape[-3]
        if hk != hq:
            dk = dk.reshape(dk.shape[0], hk, hq // hk, *dk.shape[2:]).sum(2)
            dv = dv.reshape(dv.shape[0], hk, hq // hk, *dv.shape[2:]).sum(2)
    out = []
    for grad, like in ((dq, q), (dk, k), (dv, v)):
        out.append(grad.reshape(like.shape).transpose(-3, -2).contiguous())
    return tuple(out)

"""Hand-written Triton kernels for training steps: a multi-tensor fused AdamW update,
LayerNorm / RMSNorm backward, and cross-entropy forward + backward over the vocabulary.

These are standalone functions on torch tensors (not yet wired into compiled graphs: the
training compiler will call them). They run on CUDA tensors on the GPU and on CPU tensors in
Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported), which is how
tests/codegen/triton/test_train_kernels.py checks them against torch autograd.

Invariants:
* `MultiTensorAdamW(params, grads, exp_avgs, exp_avg_sqs)(step=t, ...)` updates every tensor in
  place exactly as `torch.optim.AdamW` (amsgrad=False, maximize=False) does at step t (t counted
  from 1, already incremented): decoupled weight decay, bias corrections 1 - beta^t. One launch
  per (param dtype, grad dtype) group covers all tensors: a device table of base addresses and
  numels plus a table of BLOCK-element chunks, so the whole optimizer step is one or two kernel
  launches and CUDA-graph capturable (`step` may be a device tensor, read by the kernel).
* `norm_backward(dy, x, weight, bias, eps, rms)` returns (dx, dweight, dbias) of LayerNorm
  (rms=False) or RMSNorm (rms=True) over the last dim, recomputing the row statistics (nothing
  saved from the forward); weight gradients are reduced deterministically (per-program partial
  rows, then a column sum), never with atomics.
* `cross_entropy_forward_backward(logits, target)` returns the mean loss over targets !=
  ignore_index (as F.cross_entropy) and, unless need_grad=False, d loss / d logits, in one pass
  pair over each row of the vocabulary (an online log-sum-exp, then the softmax gradient; the
  gradient may overwrite the logits, inplace=True, to save a [rows, vocab] buffer).
All arithmetic is in float32; 16-bit inputs are read and written in their own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from . import loader

_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _mode(*tensors: torch.Tensor) -> bool:
    """True when the tensors are on the CPU (Triton's interpreter); checks that triton runs in that mode."""
    devs = {t.device for t in tensors}
    if len(devs) != 1:
        raise ValueError(f"tensors on several devices: {sorted(map(str, devs))}")
    interpret = next(iter(devs)).type == "cpu"
    loader.ensure_mode(interpret)
    return interpret


def _programs_for(rows: int, device: torch.device) -> int:
    if device.type == "cpu":
        return max(1, min(rows, 4))
    return max(1, min(rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count))


# ----------------------------------------------------------------------------------- AdamW


@triton.jit
def _typed_ptr(addr, KIND: tl.constexpr):
    if KIND == 1:
        return addr.to(tl.pointer_type(tl.bfloat16))
    elif KIND == 2:
        return addr.to(tl.pointer_type(tl.float16))
    else:
        return addr.to(tl.pointer_type(tl.float32))


@triton.jit
def _adamw_kernel(table, chunks, step_ptr, lr, beta1, beta2, log_beta1, log_beta2, eps, weight_decay,
                  BLOCK: tl.constexpr, P_KIND: tl.constexpr, G_KIND: tl.constexpr):
    c = tl.program_id(0)
    t = tl.load(chunks + 2 * c)
    start = tl.load(chunks + 2 * c + 1)
    n = tl.load(table + 5 * t + 4)
    p_ptr = _typed_ptr(tl.load(table + 5 * t), P_KIND)
    g_ptr = _typed_ptr(tl.load(table + 5 * t + 1), G_KIND)
    m_ptr = tl.load(table + 5 * t + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(table + 5 * t + 3).to(tl.pointer_type(tl.float32))
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    step = tl.load(step_ptr).to(tl.float32)
    bc1 = 1.0 - tl.exp(step * log_beta1)  # 1 - beta1 ** step
    bc2 = 1.0 - tl.exp(step * log_beta2)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = p * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / tl.sqrt(bc2) + eps
    p = p - (lr / bc1) * (m / denom)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


class MultiTensorAdamW:
    """AdamW over a fixed list of (param, grad, exp_avg, exp_avg_sq) tensors: the address and
    chunk tables are built once (the tensors must keep their storage), each call is one launch
    per dtype group. Params float32, bfloat16 or float16; grads any of those; states float32;
    all contiguous and on one device."""

    BLOCK = 1024

    def __init__(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                 exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor]) -> None:
        if not (len(params) == len(grads) == len(exp_avgs) == len(exp_avg_sqs)):
            raise ValueError("params, grads and states must have the same length")
        tensors = [*params, *grads, *exp_avgs, *exp_avg_sqs]
        self.interpret = _mode(*tensors) if tensors else True
        self.device = tensors[0].device if tensors else torch.device("cpu")
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)):
            if not all(t.is_contiguous() for t in (p, g, m, v)):
                raise ValueError(f"tensor {i} is not contiguous")
            if not (p.shape == g.shape == m.shape == v.shape):
                raise ValueError(f"tensor {i}: shapes differ {p.shape} {g.shape} {m.shape} {v.shape}")
            if m.dtype != torch.float32 or v.dtype != torch.float32 or p.dtype not in _KIND or g.dtype not in _KIND:
                raise ValueError(f"tensor {i}: unsupported dtypes {p.dtype} {g.dtype} {m.dtype} {v.dtype}")
            if p.numel():
                groups.setdefault((_KIND[p.dtype], _KIND[g.dtype]), []).append(i)
        self._launches = []
        self._keep = list(tensors)  # the tables hold raw addresses: keep the storage alive
        for (pk, gk), idx in groups.items():
            rows, chunk_rows = [], []
            for j, i in enumerate(idx):
                p, g, m, v = params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]
                rows.append([p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel()])
                chunk_rows += [[j, s] for s in range(0, p.numel(), self.BLOCK)]
            table = torch.tensor(rows, dtype=torch.int64).to(self.device)
            chunks = torch.tensor(chunk_rows, dtype=torch.int64).to(self.device)
            self._launches.append((table, chunks, pk, gk))

    def __call__(self, *, step: int | float | torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        b1, b2 = betas
        if isinstance(step, torch.Tensor):
            step_t = step.reshape(1).to(device=self.device, dtype=torch.float32)
        else:
            step_t = torch.full((1,), float(step), dtype=torch.float32, device=self.device)
        for table, chunks, pk, gk in self._launches:
            _adamw_kernel[(chunks.shape[0],)](table, chunks, step_t, float(lr), float(b1), float(b2), math.log(b1),
                                              math.log(b2), float(eps), float(weight_decay), BLOCK=self.BLOCK,
                                              P_KIND=pk, G_KIND=gk, num_warps=4)


def fused_adamw_(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                 exp_avg_sqs: Sequence[torch.Tensor], *, step: int | float | torch.Tensor, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
    """One AdamW step over the lists, in place (builds the tables; keep a MultiTensorAdamW to reuse them)."""
    MultiTensorAdamW(params, grads, exp_avgs, exp_avg_sqs)(step=step, lr=lr, betas=betas, eps=eps,
                                                          weight_decay=weight_decay)


# ------------------------------------------------------------------------- norm backward


@triton.jit
def _norm_bwd_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_part, db_part, M, N, eps, ROWS: tl.constexpr,
                     BLOCK_N: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        w = tl.where(cmask, 1.0, 0.0)
    dw_acc = tl.zeros([BLOCK_N], tl.float32)
    db_acc = tl.zeros([BLOCK_N], tl.float32)
    for r in range(ROWS):
        row = pid * ROWS + r
        mask = cmask & (row < M)
        off = row.to(tl.int64) * N + cols
        x = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            xc = x
        else:
            xc = tl.where(mask, x - tl.sum(x, 0) / N, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 0) / N + eps)
        xhat = xc * rstd
        wdy = dy * w
        c1 = tl.sum(xhat * wdy, 0) / N
        if RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            dx = (wdy - xhat * c1 - tl.sum(wdy, 0) / N) * rstd
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(dw_part + pid * N + cols, dw_acc, mask=cmask)
    tl.store(db_part + pid * N + cols, db_acc, mask=cmask)


@triton.jit
def _column_sum_kernel(part, out, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        blk = tl.load(part + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < P) & cmask[None, :], other=0.0)
        acc += tl.sum(blk, 0)
    tl.store(out + cols, acc.to(out.dtype.element_ty), mask=cmask)


def _column_sum(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    p, n = part.shape
    out = torch.empty(n, dtype=dtype, device=part.device)
    block_n = min(256, triton.next_power_of_2(n))
    _column_sum_kernel[(triton.cdiv(n, block_n),)](part, out, p, n, BLOCK_P=16, BLOCK_N=block_n, num_warps=4)
    return out


def norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None, eps: float = 1e-5,
                  rms: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of y = LayerNorm(x) * weight + bias (rms=False) or y = x / rms(x) * weight
    (rms=True), normalized over the last dim, given dy: returns (dx, dweight, dbias) with dweight
    None without a weight and dbias None without a bias (always None for RMSNorm)."""
    n = x.shape[-1]
    _mode(*[t for t in (dy, x, weight, bias) if t is not None])
    if n > 65536:
        raise ValueError(f"rows of {n} elements exceed one program's block")
    x2 = x.reshape(-1, n).contiguous()
    dy2 = dy.reshape(-1, n).contiguous()
    m = x2.shape[0]
    dx = torch.empty_like(x2)
    progs = _programs_for(m, x.device)
    rows = triton.cdiv(max(m, 1), progs)
    dw_part = torch.empty(progs, n, dtype=torch.float32, device=x.device)
    db_part = torch.empty(progs, n, dtype=torch.float32, device=x.device)
    block_n = triton.next_power_of_2(n)
    warps = max(1, min(16, block_n // 256))
    _norm_bwd_kernel[(progs,)](x2, weight if weight is not None else x2, dy2, dx, dw_part, db_part, m, n, float(eps),
                               ROWS=rows, BLOCK_N=block_n, RMS=rms, HAS_W=weight is not None, num_warps=warps)
    dw = _column_sum(dw_part, weight.dtype) if weight is not None else None
    db = _column_sum(db_part, bias.dtype) if bias is not None and not rms else None
    return dx.view(x.shape), dw, db


# ---------------------------------------------------------------------------- cross-entropy


@triton.jit
def _cross_entropy_kernel(logits, target, loss_rows, lse_rows, grad, n_valid_ptr, grad_output, V, ignore_index,
                          BLOCK_V: tl.constexpr, NEED_GRAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * V
    t = tl.load(target + row)
    m_vec = tl.full([BLOCK_V], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK_V], tl.float32)
    for v0 in range(0, V, BLOCK_V):  # pass 1: an online log-sum-exp, one running (max, sum) per lane
        offs = v0 + tl.arange(0, BLOCK_V)
        z = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, z)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # lanes with no finite logit yet keep s = 0
        s_vec = s_vec * tl.exp(m_vec - m_safe) + tl.exp(z - m_safe)
        m_vec = m_new
    m = tl.max(m_vec, 0)
    s = tl.sum(s_vec * tl.exp(m_vec - m), 0)
    lse = m + tl.log(s)
    valid = t != ignore_index
    t_safe = tl.where(valid, t, 0)
    zt = tl.load(base + t_safe).to(tl.float32)
    tl.store(loss_rows + row, tl.where(valid, lse - zt, 0.0))
    tl.store(lse_rows + row, lse)
    if NEED_GRAD:  # pass 2: d loss / d z = (softmax(z) - onehot(t)) * grad_output / n_valid
        scale = tl.where(valid, grad_output / tl.load(n_valid_ptr), 0.0)
        gbase = grad + row * V
        for v0 in range(0, V, BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            vm = offs < V
            z = tl.load(base + offs, mask=vm, other=0.0).to(tl.float32)
            g = (tl.exp(z - lse) - tl.where(offs == t, 1.0, 0.0)) * scale
            tl.store(gbase + offs, g.to(gbase.dtype.element_ty), mask=vm)


def cross_entropy_forward_backward(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                                   grad_output: float = 1.0, need_grad: bool = True, inplace: bool = False,
                                   block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean cross-entropy of logits [..., V] against integer targets [...] (rows whose target is
    ignore_index count neither in the sum nor in the mean), and its gradient with respect to the
    logits scaled by `grad_output` (the upstream gradient of the loss), in the logits' dtype.
    inplace=True writes the gradient over the logits (returned as the same tensor). Targets must
    lie in [0, V) or equal ignore_index (not checked). Returns (loss, grad or None)."""
    v = logits.shape[-1]
    _mode(logits, target)
    z = logits.reshape(-1, v)
    if not z.is_contiguous():
        if inplace:
            raise ValueError("inplace needs contiguous logits")
        z = z.contiguous()
    t = target.reshape(-1).contiguous()
    rows = z.shape[0]
    if t.shape[0] != rows:
        raise ValueError(f"{rows} rows of logits, {t.shape[0]} targets")
    loss_rows = torch.empty(rows, dtype=torch.float32, device=z.device)
    lse = torch.empty(rows, dtype=torch.float32, device=z.device)
    n_valid = (t != ignore_index).sum().to(torch.float32).reshape(1)
    grad = (z if inplace else torch.empty_like(z)) if need_grad else None
    bv = block_v or min(4096 if z.device.type == "cuda" else 1024, triton.next_power_of_2(v))
    if rows:
        _cross_entropy_kernel[(rows,)](z, t, loss_rows, lse, grad if grad is not None else z, n_valid,
                                       float(grad_output), v, ignore_index, BLOCK_V=bv, NEED_GRAD=need_grad,
                                       num_warps=8 if bv >= 2048 else 4)
    loss = loss_rows.sum() / n_valid[0]
    return loss, (grad.view(logits.shape) if grad is not None else None)

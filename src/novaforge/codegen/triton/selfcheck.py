"""Device self-checks for the Triton backend, used by benchmarks/gpu_check.py's first worker.

`kernel_cases(device)` lists, as plain torch functions with inputs, options and a tolerance
against float64, one small odd-shaped case per generated kernel kind (pointwise, cat loads,
single-pass and looped reductions, matmul IEEE / TF32 / bf16 / persistent / TMA / batched / a
pre-transposed TF32 weight, attention causal+GQA and masked, gathers); options may carry
"freeze", a float64 reference "ref64" and "expect" (a substring of the kernels' schedule keys, or
"info:<key>" of the program's info) that the caller checks. `training_kernel_checks(device)` runs
the training kernels (train_kernels.py, attention_train.py) against torch autograd and returns
one record per kernel. Nothing here compiles a graph (the caller does, through novaforge.compile),
so the module sits below the API like the rest of codegen/.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def kernel_cases(dev: str) -> list[tuple[str, Callable[..., Any], list[torch.Tensor], dict[str, Any], float]]:
    """(name, fn, inputs, options, tolerance against float64): every generated kernel kind on small
    odd shapes (weights are inputs, so that fn on float64 inputs is the float64 reference; the
    constant-weight case carries its own)."""
    g = torch.Generator(device="cpu").manual_seed(7)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=dev, dtype=dtype)

    bf = torch.bfloat16
    wkn = r(29, 45)
    table, ids = r(101, 24), torch.randint(0, 101, (3, 19), generator=g).to(dev)
    sdpa = F.scaled_dot_product_attention
    pad = torch.ones(2, 1, 37, 37, dtype=torch.bool, device=dev)
    pad[0, :, :, 30:] = False
    ieee = {"tf32": False}
    return [
        ("pointwise", lambda x, y: F.gelu(x, approximate="tanh") * y + 1.5, [r(37, 45), r(45)], {}, 1e-5),
        ("cat load (rope)", lambda x, c, s: x * c + torch.cat([-x[..., 8:], x[..., :8]], -1) * s,
         [r(3, 37, 16), r(37, 16), r(37, 16)], {}, 1e-5),
        ("softmax single-pass", lambda x: torch.softmax(x, -1), [r(37, 333)], {}, 1e-5),
        ("layernorm looped", lambda x: F.layer_norm(x, (9000,)), [r(3, 9000)], {"expect": "L"}, 1e-4),
        ("sum over axis 0", lambda x: x.sum(0) * 2, [r(33, 17)], {}, 1e-5),
        ("matmul ieee + bias relu", lambda a, w, b: F.relu(F.linear(a, w, b)), [r(37, 29), r(45, 29), r(45)], ieee,
         1e-5),
        ("matmul tf32", lambda a, b: a @ b, [r(65, 130), r(130, 33)], {"tf32": True}, 1e-3),  # (truncated operands)
        ("matmul tf32 rounded", lambda a, b: a @ b.t(), [r(65, 130), r(33, 130)],
         {"tf32": True, "matmul_tf32_round": True, "expect": "tf32rn"}, 5e-4),
        ("matmul bf16 silu gate", lambda x, y, w: F.silu(F.linear(x, w)) * y,
         [r(2, 17, 40, dtype=bf), r(2, 17, 72, dtype=bf), r(72, 40, dtype=bf) / 6], {}, 1e-2),
        ("matmul persistent bf16", lambda x, w: F.linear(x, w) + 1, [r(3, 37, 40, dtype=bf), r(72, 40, dtype=bf) / 6],
         {"matmul_persistent": "on", "matmul_programs": 3, "matmul_tile": (32, 64), "matmul_subtile": 2,
          "expect": "p3e2"}, 1e-2),
        ("matmul tma fp32", lambda a, b: a @ b, [r(40, 32), r(32, 48)], {"matmul_loader": "tma", "expect": "tma",
                                                                          **ieee}, 1e-5),
        ("matmul tma bf16 b.T", lambda a, b: a @ b.t(), [r(40, 64, dtype=bf), r(48, 64, dtype=bf)],
         {"matmul_loader": "tma", "expect": "tma"}, 1e-2),
        ("bmm batched", torch.bmm, [r(3, 19, 24), r(3, 24, 17)], ieee, 1e-5),
        ("tf32 constant row-major weight", lambda x: x @ wkn, [r(37, 29)],
         {"freeze": True, "tf32": True, "ref64": lambda x: x @ wkn.double(), "expect": "info:transposed_weights"},
         1e-3),
        ("attention causal gqa", lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True),
         [r(2, 4, 37, 64), r(2, 2, 37, 64), r(2, 2, 37, 64)], ieee, 1e-5),
        ("attention bool mask bf16", lambda q, k, v, m: sdpa(q, k, v, attn_mask=m),
         [r(2, 2, 37, 64, dtype=bf), r(2, 2, 37, 64, dtype=bf), r(2, 2, 37, 64, dtype=bf), pad], {}, 2e-2),
        ("embedding gather", lambda i: F.embedding(i, table) * 2, [ids], {}, 1e-6),
        ("cat of 20 pieces", lambda *xs: torch.cat(xs, 0), [r(3, 5) for _ in range(20)], {}, 0.0),
    ]


def training_kernel_checks(dev: str) -> list[dict[str, Any]]:
    from . import attention_train as at
    from . import train_kernels as tk

    out: list[dict[str, Any]] = []

    def record(name, fn):
        try:
            err = fn()
            out.append({"name": name, "rel_err": err, "ok": err < 2e-2})
        except Exception as e:
            traceback.print_exc()
            out.append({"name": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]})

    def adamw():
        ps = [torch.randn(s, device=dev) for s in [(37, 5), (1100,)]]
        ref = [torch.nn.Parameter(p.clone()) for p in ps]
        gs = [torch.randn_like(p) for p in ps]
        for p, gr in zip(ref, gs, strict=True):
            p.grad = gr.clone()
        torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.1, foreach=False).step()
        tk.fused_adamw_(ps, gs, [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps], step=1,
                        lr=1e-3, weight_decay=0.1)
        return max(rel(p, q.detach()) for p, q in zip(ps, ref, strict=True))

    def norm():
        x = torch.randn(7, 333, device=dev, requires_grad=True)
        w = torch.randn(333, device=dev, requires_grad=True)
        dy = torch.randn(7, 333, device=dev)
        F.layer_norm(x, (333,), w, None).backward(dy)
        dx, dw, _ = tk.norm_backward(dy, x.detach(), w.detach(), None)
        return max(rel(dx, x.grad), rel(dw, w.grad))

    def ce():
        z = torch.randn(9, 5003, device=dev, requires_grad=True)
        t = torch.randint(0, 5003, (9,), device=dev)
        want = F.cross_entropy(z, t)
        want.backward()
        loss, grad = tk.cross_entropy_forward_backward(z.detach(), t)
        return max(abs(loss.item() - want.item()) / abs(want.item()), rel(grad, z.grad))

    def flash():
        q = torch.randn(2, 4, 37, 64, device=dev, requires_grad=True)
        k = torch.randn(2, 2, 37, 64, device=dev, requires_grad=True)
        v = torch.randn(2, 2, 37, 64, device=dev, requires_grad=True)
        do = torch.randn(2, 4, 37, 64, device=dev)
        o_ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                               is_causal=True)
        o_ref.backward(do)
        o, lse = at.flash_attention_forward(q.detach(), k.detach(), v.detach(), causal=True, tf32=False)
        grads = at.flash_attention_backward(q.detach(), k.detach(), v.detach(), o, lse, do, causal=True, tf32=False)
        return max([rel(o, o_ref)] + [rel(a, b.grad) for a, b in zip(grads, (q, k, v), strict=True)])

    for name, fn in (("fused adamw", adamw), ("layernorm backward", norm), ("cross-entropy fwd+bwd", ce),
                     ("flash attention fwd+bwd causal gqa", flash)):
        record(name, fn)
    return out

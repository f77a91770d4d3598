"""JAX/XLA runner for the training workloads: the same nanoGPT-style GPT written in JAX.

The parameters are copied from the torch model the worker built (so the first loss matches
eager's), the step is one `jax.jit`-compiled function (forward, cross-entropy, gradients by
`jax.value_and_grad`, AdamW with torch's update rule and defaults: betas (0.9, 0.999),
eps 1e-8, weight decay 0.01 on every parameter, lr 3e-4) with parameters and optimizer state
donated. bf16 mirrors autocast: matmuls and attention in bf16 over float32 master weights,
LayerNorm, softmax statistics and the loss in float32. TF32 follows XLA's default precision.

Invariant: the JAX model computes the function of `nanogpt.GPT` (same layout of Linear
weights (out, in), tied LM head, causal attention, GELU(tanh)); the loss returned by a call is
that step's loss before its update, as for the torch runners.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .base import Prepared, RunContext


def _params_from_torch(model: torch.nn.Module) -> dict[str, Any]:
    import jax.numpy as jnp

    return {name: jnp.asarray(p.detach().float().cpu().numpy()) for name, p in model.named_parameters()}


def gpt_loss(params: dict[str, Any], idx: Any, targets: Any, *, n_layer: int, n_head: int, compute: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def linear(x, name: str, bias: bool = True):
        y = jnp.matmul(x.astype(compute), params[f"{name}.weight"].astype(compute).T)
        if bias:
            y = y + params[f"{name}.bias"].astype(compute)
        return y

    def layer_norm(x, name: str):
        x32 = x.astype(jnp.float32)
        mu = x32.mean(-1, keepdims=True)
        var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
        y = (x32 - mu) * jax.lax.rsqrt(var + 1e-5)
        return (y * params[f"{name}.weight"] + params[f"{name}.bias"]).astype(compute)

    B, T = idx.shape
    x = (params["wte.weight"][idx] + params["wpe.weight"][:T]).astype(compute)
    C = x.shape[-1]
    hs = C // n_head
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    for i in range(n_layer):
        p = f"h.{i}"
        qkv = linear(layer_norm(x, f"{p}.ln_1"), f"{p}.attn.c_attn")
        q, k, v = (t.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, axis=-1))
        att = jnp.matmul(q, k.transpose(0, 1, 3, 2)).astype(jnp.float32) / math.sqrt(hs)
        att = jnp.where(mask, att, -jnp.inf)
        att = jax.nn.softmax(att, axis=-1).astype(compute)
        y = jnp.matmul(att, v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + linear(y, f"{p}.attn.c_proj")
        h = jax.nn.gelu(linear(layer_norm(x, f"{p}.ln_2"), f"{p}.mlp.c_fc"), approximate=True)
        x = x + linear(h, f"{p}.mlp.c_proj")
    logits = jnp.matmul(layer_norm(x, "ln_f"), params["wte.weight"].astype(compute).T).astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (logz - picked).mean()


def make_step(n_layer: int, n_head: int, compute: Any, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.999),
              eps: float = 1e-8, weight_decay: float = 0.01):
    """A jitted (params, m, v, t, idx, targets) -> (loss, params, m, v, t) AdamW step (torch's rule)."""
    import functools

    import jax
    import jax.numpy as jnp

    loss_fn = functools.partial(gpt_loss, n_layer=n_layer, n_head=n_head, compute=compute)
    b1, b2 = betas

    def step(params, m, v, t, idx, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets)
        t = t + 1
        bc1 = 1 - b1 ** t
        bc2 = 1 - b2 ** t

        def update(p, g, m_, v_):
            p = p * (1 - lr * weight_decay)
            m_ = b1 * m_ + (1 - b1) * g
            v_ = b2 * v_ + (1 - b2) * g * g
            denom = jnp.sqrt(v_) / jnp.sqrt(bc2) + eps
            return p - (lr / bc1) * m_ / denom, m_, v_

        out = jax.tree_util.tree_map(update, params, grads, m, v)
        new_p = {k: o[0] for k, o in out.items()}
        new_m = {k: o[1] for k, o in out.items()}
        new_v = {k: o[2] for k, o in out.items()}
        return loss, new_p, new_m, new_v, t

    return jax.jit(step, donate_argnums=(0, 1, 2))


class JaxRunner:
    model_device = "cpu"  # the torch model only supplies initial weights; JAX holds its own copy

    def training(self, model: torch.nn.Module, batches: list, ctx: RunContext) -> Prepared:
        import jax
        import jax.numpy as jnp

        platform = "gpu" if ctx.device == "cuda" else "cpu"
        device = jax.devices(platform)[0]
        cfg = model.config
        compute = jnp.bfloat16 if ctx.dtype == "bfloat16" else jnp.float32
        params = jax.device_put(_params_from_torch(model), device)
        state = {
            "params": params,
            "m": jax.tree_util.tree_map(jnp.zeros_like, params),
            "v": jax.tree_util.tree_map(jnp.zeros_like, params),
            "t": jax.device_put(jnp.zeros((), jnp.float32), device),
        }
        data = [(jax.device_put(jnp.asarray(i.cpu().numpy()), device), jax.device_put(jnp.asarray(t.cpu().numpy()),
                                                                                     device)) for i, t in batches]
        step_fn = make_step(cfg.n_layer, cfg.n_head, compute)
        count = [0]

        def call() -> Any:
            idx, targets = data[count[0] % len(data)]
            count[0] += 1
            loss, state["params"], state["m"], state["v"], state["t"] = step_fn(
                state["params"], state["m"], state["v"], state["t"], idx, targets)
            return loss.block_until_ready()

        def peak_mb() -> float | None:
            stats = device.memory_stats() if hasattr(device, "memory_stats") else None
            if not stats or "peak_bytes_in_use" not in stats:
                return None
            return stats["peak_bytes_in_use"] / 2**20

        return Prepared(call, to_tensor=lambda loss: torch.tensor(float(loss)), peak_memory_mb=peak_mb,
                        info={"jax": jax.__version__, "platform": device.platform, "compute": jnp.dtype(compute).name})

"""Torch-level programs through the whole compiler (capture, lowering, passes, interpreter)
against eager, with both capture modes.

The lowering-rule tests drive each ATen overload directly; these check that what real
captures produce is covered: `make_fx` capture ('fx', the default) decomposes composite ops,
torch.export ('export') keeps many of them (linear, layer_norm, softmax.int, batch_norm, ...).
Each program lists the ops it is allowed to leave as externs; any other extern fails.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import novaforge
from novaforge.ir import verify

from .harness import LOOSE, TOL, bf16, f32

MODES = ("fx", "export")


def _x(*shape, dtype=f32, scale=2.0):
    return (torch.randn(*shape) * scale).to(dtype)


# name -> (fn, make inputs(dtype), dtypes, allowed externs)
PROGRAMS = {
    "mlp": (lambda x, w1, w2: F.linear(F.gelu(F.linear(x, w1)), w2, w2[:, 0]),
            lambda dt: (_x(3, 8, dtype=dt), _x(16, 8, dtype=dt, scale=0.3), _x(4, 16, dtype=dt, scale=0.3)), ()),
    "layernorm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), lambda dt: (_x(2, 3, 8, dtype=dt), _x(8, dtype=dt),
                                                                           _x(8, dtype=dt)), ()),
    "rmsnorm": (lambda x, w: F.rms_norm(x, (8,), w, 1e-6), lambda dt: (_x(2, 3, 8, dtype=dt), _x(8, dtype=dt)), ()),
    "groupnorm": (lambda x: F.group_norm(x, 2), lambda dt: (_x(2, 4, 3, dtype=dt),), ()),
    "batchnorm-eval": (lambda x, m, v: F.batch_norm(x, m, v), lambda dt: (_x(4, 3, 5, dtype=dt), _x(3),
                                                                          _x(3).abs() + 0.5), ()),
    "softmax": (lambda x: torch.softmax(x, -1) + torch.log_softmax(x, 0), lambda dt: (_x(3, 7, dtype=dt),), ()),
    "softmax-dtype": (lambda x: torch.softmax(x, -1, dtype=torch.float32), lambda dt: (_x(3, 7, dtype=dt),), ()),
    "activations": (lambda x: F.silu(x) + F.relu6(x) + F.hardswish(x) + F.elu(x) + F.selu(x) + F.celu(x, 0.5)
                    + F.leaky_relu(x, 0.1) + F.softplus(x) + F.mish(x) + F.hardsigmoid(x) + F.hardtanh(x)
                    + F.gelu(x, approximate="tanh") + torch.sigmoid(x) + torch.tanh(x) + F.softsign(x),
                    lambda dt: (_x(4, 9, dtype=dt),), ()),
    "glu": (lambda x: F.glu(x, -1), lambda dt: (_x(3, 8, dtype=dt),), ()),
    "unary-math": (lambda x: x.abs().sqrt() + x.exp() - x.abs().log1p() + x.sin() * x.cos() + x.square()
                   + x.frac() + x.abs().log10() + x.sign() + x.reciprocal(), lambda dt: (_x(4, 5, dtype=dt),), ()),
    "rounding": (lambda x: x.floor() + x.ceil() + x.round() + x.trunc() + torch.div(x, 0.3, rounding_mode="floor")
                 + torch.div(x, 0.3, rounding_mode="trunc") + x // 0.7 + x % 0.7, lambda dt: (_x(4, 5, dtype=dt),), ()),
    "int-math": (lambda a, b: (a // b, a % b, torch.div(a, b, rounding_mode="trunc"), a / b, a * 3 + 1, a ** 2,
                               torch.bitwise_and(a, b), a.abs(), -a, torch.clamp(a, -2, 3)),
                 lambda dt: (torch.randint(-9, 10, (3, 4)), torch.randint(1, 5, (4,)) * torch.tensor([1, -1, 1, -1])),
                 ()),
    "compare-where": (lambda x, y: torch.where((x > y) & (x != 0.5) | ~(y <= 0), x, y * 2)
                      + torch.maximum(x, y) + x.masked_fill(x < 0, -1.0) + (x == y).float(),
                      lambda dt: (_x(3, 4, dtype=dt), _x(4, dtype=dt)), ()),
    "scalars-promotion": (lambda x, i, b: (x + 1, x * 2.5, i + 1.5, i * 2, i / 2, b + 1, b & (i > 0), x + i,
                                           1 - x, 2 ** x, x ** 2, x ** 0.5, i.float().mean()),
                          lambda dt: (_x(3, 4, dtype=dt), torch.randint(-5, 5, (3, 4)), torch.rand(3, 4) < 0.5), ()),
    "reductions": (lambda x: (x.sum(), x.sum(-1, keepdim=True), x.mean((0, 2)), x.amax(1), x.amin(-1, True),
                              x.max(-1).values, x.max(1).indices, x.argmax(), x.argmin(0), x.prod(-1), x.std(1),
                              x.var(0, unbiased=False), torch.var_mean(x, -1), x.logsumexp(-1),
                              (x > 0).any(-1), (x > 0).all(), x.norm(dim=-1), x.cumsum(1)),
                   lambda dt: (_x(2, 3, 5, dtype=dt, scale=1.0),), ()),
    "views": (lambda x: (x.view(6, 4), x.reshape(-1), x.permute(2, 0, 1), x.transpose(0, 1), x.T, x.mT,
                         x.unsqueeze(1).squeeze(1), x.flatten(1), x.unflatten(-1, (2, 2)), x[:, 1:, ::2], x[..., -1],
                         x.narrow(2, 1, 2), x.expand(3, 2, 3, 4), x.movedim(0, -1), x.chunk(2, -1), x.split(1, 1),
                         x.unbind(0), x.select(1, -1), x.diagonal(0, 1, 2), x.flip(-1)),
              lambda dt: (_x(2, 3, 4, dtype=dt),), ()),
    "data-movement": (lambda x, y: (torch.cat([x, y], 0), torch.stack([x, x], -1), F.pad(x, (1, 2)),
                                    F.pad(x, (1, 1, 0, 2), value=3.0), x.repeat(2, 1), x.tril(), x.triu(1),
                                    torch.zeros_like(x), torch.ones(2, 4) * x[:1], torch.full((2, 4), 3.0) + x[1:3],
                                    torch.arange(4) * x, x.clone(), x.contiguous(), x.to(torch.float64).float(),
                                    x.new_zeros(3).long()),
                      lambda dt: (_x(3, 4, dtype=dt), _x(2, 4, dtype=dt)), ()),
    "indexing": (lambda x, i: (x[i], x[:, i[:2]], x[i, i % 5], F.embedding(i, x), x.index_select(1, i[:3]),
                               x.gather(1, (i % 5).reshape(-1, 1).expand(-1, 2)), x[[0, 2]],
                               x.scatter_add(0, i[:1].reshape(1, 1).expand(1, 5), x[:1])),
                 lambda dt: (_x(6, 5, dtype=dt), torch.tensor([1, 0, 4, 2, 5, 3])), ()),
    "setitem": (lambda x: _setitem(x), lambda dt: (_x(4, 5, dtype=dt),), ()),
    "matmuls": (lambda a, b, v: (a @ b, a[0] @ b, a @ v, v @ b[0], torch.bmm(a, b), torch.einsum("bij,bjk->bik", a, b),
                                 torch.addmm(v[:1], a[0], b[0]), torch.outer(v, v), a[0].mv(v), v.dot(v)),
                lambda dt: (_x(2, 3, 4, dtype=dt), _x(2, 4, 4, dtype=dt), _x(4, dtype=dt)), ()),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                  + F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool).tril()),
                  lambda dt: (_x(1, 2, 5, 8, dtype=dt), _x(1, 2, 5, 8, dtype=dt), _x(1, 2, 5, 8, dtype=dt)), ()),
    "cross-entropy": (lambda x, t: F.cross_entropy(x, t) + F.cross_entropy(x, t, ignore_index=1, reduction="sum")
                      + F.nll_loss(F.log_softmax(x, -1), t),
                      lambda dt: (_x(5, 7, dtype=dt), torch.tensor([1, 0, 6, 1, 3])), ()),
    "dropout-eval": (lambda x: F.dropout(x, 0.5, training=False) * 2, lambda dt: (_x(3, 4, dtype=dt),), ()),
    "zero-size": (lambda x, y: (x.sum(0), x * 2, torch.softmax(x, -1), x.mean(-1), F.layer_norm(x, (4,)), x @ y,
                                torch.cat([x, x], 0), x.amax(-1)),
                  lambda dt: (_x(0, 4, dtype=dt), _x(4, 3, dtype=dt)), ()),
    "odd-sizes": (lambda x, w: torch.softmax(F.linear(x, w), -1).sum(0),
                  lambda dt: (_x(37, 129, dtype=dt, scale=0.2), _x(65, 129, dtype=dt, scale=0.2)), ()),
    "rope": (lambda x, c, s: x * c + torch.cat([-x[..., 4:], x[..., :4]], -1) * s,
             lambda dt: (_x(1, 2, 5, 8, dtype=dt), _x(5, 8, dtype=dt), _x(5, 8, dtype=dt)), ()),
}


def _setitem(x):
    y = x.clone()
    y[0] = 1.0
    y[:, 1:3] = y[:, 1:3] * 2
    y[1, 2] = -3.0
    return y


def _case_params():
    for name, (_fn, _mk, _ext) in PROGRAMS.items():
        for mode in MODES:
            for dt in (f32, bf16):
                yield pytest.param(name, mode, dt, id=f"{name}-{mode}-{str(dt).removeprefix('torch.')}")


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _flat(o)]
    if hasattr(out, "values") and hasattr(out, "indices"):
        return [out.values, out.indices]
    raise TypeError(type(out))


@pytest.mark.parametrize(("name", "mode", "dtype"), list(_case_params()))
def test_program_matches_eager(name: str, mode: str, dtype: torch.dtype) -> None:
    fn, make, allowed = PROGRAMS[name]
    torch.manual_seed(0)
    inputs = make(dtype)
    want = _flat(fn(*inputs))
    compiled = novaforge.compile(fn, backend="interpret", capture=mode)
    got = _flat(compiled(*inputs))
    stats = compiled.stats()
    verify(stats.captured.graph)
    verify(stats.graph)
    externs = sorted({t for t, _ in stats.captured.externs} - set(allowed))
    assert not externs, f"{name} ({mode}): unexpected externs {externs}"
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w.dtype.is_floating_point:
            rtol, atol = (LOOSE if w.dtype in LOOSE else TOL)[w.dtype]
            if w.dtype == bf16:
                rtol, atol = 3e-2, 3e-2  # several bf16 ops in a row, each rounding once
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m, i=i: f"output {i}: {m}")
        else:
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda m, i=i: f"output {i}: {m}")

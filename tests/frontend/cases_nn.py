"""Cases for reduction, normalization, matmul and attention rules (lower_nn.py).

Decomposed reductions and normalizations accumulate in a different order than ATen's
kernels, so they compare with `LOOSE` tolerances (1e-5 for float32)."""

from __future__ import annotations

import functools

import torch

from .harness import FLOAT, INTS, LOOSE, C, Case, b8, bf16, f32, i32, i64, u8

aten = torch.ops.aten
CASES: list[Case] = []
add = CASES.extend
L = functools.partial(C, tol=LOOSE)  # a decomposed reduction / normalization
G = functools.partial(L, strided=False)  # eager's group norm rejects non-contiguous inputs
F = functools.partial(L, strided=False)

# ------------------------------------------------------------------------ reductions
for _t in (aten.sum.dim_IntList, aten.mean.dim):
    add([L(_t, lambda m: (m.t(3, 4, 5), [1]), "one"),
         L(_t, lambda m: (m.t(3, 4, 5), [-1, 0], True), "two-keepdim"),
         L(_t, lambda m: (m.t(3, 4, 5), None), "none"),
         L(_t, lambda m: (m.t(3, 4, 5), []), "empty-list"),
         L(_t, lambda m: (m.t(3, 0, 5), [1]), "zero-size-reduced"),
         L(_t, lambda m: (m.t(0, 4), [1], True), "zero-size-kept"),
         L(_t, lambda m: (m.t(), [0]), "0d"),
         L(_t, lambda m: (m.t(37, 129), [1]), "odd"),
         L(_t, lambda m: ((m.t(3, 4), [1]), {"dtype": f32}), "dtype", dtypes=(bf16,))])
add([C(aten.sum.dim_IntList, lambda m: (m.t(3, 4, 5), [1, 2]), "int", dtypes=INTS + (b8, u8)),
     L(aten.sum.default, lambda m: m.t(3, 4), "all"),
     C(aten.sum.default, lambda m: m.t(3, 4), "int", dtypes=INTS + (b8,)),
     L(aten.sum.default, lambda m: m.t(0, 4), "zero-size"),
     L(aten.sum.default, lambda m: ((m.t(3, 4),), {"dtype": f32}), "dtype", dtypes=(bf16, i64)),
     L(aten.mean.default, lambda m: m.t(3, 4), "all"),
     L(aten.mean.default, lambda m: m.t(), "0d"),
     L(aten.mean.default, lambda m: m.t(0, 3), "zero-size"),
     L(aten.mean.default, lambda m: ((m.t(3, 4),), {"dtype": f32}), "dtype", dtypes=(bf16, i64))])
add([L(aten.prod.default, lambda m: m.unit(3, 4) * 2, "all"),
     C(aten.prod.default, lambda m: m.pos(2, 3), "int", dtypes=INTS + (b8,)),
     L(aten.prod.default, lambda m: m.t(0, 3), "zero-size"),
     L(aten.prod.dim_int, lambda m: (m.t(3, 4, 5), 1), "dim"),
     L(aten.prod.dim_int, lambda m: (m.t(3, 4, 5), -1, True), "keepdim"),
     L(aten.prod.dim_int, lambda m: (m.t(3, 0), 1), "zero-size-reduced"),
     L(aten.prod.dim_int, lambda m: ((m.t(3, 4), 1), {"dtype": f32}), "dtype", dtypes=(bf16, i32))])
for _t in (aten.amax.default, aten.amin.default):
    add([C(_t, lambda m: (m.t(3, 4, 5), [1]), "one", dtypes=FLOAT + (i64, b8)),
         C(_t, lambda m: (m.t(3, 4, 5), [0, -1], True), "keepdim"),
         C(_t, lambda m: m.t(3, 4), "all"),
         C(_t, lambda m: (m.t(0, 4), [1]), "zero-size-kept"),
         C(_t, lambda m: (m.special().reshape(3, 4), [1]), "special"),
         C(_t, lambda m: (m.t(), []), "0d")])
for _t in (aten.max.default, aten.min.default):
    add([C(_t, lambda m: m.t(3, 4), "all", dtypes=FLOAT + (i64, b8)), C(_t, lambda m: m.special(), "special"),
         C(_t, lambda m: m.t(), "0d")])
for _t in (aten.max.dim, aten.min.dim):
    add([C(_t, lambda m: (m.t(3, 4, 5), 1), "dim", dtypes=FLOAT + (i64,)),
         C(_t, lambda m: (m.t(3, 4, 5), -1, True), "keepdim"),
         C(_t, lambda m: (m.t(3, 4).round(), 1), "ties"),
         C(_t, lambda m: (m.special().reshape(3, 4), 1), "special"),
         C(_t, lambda m: (m.t(0, 4), 1), "zero-size-kept"),
         C(_t, lambda m: (m.t(), 0), "0d")])
for _t in (aten.argmax.default, aten.argmin.default):
    add([C(_t, lambda m: (m.t(3, 4, 5), 1), "dim", dtypes=FLOAT + (i64,)),
         C(_t, lambda m: (m.t(3, 4, 5), -1, True), "keepdim"),
         C(_t, lambda m: m.t(3, 4), "all"),
         C(_t, lambda m: (m.t(3, 4), None, True), "all-keepdim"),
         C(_t, lambda m: (m.t(3, 4).round(), 1), "ties"),
         C(_t, lambda m: (m.special().reshape(3, 4), 1), "special"),
         C(_t, lambda m: (m.t(0, 4), 1), "zero-size-kept"),
         C(_t, lambda m: m.t(), "0d")])
for _p in ("any", "all"):
    add([C(getattr(aten, _p).default, lambda m: m.t(3, 4), "float", dtypes=FLOAT + (i64, b8)),
         C(getattr(aten, _p).default, lambda m: m.t(0, 3), "zero-size", dtypes=(f32, b8)),
         C(getattr(aten, _p).default, lambda m: m.t(3, 4), "u8", dtypes=(u8,)),
         C(getattr(aten, _p).dim, lambda m: (m.b(3, 4), 1), "dim", dtypes=(b8,)),
         C(getattr(aten, _p).dim, lambda m: (m.t(3, 4), -1, True), "keepdim", dtypes=(f32, i64)),
         C(getattr(aten, _p).dim, lambda m: (m.t(3, 0), 1), "zero-size-reduced", dtypes=(b8, f32)),
         C(getattr(aten, _p).dims, lambda m: (m.b(3, 4, 2), [0, 2]), "dims", dtypes=(b8,)),
         C(getattr(aten, _p).dims, lambda m: (m.b(3, 4), None, True), "none", dtypes=(b8,))])

for _ord in (2, 1, 0, 3, 0.5, float("inf"), float("-inf")):
    add([L(aten.linalg_vector_norm.default, lambda m, o=_ord: (m.t(3, 5), o, [1]), f"ord{_ord}"),
         L(aten.linalg_vector_norm.default, lambda m, o=_ord: (m.t(2, 3, 4), o, None, True), f"ord{_ord}-all-keepdim")])
add([L(aten.linalg_vector_norm.default, lambda m: ((m.t(3, 5),), {"dtype": f32}), "dtype", dtypes=(bf16,)),
     L(aten.linalg_vector_norm.default, lambda m: (m.t(3, 0), 2, [1]), "zero-size-reduced"),
     L(aten.linalg_vector_norm.default, lambda m: (m.t(), 2), "0d")])
for _t in (aten.var.correction, aten.std.correction):
    add([L(_t, lambda m: (m.t(3, 5), [1]), "dim"),
         L(_t, lambda m: ((m.t(3, 5), [0]), {"correction": 0, "keepdim": True}), "biased-keepdim"),
         L(_t, lambda m: ((m.t(3, 5),), {"correction": 2}), "all-c2"),
         L(_t, lambda m: (m.t(3, 1), [1]), "single-element"),
         L(_t, lambda m: (m.t(4, 0), [1]), "zero-size-reduced"),
         L(_t, lambda m: (m.t(0, 4), [1]), "zero-size-kept"),
         L(_t, lambda m: (m.t(5, 300) + 100, [1]), "offset")])
for _t in (aten.var.dim, aten.std.dim):
    add([L(_t, lambda m: (m.t(3, 5), [1]), "unbiased"),
         L(_t, lambda m: (m.t(3, 5), [-1], False, True), "biased-keepdim"),
         L(_t, lambda m: (m.t(3, 5, 2), None), "none")])
for _t in (aten.var.default, aten.std.default):
    add([L(_t, lambda m: m.t(3, 5), "unbiased"), L(_t, lambda m: (m.t(3, 5), False), "biased")])
add([L(aten.var_mean.correction, lambda m: (m.t(3, 5), [1]), "dim"),
     L(aten.var_mean.correction, lambda m: ((m.t(3, 5), [0]), {"correction": 0, "keepdim": True}), "keepdim"),
     L(aten.var_mean.dim, lambda m: (m.t(3, 5), [1], False), "biased"),
     L(aten.var_mean.dim, lambda m: (m.t(3, 5), [1], True, True), "keepdim"),
     L(aten.std_mean.correction, lambda m: (m.t(3, 5), [1]), "dim"),
     L(aten.std_mean.correction, lambda m: ((m.t(3, 5),), {"correction": 0}), "all")])
add([L(aten.logsumexp.default, lambda m: (m.t(3, 5), [1]), "dim"),
     L(aten.logsumexp.default, lambda m: (m.t(3, 5) * 50, [0, 1], True), "large-keepdim"),
     L(aten.logsumexp.default, lambda m: (torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 1.0],
                                                      [float("inf"), 0.0, 1.0]]), [1]), "infs", dtypes=(f32,)),
     L(aten.logsumexp.default, lambda m: (m.t(3, 0), [1]), "zero-size-reduced"),
     L(aten.logsumexp.default, lambda m: (m.t(3, 5), [1]), "int", dtypes=(i64,)),
     L(aten.logsumexp.default, lambda m: (m.t(), [0]), "0d")])

# ----------------------------------------------------------------------------- softmax
for _t in (aten._softmax.default, aten._log_softmax.default):
    add([L(_t, lambda m: (m.t(3, 7), -1, False), "last"),
         L(_t, lambda m: (m.t(3, 7, 2), 1, False), "middle"),
         L(_t, lambda m: (m.t(3, 7) * 30, 1, False), "large"),
         L(_t, lambda m: (m.t(0, 7), 1, False), "zero-size"),
         L(_t, lambda m: (m.t(3, 0), 1, False), "zero-size-reduced"),
         L(_t, lambda m: (m.t(), 0, False), "0d")])
for _t in (aten.softmax.int, aten.log_softmax.int):
    add([L(_t, lambda m: (m.t(3, 7), -1), "last"),
         L(_t, lambda m: (m.t(3, 7), 0, f32), "dtype", dtypes=(bf16,)),
         L(_t, lambda m: (m.t(4, 1, 5), -1), "odd")])
add([L(aten._safe_softmax.default, lambda m: (m.t(3, 7), -1), "plain"),
     L(aten._safe_softmax.default, lambda m: (m.t(3, 7).masked_fill(torch.tensor([[True], [False], [False]]),
                                                                  float("-inf")), -1), "masked-row")])

# -------------------------------------------------------------------------------- norms
add([L(aten.native_layer_norm.default, lambda m: (m.t(3, 8), [8], m.t(8), m.t(8), 1e-5), "affine"),
     L(aten.native_layer_norm.default, lambda m: (m.t(2, 3, 4), [3, 4], None, None, 1e-5), "two-dims"),
     L(aten.native_layer_norm.default, lambda m: (m.t(3, 8) * 100 + 50, [8], m.t(8), None, 1e-6), "offset"),
     L(aten.native_layer_norm.default, lambda m: (m.t(0, 8), [8], m.t(8), m.t(8), 1e-5), "zero-size"),
     L(aten.native_layer_norm.default, lambda m: (m.t(3, 8), [8], m.t(8, dtype=f32), m.t(8, dtype=f32), 1e-5),
       "mixed", dtypes=(bf16,)),
     L(aten.layer_norm.default, lambda m: (m.t(3, 8), [8], m.t(8), m.t(8)), "affine"),
     L(aten.layer_norm.default, lambda m: (m.t(3, 8), [8]), "plain"),
     L(aten.layer_norm.default, lambda m: (m.t(2, 3, 5), [5], None, m.t(5), 1e-3), "bias-only")])
add([L(aten.rms_norm.default, lambda m: (m.t(3, 8), [8], m.t(8), 1e-6), "weight"),
     L(aten.rms_norm.default, lambda m: (m.t(3, 8), [8]), "default-eps"),
     L(aten.rms_norm.default, lambda m: (m.t(2, 3, 4) * 1e-3, [3, 4], None), "small-two-dims"),
     L(aten.rms_norm.default, lambda m: (m.t(3, 8), [8], m.t(8, dtype=f32)), "f32-weight", dtypes=(bf16,))])
_bn = lambda m: (m.t(4, 3, 5), m.t(3), m.t(3), m.t(3), m.pos(3))  # noqa: E731
add([L(aten._native_batch_norm_legit_no_training.default, lambda m: (*_bn(m), 0.1, 1e-5), "affine"),
     L(aten._native_batch_norm_legit_no_training.default,
       lambda m: (m.t(2, 3, 4, 4), None, None, m.t(3), m.pos(3), 0.1, 1e-5), "4d-plain"),
     L(aten._native_batch_norm_legit_no_training.default,
       lambda m: (m.t(4, 3, 5), m.t(3, dtype=f32), m.t(3, dtype=f32), m.t(3, dtype=f32), m.pos(3, dtype=f32),
                  0.1, 1e-5), "mixed", dtypes=(bf16,)),
     L(aten._native_batch_norm_legit_functional.default, lambda m: (*_bn(m), True, 0.1, 1e-5), "train"),
     L(aten._native_batch_norm_legit_functional.default, lambda m: (*_bn(m), False, 0.1, 1e-5), "eval"),
     L(aten._native_batch_norm_legit_functional.default,
       lambda m: (m.t(2, 3), None, None, m.t(3), m.pos(3), True, 0.3, 1e-3), "train-2d-plain"),
     L(aten.native_batch_norm.default, lambda m: (*_bn(m), False, 0.1, 1e-5), "eval"),
     L(aten.native_batch_norm.default, lambda m: (m.t(4, 3, 5), m.t(3), m.t(3), None, None, True, 0.1, 1e-5),
       "train-no-stats"),
     L(aten._native_batch_norm_legit.no_stats, lambda m: (m.t(4, 3, 5), m.t(3), m.t(3), True, 0.1, 1e-5), "train"),
     L(aten._native_batch_norm_legit.no_stats, lambda m: (m.t(4, 3), None, None, True, 0.1, 1e-5), "2d-plain")])
add([G(aten.native_group_norm.default, lambda m: (m.t(2, 6, 5), m.t(6), m.t(6), 2, 6, 5, 3, 1e-5), "affine"),
     G(aten.native_group_norm.default, lambda m: (m.t(2, 4, 3, 3), None, None, 2, 4, 9, 2, 1e-5), "4d"),
     G(aten.native_group_norm.default, lambda m: (m.t(3, 4, 2), m.t(4), None, 3, 4, 2, 4, 1e-5), "per-channel"),
     G(aten.native_group_norm.default, lambda m: (m.t(0, 4, 2), m.t(4), None, 0, 4, 2, 2, 1e-5), "zero-size")])

# ------------------------------------------------------------------------------- matmul
add([L(aten.mm.default, lambda m: (m.t(5, 7), m.t(7, 3)), "basic", dtypes=FLOAT + (i64,)),
     L(aten.mm.default, lambda m: (m.t(5, 0), m.t(0, 3)), "k0"),
     L(aten.mm.default, lambda m: (m.t(0, 4), m.t(4, 3)), "m0"),
     L(aten.mm.default, lambda m: (m.t(33, 65), m.t(65, 17)), "odd"),
     L(aten.bmm.default, lambda m: (m.t(2, 5, 7), m.t(2, 7, 3)), "basic"),
     L(aten.matmul.default, lambda m: (m.t(2, 1, 5, 7), m.t(3, 7, 4)), "bcast"),
     L(aten.matmul.default, lambda m: (m.t(7), m.t(7)), "1d-1d"),
     L(aten.matmul.default, lambda m: (m.t(7), m.t(2, 7, 3)), "1d-3d"),
     L(aten.matmul.default, lambda m: (m.t(2, 4, 7), m.t(7)), "3d-1d"),
     L(aten.matmul.default, lambda m: (m.t(4, 7), m.t(7, 3)), "2d"),
     L(aten.mv.default, lambda m: (m.t(4, 7), m.t(7)), "basic"),
     L(aten.dot.default, lambda m: (m.t(7), m.t(7)), "basic", dtypes=FLOAT + (i64,))])
add([L(aten.addmm.default, lambda m: (m.t(3), m.t(5, 7), m.t(7, 3)), "bias"),
     L(aten.addmm.default, lambda m: ((m.t(5, 3), m.t(5, 7), m.t(7, 3)), {"beta": 0.5, "alpha": 2}), "beta-alpha"),
     L(aten.addmm.default, lambda m: ((m.t(5, 3) * float("nan"), m.t(5, 7), m.t(7, 3)), {"beta": 0}), "beta0"),
     L(aten.baddbmm.default, lambda m: (m.t(1, 3), m.t(2, 5, 7), m.t(2, 7, 3)), "bias"),
     L(aten.baddbmm.default, lambda m: ((m.t(2, 5, 3), m.t(2, 5, 7), m.t(2, 7, 3)), {"alpha": 0.5}), "alpha"),
     L(aten.addmv.default, lambda m: (m.t(4), m.t(4, 7), m.t(7)), "bias")])
add([L(aten._weight_int8pack_mm.default, lambda m: (m.t(5, 8), m.t(4, 8, dtype=torch.int8), m.pos(4)), "w-int8",
       dtypes=(torch.float32,), strided=False)])
add([L(aten._int_mm.default, lambda m: (m.t(5, 8, dtype=torch.int8), m.t(8, 4, dtype=torch.int8)), "int8",
       dtypes=(torch.float32,), strided=False),
     L(aten._int_mm.default, lambda m: (m.t(3, 1040, dtype=torch.int8), m.t(1040, 4, dtype=torch.int8)),
       "k-chunks", dtypes=(torch.float32,), strided=False)])
add([L(aten.linear.default, lambda m: (m.t(3, 5), m.t(4, 5), m.t(4)), "bias"),
     L(aten.linear.default, lambda m: (m.t(2, 3, 5), m.t(4, 5)), "3d-no-bias"),
     L(aten.linear.default, lambda m: (m.t(3, 5), m.t(5)), "1d-weight"),
     L(aten.linear.default, lambda m: (m.t(5), m.t(4, 5), m.t(4)), "1d-input"),
     L(aten.linear.default, lambda m: (m.t(0, 5), m.t(4, 5), m.t(4)), "zero-size")])
add([C(aten.outer.default, lambda m: (m.t(4), m.t(3)), "basic"),
     C(aten.outer.default, lambda m: (m.t(4, dtype=i64), m.t(3)), "promote", dtypes=(f32,))])

# ---------------------------------------------------------------------------- attention
_qkv = lambda m, hq=4, hk=4, lq=5, s=6: (m.t(2, hq, lq, 8), m.t(2, hk, s, 8), m.t(2, hk, s, 8))  # noqa: E731
add([L(aten.scaled_dot_product_attention.default, lambda m: _qkv(m), "plain"),
     L(aten.scaled_dot_product_attention.default, lambda m: (_qkv(m, lq=6), {"is_causal": True}), "causal"),
     L(aten.scaled_dot_product_attention.default, lambda m: (_qkv(m, lq=3), {"is_causal": True}), "causal-short-q"),
     L(aten.scaled_dot_product_attention.default, lambda m: ((*_qkv(m), m.b(5, 6) | torch.eye(5, 6, dtype=b8)), {}),
       "bool-mask"),
     L(aten.scaled_dot_product_attention.default, lambda m: ((*_qkv(m), m.t(2, 1, 5, 6)), {"scale": 0.3}),
       "float-mask-scale"),
     L(aten.scaled_dot_product_attention.default, lambda m: (_qkv(m, hq=4, hk=2), {"enable_gqa": True}), "gqa"),
     L(aten.scaled_dot_product_attention.default, lambda m: (m.t(5, 8), m.t(6, 8), m.t(6, 4)), "2d"),
     C(aten.scaled_dot_product_attention.default, lambda m: (_qkv(m), {"dropout_p": 0.5}), "dropout",
       extern=True, seeded=True, tol=LOOSE),
     # the internal CPU flash kernel reads garbage from inputs whose last axis is strided (sdpa
     # makes them contiguous before calling it), so only contiguous inputs are meaningful here
     F(aten._scaled_dot_product_flash_attention_for_cpu.default, lambda m: _qkv(m), "plain", outputs=(0,)),
     F(aten._scaled_dot_product_flash_attention_for_cpu.default, lambda m: (*_qkv(m, lq=6), 0.0, True), "causal",
       outputs=(0,)),
     F(aten._scaled_dot_product_flash_attention_for_cpu.default, lambda m: _qkv(m), "logsumexp-used"),
     F(aten._scaled_dot_product_flash_attention_for_cpu.default, lambda m: (*_qkv(m, lq=6), 0.0, True),
       "logsumexp-used-causal"),
     F(aten._scaled_dot_product_flash_attention_for_cpu.default,
       lambda m: ((*_qkv(m), 0.0, False), {"attn_mask": m.t(2, 1, 5, 6)}), "logsumexp-used-mask")])


def _flash_backward_args(m, causal=False, hq=4, hk=4):
    """(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal) with out and logsumexp from the forward."""
    q, k, v = _qkv(m, hq=hq, hk=hk, lq=6 if causal else 5)
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return (m.t(*o.shape), q, k, v, o, lse, 0.0, causal)


add([F(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, lambda m: _flash_backward_args(m), "plain"),
     F(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
       lambda m: _flash_backward_args(m, causal=True), "causal"),
     F(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
       lambda m: _flash_backward_args(m, hk=2), "gqa"),
     F(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
       lambda m: (*_flash_backward_args(m)[:6], 0.5, False), "dropout", extern=True)])

# ------------------------------------------------------------------------ convolutions
add([L(aten.convolution.default, lambda m: (m.t(1, 2, 5, 5), m.t(3, 2, 3, 3), m.t(3), [1, 1], [1, 1], [1, 1],
                                             False, [0, 0], 1), "2d", extern=True),
     L(aten.conv1d.default, lambda m: (m.t(1, 2, 7), m.t(3, 2, 3)), "1d", extern=True),
     L(aten.conv2d.default, lambda m: (m.t(1, 2, 5, 5), m.t(4, 1, 3, 3), None, [1, 1], [0, 0], [1, 1], 2), "groups",
       extern=True),
     L(aten.conv3d.default, lambda m: (m.t(1, 2, 3, 3, 3), m.t(2, 2, 1, 1, 1)), "3d", extern=True),
     L(aten.conv_transpose2d.input, lambda m: (m.t(1, 2, 3, 3), m.t(2, 3, 2, 2)), "transpose", extern=True)])

# ---------------------------------------------------------------------------- nll loss
_nll = lambda m, n=5, c=7: (m.t(n, c).log_softmax(-1), m.idx(c, n))  # noqa: E731
add([L(aten.nll_loss_forward.default, lambda m, r=r: (*_nll(m), None, r, -100), f"reduction{r}") for r in (0, 1, 2)])
add([L(aten.nll_loss_forward.default, lambda m: (m.t(7).log_softmax(-1), m.idx(7), None, 1, -100), "1d"),
     L(aten.nll_loss_forward.default, lambda m: (*_nll(m), None, 1, 2), "ignore-index"),
     L(aten.nll_loss_forward.default, lambda m: (m.t(3, 4), torch.tensor([1, -100, 2]), None, 1, -100),
       "ignored-negative"),
     L(aten.nll_loss_forward.default, lambda m: (m.t(2, 4), torch.tensor([-100, -100]), None, 1, -100), "all-ignored"),
     L(aten.nll_loss_forward.default, lambda m: (*_nll(m), m.pos(7), 1, -100), "weighted", extern=True)])

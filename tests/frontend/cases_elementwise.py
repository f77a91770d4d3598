"""Cases for the elementwise, creation and copy rules (lower_elementwise.py)."""

from __future__ import annotations

import torch

from novaforge.frontend.lower_elementwise import UNARY_TARGETS

from .harness import FLOAT, INTS, C, Case, b8, bf16, eager_supports, f32, i32, i64, u8

aten = torch.ops.aten
CASES: list[Case] = []
add = CASES.extend


def binary(target, a: str = "t", b: str = "t", *, ints: bool = True, bools: bool = False,
           scalars: bool = True, **kw) -> list[Case]:
    """The standard set for a binary Tensor overload: broadcasting, 0-d, zero-size, odd sizes,
    Python scalars, mixed dtypes, integer and bool tensors. `a`/`b` name the Maker method that
    draws each operand (t, pos, nz, unit)."""

    def A(m, *s, **k):
        return getattr(m, a)(*s, **k)

    def B(m, *s, **k):
        return getattr(m, b)(*s, **k)

    cs = [
        C(target, lambda m: (A(m, 3, 5), B(m, 3, 5)), "same", **kw),
        C(target, lambda m: (A(m, 4, 1, 5), B(m, 3, 1)), "bcast", **kw),
        C(target, lambda m: (A(m, 7, 13), B(m)), "0d-rhs", **kw),
        C(target, lambda m: (A(m), B(m, 2, 3)), "0d-lhs", **kw),
        C(target, lambda m: (A(m, 0, 3), B(m, 3)), "zero-size", **kw),
        C(target, lambda m: (A(m, 2, 3, dtype=f32), B(m, 3, dtype=bf16)), "f32-bf16", dtypes=(f32,), **kw),
        C(target, lambda m: (A(m, 2, 3, dtype=i64), B(m, 3, dtype=f32)), "i64-f32", dtypes=(f32,), **kw),
    ]
    one = torch.ones(2)
    if scalars and eager_supports(target, one, 2) and eager_supports(target, one.long(), 2.5):
        cs += [
            C(target, lambda m: (A(m, 2, 3), 3 if b != "unit" else 0), "int-scalar", **kw),
            C(target, lambda m: (A(m, 2, 3), -1.5 if b not in ("pos", "unit") else 0.75), "float-scalar", **kw),
            C(target, lambda m: (A(m, 2, 3, dtype=i64), 2.5 if b != "unit" else 0.5), "int-tensor-float-scalar",
              dtypes=(f32,), **kw),
        ]
    if ints:
        cs += [C(target, lambda m: (A(m, 3, 1, 4), B(m, 5, 1)), "int", dtypes=INTS, **kw),
               C(target, lambda m: (A(m, 3, 4, dtype=i32), B(m, 4, dtype=i64)), "i32-i64", dtypes=(i64,), **kw)]
        if scalars and eager_supports(target, one.long(), 2):
            cs.append(C(target, lambda m: (A(m, 3, 4), 3), "int-int-scalar", dtypes=INTS, **kw))
    if bools:
        cs += [C(target, lambda m: (m.b(3, 4), m.b(4)), "bool", dtypes=(b8,), **kw),
               C(target, lambda m: (m.b(3, 4), B(m, 4)), "bool-float", **kw)]
    return cs


def scalar_overload(target, a: str = "t", scalar=2, *, ints: bool = True, **kw) -> list[Case]:
    """Cases for a `.Scalar` overload (tensor, Python number)."""
    cs = [C(target, lambda m: (getattr(m, a)(3, 5), scalar), "int-scalar", **kw),
          C(target, lambda m: (getattr(m, a)(3, 5), float(scalar) + 0.25), "float-scalar", **kw),
          C(target, lambda m: (getattr(m, a)(0, 5), scalar), "zero-size", **kw),
          C(target, lambda m: (getattr(m, a)(), scalar), "0d", **kw)]
    if ints:
        cs += [C(target, lambda m: (getattr(m, a)(3, 5), scalar), "int", dtypes=INTS, **kw),
               C(target, lambda m: (getattr(m, a)(3, 5, dtype=i64), float(scalar) + 0.5), "int-tensor-float",
                 dtypes=(f32,), **kw)]
    return cs


# ------------------------------------------------------------------- binary arithmetic
add(binary(aten.add.Tensor, bools=True))
add([C(aten.add.Tensor, lambda m: ((m.t(3, 4), m.t(4)), {"alpha": 2}), "alpha-int"),
     C(aten.add.Tensor, lambda m: ((m.t(3, 4), m.t(4)), {"alpha": -0.5}), "alpha-float"),
     C(aten.add.Tensor, lambda m: ((m.t(3, 4), m.t(4)), {"alpha": 3}), "alpha-int-dtype", dtypes=INTS)])
add(scalar_overload(aten.add.Scalar))
add([C(aten.add.Scalar, lambda m: ((m.t(3, 4), 2), {"alpha": 3}), "alpha")])
add(binary(aten.sub.Tensor))
add([C(aten.sub.Tensor, lambda m: ((m.t(3, 4), m.t(3, 1)), {"alpha": 2.5}), "alpha")])
add(scalar_overload(aten.sub.Scalar))
add([C(aten.sub.Scalar, lambda m: ((m.t(3, 4), 2), {"alpha": -2}), "alpha")])
add(binary(aten.mul.Tensor, bools=True))
add(scalar_overload(aten.mul.Scalar))
add([C(aten.mul.Scalar, lambda m: (m.b(3, 4), True), "bool", dtypes=(b8,))])
for _t in (aten.maximum.default, aten.minimum.default):
    add(binary(_t, bools=True, scalars=False))
    add([C(_t, lambda m: (m.special(), m.special().flip(0)), "special")])
add(binary(aten.remainder.Tensor, b="nz"))
add([C(aten.remainder.Tensor, lambda m: (m.special(), m.nz(12)), "special")])
add(scalar_overload(aten.remainder.Scalar, scalar=-3))
add(binary(aten.atan2.default, ints=False))
add([C(aten.atan2.default, lambda m: (m.special(), m.special().flip(0)), "special")])
add(binary(aten.pow.Tensor_Tensor, a="pos", ints=False, scalars=False))
add([C(aten.pow.Tensor_Tensor, lambda m: (m.pos(3, 4, dtype=i64), m.idx(4, 4)), "int", dtypes=(i64,)),
     C(aten.pow.Tensor_Tensor, lambda m: (m.t(3, 4), m.idx(4, 4).float()), "neg-base-int-exp", dtypes=(f32,))])
for _e in (2, 3, 0.5, -0.5, -1, 1, 0, 1.7, -2):
    add([C(aten.pow.Tensor_Scalar, lambda m, e=_e: (m.pos(3, 5), e), f"exp{_e}")])
add([C(aten.pow.Tensor_Scalar, lambda m: (m.t(4, 5), 2), "int-exp2", dtypes=INTS),
     C(aten.pow.Tensor_Scalar, lambda m: (m.t(4, 5, dtype=i64), 0.5), "int-tensor-float-exp", dtypes=(f32,)),
     C(aten.pow.Tensor_Scalar, lambda m: (m.t(0, 5), 2), "zero-size"),
     C(aten.pow.Tensor_Scalar, lambda m: (m.special(), 2), "special")])
add([C(aten.pow.Scalar, lambda m: (2, m.t(3, 5)), "int-base"),
     C(aten.pow.Scalar, lambda m: (1.5, m.t(3, 5)), "float-base"),
     C(aten.pow.Scalar, lambda m: (2, m.idx(5, 3, 5)), "int-int", dtypes=(i64,)),
     C(aten.pow.Scalar, lambda m: (2.5, m.idx(5, 3, 5)), "float-base-int-exp", dtypes=(f32,))])

add(binary(aten.rsub.Tensor))
add([C(aten.rsub.Tensor, lambda m: ((m.t(3, 4), m.t(4)), {"alpha": 2}), "alpha")])
add(scalar_overload(aten.rsub.Scalar))
add([C(aten.rsub.Scalar, lambda m: ((m.t(3, 4), 2), {"alpha": 3}), "alpha")])

add(binary(aten.div.Tensor, b="nz"))
add([C(aten.div.Tensor, lambda m: (m.special(), m.special().flip(0)), "special"),
     C(aten.div.Tensor, lambda m: (m.t(3, 4), m.nz(4)), "int-int", dtypes=INTS)])
add(scalar_overload(aten.div.Scalar, scalar=3))
add(binary(aten.true_divide.Tensor, b="nz", scalars=False))
for _mode in (None, "floor", "trunc"):
    for _t in (aten.div.Tensor_mode,):
        add([C(_t, lambda m, r=_mode: ((m.t(3, 5), m.nz(5)), {"rounding_mode": r}), f"{_mode}"),
             C(_t, lambda m, r=_mode: ((m.t(3, 5), m.nz(3, 1)), {"rounding_mode": r}), f"{_mode}-int", dtypes=INTS),
             C(_t, lambda m, r=_mode: ((m.special(), m.special().flip(0)), {"rounding_mode": r}), f"{_mode}-special"),
             C(_t, lambda m, r=_mode: ((m.t(0, 5), m.nz(5)), {"rounding_mode": r}), f"{_mode}-zero-size")])
    add([C(aten.div.Scalar_mode, lambda m, r=_mode: ((m.t(3, 5), 3), {"rounding_mode": r}), f"{_mode}"),
         C(aten.div.Scalar_mode, lambda m, r=_mode: ((m.t(3, 5), -3), {"rounding_mode": r}), f"{_mode}-int",
           dtypes=INTS),
         C(aten.div.Scalar_mode, lambda m, r=_mode: ((m.t(3, 5), 0.1), {"rounding_mode": r}), f"{_mode}-tenth")])
add(binary(aten.floor_divide.default, b="nz"))
add([C(aten.floor_divide.default, lambda m: (torch.tensor([1.0, -1.0, 7.0, 0.3]), torch.tensor([0.1, 0.1, -0.7, 0.1])),
       "rounding-edge", dtypes=(f32,)),
     C(aten.floor_divide.default, lambda m: (m.special(), m.special().flip(0)), "special")])
add(scalar_overload(aten.floor_divide.Scalar, scalar=-3))

# ----------------------------------------------------------------------- comparisons
for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    add(binary(getattr(aten, _op).Tensor, bools=True))
    add([C(getattr(aten, _op).Tensor, lambda m: (m.special(), m.special().flip(0)), "special"),
         C(getattr(aten, _op).Tensor, lambda m: (m.t(3, 4, dtype=i64), m.t(4, dtype=i32) * 0.5), "i64-half",
           dtypes=(f32,)),
         C(getattr(aten, _op).Tensor, lambda m: (m.t(3, 4, dtype=u8), m.t(4, dtype=torch.int8)), "u8-i8",
           dtypes=(i64,))])
    add(scalar_overload(getattr(aten, _op).Scalar, scalar=1))
    add([C(getattr(aten, _op).Scalar, lambda m: (m.t(3, 4, dtype=i64), 0.5), "int-tensor-half", dtypes=(f32,)),
         C(getattr(aten, _op).Scalar, lambda m: (m.b(3, 4), True), "bool", dtypes=(b8,))])

# ---------------------------------------------------------------------------- unary
_DOMAIN = {"log": "pos", "log1p": "pos", "log2": "pos", "sqrt": "pos", "rsqrt": "pos", "asin": "unit",
           "acos": "unit", "reciprocal": "nz"}
for _name in UNARY_TARGETS:
    _t = getattr(aten, _name).default
    _kind = _DOMAIN.get(_name, "t")
    if _name == "bitwise_not":
        add([C(_t, lambda m: m.t(3, 5), "int", dtypes=(i64, i32, u8, b8)),
             C(_t, lambda m: m.t(0, 5), "zero-size", dtypes=(i64,))])
        continue
    add([C(_t, lambda m, k=_kind: getattr(m, k)(3, 5), "2d"),
         C(_t, lambda m, k=_kind: getattr(m, k)(), "0d"),
         C(_t, lambda m, k=_kind: getattr(m, k)(0, 4), "zero-size"),
         C(_t, lambda m, k=_kind: getattr(m, k)(7, 13), "odd"),
         C(_t, lambda m: m.special(), "special")])
    if eager_supports(_t, torch.ones(2, dtype=i64)):
        add([C(_t, lambda m, k=_kind: getattr(m, k)(3, 5), "int", dtypes=INTS)])
    if eager_supports(_t, torch.ones(2, dtype=b8)):
        add([C(_t, lambda m: m.b(3, 5), "bool", dtypes=(b8,))])

add([C(aten.gelu.default, lambda m: m.t(3, 7), "erf"),
     C(aten.gelu.default, lambda m: ((m.t(3, 7),), {"approximate": "tanh"}), "tanh"),
     C(aten.gelu.default, lambda m: m.special(), "special"),
     C(aten.gelu.default, lambda m: m.t(0, 7), "zero-size")])
for _t in (aten.isnan.default, aten.isinf.default, aten.isfinite.default):
    add([C(_t, lambda m: m.special(), "special"), C(_t, lambda m: m.t(3, 0), "zero-size"),
         C(_t, lambda m: m.t(3, 4), "int", dtypes=INTS + (b8,))])

# --------------------------------------------------------------------------- logical
add([C(aten.logical_not.default, lambda m: m.t(3, 4), "float"),
     C(aten.logical_not.default, lambda m: m.t(3, 4), "int-bool", dtypes=(i64, b8)),
     C(aten.logical_not.default, lambda m: m.special(), "special")])
for _op in ("logical_and", "logical_or", "logical_xor"):
    add([C(getattr(aten, _op).default, lambda m: (m.t(3, 4), m.t(4)), "float"),
         C(getattr(aten, _op).default, lambda m: (m.b(3, 1, 4), m.b(2, 1)), "bool", dtypes=(b8,)),
         C(getattr(aten, _op).default, lambda m: (m.t(3, 4, dtype=i64), m.b(4)), "int-bool", dtypes=(b8,)),
         C(getattr(aten, _op).default, lambda m: (m.special(), m.special().flip(0)), "special"),
         C(getattr(aten, _op).default, lambda m: (m.t(0, 4), m.t(4)), "zero-size")])
for _op, _dunder in (("bitwise_and", "__and__"), ("bitwise_or", "__or__"), ("bitwise_xor", "__xor__")):
    for _t in (getattr(aten, _op).Tensor, getattr(aten, _dunder).Tensor):
        add([C(_t, lambda m: (m.t(3, 1, 4), m.t(2, 4)), "int", dtypes=(i64, i32, u8)),
             C(_t, lambda m: (m.b(3, 4), m.b(4)), "bool", dtypes=(b8,)),
             C(_t, lambda m: (m.t(3, 4, dtype=i32), m.t(4, dtype=i64)), "i32-i64", dtypes=(i64,)),
             C(_t, lambda m: (m.t(0, 4), m.t(4)), "zero-size", dtypes=(i64,))])
    for _t in (getattr(aten, _op).Scalar, getattr(aten, _dunder).Scalar):
        add([C(_t, lambda m: (m.t(3, 4), 6), "int", dtypes=(i64, i32, u8)),
             C(_t, lambda m: (m.b(3, 4), True), "bool", dtypes=(b8,))])

# ----------------------------------------------------------------------------- where
for _t, _mk in (
    (aten.where.self, lambda m: (m.b(3, 1, 4), m.t(2, 4), m.t(3, 1, 1))),
    (aten.where.ScalarSelf, lambda m: (m.b(3, 4), 1.5, m.t(4))),
    (aten.where.ScalarOther, lambda m: (m.b(3, 4), m.t(3, 1), -2)),
    (aten.where.Scalar, lambda m: (m.b(3, 4), 1.5, -2)),
):
    add([C(_t, _mk, "bcast", dtypes=FLOAT + (i64,))])
add([C(aten.where.self, lambda m: (m.b(0, 4), m.t(4), m.t(1)), "zero-size"),
     C(aten.where.self, lambda m: (m.b(3, 4), m.t(4, dtype=i64), m.t(3, 4)), "promote"),
     C(aten.where.self, lambda m: (m.b(3, 4), m.t(4), m.t()), "0d"),
     C(aten.where.self, lambda m: (m.t(3, 4, dtype=u8), m.t(4), m.t(3, 4)), "u8-cond"),
     C(aten.where.ScalarOther, lambda m: (m.b(3, 4), m.t(3, 4, dtype=i64), 0.5), "int-float-scalar",
       dtypes=(f32,))])
add([C(aten.masked_fill.Scalar, lambda m: (m.t(3, 4), m.b(4), -1e9), "bcast"),
     C(aten.masked_fill.Scalar, lambda m: (m.t(3, 4), m.b(3, 4), float("-inf")), "inf"),
     C(aten.masked_fill.Scalar, lambda m: (m.t(3, 4), m.b(3, 4), 2), "int", dtypes=INTS + (b8,)),
     C(aten.masked_fill.Scalar, lambda m: (m.t(0, 4), m.b(4), 1.0), "zero-size"),
     C(aten.masked_fill.Tensor, lambda m: (m.t(3, 4), m.b(3, 1), m.t()), "0d-value"),
     C(aten.masked_fill.Tensor, lambda m: (m.t(3, 4), m.b(4), m.t(dtype=f32)), "f32-value", dtypes=(bf16,))])

# ----------------------------------------------------------------- clamps, activations
for _t in (aten.clamp.default, aten.clip.default):
    add([C(_t, lambda m: (m.t(3, 5), -1.0, 0.5), "both"),
         C(_t, lambda m: ((m.t(3, 5),), {"min": -0.5}), "min"),
         C(_t, lambda m: ((m.t(3, 5),), {"max": 0.5}), "max"),
         C(_t, lambda m: (m.t(3, 5), 1.0, -1.0), "min-gt-max"),
         C(_t, lambda m: (m.special(), -1.0, 1.0), "special"),
         C(_t, lambda m: (m.t(3, 5), -2, 3), "int", dtypes=INTS),
         C(_t, lambda m: (m.t(3, 5, dtype=i64), -0.5, 2.5), "int-tensor-float-bounds", dtypes=(f32,)),
         C(_t, lambda m: (m.t(0, 5), -1, 1), "zero-size")])
add([C(aten.clamp.Tensor, lambda m: (m.t(3, 5), m.t(5), m.t(3, 1)), "both"),
     C(aten.clamp.Tensor, lambda m: ((m.t(3, 5),), {"min": m.t(5)}), "min"),
     C(aten.clamp.Tensor, lambda m: ((m.t(3, 5),), {"max": m.t()}), "max"),
     C(aten.clamp.Tensor, lambda m: (m.t(3, 5), m.t(5), m.t(5)), "int", dtypes=INTS)])
add([C(aten.hardtanh.default, lambda m: m.t(3, 5), "default"),
     C(aten.hardtanh.default, lambda m: (m.t(3, 5), 0.0, 6.0), "relu6"),
     C(aten.hardtanh.default, lambda m: m.special(), "special")])
for _t, _tt in ((aten.clamp_min.default, aten.clamp_min.Tensor), (aten.clamp_max.default, aten.clamp_max.Tensor)):
    add([C(_t, lambda m: (m.t(3, 5), 0.5), "float"), C(_t, lambda m: (m.t(3, 5), 2), "int", dtypes=INTS),
         C(_t, lambda m: (m.special(), 0.0), "special"),
         C(_tt, lambda m: (m.t(3, 5), m.t(5)), "bcast"), C(_tt, lambda m: (m.t(3, 5), m.t(3, 1)), "int", dtypes=INTS)])
_ACT = (lambda m: m.t(4, 9), lambda m: m.special(), lambda m: m.t(0, 3), lambda m: m.t())
for _t in (aten.leaky_relu.default, aten.hardsigmoid.default, aten.hardswish.default, aten.softplus.default,
           aten.mish.default, aten.elu.default):
    add([C(_t, mk, lab) for mk, lab in zip(_ACT, ("2d", "special", "zero-size", "0d"), strict=True)])
add([C(aten.leaky_relu.default, lambda m: (m.t(4, 9), 0.2), "slope"),
     C(aten.softplus.default, lambda m: (m.t(4, 9), 2.0, 3.0), "beta-threshold"),
     C(aten.softplus.default, lambda m: (m.t(4, 9) * 10, 1, 20), "large"),
     C(aten.elu.default, lambda m: (m.t(4, 9), 1.6732632423543772, 1.0507009873554805), "selu"),
     C(aten.elu.default, lambda m: (m.t(4, 9), 0.5, 1.0, 2.0), "celu")])
add([C(aten.celu.default, mk, lab) for mk, lab in zip(_ACT, ("2d", "special", "zero-size", "0d"), strict=True)])
add([C(aten.celu.default, lambda m: (m.t(4, 9), 0.5), "alpha"),
     C(aten.glu.default, lambda m: m.t(3, 8), "last"),
     C(aten.glu.default, lambda m: (m.t(4, 3, 2), 0), "dim0"),
     C(aten.glu.default, lambda m: (m.t(0, 6), -1), "zero-size"),
     C(aten.frac.default, lambda m: m.t(3, 5) * 3, "2d"),
     C(aten.frac.default, lambda m: m.special(), "special"),
     C(aten.log10.default, lambda m: m.pos(3, 5) * 100, "2d"),
     C(aten.log10.default, lambda m: m.special(), "special"),
     C(aten.log10.default, lambda m: m.pos(3, 5), "int", dtypes=(i64,)),
     C(aten.round.decimals, lambda m: ((m.t(3, 5) * 10,), {"decimals": 2}), "d2"),
     C(aten.round.decimals, lambda m: ((m.t(3, 5) * 1000,), {"decimals": -2}), "d-2"),
     C(aten.round.decimals, lambda m: ((m.t(3, 5) * 3,), {"decimals": 0}), "d0"),
     C(aten.round.decimals, lambda m: ((m.special(),), {"decimals": 1}), "special")])
add([C(aten.lerp.Scalar, lambda m: (m.t(3, 5), m.t(5), 0.3), "low-weight"),
     C(aten.lerp.Scalar, lambda m: (m.t(3, 5), m.t(5), 0.8), "high-weight"),
     C(aten.lerp.Scalar, lambda m: (m.t(3, 5) * 1000, m.t(5) * 1e-3, 1.0), "weight-one"),
     C(aten.lerp.Tensor, lambda m: (m.t(3, 5), m.t(5), m.unit(3, 1) + 0.5), "tensor-weight"),
     C(aten.lerp.Tensor, lambda m: (m.t(0, 5), m.t(5), m.t()), "zero-size")])
for _t, _b in ((aten.addcmul.default, "t"), (aten.addcdiv.default, "nz")):
    add([C(_t, lambda m, b=_b: (m.t(3, 5), m.t(5), getattr(m, b)(3, 1)), "bcast"),
         C(_t, lambda m, b=_b: ((m.t(3, 5), m.t(3, 5), getattr(m, b)(3, 5)), {"value": -0.5}), "value"),
         C(_t, lambda m, b=_b: ((m.t(0, 5), m.t(5), getattr(m, b)(5)), {"value": 2}), "zero-size")])
add([C(aten.addcmul.default, lambda m: ((m.t(3, 5), m.t(5), m.t(3, 1)), {"value": 2}), "int", dtypes=INTS)])

# -------------------------------------------------------------------------- creation
add([C(aten.full.default, lambda m: (((2, 3), 1.5), {"dtype": m.dtype}), "float", dtypes=FLOAT + (i64, b8)),
     C(aten.full.default, lambda m: ((0, 3), 2), "zero-size", dtypes=(f32,)),
     C(aten.full.default, lambda m: ((2, 3), 7), "int-default-dtype", dtypes=(i64,)),
     C(aten.full.default, lambda m: ((), float("-inf")), "0d-inf", dtypes=(f32,)),
     C(aten.full_like.default, lambda m: (m.t(3, 4), 2.5), "float"),
     C(aten.full_like.default, lambda m: ((m.t(3, 4), 7), {"dtype": i32}), "dtype"),
     C(aten.new_full.default, lambda m: (m.t(2), (3, 4), -1), "new"),
     C(aten.zeros.default, lambda m: (((2, 3),), {"dtype": m.dtype}), "2d", dtypes=FLOAT + (i64, b8)),
     C(aten.zeros.default, lambda m: ((0, 3),), "zero-size", dtypes=(f32,)),
     C(aten.zeros_like.default, lambda m: m.t(3, 4), "like", dtypes=FLOAT + (i64,)),
     C(aten.new_zeros.default, lambda m: (m.t(2), (3, 4)), "new"),
     C(aten.ones.default, lambda m: (((2, 3),), {"dtype": m.dtype}), "2d", dtypes=FLOAT + (i64, b8)),
     C(aten.ones_like.default, lambda m: m.t(3, 4), "like", dtypes=FLOAT + (i64, b8)),
     C(aten.new_ones.default, lambda m: ((m.t(2), (3, 4)), {"dtype": i64}), "new"),
     C(aten.empty.memory_format, lambda m: (((2, 3),), {"dtype": m.dtype}), "2d", values=False),
     C(aten.empty_like.default, lambda m: m.t(3, 4), "like", values=False),
     C(aten.new_empty.default, lambda m: (m.t(2), (3, 0)), "new", values=False),
     C(aten.empty_strided.default, lambda m: ((3, 4), (1, 3)), "strided", values=False),
     C(aten.scalar_tensor.default, lambda m: ((2.5,), {"dtype": m.dtype}), "float", dtypes=FLOAT + (i64,)),
     C(aten.scalar_tensor.default, lambda m: (3,), "default-dtype", dtypes=(f32,)),
     C(aten.fill.Scalar, lambda m: (m.t(3, 4), 1.5), "float", dtypes=FLOAT + (i64,)),
     C(aten.fill.Scalar, lambda m: (m.t(0, 4), 1.5), "zero-size"),
     C(aten.fill.Tensor, lambda m: (m.t(3, 4), m.t()), "0d"),
     C(aten.fill.Tensor, lambda m: (m.t(3, 4), m.t(dtype=i64)), "int-value"),
     C(aten.arange.default, lambda m: ((7,), {"dtype": m.dtype}), "end", dtypes=FLOAT + (i64,)),
     C(aten.arange.default, lambda m: (5,), "int-default", dtypes=(i64,)),
     C(aten.arange.default, lambda m: (2.5,), "float-end", dtypes=(f32,)),
     C(aten.arange.default, lambda m: (0,), "empty", dtypes=(i64,)),
     C(aten.arange.start, lambda m: (-3, 4), "start", dtypes=(i64,)),
     C(aten.arange.start, lambda m: ((0.5, 4), {"dtype": m.dtype}), "float-start"),
     C(aten.arange.start_step, lambda m: (1, 10, 3), "step", dtypes=(i64,)),
     C(aten.arange.start_step, lambda m: (10, 1, -2), "neg-step", dtypes=(i64,)),
     C(aten.arange.start_step, lambda m: ((0.0, 1.0, 0.1), {"dtype": m.dtype}), "float-step"),
     C(aten.arange.start_step, lambda m: (-1.0, 1.0, 0.25), "float-default", dtypes=(f32,))])

# ---------------------------------------------------------------------------- copies
for _t in (aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
           aten.lift_fresh_copy.default, aten.lift_fresh.default, aten.resolve_conj.default,
           aten.resolve_neg.default, aten.positive.default):
    add([C(_t, lambda m: m.t(3, 4), "2d", dtypes=FLOAT + (i64,), exact=True),
         C(_t, lambda m: m.t(0, 4), "zero-size", dtypes=(f32,), exact=True)])
add([C(aten.clone.default, lambda m: ((m.t(3, 4),), {"memory_format": torch.contiguous_format}), "format",
       exact=True)])
add([C(aten._to_copy.default, lambda m: ((m.t(3, 4),), {"dtype": d}), f"to-{d}", dtypes=(f32, bf16, i64, b8))
     for d in (f32, bf16, i64, i32, b8, u8)])
add([C(aten._to_copy.default, lambda m: m.t(3, 4), "same", exact=True),
     C(aten._to_copy.default, lambda m: ((m.special(),), {"dtype": bf16}), "special", dtypes=(f32,)),
     C(aten.to.dtype, lambda m: (m.t(3, 4), i32), "int"),
     C(torch.ops.prims.convert_element_type.default, lambda m: (m.t(3, 4), bf16), "prims", dtypes=(f32, i64)),
     C(aten.to.dtype, lambda m: (m.t(3, 4) * 1000, bf16), "round", dtypes=(f32,)),
     C(aten.to.dtype_layout, lambda m: ((m.t(3, 4),), {"dtype": f32}), "layout", dtypes=(bf16, i64)),
     C(aten.to.device, lambda m: (m.t(3, 4), torch.device("cpu"), i64), "device-same"),
     C(aten.to.other, lambda m: (m.t(3, 4), m.t(2, dtype=bf16)), "other", dtypes=(f32, i64)),
     C(aten.type_as.default, lambda m: (m.t(3, 4), m.t(2, dtype=i32)), "int"),
     C(aten.copy.default, lambda m: (m.t(3, 4), m.t(4, dtype=i64)), "bcast-cast"),
     C(aten.copy.default, lambda m: (m.t(3, 4), m.t(3, 4)), "same", exact=True)])
add([C(aten._assert_tensor_metadata.default, lambda m: ((m.t(3, 4),), {"dtype": m.dtype}), "noop"),
     C(aten._assert_scalar.default, lambda m: (True, "ok"), "noop", dtypes=(f32,)),
     C(aten.sym_constrain_range_for_size.default, lambda m: ((3,), {"min": 0, "max": 8}), "noop", dtypes=(f32,)),
     C(aten.sym_constrain_range.default, lambda m: ((3,), {"min": 0, "max": 8}), "noop", dtypes=(f32,)),
     C(aten._assert_async.msg, lambda m: (torch.tensor(True), "ok"), "noop", dtypes=(f32,))])
for _t in (aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default):
    add([C(_t, lambda m: (m.t(3, 4, 2), 0.5, False), "eval", exact=True),
         C(_t, lambda m: (m.t(3, 4, 2), 0.0, True), "p0", exact=True),
         C(_t, lambda m: (m.t(3, 4, 2), 0.5, True), "train", extern=True, seeded=True)])
add([C(aten.native_dropout.default, lambda m: (m.t(3, 4), 0.5, False), "eval", exact=True),
     C(aten.native_dropout.default, lambda m: (m.t(3, 4), 0.0, True), "p0", exact=True),
     C(aten.native_dropout.default, lambda m: (m.t(3, 4), 0.5, True), "train", extern=True, seeded=True),
     C(aten.native_dropout.default, lambda m: (m.t(3, 4), 0.5, None), "train-none", extern=True, seeded=True)])
# random="eager" keeps ATen's draws (externs); the counter-based draws are tested in tests/test_random.py
add([C(aten.bernoulli.p, lambda m: (m.t(3, 4), 0.3), "p", extern=True, seeded=True),
     C(aten.bernoulli.default, lambda m: (m.t(3, 4).sigmoid(),), "probs", extern=True, seeded=True),
     C(aten.rand_like.default, lambda m: (m.t(3, 4),), "like", extern=True, seeded=True),
     C(aten.rand.default, lambda m: (([3, 4],), {"dtype": m.dtype}), "size", extern=True, seeded=True)])

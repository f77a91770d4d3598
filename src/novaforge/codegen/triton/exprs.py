"""Triton expressions for IR elementwise ops, literals, dtypes and strided index arithmetic.

Invariant: `render_op(node, args, ctx)` returns a Triton expression that computes the op on
operands held in their *compute* dtype (16-bit floats are computed in float32, every other
dtype in itself) and yields the output in its compute dtype; rounding to a 16-bit float happens
only at explicit casts and at stores, as in a fused kernel. Every helper it needs is registered
in `ctx.helpers` and defined by `helper_source`. Only core `triton.language` functions are used
(no libdevice), so one source runs on the GPU and in Triton's CPU interpreter. Ops without a
rendering return None, which makes the whole kernel fall back to torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ...ir import Node
from ...ir.symbolic import Sym
from ...ir.types import is_float
from ..body import NOT_GENERATED

TL_DTYPE: dict[torch.dtype, str] = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def tl_compute(dtype: torch.dtype) -> str:
    return TL_DTYPE[compute_dtype(dtype)]


@dataclass
class ExprContext:
    helpers: set[str] = field(default_factory=set)
    arg_consts: list = field(default_factory=list)  # per operand of the op being rendered: its literal value or None

    def use(self, name: str) -> str:
        self.helpers.add(name)
        return name


def signbit(x: str, dtype: torch.dtype) -> str:
    """Is the sign bit of `x` (a float in its compute dtype) set? True for -0.0 too."""
    bits = "tl.int64" if compute_dtype(dtype) == torch.float64 else "tl.int32"
    return f"({x}.to({bits}, bitcast=True) < 0)"


# NaN as a bit pattern, not a global: Triton 3.6 checks at each launch that a kernel's globals
# still equal their values at compile time, and a constexpr NaN never equals itself ("Global
# variable _NAN has changed since we compiled this kernel", seen on the H200)
NAN = "tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)"


def literal(value: float | int | bool, dtype: torch.dtype) -> str:
    """A 0-d Triton tensor holding `value` in the compute dtype of `dtype`."""
    cdt = tl_compute(dtype)
    if isinstance(value, Sym):  # a size used as a number: the kernel's size arguments
        return f"((tl.zeros([], tl.int64) + {value}) != 0)" if dtype == torch.bool else \
            f"(tl.zeros([], {cdt}) + {value})"
    if dtype == torch.bool:
        return f"tl.full([], {1 if value else 0}, tl.int1)"
    if is_float(dtype):
        v = float(value)
        if math.isnan(v):
            return f"{NAN}.to({cdt})"
        if math.isinf(v):
            text = "_INF" if v > 0 else "_NEG_INF"
        else:
            text = repr(v)
        return f"tl.full([], {text}, {cdt})"
    return f"tl.full([], {int(value)}, {cdt})"


def downcast(x: str, dtype: torch.dtype) -> str:
    """`x` (compute dtype) converted to `dtype`; float32 -> 16-bit rounds to nearest even, which
    the GPU does by default and the interpreter only when asked."""
    if dtype in (torch.float16, torch.bfloat16):
        return f"{x}.to({TL_DTYPE[dtype]}, fp_downcast_rounding=\"rtne\")"
    return f"{x}.to({TL_DTYPE[dtype]})"


def scalar_value(node: Node | None) -> float | int | bool | None:
    """The value of a `scalar` (or `full`) generator node, else None."""
    if node is not None and node.op in ("scalar", "full"):
        return node.attrs["value"]
    return None


# ------------------------------------------------------------------------------ op table
Render = Callable[[Sequence[str], Node, ExprContext], "str | None"]


def _u(fmt: str) -> Render:
    return lambda a, n, c: fmt.format(*a)


def _helper(name: str, nargs: int = 1) -> Render:
    return lambda a, n, c: f"{c.use(name)}({', '.join(a[:nargs])})"


def _float_only(fmt: str) -> Render:
    def r(a, n, c):
        return fmt.format(*a) if is_float(n.inputs[0].type.dtype) else None

    return r


def _gelu(a, n, c):
    x = a[0]
    if n.attrs["approximate"] == "tanh":
        return f"0.5 * {x} * (1.0 + {c.use('_tanh')}(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _cmp_extreme(fn: str) -> Render:
    def r(a, n, c):
        if is_float(n.inputs[0].type.dtype):
            return f"tl.{fn}({a[0]}, {a[1]}, propagate_nan=tl.PropagateNan.ALL)"
        return f"tl.{fn}({a[0]}, {a[1]})"

    return r


def _int_or_float(fl: str, integer: str) -> Render:
    def r(a, n, c):
        if is_float(n.inputs[0].type.dtype):
            return fl.format(*a)
        name = integer
        return f"{c.use(name)}({a[0]}, {a[1]})"

    return r


def _sign(a, n, c):
    dt = n.inputs[0].type.dtype
    if dt == torch.bool:
        return a[0]
    cdt = tl_compute(dt)
    return f"tl.where({a[0]} > 0, 1, tl.where({a[0]} < 0, -1, 0)).to({cdt})"


def _relu(a, n, c):
    if n.inputs[0].type.dtype == torch.bool:
        return a[0]
    return f"tl.where({a[0]} < 0, 0, {a[0]})"


def _not(a, n, c):
    return f"({a[0]} == 0)" if n.inputs[0].type.dtype == torch.bool else f"(~{a[0]})"


def _pow(a, n, c):
    dt = n.inputs[0].type.dtype
    exp_value = c.arg_consts[1] if len(c.arg_consts) > 1 else None
    if exp_value is not None:
        e = float(exp_value)
        if e == int(e) and -4 <= e <= 8 and (e >= 0 or is_float(dt)):
            k = int(abs(e))
            if k == 0:
                return f"(tl.zeros_like({a[0]}) + 1)"
            prod = " * ".join([f"{a[0]}"] * k)
            return f"(1.0 / ({prod}))" if e < 0 else f"({prod})"
        if e == 0.5 and is_float(dt):
            return f"tl.sqrt({a[0]})"
        if e == -0.5 and is_float(dt):
            return f"tl.rsqrt({a[0]})"
        if is_float(dt) and math.isfinite(e) and e != int(e):
            # a non-integer constant exponent: NaN for negative bases, C's pow(-inf, e) at -inf
            x, at_neg_inf = a[0], "_INF" if e > 0 else "0.0"
            r = f"tl.exp2({e!r} * tl.log2(tl.abs({x})))"
            return f"tl.where({x} == _NEG_INF, {at_neg_inf}, tl.where({x} < 0, {NAN}, {r}))"
    if dt == torch.bool:
        return None
    if not is_float(dt):
        return f"{c.use('_pow_int')}({a[0]}, {a[1]})"
    return f"{c.use('_pow')}({a[0]}, {a[1]})"


def _cast(a, n, c):
    src, dst = n.inputs[0].type.dtype, n.attrs["dtype"]
    x = a[0]
    if dst == src:
        return x
    if dst == torch.bool:
        return f"({x} != 0)"
    if dst in (torch.float16, torch.bfloat16):
        if src not in (torch.float32, torch.float16, torch.bfloat16):
            # torch converts integers and float64 to a 16-bit float through float32 (c10::BFloat16
            # and c10::Half are built from a float): the same two roundings here
            x = f"{x}.to(tl.float32)"
        return f"{downcast(x, dst)}.to(tl.float32)"  # round to the 16-bit type, compute in float32
    if compute_dtype(dst) == compute_dtype(src):
        return x
    return f"{x}.to({TL_DTYPE[dst]})"


def _counter_uniform(a, n, c):
    u = f"{c.use('_counter_uniform')}({a[0]}, {a[1]})"  # float32, a multiple of 2^-24
    dst = n.attrs["dtype"]
    if dst in (torch.float16, torch.bfloat16):
        return f"{downcast(u, dst)}.to(tl.float32)"  # rounded to the 16-bit type, computed in float32
    return u if dst == torch.float32 else f"{u}.to({TL_DTYPE[dst]})"


def _atan2(a, n, c):
    dt = n.inputs[0].type.dtype
    return f"{c.use('_atan2')}({a[0]}, {a[1]}, {signbit(a[0], dt)}, {signbit(a[1], dt)})"


def _atan(a, n, c):
    return f"{c.use('_atan')}({a[0]}, {signbit(a[0], n.inputs[0].type.dtype)})"


def _asin(a, n, c):  # asin x = atan2(x, sqrt((1 - x)(1 + x)))
    return f"{c.use('_asin')}({a[0]}, {signbit(a[0], n.inputs[0].type.dtype)})"


def _acos(a, n, c):  # acos x = atan2(sqrt((1 - x)(1 + x)), x)
    return f"{c.use('_acos')}({a[0]}, {signbit(a[0], n.inputs[0].type.dtype)})"


# One entry per IR elementwise op: render(args, node, ctx) -> a Triton expression, or None for an
# operand dtype it does not express (the kernel then runs through torch). The ops generated by
# kernel templates instead of an expression are in TEMPLATES, those the backend does not generate
# in NOT_RENDERED (with the reason). Every IR op is in exactly one of the three (tests check it).
TRITON_EXPR: dict[str, Render] = {
    "exp": _u("tl.exp({0})"), "exp2": _u("tl.exp2({0})"), "log": _u("tl.log({0})"), "log2": _u("tl.log2({0})"),
    "log1p": _helper("_log1p"), "expm1": _helper("_expm1"), "sqrt": _u("tl.sqrt({0})"),
    "rsqrt": _u("tl.rsqrt({0})"), "sin": _u("tl.sin({0})"), "cos": _u("tl.cos({0})"),
    "tan": _u("(tl.sin({0}) / tl.cos({0}))"), "tanh": _helper("_tanh"), "sinh": _helper("_sinh"),
    "cosh": _helper("_cosh"), "sigmoid": _u("tl.sigmoid({0})"), "erf": _u("tl.erf({0})"),
    "reciprocal": _u("(1.0 / {0})"), "floor": _u("tl.floor({0})"), "ceil": _u("tl.ceil({0})"),
    "round": _helper("_round"), "trunc": _helper("_trunc"), "silu": _u("({0} * tl.sigmoid({0}))"),
    "gelu": _gelu,
    "neg": _u("(-{0})"), "abs": _u("tl.abs({0})"), "sign": _sign, "relu": _relu, "bitwise_not": _not,
    "isnan": _u("({0} != {0})"), "isinf": _float_only("(tl.abs({0}) == _INF)"),
    "isfinite": _float_only("(tl.abs({0}) < _INF)"), "logical_not": _u("({0} == 0)"),
    "add": _u("({0} + {1})"), "sub": _u("({0} - {1})"), "mul": _u("({0} * {1})"), "div": _u("({0} / {1})"),
    "pow": _pow, "maximum": _cmp_extreme("maximum"), "minimum": _cmp_extreme("minimum"),
    "remainder": _int_or_float("({0} - tl.floor({0} / {1}) * {1})", "_remainder_int"),
    "floor_divide": _int_or_float("tl.floor({0} / {1})", "_floordiv_int"),
    "bitwise_and": _u("({0} & {1})"), "bitwise_or": _u("({0} | {1})"), "bitwise_xor": _u("({0} ^ {1})"),
    "eq": _u("({0} == {1})"), "ne": _u("({0} != {1})"), "lt": _u("({0} < {1})"), "le": _u("({0} <= {1})"),
    "gt": _u("({0} > {1})"), "ge": _u("({0} >= {1})"),
    "logical_and": _u("({0} & {1})"), "logical_or": _u("({0} | {1})"), "logical_xor": _u("({0} ^ {1})"),
    "where": _u("tl.where({0}, {1}, {2})"), "copy": _u("{0}"), "cast": _cast,
    "atan": _atan, "atan2": _atan2, "asin": _asin, "acos": _acos,
    "counter_uniform": lambda a, n, c: _counter_uniform(a, n, c),
}

# ops that kernel templates generate (no per-element expression): what generates them
TEMPLATES: dict[str, str] = {
    **{op: "row reductions (render.py)" for op in ("sum", "prod", "max", "min")},
    **{op: "indexing: strides of a load (ir/views.py)" for op in ("reshape", "permute", "expand", "slice")},
    "scalar": "a literal", "full": "a literal", "iota": "index arithmetic",
    "cat": "piecewise masked loads, or a gather kernel (render_gather.py)",
    "take": "a gather kernel (render_gather.py)", "gather": "a gather kernel (render_gather.py)",
    "matmul": "tiled matmul with a fused epilogue (render_matmul.py)",
    "attention": "flash attention with a fused epilogue (render_attention.py)",
}
NOT_RENDERED: dict[str, str] = {**NOT_GENERATED,  # the ops neither backend generates, and:
                                 "scatter_add": "scatters are not generated by the Triton backend yet",
                                 "attention_lse": "a torch step: ATen's CPU flash forward, on CUDA "
                                                  "the standalone kernels of attention_train.py",
                                 "attention_backward": "a torch step: ATen's CPU flash backward, on CUDA "
                                                       "the standalone kernels of attention_train.py"}


def supports(op: str) -> bool:
    return op in TRITON_EXPR


def not_rendered(op: str) -> str:
    """Why an op has no Triton rendering (the fallback reason a kernel holding it reports)."""
    return f"{op} not rendered in Triton: {NOT_RENDERED.get(op, 'no rendering registered')}"


def render_op(node: Node, args: Sequence[str], ctx: ExprContext) -> str | None:
    fn = TRITON_EXPR.get(node.op)
    return None if fn is None else fn(args, node, ctx)


# ---------------------------------------------------------------------------- helpers
HELPERS: dict[str, str] = {
    # ir/ops/random.py: SplitMix64(seed, counter), its top 24 bits times 2^-24
    "_counter_uniform": """
@triton.jit
def _counter_uniform(counter, seed):
    z = seed.to(tl.uint64, bitcast=True) + (counter.to(tl.uint64, bitcast=True) + 1) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 40).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08
""",
    "_tanh": """
@triton.jit
def _tanh(x):
    a = tl.abs(x)
    t = tl.exp(-2.0 * a)
    r = (1.0 - t) / (1.0 + t)
    small = a * (1.0 - a * a * (0.3333333333333333 - 0.13333333333333333 * a * a))
    r = tl.where(a < 0.0625, small, r)
    return tl.where(x < 0, -r, r)
""",
    "_sinh": """
@triton.jit
def _sinh(x):
    a = tl.abs(x)
    e = tl.exp(a)
    r = 0.5 * (e - 1.0 / e)
    small = a * (1.0 + a * a * (0.16666666666666666 + 0.008333333333333333 * a * a))
    r = tl.where(a < 0.0625, small, r)
    return tl.where(x < 0, -r, r)
""",
    "_cosh": """
@triton.jit
def _cosh(x):
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)
""",
    "_log1p": """
@triton.jit
def _log1p(x):
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0, x, tl.log(u) * (x / tl.where(d == 0, 1.0, d)))
""",
    "_expm1": """
@triton.jit
def _expm1(x):
    u = tl.exp(x)
    d = u - 1.0
    lu = tl.log(u)
    r = tl.where(lu == 0, x, d * (x / tl.where(lu == 0, 1.0, lu)))
    r = tl.where(d == -1.0, -1.0, r)
    return tl.where(x > 80.0, u, r)
""",
    "_round": """
@triton.jit
def _round(x):
    r = tl.floor(x + 0.5)
    half = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0
    return tl.where(half & odd, r - 1.0, r)
""",
    "_trunc": """
@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))
""",
    "_pow": """
@triton.jit
def _pow(x, y):
    a = tl.abs(x)
    r = tl.exp2(y * tl.log2(a))
    yi = tl.floor(y)
    integral = yi == y
    odd = integral & ((yi - 2.0 * tl.floor(yi * 0.5)) != 0)
    r = tl.where((x < 0) & odd, -r, r)
    r = tl.where((x < 0) & (~integral), tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True), r)
    r = tl.where(y == 0, 1.0, r)
    return r
""",
    "_pow_int": """
@triton.jit
def _pow_int(a, b):
    # ATen's powi: square and multiply; negative exponents give 0 except for bases 1 and -1
    r = tl.zeros_like(a) + 1
    x = a
    e = b
    for _ in tl.static_range(63):
        r = tl.where((e & 1) != 0, r * x, r)
        e = e >> 1
        x = x * x
    neg = tl.where(a == 1, 1, tl.where(a == -1, tl.where(((-b) & 1) != 0, -1, 1), 0))
    return tl.where(b < 0, neg.to(r.dtype), r)
""",
    "_remainder_int": """
@triton.jit
def _remainder_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
""",
    "_floordiv_int": """
@triton.jit
def _floordiv_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
""",
    "_atan01": """
@triton.jit
def _atan01(t):
    # atan on [0, 1] (Cephes atanf): t > tan(pi/8) is reduced by atan t = pi/4 + atan((t - 1) / (t + 1))
    big = t > 0.41421356237309503
    z = tl.where(big, (t - 1.0) / (t + 1.0), t)
    zz = z * z
    p = (((0.0805374449538 * zz - 0.138776856032) * zz + 0.199777106478) * zz - 0.333329491539) * zz * z + z
    return tl.where(big, 0.7853981633974483 + p, p)
""",
    "_atan": """
@triton.jit
def _atan(x, xneg):
    a = tl.abs(x)
    inv = a > 1.0
    r = _atan01(tl.where(inv, 1.0 / tl.where(inv, a, 1.0), a))
    r = tl.where(inv, 1.5707963267948966 - r, r)
    return tl.where(xneg, r * -1.0, r)
""",
    "_atan2": """
@triton.jit
def _atan2(y, x, yneg, xneg):
    # the angle of (x, y): atan of min/max in [0, 1], then the octant; signed zeros as in C's atan2
    ax = tl.abs(x)
    ay = tl.abs(y)
    hi = tl.maximum(ax, ay)
    lo = tl.minimum(ax, ay)
    t = tl.where(hi == 0, 0.0, lo / tl.where(hi == 0, 1.0, hi))
    t = tl.where(ax == _INF, tl.where(ay == _INF, 1.0, t), t)  # (no &: the interpreter fails on 0-d & 1-d)
    r = _atan01(t)
    r = tl.where(ay > ax, 1.5707963267948966 - r, r)
    r = tl.where(xneg, 3.141592653589793 - r, r)
    r = tl.where(yneg, r * -1.0, r)  # (not -r: Triton negates as 0 - r, which loses -0.0)
    r = tl.where(x != x, x + y, r)
    return tl.where(y != y, x + y, r)
""",
    "_asin": """
@triton.jit
def _asin(x, xneg):
    c = tl.sqrt((1.0 - x) * (1.0 + x))
    return _atan2(x, c, xneg, c < 0)
""",
    "_acos": """
@triton.jit
def _acos(x, xneg):
    c = tl.sqrt((1.0 - x) * (1.0 + x))
    return _atan2(c, x, c < 0, xneg)
""",
    "_prod_combine": """
@triton.jit
def _prod_combine(a, b):
    return a * b
""",
}

PRELUDE = '''import triton
import triton.language as tl

_INF = tl.constexpr(float("inf"))
_NEG_INF = tl.constexpr(float("-inf"))
'''


HELPER_DEPS: dict[str, tuple[str, ...]] = {"_atan": ("_atan01",), "_atan2": ("_atan01",), "_asin": ("_atan2",),
                                           "_acos": ("_atan2",)}


def helper_source(names: set[str]) -> str:
    full: set[str] = set()
    stack = list(names)
    while stack:
        n = stack.pop()
        if n not in full:
            full.add(n)
            stack.extend(HELPER_DEPS.get(n, ()))
    return "".join(HELPERS[n] for n in sorted(full))


# ------------------------------------------------------------------- strided index math
def linear_offset(var: str, dims: Sequence[tuple[int, int]]) -> str:
    """Element offset sum(coord_d * stride_d) where `var` enumerates the dims' coordinates in
    row-major order (`dims` = [(size, stride), ...], outermost first). Size-1 dims are dropped,
    adjacent dims whose strides chain are merged, the outermost group needs no modulo and the
    innermost no division. Returns "0" when no dim moves."""
    ds = [(n, s) for n, s in dims if n != 1]
    merged: list[tuple[int, int]] = []
    for n, s in ds:
        if merged and merged[-1][1] == s * n:
            pn, _ = merged[-1]
            merged[-1] = (pn * n, s)
        else:
            merged.append((n, s))
    terms = []
    inner = 1
    for i in range(len(merged) - 1, -1, -1):
        n, s = merged[i]
        if s != 0:
            e = var if inner == 1 else f"({var} // {inner})"
            if i > 0:
                e = f"({e} % {n})"
            terms.append(e if s == 1 else f"{e} * {s}")
        inner *= n
    return " + ".join(reversed(terms)) if terms else "0"


def single_stride(dims: Sequence[tuple[int, int]]) -> int | None:
    """The one stride that walks all of `dims` as a flat index, or None if they do not chain."""
    ds = [(n, s) for n, s in dims if n != 1]
    if not ds:
        return 1
    for (_, s0), (n1, s1) in zip(ds, ds[1:], strict=False):
        if s0 != s1 * n1:
            return None
    return ds[-1][1]

"""C++ expressions for IR ops, literals, loads and stores (one element at a time).

Every IR dtype has a storage type (what a pointer points to) and a compute type (what a
variable holds): 16-bit floats are stored as such and computed in float32 ("accumulate in
float32"); only an explicit cast rounds to 16-bit precision, as a store does. Integers and
bools compute in their own C types, with torch's semantics (truncating float->int casts,
Python-style floor division and remainder, wrap-around with -fwrapv).

Invariant: `op_expr` returns an expression whose value, converted by `store_expr` to the
output's storage type, equals the torch result of the op (up to ~1 ulp for transcendental
functions, see nf_cpu.h), or raises `Unsupported` for an op/dtype it cannot express.
"""

from __future__ import annotations

import math

import torch

from ...ir import Node
from .analysis import Unsupported

STORAGE: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.bfloat16: "uint16_t",
    torch.float16: "_Float16",
    torch.int64: "int64_t",
    torch.int32: "int32_t",
    torch.int16: "int16_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.bool: "uint8_t",  # bools are bytes in memory (a C++ `bool` load blocks GCC's vectorizer)
}
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in STORAGE:
        raise Unsupported(f"dtype {dtype} is not generated on the CPU")


def compute_type(dtype: torch.dtype) -> str:
    check_dtype(dtype)
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype in FLOATS else STORAGE[dtype]


def storage_type(dtype: torch.dtype) -> str:
    check_dtype(dtype)
    return STORAGE[dtype]


def load_expr(ptr_elem: str, dtype: torch.dtype) -> str:
    """The compute value of one stored element (`ptr_elem` is an lvalue like `in0[i]`)."""
    if dtype == torch.bfloat16:
        return f"nf_bf16_load({ptr_elem})"
    if dtype == torch.float16:
        return f"(float){ptr_elem}"
    if dtype == torch.bool:
        return f"({ptr_elem} != 0)"
    return ptr_elem


def store_expr(value: str, dtype: torch.dtype) -> str:
    """The storage value of a compute value."""
    if dtype == torch.bfloat16:
        return f"nf_bf16_store({value})"
    if dtype == torch.float16:
        return f"(_Float16)({value})"
    if dtype == torch.bool:
        return f"(uint8_t)({value})"
    return value


def float_literal(x: float) -> str:
    if math.isnan(x):
        return "__builtin_nanf(\"\")"
    if math.isinf(x):
        return "__builtin_inff()" if x > 0 else "(-__builtin_inff())"
    return f"{float(x).hex()}f" if x >= 0 else f"(-{float(-x).hex()}f)"


def literal(value, dtype: torch.dtype) -> str:
    check_dtype(dtype)
    if dtype in FLOATS:
        # the value the interpreter's 0-d tensor holds (rounded to the dtype), as a float
        v = torch.tensor(value, dtype=dtype).float().item()
        return float_literal(v)
    if dtype == torch.bool:
        return "true" if bool(value) else "false"
    v = torch.tensor(value, dtype=dtype).item()
    if dtype == torch.int64:
        return f"(int64_t){v}LL" if v != -(2**63) else "(int64_t)(-9223372036854775807LL - 1)"
    return f"({STORAGE[dtype]}){v}"


UNARY_FLOAT_FN = {
    "exp": "nf_exp", "exp2": "nf_exp2", "expm1": "nf_expm1", "log": "nf_log", "log2": "nf_log2",
    "log1p": "nf_log1p", "tanh": "nf_tanh", "sigmoid": "nf_sigmoid", "silu": "nf_silu", "erf": "nf_erf",
    "sin": "nf_sin", "cos": "nf_cos", "sqrt": "__builtin_sqrtf", "floor": "__builtin_floorf",
    "ceil": "__builtin_ceilf", "trunc": "__builtin_truncf", "round": "__builtin_rintf",
    # not vectorized (libm): rare in models
    "tan": "std::tan", "asin": "std::asin", "acos": "std::acos", "atan": "std::atan", "sinh": "std::sinh",
    "cosh": "std::cosh",
}
SCALAR_ONLY = {"std::tan", "std::asin", "std::acos", "std::atan", "std::sinh", "std::cosh", "std::pow",
               "std::atan2", "nf_floordiv_f", "nf_remainder_f"}
BINARY_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
COMPARE_SYM = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def op_expr(node: Node, args: list[str], in_dtypes: list[torch.dtype]) -> str:
    """C++ expression of `node` applied to compute values `args`."""
    op = node.op
    out_dtype = node.outputs[0].type.dtype
    for dt in (*in_dtypes, out_dtype):
        check_dtype(dt)
    dt = in_dtypes[0] if in_dtypes else out_dtype
    isf = dt in FLOATS
    a = args[0] if args else ""
    b = args[1] if len(args) > 1 else ""
    if op in BINARY_SYM:
        if dt == torch.bool:
            if op in ("add", "mul"):  # torch: logical or / and
                return f"(bool)({a} {'|' if op == 'add' else '&'} {b})"
            raise Unsupported(f"{op} of bools")
        if op == "div" and not isf:
            raise Unsupported("integer div")
        return f"({a} {BINARY_SYM[op]} {b})"
    if op in COMPARE_SYM:
        return f"({a} {COMPARE_SYM[op]} {b})"
    if op in UNARY_FLOAT_FN:
        return f"{UNARY_FLOAT_FN[op]}({a})"
    if op == "rsqrt":
        return f"(1.0f / __builtin_sqrtf({a}))"
    if op == "reciprocal":
        return f"(1.0f / {a})"
    if op == "gelu":
        return f"nf_gelu_tanh({a})" if node.attrs["approximate"] == "tanh" else f"nf_gelu_erf({a})"
    if op == "neg":
        if dt == torch.bool:
            raise Unsupported("neg of bools")
        return f"(-{a})" if isf or dt == torch.int64 else f"({STORAGE[dt]})(-{a})"
    if op == "abs":
        return f"__builtin_fabsf({a})" if isf else (a if dt in (torch.bool, torch.uint8) else f"({a} < 0 ? -{a} : {a})")
    if op == "sign":
        if isf:
            return f"nf_sign({a})"
        return f"({a} > 0 ? 1 : ({a} < 0 ? -1 : 0))" if dt != torch.bool else a
    if op == "relu":
        return f"nf_relu({a})" if isf else f"({a} > 0 ? {a} : 0)"
    if op in ("maximum", "minimum"):
        if dt == torch.bool:
            return f"(bool)({a} {'|' if op == 'maximum' else '&'} {b})"
        if isf:
            return f"nf_{op}({a}, {b})"
        return f"({a} {'>' if op == 'maximum' else '<'} {b} ? {a} : {b})"
    if op == "pow":
        if isf:
            return f"std::pow({a}, {b})"
        if dt == torch.bool:
            raise Unsupported("pow of bools")
        return f"({STORAGE[dt]})nf_pow_i({a}, {b})"
    if op == "atan2":
        return f"std::atan2({a}, {b})"
    if op == "remainder":
        if isf:
            return f"nf_remainder_f({a}, {b})"
        if dt == torch.bool:
            raise Unsupported("remainder of bools")
        return f"({STORAGE[dt]})nf_remainder_i({a}, {b})"
    if op == "floor_divide":
        if isf:
            return f"nf_floordiv_f({a}, {b})"
        if dt == torch.bool:
            raise Unsupported("floor_divide of bools")
        return f"({STORAGE[dt]})nf_floordiv_i({a}, {b})"
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor"):
        if isf:
            raise Unsupported(f"{op} of floats")
        sym = {"and": "&", "or": "|", "xor": "^"}[op.split("_")[1]]
        if op.startswith("logical"):
            return f"((bool){a} {sym} (bool){b})"
        return f"({STORAGE[dt]})({a} {sym} {b})"
    if op == "bitwise_not":
        if isf:
            raise Unsupported("bitwise_not of floats")
        return f"(!{a})" if dt == torch.bool else f"({STORAGE[dt]})(~{a})"
    if op == "logical_not":
        return f"(!{a})"
    if op == "isnan":
        return f"({a} != {a})" if isf else "false"
    if op == "isinf":
        return f"(__builtin_fabsf({a}) == __builtin_inff())" if isf else "false"
    if op == "isfinite":
        return f"({a} - {a} == 0.0f)" if isf else "true"
    if op == "where":
        return f"({a} ? {b} : {args[2]})"
    if op == "copy":
        return a
    if op == "cast":
        return cast_expr(a, dt, node.attrs["dtype"])
    raise Unsupported(f"op {op} has no C++ form")


def cast_expr(a: str, src: torch.dtype, dst: torch.dtype) -> str:
    if src == dst:
        return a
    if dst == torch.bool:
        return f"({a} != 0)"
    if dst in FLOATS:
        v = a if src in FLOATS else f"(float){a}"
        if dst == torch.bfloat16:
            return f"nf_round_bf16({v})"
        if dst == torch.float16:
            return f"(float)(_Float16)({v})"
        return v
    # to an integer type: floats truncate toward zero
    return f"({STORAGE[dst]}){a}"


def uses_scalar_only(expr: str) -> bool:
    """Does an expression call a libm function that blocks vectorization?"""
    return any(fn + "(" in expr for fn in SCALAR_ONLY)

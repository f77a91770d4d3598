"""Symbolic sizes: a dimension of an IR value is an `int` or a `Sym`, an expression over size
symbols (`s0`, `s1`, ...) kept in sympy's canonical form (`s0*12`, `s0 + 1`).

A graph with symbols carries a `SymbolTable` (`graph.meta["symbols"]`): each symbol's range
(`s0 in [2, 4096]`), its hint (the size it was captured at) and the guards the capture
recorded (conditions on the symbols the traced program assumed, such as a branch the model
took on a size). `specialize(graph, values)` substitutes concrete sizes for the symbols and
returns an ordinary static graph; `SymbolTable.admits(values)` says whether a call's sizes lie
inside the ranges and satisfy the guards.

Invariants:
* arithmetic on a `Sym` returns an `int` whenever the result is a constant, so static code
  paths see plain ints; two `Sym`s are equal exactly when their expressions are;
* a `Sym` never answers a question about its value by guessing: `==` is equality of the
  canonical expressions (two shapes are the same shape for every size, or they are different
  shapes); an ordering (`<`, `<=`, ...) is decided from the symbols' ranges, or it raises
  `SymbolicDecision` (the capture then falls back to static sizes); `int(sym)` and
  `range(sym)` raise it too.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy

SYMBOL_PREFIX = "s"
DEFAULT_MAX = 1 << 31
PLAN_SIZE = 512  # the size symbolic schedules are planned at, within the range (`planning_hints`)


class SymbolicDecision(Exception):
    """A size-dependent decision that the symbols' ranges do not settle."""


def symbol(index: int) -> sympy.Symbol:
    return sympy.Symbol(f"{SYMBOL_PREFIX}{index}", integer=True, positive=True)


_RANGES = threading.local()  # the ranges comparisons decide with (set while a graph is worked on)


_HINTS = threading.local()  # the sizes performance decisions are taken at (see `hint`)


class using_ranges:
    """Context: comparisons of `Sym`s decide from these symbol ranges ({symbol: (lo, hi)});
    `hint` evaluates sizes at `hints` ({symbol: size}) while it is open."""

    def __init__(self, ranges: Mapping[sympy.Symbol, tuple[int, int]],
                 hints: Mapping[sympy.Symbol, int] | None = None) -> None:
        self.ranges = ranges  # read live: symbols added while the context is open count
        self.hints = hints

    def __enter__(self) -> None:
        self.saved = getattr(_RANGES, "value", None), getattr(_HINTS, "value", None)
        _RANGES.value = self.ranges
        if self.hints is not None:
            _HINTS.value = self.hints

    def __exit__(self, *exc: Any) -> None:
        _RANGES.value, _HINTS.value = self.saved


def _bounds(expr: sympy.Expr) -> tuple[Any, Any]:
    """Lower and upper bound of `expr` over the active ranges (symbols without one: [1, inf))."""
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    active = getattr(_RANGES, "value", None) or {}
    ranges = {s: ValueRanges(*active.get(s, (1, DEFAULT_MAX))) for s in expr.free_symbols}
    vr = bound_sympy(expr, ranges)
    return vr.lower, vr.upper


def _positive(expr: sympy.Expr, what: str, strict: bool) -> bool:
    """Is `expr` > 0 (strict) or >= 0 for every value in the ranges? True or False when the
    ranges settle it; SymbolicDecision when the answer differs between sizes."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return int(expr) > 0 if strict else int(expr) >= 0
    for form in (expr, sympy.factor(expr)):  # (interval bounds of s0*s1 - s1 are loose; of s1*(s0 - 1), tight)
        lo, hi = _bounds(form)
        if (lo > 0) if strict else (lo >= 0):
            return True
        if (hi <= 0) if strict else (hi < 0):
            return False
    raise SymbolicDecision(f"{what} depends on the sizes ({expr} ranges over [{lo}, {hi}])")


def _expr(x: Any) -> sympy.Expr:
    if isinstance(x, Sym):
        return x.expr
    if isinstance(x, bool):
        return sympy.Integer(int(x))
    if isinstance(x, int):
        return sympy.Integer(x)
    raise TypeError(f"not a size: {x!r}")


def as_dim(expr: sympy.Expr) -> int | Sym:
    """`expr` as a dimension: an int when it is constant, else a Sym."""
    expr = sympy.expand(expr)
    if expr.is_Integer:
        return int(expr)
    return Sym(expr)


class Sym:
    """A symbolic size (see the module docstring)."""

    __slots__ = ("expr",)

    def __init__(self, expr: sympy.Expr) -> None:
        object.__setattr__(self, "expr", expr)

    def __setattr__(self, *a: Any) -> None:
        raise AttributeError("Sym is immutable")

    # arithmetic: results are canonical; constants come back as ints
    def __add__(self, o: Any) -> int | Sym:
        return as_dim(self.expr + _expr(o))

    __radd__ = __add__

    def __sub__(self, o: Any) -> int | Sym:
        return as_dim(self.expr - _expr(o))

    def __rsub__(self, o: Any) -> int | Sym:
        return as_dim(_expr(o) - self.expr)

    def __mul__(self, o: Any) -> int | Sym:
        return as_dim(self.expr * _expr(o))

    __rmul__ = __mul__

    def __neg__(self) -> int | Sym:
        return as_dim(-self.expr)

    def __floordiv__(self, o: Any) -> int | Sym:
        return as_dim(sympy.floor(self.expr / _expr(o)))

    def __rfloordiv__(self, o: Any) -> int | Sym:
        return as_dim(sympy.floor(_expr(o) / self.expr))

    def __mod__(self, o: Any) -> int | Sym:
        return as_dim(sympy.Mod(self.expr, _expr(o)))

    def __rmod__(self, o: Any) -> int | Sym:
        return as_dim(sympy.Mod(_expr(o), self.expr))

    # comparisons: decided from the ranges, never from a sample value
    def __eq__(self, o: object) -> bool:
        if not isinstance(o, Sym | int):
            return NotImplemented
        # equality of sizes is equality of their canonical expressions: s0 and s0*s1 are
        # different sizes, even though they coincide where s1 = 1
        return sympy.expand(self.expr - _expr(o)) == 0

    def __ne__(self, o: object) -> bool:
        eq = self.__eq__(o)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, o: Any) -> bool:
        return _positive(_expr(o) - self.expr, f"{self} < {o}", strict=True)

    def __le__(self, o: Any) -> bool:
        return _positive(_expr(o) - self.expr, f"{self} <= {o}", strict=False)

    def __gt__(self, o: Any) -> bool:
        return _positive(self.expr - _expr(o), f"{self} > {o}", strict=True)

    def __ge__(self, o: Any) -> bool:
        return _positive(self.expr - _expr(o), f"{self} >= {o}", strict=False)

    def __bool__(self) -> bool:
        return self != 0

    def __hash__(self) -> int:
        return hash(("Sym", self.expr))

    def __int__(self) -> int:
        raise SymbolicDecision(f"a concrete size is needed for {self}")

    __index__ = __int__

    def __repr__(self) -> str:
        return str(self.expr)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        """In an f-string, a Sym is its C++ expression (`768*s0`, `nf_floordiv_i(s0 + 1, 2)`):
        the code generators interpolate sizes this way, and a generated function declares each
        symbol it names (`const int64_t s0 = nf_sym[0];`). Inside `formatting()` it is
        the Triton expression over the kernel's size arguments (`tl_expr`), and the symbols
        are recorded. `str()` keeps sympy's form."""
        if spec:
            raise TypeError(f"format spec {spec!r} for a symbolic size {self}")
        fmt = getattr(_FORMAT, "value", None)
        if fmt is not None:
            fmt.used.update(self.expr.free_symbols)
            return tl_expr(self.expr)
        return c_expr(self.expr)

    def subs(self, values: Mapping[sympy.Symbol, int]) -> int | Sym:
        try:  # the common case, every symbol has a value: a compiled evaluator
            return _compiled((self.expr,))(values)[0]
        except KeyError:
            return as_dim(self.expr.subs(values))


def c_expr(expr: sympy.Expr) -> str:
    """A size expression as C++ over int64_t symbol variables named as the symbols (`s0`).
    Integer polynomials print as themselves, parenthesized unless a lone symbol or number (they
    are interpolated into larger expressions); floor and ceiling of a quotient, Mod, Max and
    Min through nf_cpu.h's integer helpers. Anything else raises SymbolicDecision."""
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, sympy.Add):
        terms = [c_expr(t) for t in sympy.Add.make_args(expr)]
        out = terms[0]
        for t in terms[1:]:
            out += f" - {t[1:]}" if t.startswith("-") else f" + {t}"
        return f"({out})"
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            raise SymbolicDecision(f"size {expr} is not an integer expression")
        factors = [c_expr(f) for f in sympy.Mul.make_args(rest)]
        prod = "*".join(factors)
        # parenthesized: interpolated after `/` or `%`, `t / 2*s0` would be (t / 2) * s0
        return f"({prod})" if coeff == 1 else (f"(-{prod})" if coeff == -1 else f"({int(coeff)}*{prod})")
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base = c_expr(expr.base)
        return "(" + "*".join([base] * int(expr.exp)) + ")"
    if isinstance(expr, sympy.floor | sympy.ceiling):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if isinstance(expr, sympy.ceiling):
            return f"(-nf_floordiv_i({c_expr(-num)}, {c_expr(den)}))"
        return f"nf_floordiv_i({c_expr(num)}, {c_expr(den)})"
    if isinstance(expr, sympy.Mod):
        return f"nf_remainder_i({c_expr(expr.args[0])}, {c_expr(expr.args[1])})"
    if isinstance(expr, sympy.Max | sympy.Min):
        fn = "std::max" if isinstance(expr, sympy.Max) else "std::min"
        out = c_expr(expr.args[0])
        for a in expr.args[1:]:
            out = f"{fn}<int64_t>({out}, {c_expr(a)})"
        return out
    raise SymbolicDecision(f"size {expr} has no C++ form")


_EVALUATORS: dict[Any, Any] = {}


def _compiled(exprs: tuple[sympy.Expr, ...]) -> Any:
    """One Python lambda over the symbols of `exprs`: {symbol: int} -> their ints, as a tuple
    (a KeyError for a symbol without a value)."""
    fn = _EVALUATORS.get(exprs)
    if fn is None:
        syms = sorted(set().union(*(e.free_symbols for e in exprs)), key=str)
        code = ", ".join(py_expr(e) for e in exprs)
        body = eval(f"lambda {', '.join(s.name for s in syms)}: ({code},)", {"max": max, "min": min})  # noqa: S307

        def fn(values: Mapping[sympy.Symbol, int], body: Any = body, syms: list = syms) -> tuple[int, ...]:
            return body(*[int(values[s]) for s in syms])

        if len(_EVALUATORS) > 65536:
            _EVALUATORS.clear()
        _EVALUATORS[exprs] = fn
    return fn


def evaluator(expr: sympy.Expr) -> Any:
    """A compiled function {symbol: int} -> int for a size expression (sympy's `subs` costs
    tens of microseconds; a program for a range of sizes evaluates hundreds per new size)."""
    fn = _compiled((expr,))
    return lambda values: int(fn(values)[0])


def shape_evaluator(shape: tuple) -> Any:
    """A compiled function {symbol: int} -> the shape's ints (one lambda for all its dims: a
    program for a range of sizes evaluates every per-size type once per new size)."""
    return _compiled(tuple(_expr(d) for d in shape))


_FORMAT = threading.local()  # the open `formatting` context (Syms print for Triton)


class formatting:
    """Context: Syms in f-strings print as Triton expressions (`tl_expr`) over size arguments
    named as the symbols; `used` collects every symbol printed, `args()` names them in index
    order (a kernel's size parameters)."""

    def __init__(self) -> None:
        self.used: set[sympy.Symbol] = set()

    def args(self) -> tuple[str, ...]:
        return tuple(s.name for s in sorted(self.used, key=lambda s: int(s.name[len(SYMBOL_PREFIX):])))

    def __enter__(self) -> formatting:
        self.saved = getattr(_FORMAT, "value", None)
        _FORMAT.value = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _FORMAT.value = self.saved


def current_formatting() -> formatting | None:
    return getattr(_FORMAT, "value", None)


def tl_expr(expr: sympy.Expr) -> str:
    """A size expression as Triton integer code over scalar size arguments: `py_expr`'s form,
    except that ceilings are (a + b - 1) // b and Max/Min are tl.maximum/tl.minimum. Triton's `//`
    and `%` truncate like C's: a floor or Mod of a dividend not known to be non-negative goes
    through a non-negative remainder (`-floor(-s0/16)`, a ceiling, is common). Divisors are
    positive sizes."""
    return py_expr(expr, triton=True)


def py_expr(expr: sympy.Expr, triton: bool = False) -> str:
    """A size expression as exact integer Python (`//` and `%` for floor and Mod)."""
    if triton:
        if isinstance(expr, sympy.ceiling):
            num, den = sympy.fraction(sympy.together(expr.args[0]))
            return f"(({py_expr(num, True)} + {py_expr(den, True)} - 1) // {py_expr(den, True)})"
        if isinstance(expr, sympy.Max | sympy.Min):
            fn = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
            out = py_expr(expr.args[0], True)
            for a in expr.args[1:]:
                out = f"{fn}({out}, {py_expr(a, True)})"
            return out
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(py_expr(t, triton) for t in sympy.Add.make_args(expr)) + ")"
    if isinstance(expr, sympy.Mul):
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            raise SymbolicDecision(f"size {expr} is not an integer expression")
        return "(" + "*".join([str(int(coeff))] + [py_expr(f, triton) for f in sympy.Mul.make_args(rest)]) + ")"
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        if triton:  # (no integer power in Triton)
            return "(" + "*".join([py_expr(expr.base, True)] * int(expr.exp)) + ")"
        return f"({py_expr(expr.base)}**{int(expr.exp)})"
    if isinstance(expr, sympy.floor | sympy.ceiling):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if isinstance(expr, sympy.ceiling):
            return f"(-((-{py_expr(num, triton)}) // {py_expr(den, triton)}))"
        a, b = py_expr(num, triton), py_expr(den, triton)
        if triton and num.is_nonnegative is not True:  # (C's truncation: floor through a non-negative remainder)
            return f"(({a} - (({a} % {b}) + {b}) % {b}) // {b})"
        return f"({a} // {b})"
    if isinstance(expr, sympy.Mod):
        a, b = py_expr(expr.args[0], triton), py_expr(expr.args[1], triton)
        if triton and expr.args[0].is_nonnegative is not True:
            return f"((({a} % {b}) + {b}) % {b})"
        return f"({a} % {b})"
    if isinstance(expr, sympy.Max | sympy.Min):
        args = ", ".join(py_expr(a, triton) for a in expr.args)
        return ("max(" if isinstance(expr, sympy.Max) else "min(") + args + ")"
    raise SymbolicDecision(f"size {expr} has no integer form")


def hint(x: Any) -> int:
    """A size for a performance decision (threads, blocking, tile sizes): an int as it is; a Sym
    at the hints of the open `using_ranges` context. Never for a decision that correctness
    depends on: those use the ranges (`provably`, `upper`)."""
    if not isinstance(x, Sym):
        return int(x)
    hints = getattr(_HINTS, "value", None)
    if not hints:
        raise SymbolicDecision(f"no planning size for {x}")
    value = x.expr.subs(hints)
    if not value.is_number:
        raise SymbolicDecision(f"no planning size for {sorted(map(str, value.free_symbols))} in {x}")
    return int(value)


def context_signature() -> str:
    """The open context's ranges and planning hints as text ("" when none is open): code
    planned for symbolic sizes depends on them (a stack buffer bounded by a range, a schedule
    chosen at a hint), so every key of such code includes this."""
    ranges = getattr(_RANGES, "value", None) or {}
    hints = getattr(_HINTS, "value", None) or {}
    items = sorted(ranges.items(), key=lambda kv: str(kv[0]))
    return ";".join(f"{s}[{lo},{hi}]@{hints.get(s)}" for s, (lo, hi) in items)


def hinted(x: Any) -> Any:
    """`x` (a size, a shape, a TensorType, a list of them) with every Sym at its `hint`."""
    if isinstance(x, Sym):
        return hint(x)
    if isinstance(x, tuple | list):
        return type(x)(hinted(e) for e in x)
    if hasattr(x, "with_shape") and is_symbolic(x):
        return x.with_shape(hinted(x.shape))
    return x


def upper(x: Any) -> int | None:
    """The largest value a size takes over the open ranges (None: unbounded)."""
    if not isinstance(x, Sym):
        return int(x)
    _, hi = _bounds(x.expr)
    return int(hi) if hi.is_number and hi.is_finite else None


def provably(cond: Any) -> bool:
    """Evaluate a size condition (a callable) for an optimization: True only when it holds for
    every size in the ranges; a condition that depends on the sizes counts as False."""
    try:
        return bool(cond())
    except SymbolicDecision:
        return False


def size_arg(x: Any) -> int | Sym:
    """A size or index argument: a Sym as is, anything else as an int."""
    return x if isinstance(x, Sym) else int(x)


def is_symbolic(x: Any) -> bool:
    """Does `x` (a dim, a shape, a TensorType, or a nest of lists/tuples/dicts) hold a Sym?"""
    if isinstance(x, Sym):
        return True
    if isinstance(x, list | tuple):
        return any(is_symbolic(e) for e in x)
    if isinstance(x, Mapping):  # (a node's Attrs too)
        return any(is_symbolic(e) for e in x.values())
    shape = getattr(x, "shape", None)
    return isinstance(shape, tuple) and any(isinstance(d, Sym) for d in shape)


def substitute(x: Any, values: Mapping[sympy.Symbol, int]) -> Any:
    """`x` with every Sym replaced by its value (ints, tuples, lists, dicts, slices, TensorTypes)."""
    if isinstance(x, Sym):
        out = x.subs(values)
        if isinstance(out, Sym):
            raise SymbolicDecision(f"no value for {sorted(map(str, out.expr.free_symbols))} in {x}")
        return out
    if isinstance(x, tuple):
        return tuple(substitute(e, values) for e in x)
    if isinstance(x, list):
        return [substitute(e, values) for e in x]
    if isinstance(x, dict):
        return {k: substitute(e, values) for k, e in x.items()}
    if isinstance(x, slice):
        return slice(substitute(x.start, values), substitute(x.stop, values), substitute(x.step, values))
    if hasattr(x, "with_shape") and is_symbolic(x):
        return x.with_shape(substitute(x.shape, values))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # e.g. a strided layout
        changed = {f.name: substitute(getattr(x, f.name), values) for f in dataclasses.fields(x)
                   if _holds_sym(getattr(x, f.name))}
        return dataclasses.replace(x, **changed) if changed else x
    return x


def _holds_sym(x: Any) -> bool:
    if isinstance(x, Sym):
        return True
    if isinstance(x, list | tuple):
        return any(_holds_sym(e) for e in x)
    return False


@dataclass
class SymbolTable:
    """The symbols of one graph: range and hint per symbol, and the guards of its capture."""

    ranges: dict[sympy.Symbol, tuple[int, int]] = field(default_factory=dict)
    hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    guards: list[sympy.Basic] = field(default_factory=list)  # boolean sympy expressions

    def add(self, sym: sympy.Symbol, hint: int, lo: int = 2, hi: int = DEFAULT_MAX) -> None:
        self.ranges[sym] = (lo, hi)
        self.hints[sym] = hint

    @property
    def symbols(self) -> list[sympy.Symbol]:
        return sorted(self.ranges, key=lambda s: int(s.name[len(SYMBOL_PREFIX):]))

    def admits(self, values: Mapping[sympy.Symbol, int]) -> str | None:
        """None when `values` lie in the ranges and satisfy every guard, else the reason."""
        for s, (lo, hi) in self.ranges.items():
            v = values.get(s)
            if v is None:
                return f"no value for {s}"
            if not lo <= v <= hi:
                return f"{s} = {v} is outside [{lo}, {hi}]"
        for g in self.guards:
            if not bool(g.subs(values)):
                return f"guard {g} fails for {dict((str(k), v) for k, v in values.items())}"
        return None

    def ranges_context(self) -> using_ranges:
        return using_ranges(self.ranges, self.planning_hints())

    def planning_hints(self) -> dict[sympy.Symbol, int]:
        """The size each symbol's performance decisions are taken at: the range's upper end,
        capped at PLAN_SIZE, and never below the captured size. A schedule made for large
        sizes costs microseconds at small ones (an unneeded thread fork); one made for small
        sizes costs a factor at large ones (one thread, small tiles)."""
        return {s: max(self.hints[s], min(hi, PLAN_SIZE)) if self.hints.get(s) else min(hi, PLAN_SIZE)
                for s, (lo, hi) in self.ranges.items()}

    def describe(self) -> str:
        parts = [f"{s} in [{lo}, {hi if hi < DEFAULT_MAX else 'inf'}] (captured at {self.hints[s]})"
                 for s, (lo, hi) in ((s, self.ranges[s]) for s in self.symbols)]
        parts += [f"guard {g}" for g in self.guards]
        return "; ".join(parts)


def graph_symbols(graph: Any) -> list[sympy.Symbol]:
    """The size symbols a graph uses, indexed by number: [s0, s1, ...] up to the highest one used
    (the order of the `nf_sym` array generated code reads). Not only its inputs' shapes: a size
    that comes in as an integer argument (`x[:, -n:]` with n a SymInt) shapes only values inside
    the graph, or sits in a node's attributes (`arange(n, n + 8)`), kernel bodies included."""
    used: set[int] = set()
    seen_kernels: set[str] = set()  # structural keys: one body structure, one set of symbols

    def visit(x: Any) -> None:
        if isinstance(x, Sym):
            used.update(int(s.name[len(SYMBOL_PREFIX):]) for s in x.expr.free_symbols)
        elif isinstance(x, list | tuple):
            for e in x:
                visit(e)
        elif isinstance(x, Mapping):
            for e in x.values():
                visit(e)
        elif hasattr(x, "body") and hasattr(x.body, "nodes"):  # a fused kernel
            key = getattr(x, "structural_key", "")
            if not key or key not in seen_kernels:
                seen_kernels.add(key)
                visit_graph(x.body)

    def visit_graph(g: Any) -> None:
        for gi in g.inputs:
            visit(getattr(gi.value.type, "shape", ()))
        for n in g.nodes:
            for v in n.outputs:
                visit(getattr(v.type, "shape", ()))
            visit(n.attrs)

    visit_graph(graph)
    return [symbol(i) for i in range(max(used) + 1)] if used else []


def bind_symbols(pattern: Iterable[tuple[Any, int]]) -> dict[sympy.Symbol, int] | str:
    """Solve dims for their symbols: pattern is (dim, concrete size) pairs; a dim that is a lone
    symbol binds it, others are checked once all are bound. Returns the values or the reason
    they do not fit."""
    values: dict[sympy.Symbol, int] = {}
    later: list[tuple[Sym, int]] = []
    for dim, size in pattern:
        if isinstance(dim, Sym):
            if dim.expr.is_Symbol:
                prev = values.setdefault(dim.expr, size)
                if prev != size:
                    return f"{dim} is {prev} and {size}"
            else:
                later.append((dim, size))
        elif dim != size:
            return f"size {size} where {dim} is required"
    for dim, size in later:
        try:
            got = substitute(dim, values)
        except SymbolicDecision as e:
            return str(e)
        if got != size:
            return f"{dim} = {got}, but the input has {size}"
    return values

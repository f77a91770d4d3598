"""The op record and the registry every family file adds to.

An `OpDef` is everything about one IR primitive, in one place (its family file under
`ir/ops/`): name, arity, attribute schema (with defaults), shape/dtype inference, reference
semantics through torch (`impl`, used by the interpreter and by constant folding), flags, cost
(FLOPs per element, `transcendental`), for combining reductions their identity and combine
op, the ATen rules that lower directly to it (`aten`: overload -> rule, beside the op like
JAX's lowerings), its vector-Jacobian product (`vjp`, beside the op too), and the facts
passes ask about a node: `returns_input` (this node is its input: an identity view) and
`abs_bound` (a bound on |output| from bounds on |inputs|, for mask analysis). Passes read
flags and records, never lists of op names:

* ``elementwise``  one output element depends on the same-index element of each (broadcast)
                   input; all inputs share one dtype except where noted (`where`'s condition).
* ``reduction``    reduces `axes` of its single input (`keepdim` keeps them as size 1); a
                   *combining* reduction (`reduce` set: sum, prod, max, min) folds elements
                   with an associative binary op and is what kernels fuse.
* ``view``         reindexes its input without computing (reshape, permute, expand, slice):
                   free when folded into a consumer's indexing.
* ``generator``    has no tensor inputs (scalars, fills, iota).
* ``literal``      a generator whose elements all equal `attrs["value"]` (scalar, full).
* ``anchor``       a compute-heavy op that fusion builds kernels around (matmul, attention).
* ``index``        reads its first input at positions given by an index tensor.
* ``scan``         a running reduction along one axis (cumsum).
* ``commutative``  a binary op whose operands may be swapped.
* ``random``       draws random numbers (never merged by CSE, never folded).
* ``side_effect``  must run even if unused; never merged or removed.
* ``extern``       an ATen call the compiler does not generate code for; placed and counted.
* ``fused``        a kernel produced by the fuse pass (its body is a Graph).

Invariant: `infer` is total for valid inputs and raises `TypeError`/`ValueError` otherwise;
`impl(inputs, attrs)` on tensors of the inferred input types returns tensors of the inferred
output types (a single tensor or a tuple). A name is defined once (`define` raises on a
second definition) and an ATen overload lowers through at most one record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..symbolic import hinted, is_symbolic
from ..types import TensorType, broadcast_shapes, is_float

REQUIRED = object()
Infer = Callable[[Sequence[TensorType], Any], list[TensorType]]
Impl = Callable[[Sequence[torch.Tensor], Any], Any]
Flops = Callable[[Sequence[TensorType], Sequence[TensorType], Any], float]
# vjp(node, cotangents of its outputs, builder) -> cotangents of its inputs (None: no gradient)
Vjp = Callable[..., Sequence[Any]]
Rule = Callable[..., Any]  # an ATen lowering rule: rule(ctx: LowerCtx, *args, **kwargs) -> IR value(s)
# abs_bound(bound_of) -> a bound on |output|, or None; bound_of(i) bounds |input i| (None: unbounded)
Bound = Callable[[Callable[[int], "float | None"]], "float | None"]


@dataclass(frozen=True)
class Reduction:
    """How a combining reduction folds its elements: acc = combine(acc, x) from `identity`.

    `combine` names the associative IR binary op (add, mul, maximum, minimum); `identity`
    gives the start value for a dtype (what an empty reduction returns)."""

    combine: str
    identity: Callable[[torch.dtype], bool | int | float]


@dataclass(eq=False)
class OpDef:
    name: str
    arity: tuple[int, int | None]
    infer: Infer
    impl: Impl | None
    attrs: dict[str, Any] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()
    flops_per_elem: float = 1.0
    doc: str = ""
    family: str = ""
    transcendental: bool = False  # costly per element (exp, log, trig): worth computing once
    reduce: Reduction | None = None
    flops: Flops | None = None  # when the cost is not `flops_per_elem` per output element
    aten: dict[Any, Rule] = field(default_factory=dict)  # ATen overload -> lowering rule
    vjp: Vjp | None = None
    returns_input: Callable[[Any], bool] | None = None  # node -> does it return its first input unchanged?
    abs_bound: Bound | None = None  # |output| bound from its inputs' bounds

    def check_attrs(self, given: dict[str, Any]):  # -> Attrs
        from ..attrs import Attrs

        unknown = set(given) - set(self.attrs)
        if unknown:
            raise TypeError(f"{self.name}: unknown attributes {sorted(unknown)}")
        out = {}
        for k, default in self.attrs.items():
            if k in given:
                out[k] = given[k]
            elif default is REQUIRED:
                raise TypeError(f"{self.name}: missing attribute {k!r}")
            else:
                out[k] = default
        return Attrs(out)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def cost(self, ins: Sequence[TensorType], outs: Sequence[TensorType], attrs: Any) -> float:
        """Floating-point work of one node of this op."""
        if self.flops is not None:
            return self.flops(ins, outs, attrs)
        if self.has("reduction"):
            return float(ins[0].numel)
        return self.flops_per_elem * sum(t.numel for t in outs)

    # -- the rules beside the op (decorators) ------------------------------------------------
    def lowers(self, *targets: Any) -> Callable[[Rule], Rule]:
        """Register `rule` as the ATen lowering of `targets` (overloads) to this op."""

        def deco(rule: Rule) -> Rule:
            for t in targets:
                owner = ATEN_OWNER.get(t)
                if owner is not None and owner != self.name:
                    raise ValueError(f"{t} already lowers through {owner}")
                ATEN_OWNER[t] = self.name
                self.aten[t] = rule
            return rule

        return deco

    @property
    def evaluable(self) -> bool:
        """Can a node of this op be computed at compile time from constant inputs (constant
        folding, mask analysis)? It has a reference implementation, draws no random numbers,
        has no side effect and is no fused kernel."""
        return self.impl is not None and not (self.has("random") or self.has("side_effect") or self.has("fused"))

    def evaluate(self, args: Sequence[torch.Tensor], attrs: Any) -> tuple[torch.Tensor, ...]:
        """The op on constant tensors (no autograd), as a tuple of outputs: the one way passes
        evaluate constants."""
        with torch.no_grad():
            out = self.impl(args, attrs)
        return tuple(out) if isinstance(out, list | tuple) else (out,)

    def defvjp(self, fn: Vjp) -> Vjp:
        self.vjp = fn
        return fn


OPS: dict[str, OpDef] = {}
ATEN_OWNER: dict[Any, str] = {}  # ATen overload -> the IR op whose record holds its rule


def define(name: str, arity, infer: Infer, impl: Impl | None, attrs=None, flags=(), flops=1.0, doc="",
           family: str = "", transcendental: bool = False, reduce: Reduction | None = None,
           cost: Flops | None = None, returns_input: Callable[[Any], bool] | None = None,
           abs_bound: Bound | None = None) -> OpDef:
    if name in OPS:
        raise ValueError(f"op {name!r} is defined twice")
    if isinstance(arity, int):
        arity = (arity, arity)
    d = OpDef(name, arity, infer, impl, dict(attrs or {}), frozenset(flags), flops, doc, family, transcendental,
              reduce, cost, returns_input=returns_input, abs_bound=abs_bound)
    OPS[name] = d
    return d


def node_flops(op: str, ins: Sequence[TensorType], outs: Sequence[TensorType], attrs) -> float:
    """Floating-point work of one op (pointwise ops count `flops_per_elem` per output element);
    symbolic sizes count at their planning hint (ir/symbolic.py `hint`)."""
    if is_symbolic(ins) or is_symbolic(outs):
        ins, outs = hinted(list(ins)), hinted(list(outs))
    return OPS[op].cost(ins, outs, attrs)


# ------------------------------------------------------------------ inference helpers
def same_dtype(name: str, ts: Sequence[TensorType]) -> torch.dtype:
    dt = ts[0].dtype
    for t in ts[1:]:
        if t.dtype != dt:
            raise TypeError(f"{name}: operand dtypes differ ({', '.join(str(t) for t in ts)})")
    return dt


def device_of(name: str, ts: Sequence[TensorType]) -> str:
    devs = {t.device for t in ts if t.rank > 0} or {t.device for t in ts}
    if len(devs) > 1:
        raise TypeError(f"{name}: operands on different devices {sorted(devs)}")
    return devs.pop()


def elementwise_infer(name: str, out_dtype: torch.dtype | None = None, float_only: bool = False) -> Infer:
    def infer(ts, a):
        dt = same_dtype(name, ts)
        if float_only and not is_float(dt):
            raise TypeError(f"{name}: needs a floating-point operand, got {dt}")
        shape = broadcast_shapes(*(t.shape for t in ts))
        return [TensorType(shape, out_dtype or dt, device_of(name, ts))]

    return infer


def _largest(*vs: float) -> float:
    return max(vs)


def bound_of(*inputs: int, combine: Callable[..., float] = _largest) -> Bound:
    """A bound rule: `combine` of the bounds of `inputs` (None if any is unbounded)."""

    def bound(b: Callable[[int], float | None]) -> float | None:
        vs = []
        for i in inputs:
            v = b(i)
            if v is None:
                return None
            vs.append(v)
        return combine(*vs)

    return bound


def extreme(dtype: torch.dtype, high: bool) -> bool | int | float:
    """The largest (`high`) or lowest value of a dtype: +-inf for floats, the integer limits,
    True/False for bool."""
    if dtype == torch.bool:
        return high
    if dtype.is_floating_point:
        return math.inf if high else -math.inf
    info = torch.iinfo(dtype)
    return info.max if high else info.min

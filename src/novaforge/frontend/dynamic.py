"""Dynamic shapes on the capture side: symbolic fake inputs, torch SymInts -> IR `Sym`s, and
specialization of a symbolic graph to concrete sizes.

* `dynamic_dims(option, tensors)` reads the `dynamic=` option (True: every dim of every user
  tensor input with a size > 1; or {input index: {dim: (lo, hi)}}) into a list, one entry per
  user tensor, of the dims to make symbolic and their ranges.
* `symbolic_inputs(tensors, dims)` makes fake tensors whose chosen dims are symbols of one
  ShapeEnv (torch's own symbolic tracing then records every size-dependent branch of the model
  as a guard).
* `SymbolConverter` (active while an FX graph is lowered) turns torch's SymInts into IR dims:
  torch's symbols are renamed s0, s1, ... in order of first appearance, with their hint and
  range, torch symbols of one captured size sharing one of ours (duck sizing); a
  data-dependent (unbacked) size is not converted (the caller refuses it).
* `specialize(graph, values)` substitutes concrete sizes: the result is an ordinary static
  graph, value for value and node for node.

Invariant: a symbolic graph specialized at the sizes it was captured at equals the graph a
static capture at those sizes gives, up to value numbering; `SymbolTable.admits` is checked
before any specialization (ranges and the capture's guards), so a specialized graph is only
used for sizes the trace is valid for.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ..ir import Graph
from ..ir.specialize import python_scalar, specialize
from ..ir.symbolic import DEFAULT_MAX, Sym, SymbolicDecision, SymbolTable, as_dim, symbol

DimRanges = dict[int, tuple[int, int]]

_ACTIVE = threading.local()


class OutsideRange(ValueError):
    """A call's size lies outside the range the option gives for it (it is compiled statically)."""


def dynamic_dims(option: Any, tensors: Sequence[torch.Tensor]) -> list[DimRanges] | None:
    """Per user tensor input, the dims to trace symbolically (None: nothing is dynamic)."""
    if not option:
        return None
    if option is True:
        dims = [{d: (2, DEFAULT_MAX) for d, n in enumerate(t.shape) if n > 1} for t in tensors]
    elif isinstance(option, Mapping):
        dims = [{} for _ in tensors]
        for i, spec in option.items():
            if not isinstance(i, int) or not 0 <= i < len(tensors):
                raise ValueError(f"dynamic: {i!r} is not the index of a tensor input (0..{len(tensors) - 1})")
            for d, rng in dict(spec).items():
                t = tensors[i]
                if not isinstance(d, int) or not -t.dim() <= d < t.dim():
                    raise ValueError(f"dynamic: input {i} has no dim {d!r}")
                lo, hi = (2, DEFAULT_MAX) if rng is None else (int(rng[0]), int(rng[1]))
                if lo < 2 or hi < lo:
                    raise ValueError(f"dynamic: range {rng!r} of input {i} dim {d}: need 2 <= lo <= hi")
                if not lo <= t.shape[d] <= hi:
                    raise OutsideRange(f"dynamic: input {i} dim {d} is {t.shape[d]}, outside {rng!r}")
                dims[i][d % t.dim()] = (lo, hi)
    else:
        raise ValueError(f"dynamic must be True, False or {{input index: {{dim: (lo, hi)}}}}, got {option!r}")
    return dims if any(dims) else None


def symbolic_inputs(tensors: Sequence[torch.Tensor], dims: Sequence[DimRanges]):
    """(fake mode, fake tensors): each chosen dim a fresh symbol of the mode's ShapeEnv."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    fakes = []
    for t, ds in zip(tensors, dims, strict=True):
        # duck sizing: dims of the same size share a symbol (as Dynamo does), so a K and a V cache
        # of one length stay one length; a call where they differ binds no values (static path)
        sizes = [DimDynamic.DUCK if d in ds else DimDynamic.STATIC for d in range(t.dim())]
        ctx = StatelessSymbolicContext(dynamic_sizes=sizes)
        f = mode.from_tensor(t, symbolic_context=ctx)
        for d, (lo, hi) in ds.items():
            s = f.shape[d]
            if isinstance(s, torch.SymInt):
                env.constrain_symbol_range(s.node.expr, compiler_min=lo, compiler_max=hi)
        fakes.append(f)
    return mode, fakes


def plain_sympy(expr: sympy.Expr) -> sympy.Expr:
    """A ShapeEnv expression with torch's own sympy functions (torch.utils._sympy.functions: Max,
    Min, FloorDiv, CeilDiv, Mod, PythonMod, ModularIndexing, Identity) rewritten as the plain
    sympy forms the IR's size expressions are made of (floor / ceiling of a quotient, sympy's
    Max, Min and Mod): a sliding-window model's `Max(0, s0 - 7)` is then a size the code
    generators can write. Sizes are non-negative, so C-style and Python-style modulo agree."""
    from torch.utils._sympy import functions as tf

    rules = [(tf.Identity, lambda x: x), (tf.Max, sympy.Max), (tf.Min, sympy.Min),
             (tf.FloorDiv, lambda a, b: sympy.floor(a / b)), (tf.CeilDiv, lambda a, b: sympy.ceiling(a / b)),
             (tf.ModularIndexing, lambda x, d, m: sympy.Mod(sympy.floor(x / d), m)),
             (tf.PythonMod, sympy.Mod), (tf.Mod, sympy.Mod)]
    for cls, plain in rules:
        if expr.has(cls):
            expr = expr.replace(cls, plain)
    return expr


class SymbolConverter:
    """torch SymInts -> IR dims while one graph is lowered (see the module docstring)."""

    def __init__(self) -> None:
        self.table = SymbolTable()
        self.names: dict[sympy.Symbol, sympy.Symbol] = {}  # torch's symbol -> ours
        self.by_hint: dict[int, sympy.Symbol] = {}  # our symbol of each captured size
        self.shape_env: Any = None

    def dim(self, s: Any) -> int | Sym | None:
        """An IR dim for a size (None: data-dependent)."""
        if isinstance(s, int):
            return s
        if not isinstance(s, torch.SymInt):
            return None
        node = s.node
        expr = node.expr
        if expr.is_number:
            return int(expr)
        env = node.shape_env
        self.shape_env = env
        hints = getattr(env, "backed_var_to_val", None)
        if hints is None:
            hints = env.var_to_val
        mapping = {}
        for fs in expr.free_symbols:
            if fs not in hints:
                return None  # unbacked: a size that depends on tensor data
            mapping[fs] = self._ours(fs, int(hints[fs]), env)
        return as_dim(plain_sympy(expr.xreplace(mapping)))

    def _ours(self, fs: sympy.Symbol, hint: int, env: Any) -> sympy.Symbol:
        ours = self.names.get(fs)
        if ours is None:
            vr = env.var_to_range.get(fs)
            lo = max(2, int(vr.lower)) if vr is not None and vr.lower.is_Integer else 2
            hi = min(int(vr.upper) if vr is not None and vr.upper.is_Integer else DEFAULT_MAX, DEFAULT_MAX)
            # duck sizing: torch symbols of one size share our symbol (Dynamo gives a KV cache's
            # keys and values a symbol each, though attention needs them equal); a call where
            # they differ binds no values and is compiled for its own sizes
            ours = self.by_hint.get(hint)
            if ours is None:
                ours = self.by_hint[hint] = symbol(len(self.by_hint))
                self.table.add(ours, hint, lo, hi)
            else:
                a, b = self.table.ranges[ours]
                self.table.ranges[ours] = (max(a, lo), min(b, hi))
            self.names[fs] = ours
        return ours

    def finish(self) -> SymbolTable:
        """The table, with the ShapeEnv's guards in our symbols (guards on sizes only)."""
        env = self.shape_env
        if env is not None:
            for g in getattr(env, "guards", []):
                expr = g.expr
                if not expr.free_symbols <= set(self.names):
                    continue  # a guard on a symbol the graph never uses as a size
                renamed = expr.xreplace(self.names)
                if renamed is not sympy.true:
                    self.table.guards.append(renamed)
        return self.table

    def __enter__(self) -> SymbolConverter:
        self.saved = getattr(_ACTIVE, "value", None)
        _ACTIVE.value = self
        self.ranges = self.table.ranges_context()
        self.ranges.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ranges.__exit__(*exc)
        _ACTIVE.value = self.saved


def active_converter() -> SymbolConverter | None:
    return getattr(_ACTIVE, "value", None)


def symbol_values(table: SymbolTable, graph: Graph, tensors: Sequence[torch.Tensor]) -> dict | str:
    """The symbol values a call's user tensors give (or the reason they do not fit the graph)."""
    from ..ir.symbolic import bind_symbols

    users = graph.user_inputs
    if len(users) != len(tensors):
        return f"{len(tensors)} tensors for {len(users)} inputs"
    pattern = []
    for gi, t in zip(users, tensors, strict=True):
        if t.dim() != gi.value.type.rank:
            return f"input {gi.name} has rank {t.dim()}, the program {gi.value.type.rank}"
        pattern.extend(zip(gi.value.type.shape, t.shape, strict=True))
    values = bind_symbols(pattern)
    if isinstance(values, str):
        return values
    why = table.admits(values)
    return why if why is not None else values


__all__ = ["SymbolConverter", "SymbolicDecision", "active_converter", "dynamic_dims", "python_scalar",
           "specialize", "symbol_values", "symbolic_inputs"]

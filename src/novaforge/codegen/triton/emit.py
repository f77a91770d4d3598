"""Emitting a kernel body as Triton statements over "lanes" of the kernel space.

A kernel's program covers a tile of the space; each `Lane` is one index tensor of the program
(`x` for pointwise, `r`/`c` for the rows and reduced columns of a reduction, the row and column
indices of a matmul or attention output tile) that enumerates some of the space's dims in
row-major order. Every space dim belongs to exactly one lane, so a leaf's element offset is the
sum over lanes of `linear_offset(lane, its dims with the leaf's strides)`.

Invariant: a value emitted by `BodyEmitter.value(v)` is a Triton tensor that holds, for every
position of the program's tile, v at that position of the space (broadcast dims of v become
size-1 tile dims, which Triton broadcasts). `deps[v]` is the set of lanes the value varies
along; loads and stores are masked by exactly the masks of the lanes their offsets or values
vary along, so no out-of-range address is touched and no padding lane is stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ...ir import OPS, Value
from .analysis import BodyInfo, Leaf, Unsupported, cat_pieces
from .exprs import ExprContext, downcast, linear_offset, literal, render_op, tl_compute


@dataclass(frozen=True)
class Lane:
    var: str  # the index tensor's name in the kernel
    dims: tuple[int, ...]  # space dims it enumerates, outermost first
    mask: str | None  # its bounds mask; None when every position is in range


class BodyEmitter:
    def __init__(self, info: BodyInfo, lanes: list[Lane], ptrs: list[str], indent: int = 1) -> None:
        self.info = info
        self.lanes = lanes
        self.ptrs = ptrs
        self.lines: list[str] = []
        self.indent = indent
        self.names: dict[Value, str] = {}
        self.deps: dict[Value, frozenset[str]] = {}
        self.ctx = ExprContext()
        self._count = 0
        self.static = self._static_deps()

    # -- bookkeeping ----------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    @contextlib.contextmanager
    def block(self, header: str) -> Iterator[None]:
        """An indented block (a loop); names defined inside are forgotten after it."""
        self.line(header)
        self.indent += 1
        saved_names, saved_deps = dict(self.names), dict(self.deps)
        try:
            yield
        finally:
            self.indent -= 1
            self.names, self.deps = saved_names, saved_deps

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Statements at the same indentation whose names are forgotten after (one epilogue
        subtile: its loads and values are re-emitted for the next one)."""
        saved_names, saved_deps = dict(self.names), dict(self.deps)
        try:
            yield
        finally:
            self.names, self.deps = saved_names, saved_deps

    def preset(self, v: Value, name: str, deps: Iterable[str]) -> None:
        self.names[v] = name
        self.deps[v] = frozenset(deps)

    # -- static dependence of values on lanes ------------------------------------------------
    def leaf_lanes(self, leaf: Leaf) -> frozenset[str]:
        if leaf.kind == "const":
            return frozenset()
        strides = self.info.space_strides(leaf)
        return frozenset(ln.var for ln in self.lanes
                         if any(strides[d] != 0 and self.info.space[d] != 1 for d in ln.dims))

    def _static_deps(self) -> dict[Value, frozenset[str]]:
        out: dict[Value, frozenset[str]] = {}
        info = self.info
        for v, leaf in info.leaves.items():
            try:
                out[v] = self.leaf_lanes(leaf)
            except Unsupported:  # an anchor operand: read by the anchor's own code, never by the emitter
                out[v] = frozenset()
        for n in info.computed:
            if n is info.anchor:
                out[n.out] = frozenset(ln.var for ln in self.lanes)
            elif OPS[n.op].has("reduction"):
                red = {ln.var for ln in self.lanes if set(ln.dims) & set(info.red_axes)}
                out[n.out] = out[n.inputs[0]] - red
            elif n.op == "cat":
                out[n.out] = self._cat_lanes(n)
            else:
                out[n.out] = frozenset().union(*(out.get(v, frozenset()) for v in n.inputs))
        return out

    # -- addressing -------------------------------------------------------------------------
    def offset(self, strides: tuple[int, ...], base: int = 0) -> tuple[str, frozenset[str]]:
        parts = [f"{base}"] if base else []
        used = set()
        for ln in self.lanes:
            e = linear_offset(ln.var, [(self.info.space[d], strides[d]) for d in ln.dims])
            if e != "0":
                parts.append(e)
                used.add(ln.var)
        return (" + ".join(parts) if parts else "0"), frozenset(used)

    def mask_for(self, lanes: Iterable[str]) -> str | None:
        want = set(lanes)
        masks = [ln.mask for ln in self.lanes if ln.var in want and ln.mask]
        if not masks:
            return None
        return masks[0] if len(masks) == 1 else "(" + " & ".join(masks) + ")"

    # -- values -----------------------------------------------------------------------------
    def value(self, v: Value) -> str:
        if v in self.names:
            return self.names[v]
        if v in self.info.leaves:
            return self._load(v)
        self.emit_cone([v])
        return self.names[v]

    def cone(self, targets: Iterable[Value]) -> set[Value]:
        """Computed values (not yet emitted) that the targets need."""
        need: set[Value] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            if v in self.names or v in need or v in self.info.leaves:
                continue
            n = self.info.producer[v]
            if n is self.info.anchor or OPS[n.op].has("reduction"):
                raise AssertionError(f"{n.op} result used before it was computed")
            need.add(v)
            stack.extend(n.inputs)
        return need

    def emit_cone(self, targets: Iterable[Value], only: set[Value] | None = None) -> None:
        need = self.cone(targets)
        if only is not None:
            need &= only
        for n in self.info.computed:
            if n.out in need and n.out not in self.names:
                self._emit_node(n)

    def _const_of(self, v: Value):
        leaf = self.info.leaves.get(v)
        return leaf.value if leaf is not None and leaf.kind == "const" else None

    def _lanes_of(self, strides: tuple[int, ...]) -> frozenset[str]:
        return frozenset(ln.var for ln in self.lanes
                         if any(strides[d] != 0 and self.info.space[d] != 1 for d in ln.dims))

    def _cat_lanes(self, n) -> frozenset[str]:
        dim, pieces = cat_pieces(n, self.info.leaves, self.info.space)
        unit = tuple(1 if d == dim else 0 for d in range(len(self.info.space)))
        return self._lanes_of(unit).union(*(self._lanes_of(p.leaf.strides) for p in pieces if p.leaf.kind != "const"))

    def _emit_cat(self, n) -> None:
        """A cat load: each piece read at its own addresses (masked to its range along the cat's
        dim), the pieces selected by that coordinate."""
        dim, pieces = cat_pieces(n, self.info.leaves, self.info.space)
        unit = tuple(1 if d == dim else 0 for d in range(len(self.info.space)))
        coord, coord_lanes = self.offset(unit)
        ca = self.fresh("ca")
        self.line(f"{ca} = {coord}")
        deps = set(coord_lanes)
        value = None
        for k in range(len(pieces) - 1, -1, -1):  # the last piece is the default of the selects
            p = pieces[k]
            sel = " & ".join(([f"({ca} >= {p.lo})"] if k else []) + ([f"({ca} < {p.hi})"] if k < len(pieces) - 1
                                                                      else []))
            if p.leaf.kind == "const":
                text = literal(p.leaf.value, p.leaf.dtype)
            else:
                off, used = self.offset(p.leaf.strides, p.leaf.layout.offset - p.lo * p.leaf.strides[dim])
                deps |= used
                if p.leaf.kind == "iota":
                    start, step = p.leaf.start, p.leaf.step
                    text = f"(({off}).to({tl_compute(p.leaf.dtype)}) * {step!r} + {start!r})" if off != "0" \
                        else literal(start, p.leaf.dtype)
                else:
                    mask = self.mask_for(used | coord_lanes)
                    full = " & ".join(m for m in (sel, mask) if m)
                    if full and not used:  # a one-element piece: the pointer takes the mask's block shape
                        off = f"{off} + 0 * {ca}"
                    text = f"tl.load({self.ptrs[p.leaf.buf]} + {off}" + (f", mask={full}, other=0)" if full else ")")
                    if p.leaf.dtype in (torch.float16, torch.bfloat16):
                        text += ".to(tl.float32)"
            name = self.fresh("g")
            self.line(f"{name} = {text}" if value is None or not sel else f"{name} = tl.where({sel}, {text}, {value})")
            value = name
        assert value is not None, "a cat load over a non-empty space has a non-empty piece"
        self.preset(n.out, value, deps)

    def _emit_node(self, n) -> None:
        if n.op == "cat":
            self._emit_cat(n)
            return
        args = [self.value(v) for v in n.inputs]
        self.ctx.arg_consts = [self._const_of(v) for v in n.inputs]
        expr = render_op(n, args, self.ctx)
        if expr is None:
            raise AssertionError(f"no rendering for {n.op}")
        name = self.fresh("v")
        self.line(f"{name} = {expr}")
        self.preset(n.out, name, frozenset().union(*(self.deps.get(v, frozenset()) for v in n.inputs)))

    def _load(self, v: Value) -> str:
        leaf = self.info.leaves[v]
        name = self.fresh("c" if leaf.kind == "const" else "x")
        if leaf.kind == "const":
            self.line(f"{name} = {literal(leaf.value, leaf.dtype)}")
            self.preset(v, name, ())
            return name
        off, used = self.offset(self.info.space_strides(leaf), leaf.layout.offset)
        if leaf.kind == "iota":
            start, step = leaf.start, leaf.step
            cdt = tl_compute(leaf.dtype)
            if off == "0":
                self.line(f"{name} = {literal(start, leaf.dtype)}")
            else:
                self.line(f"{name} = ({off}).to({cdt}) * {step!r} + {start!r}")
            self.preset(v, name, used)
            return name
        mask = self.mask_for(used)
        text = f"tl.load({self.ptrs[leaf.buf]} + {off}" + (f", mask={mask}, other=0)" if mask else ")")
        if leaf.dtype in (torch.float16, torch.bfloat16):
            text += ".to(tl.float32)"
        self.line(f"{name} = {text}")
        self.preset(v, name, used)
        return name

    def store(self, ptr: str, v: Value, strides: tuple[int, ...], dtype: torch.dtype) -> None:
        val = self.value(v)
        off, used = self.offset(strides)
        deps = self.deps.get(v, frozenset())
        if not used or not deps <= used:  # the value spans lanes the address does not: match its tile shape
            off = f"{off} + tl.zeros({val}.shape, tl.int32)"
        mask = self.mask_for(used | deps)
        self.line(f"tl.store({ptr} + {off}, {downcast(val, dtype)}" + (f", mask={mask})" if mask else ")"))


def identity(op: str, dtype: torch.dtype) -> str:
    """The identity element of a reduction (its record's), as a Triton literal of the accumulator dtype."""
    return literal(OPS[op].reduce.identity(dtype), dtype)


# the Triton of each combine op (the reductions' records name it): a two-operand update, a tile reduction
_COMBINE = {"add": "{acc} + {x}", "mul": "{acc} * {x}", "maximum": "tl.maximum({acc}, {x})",
            "minimum": "tl.minimum({acc}, {x})"}
_TILE_REDUCE = {"add": "tl.sum", "maximum": "tl.max", "minimum": "tl.min"}  # mul: tl.reduce with a helper


def combine(op: str, acc: str, x: str) -> str:
    return _COMBINE[OPS[op].reduce.combine].format(acc=acc, x=x)


def reduce_expr(op: str, x: str, axis: int, ctx: ExprContext) -> str:
    c = OPS[op].reduce.combine
    if c == "mul":
        return f"tl.reduce({x}, {axis}, {ctx.use('_prod_combine')}, keep_dims=True)"
    return f"{_TILE_REDUCE[c]}({x}, axis={axis}, keep_dims=True)"

"""What a CPU program built for a range of sizes fixes per size (`CpuProgram.at`).

A symbolic program's generated code takes the size symbols as an argument; an instance at
concrete sizes differs from another only in its slot types, arena offsets, evaluated "sized"
slots (recipes run by torch), non-generated steps and output views. `SymbolicLayout` holds what
is shared by every size: the symbolic memory plan, the buckets of sizes that share one
placement and arena, and compiled evaluators for the types and recipes.

Invariants: a bucket's placement (offsets planned at the bucket's top sizes) is used for a
size only when no buffer is larger at that size than at the top (else the size gets its own);
`Bucket.slots` are the program's slots with that placement, shared read-only by its sizes; an
instance copies a slot before changing it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..ir import OPS, Graph, Node
from ..ir.graph import Attrs
from ..ir.specialize import python_scalar, specialize
from ..ir.symbolic import is_symbolic, shape_evaluator, substitute
from ..ir.types import TensorType

if TYPE_CHECKING:
    from .cpu_program import SlotSpec


def _compile_recipe(recipe: Graph) -> Callable[[Mapping[Any, int]], torch.Tensor]:
    """A function of the symbol values computing a recipe's output (as `evaluate_recipe` does),
    with the nodes, their implementations and which attributes hold sizes looked up once."""
    env_index = {gi.value: i for i, gi in enumerate(recipe.inputs)}
    consts = [gi.tensor for gi in recipe.inputs]
    calls = []
    for n in recipe.nodes:
        for o in n.outputs:
            env_index[o] = len(env_index)
        sym_attrs = is_symbolic(n.attrs)
        calls.append((OPS[n.op], [env_index[v] for v in n.inputs], n.attrs, sym_attrs, len(n.outputs)))
    out = env_index[recipe.outputs[0]]

    def run(values: Mapping[Any, int]) -> torch.Tensor:
        env: list[Any] = list(consts)
        for op, ins, attrs, sym_attrs, _ in calls:
            if sym_attrs:
                attrs = Attrs({k: substitute(a, values) for k, a in attrs.items()})
                if op.name == "scalar":  # a size used as a number takes the scalar's dtype
                    attrs = attrs.replace(value=python_scalar(attrs["value"], attrs["dtype"]))
            env.extend(op.evaluate([env[i] for i in ins], attrs))
        return env[out].detach().contiguous()

    return run


def is_causal_triangle(mask: torch.Tensor) -> bool:
    """Is a boolean mask [..., L, S] exactly the top-left lower triangle (key j <= query i) in
    every leading position (attention's `causal`)?"""
    if mask.dtype != torch.bool or mask.dim() < 2:
        return False
    tri = torch.ones(mask.shape[-2:], dtype=torch.bool).tril()
    return bool((mask == tri).all())


def node_at(n: Node, values: Mapping[Any, int]) -> Node:
    if not is_symbolic(list(n.attrs.values())):
        return n
    return Node(n.op, n.inputs, Attrs({k: substitute(a, values) for k, a in n.attrs.items()}), n.outputs, n.meta)


def step_at(st: Any, values: Mapping[Any, int]) -> Any:
    """A step of a symbolic program at concrete sizes (generated segments take the sizes as an
    argument and are the same step)."""
    if st.kind == "seg":
        return st
    return dataclasses.replace(st, operands=[(s, substitute(lay, values)) for s, lay in st.operands],
                               attrs=substitute(st.attrs, values),
                               body=specialize(st.body, values) if st.body is not None else None)


def copy_slot(spec: Any) -> Any:
    """A shallow copy (an instance's own slot; copy.copy costs ten times as much)."""
    new = object.__new__(type(spec))
    new.__dict__.update(spec.__dict__)
    return new


@dataclass
class SymbolicLayout:
    """What a program for a range of sizes fixes per call size (see `CpuProgram.at`): the memory
    plan (offsets placed per size), the value of each arena slot, and the scratch slots.

    Offsets are placed per *bucket* of sizes (each symbol rounded up to a quarter octave:
    ..., 512, 640, 768, ...) and shared by every size in it: a buffer's size grows with the
    symbols, so a placement without overlaps at the bucket's top has none below it (checked
    per size; a size where it fails gets its own placement). The sizes of one bucket share its
    arena (the process's shared one when large: see CpuProgram) and its lock (one call at a time
    uses the arena)."""

    plan: Any  # passes.plan_memory.MemoryPlan with symbolic sizes
    arena_values: dict[int, Any]  # arena slot -> the IR value its offset is planned for
    scratch: list[int]  # scratch slots (at the arena's end, sized by the largest)
    symbols: list[Any]  # the graph's size symbols (sympy), s0, s1, ... in index order
    buckets: dict[tuple, Bucket] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _shapes: list | None = None
    _types: tuple | None = None  # ([(slot, rank, dtype, device)], all their dims' evaluator): `varying_types`
    _recipes: dict[int, Callable[[Mapping[Any, int]], torch.Tensor]] = field(default_factory=dict)
    _plan_sizes: tuple | None = None  # (symbolic buffers, their sizes' evaluator): `bucket_for`

    def varying_slots(self, slots: list[SlotSpec]) -> list[tuple[int, Callable[[Mapping[Any, int]], tuple] | None]]:
        """(slot, its shape's compiled evaluator, or None for a static type) per slot whose type or
        value differs between two sizes of one bucket: a symbolic type, or a sized slot. (Arena and
        scratch slots of static type differ between buckets only: `Bucket.slots`.)"""
        if self._shapes is None:
            self._shapes = [(s, shape_evaluator(spec.type.shape) if is_symbolic(spec.type) else None)
                            for s, spec in enumerate(slots) if spec.kind == "sized" or is_symbolic(spec.type)]
            typed = [(s, slots[s].type) for s, at in self._shapes if at is not None]
            dims = tuple(d for _, ty in typed for d in ty.shape)
            self._types = ([(s, ty.rank, ty.dtype, ty.device) for s, ty in typed],
                           shape_evaluator(dims) if dims else lambda values: ())
        return self._shapes

    def slots_at(self, bucket: Bucket, values: Mapping[Any, int]) -> tuple[list, int]:
        """An instance's slots at `values` in `bucket` (whose `slots` are placed): the bucket's,
        with every slot of symbolic type copied and retyped; and the arena bytes it needs (the
        bucket's placement, then the largest scratch slot at these sizes)."""
        slots = list(bucket.slots)
        for s, ty in self.varying_types(values):
            spec = slots[s] = copy_slot(slots[s])
            spec.type = ty
        scratch = max([(slots[s].type.nbytes + 63) // 64 * 64 for s in self.scratch], default=0)
        return slots, max((bucket.plan.arena_bytes + 63) // 64 * 64 + scratch, 64)

    def varying_types(self, values: Mapping[Any, int]) -> list[tuple[int, TensorType]]:
        """(slot, its type at `values`) per slot of symbolic type: every shape from one compiled
        function, and slots of one shape and dtype share one TensorType (a decode step's 24 cache
        inputs are one type)."""
        self.varying()
        meta, dims_at = self._types
        dims = dims_at(values)
        made: dict[tuple, TensorType] = {}
        out, k = [], 0
        for s, rank, dtype, device in meta:
            shape = tuple(dims[k:k + rank])
            k += rank
            ty = made.get((shape, dtype, device))
            if ty is None:
                ty = made[(shape, dtype, device)] = TensorType(shape, dtype, device)
            out.append((s, ty))
        return out

    def varying(self) -> list[tuple[int, Callable[[Mapping[Any, int]], tuple] | None]]:
        """`varying_slots` as the program's first `at` computed them (an instance's slots have
        concrete types and could not tell)."""
        if self._shapes is None:
            raise RuntimeError("varying(): no instance was made yet")
        return self._shapes

    def evaluate(self, slot: int, recipe: Graph, values: Mapping[Any, int]) -> torch.Tensor:
        """A sized slot's value at these sizes (its recipe's ops run by torch; the recipe
        compiled to a list of calls once)."""
        run = self._recipes.get(slot)
        if run is None:
            run = self._recipes[slot] = _compile_recipe(recipe)
        return run(values)

    def bucket_for(self, values: Mapping[Any, int]) -> Bucket:
        key = tuple(bucket_size(int(values[s])) for s in self.symbols)
        with self.lock:
            b = self.buckets.get(key)
            if b is None:
                top = dict(zip(self.symbols, key, strict=True))
                b = self.buckets[key] = Bucket(self.plan.at(top))
            if len(self.buckets) > 64:  # (a long-running server: forget the oldest)
                self.buckets.pop(next(iter(self.buckets)))
        if self._plan_sizes is None:  # (the buffers' sizes as one compiled function of the symbols)
            keys = [v for v, n in self.plan.sizes.items() if is_symbolic(n)]
            self._plan_sizes = (keys, shape_evaluator(tuple(self.plan.sizes[v] for v in keys)) if keys
                                else lambda values: ())
        keys, sizes_at = self._plan_sizes
        top = b.plan.sizes
        if any(n > top[v] for v, n in zip(keys, sizes_at(values), strict=True)):
            return Bucket(self.plan.at(values))  # a buffer that shrinks as the sizes grow: its own plan
        return b


@dataclass
class Bucket:
    plan: Any  # the memory plan placed at the bucket's top sizes
    arena: torch.Tensor | None = None  # allocated by the first call of a size in the bucket
    slots: list | None = None  # the program's slots placed by `plan` (`CpuProgram._placed_slots`)
    instance: Any = None  # the first instance made in this bucket, when others may start from it
    lock: threading.Lock = field(default_factory=threading.Lock)


def bucket_size(n: int) -> int:
    """`n` rounded up to a quarter octave (16 for n <= 16): 17 -> 20, 100 -> 112, 513 -> 640."""
    if n <= 16:
        return 16
    step = (1 << (n.bit_length() - 1)) // 4
    return -(-n // step) * step

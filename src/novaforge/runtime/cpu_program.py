"""CpuProgram: runs a compiled graph with one arena and a short list of prepared steps.

Built once by the CPU backend from the planned graph:

* slots: every buffer the program touches has a slot index in one ctypes `void*` array passed
  to the library's entry points: constants and arena buffers (fixed addresses, written once),
  inputs and fresh outputs (rewritten at each call);
* the arena: one uint8 tensor of the memory plan's size (plus scratch for library results),
  allocated once per program and reused by every call; a program whose arena exceeds
  SHARED_ARENA_OVER runs instead in the process's shared CPU arena (runtime/shared_arena.py), so
  a training step's forward and backward, the sizes of a dynamic-shape program and the graphs
  of a graph break hold one arena between them, not one each;
* steps, run in order: `seg` calls one C entry point that runs a run of generated kernels back
  to back; `matmul` / `sdpa` call the library through precomputed strided views; `torch` runs
  a kernel body through the interpreter's torch ops and copies the result into its buffers.

Per call the program binds inputs (made contiguous; an input that a kernel updates in place is
copied when another input shares its memory), allocates the fresh outputs (outputs are
never views of the arena, which the next call overwrites), writes their addresses into the
slot array and runs the steps. Returns outputs then mutated inputs' new values, exactly like
`runtime.interpret.interpret`.

Invariant: every slot pointer the library sees during a call addresses a live buffer of the
slot's type; calls are serialized per program (one arena), and calls of programs in the shared
arena are serialized among them (its lock). A program called from inside another's call on the
same thread (the shared lock already held) runs that call in a private arena.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from ..ir import OPS, Graph, Node
from ..ir.extern import call_extern
from ..ir.ops.matmul import exact_int_matmul
from ..ir.types import TensorType
from ..ir.views import Strided
from . import collectives
from .inplace_step import make_runner as make_inplace_runner
from .interpret import prepare, storage_relative
from .shared_arena import SharedArena
from .state import storage_ptr
from .symbolic_layout import Bucket, SymbolicLayout, copy_slot, is_causal_triangle, node_at, step_at


class KernelIndexError(IndexError, RuntimeError):
    """A generated kernel met an index out of range. Eager raises IndexError for some ops
    (embedding) and RuntimeError for others (gather, scatter_add): this is both, so a caller
    catching what eager raises catches it."""


class SlotKind(StrEnum):
    CONST = "const"
    SIZED = "sized"  # a value of the sizes alone: its recipe is evaluated once per size (`at`)
    INPUT = "input"
    ARENA = "arena"
    FRESH = "fresh"
    SCRATCH = "scratch"


class StepKind(StrEnum):
    SEG = "seg"  # one C entry point running a run of generated kernels
    MATMUL = "matmul"  # a library matmul
    SDPA = "sdpa"  # the library's attention
    TORCH = "torch"  # a kernel body through torch


class OutputKind(StrEnum):
    SLOT = "slot"
    INPUT = "input"
    VIEW = "view"
    CONST = "const"


@dataclass
class SlotSpec:
    kind: SlotKind
    type: TensorType
    index: int = 0  # input position | arena/scratch byte offset | fresh output position
    tensor: torch.Tensor | None = None  # const; sized, once `at` evaluated it
    written: bool = False  # input: a kernel writes the input's new value into its buffer
    recipe: Graph | None = None  # sized: the graph computing it from the sizes
    causal: bool = False  # sized: read only as flash-attention masks; null (causal) where it is the triangle

    def __post_init__(self) -> None:
        self.kind = SlotKind(self.kind)


@dataclass
class StepSpec:
    kind: StepKind
    seg: str = ""  # entry point name (seg)
    operands: list[tuple[int, Strided]] = field(default_factory=list)  # (slot, view) library operands
    out: int = -1  # result slot (matmul, sdpa)
    attrs: dict = field(default_factory=dict)
    body: Graph | None = None  # torch
    ins: list[int] = field(default_factory=list)  # torch: input slots
    outs: list[int] = field(default_factory=list)  # torch: output slots
    label: str = ""
    kernel: int = -1  # the kernel's ordinal among the graph's kernel nodes (profiling)
    sites: list[str] = field(default_factory=list)  # seg: per launch, the indexing ops and source lines it runs

    def __post_init__(self) -> None:
        self.kind = StepKind(self.kind)


@dataclass
class ProgramTimings:
    """Cumulative times of a profiling program (`CpuProgram.timings()`); subtract two snapshots
    to get the times of the calls between them."""

    calls: int
    run_s: float  # inside run(): binding, allocation, steps, outputs
    steps: list[tuple[str, int, float]]  # (kind, kernel ordinal or -1 for a segment, seconds)
    launches: list[tuple[int, str, float]]  # generated launches: (kernel ordinal, label, seconds in C)

    def minus(self, before: ProgramTimings) -> ProgramTimings:
        return ProgramTimings(
            self.calls - before.calls, self.run_s - before.run_s,
            [(k, o, s - b) for (k, o, s), (_, _, b) in zip(self.steps, before.steps, strict=True)],
            [(o, lab, s - b) for (o, lab, s), (_, _, b) in zip(self.launches, before.launches, strict=True)])


@dataclass(frozen=True)
class BoundInputs:
    """A call's inputs bound once (`CpuProgram.bind_inputs`): (slot, tensor, data address) each."""

    slots: list[tuple[int, torch.Tensor, int]]


@dataclass
class OutputSpec:
    kind: OutputKind
    slot: int = -1
    input: int = -1
    views: tuple[Node, ...] = ()
    tensor: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.kind = OutputKind(self.kind)


def _view(t: torch.Tensor, lay: Strided) -> torch.Tensor:
    return t.as_strided(lay.shape, lay.strides, t.storage_offset() + lay.offset)


SHARED_ARENA_OVER = 16 << 20  # arena bytes above which a CPU program runs in the shared CPU arena
CPU_ARENA_KEY = ("cpu", "cpp")  # (apart from the Triton backend's arena for a CPU device, its interpreter runs)


class CpuProgram:
    def __init__(self, lib: ctypes.CDLL | None, slots: list[SlotSpec], steps: list[StepSpec],
                 outputs: list[OutputSpec], n_inputs: int, arena_bytes: int,
                 info: dict[str, Any] | None = None) -> None:
        self.lib = lib
        self.slots = slots
        self.steps = steps
        self.outputs = outputs
        self.n_inputs = n_inputs
        self.info = dict(info or {})
        self._arena_bytes = max(arena_bytes, 64)
        self.arena = torch.empty(0, dtype=torch.uint8)
        # (the process's shared CPU arena for a large one; own arena otherwise)
        self._shared: SharedArena | None = SharedArena.of(CPU_ARENA_KEY) if arena_bytes > SHARED_ARENA_OVER else None
        self._ptrs = (ctypes.c_void_p * max(len(slots), 1))()
        self._sizes = (ctypes.c_int64 * 1)()  # the symbols' values (programs for a range of sizes)
        self._env: list[torch.Tensor | None] = [None] * len(slots)
        self._lock: Any = threading.RLock()  # (re-entered by call_timed)
        self._inputs: list[tuple[int, int, TensorType]] = []  # (slot, input position, type)
        self._ptrs_bound: BoundInputs | None = None  # the binding whose addresses the input slots hold
        self._written: list[int] = []  # positions of inputs whose buffer a kernel writes
        self._fresh: list[tuple[int, TensorType]] = []
        self._runners: list[Callable[[], None]] = []
        self._out_slots: list[int] | None = None
        self._ready = False
        self.calls = 0
        out_slots = [o.slot for o in outputs]
        # every result is its own fresh tensor (the caller need not check for aliasing)
        self.outputs_fresh = (all(o.kind == "slot" and slots[o.slot].kind == "fresh" for o in outputs)
                              and len(set(out_slots)) == len(out_slots))
        self.run_s = 0.0  # total seconds inside run() (profiling reads it)
        self._profiling = bool(self.info.get("profile"))
        self._step_s = [0.0] * len(steps)
        self.collectives = collectives.Pending()  # collectives in flight, and the time waits blocked
        # runs the steps instead of the plain loop when set: observer(runners, slot tensors)
        # (runtime/check_numerics.py checks every kernel this way)
        self.observer: Callable[[list[Callable[[], None]], list], None] | None = None
        self.symbolic: SymbolicLayout | None = None  # a program for a range of sizes (`at`)
        self._bucket: Bucket | None = None  # (a program made by `at`: its bucket's arena and lock)
        self.symbolic_of: SymbolicLayout | None = None  # (a program made by `at`: its program's layout)
        self._varying_io: tuple[list[int], list[int]] | None = None  # (`_resized`: positions in _inputs, _fresh)
        self.sizes: dict[Any, int] = {}  # the symbol values of a program made by `at`
        # decides which program serves each call while refining (codegen/cpu/refine.py): run()
        # then goes through refiner.run(self, inputs), which calls `call_timed` on one of them
        self.refiner: Any = None

    def at(self, values: Mapping[Any, int]) -> CpuProgram:
        """This program (built for symbolic sizes) at concrete symbol values: the same library
        and kernels, with slot types, arena offsets, library-step views and torch-step bodies
        for these sizes, and the sizes passed to every generated entry point. Milliseconds: no
        code is generated or compiled."""
        sym = self.symbolic
        if sym is None:
            raise ValueError("at(): this program was built for static sizes")
        bucket = sym.bucket_for(values)
        base = bucket.instance
        if base is not None:  # (another size of this bucket, bound already: its copy, resized)
            prog = base._resized(values)
            if prog is not None:
                return prog
        if bucket.slots is None:  # (slots placed in the bucket's arena: shared by its sizes)
            bucket.slots = self._placed_slots(bucket.plan)
        sym.varying_slots(self.slots)  # (computed once, from this program's symbolic types)
        slots, arena_bytes = sym.slots_at(bucket, values)
        for s, _ in sym.varying():
            spec = slots[s]
            if spec.kind == "sized":
                if spec is bucket.slots[s]:  # (a sized slot of static type: not copied yet)
                    spec = slots[s] = copy_slot(spec)
                spec.tensor = sym.evaluate(s, spec.recipe, values)
                if spec.causal and is_causal_triangle(spec.tensor):
                    spec.tensor = None  # the flash kernels read a null mask as causal
        steps = [st if st.kind == "seg" else step_at(st, values) for st in self.steps]
        outputs = [o if not o.views else dataclasses.replace(o, views=tuple(node_at(n, values) for n in o.views))
                   for o in self.outputs]
        prog = CpuProgram(self.lib, slots, steps, outputs, self.n_inputs, arena_bytes, self.info)
        prog._bucket = bucket
        prog._lock = bucket.lock
        prog.symbolic_of = sym
        prog.sizes = {s: int(values[s]) for s in sym.symbols}
        prog._sizes = (ctypes.c_int64 * max(len(sym.symbols), 1))(*[prog.sizes[s] for s in sym.symbols])
        for attr in ("schedules", "kernel_slots"):
            if hasattr(self, attr):
                setattr(prog, attr, getattr(self, attr))
        if bucket.instance is None and prog._resizable():
            bucket.instance = prog
        return prog

    def _resizable(self) -> bool:
        """Can another size of this instance's bucket start from a copy of it (`_resized`)? Only
        when a size changes nothing but slot types and the sizes argument: every step generated
        code, no sized slot, every output a fresh slot without views, its own (bucket) arena."""
        return (all(st.kind == "seg" for st in self.steps) and self._shared is None and not self._profiling
                and self.outputs_fresh and not any(o.views for o in self.outputs)
                and not any(spec.kind == "sized" for spec in self.slots))

    def _resized(self, values: Mapping[Any, int]) -> CpuProgram | None:
        """This bound instance (`_resizable`) copied to other sizes of its bucket: the slots whose
        type varies are copied with their new types, the slot addresses (arena, constants) kept,
        the steps' runners made anew over the copy's own address and size arrays. None when this
        instance is not bound yet, a checker observes it, or the sizes need a larger scratch than
        its arena holds (the caller then builds the instance in full)."""
        sym = self.symbolic_of
        if not self._ready or self.observer is not None or sym is None:
            return None
        slots, arena_bytes = sym.slots_at(self._bucket, values)
        if arena_bytes > self.arena.numel():
            return None
        new = object.__new__(CpuProgram)
        new.__dict__.update(self.__dict__)
        new.slots, new._arena_bytes = slots, arena_bytes
        new._ptrs = (ctypes.c_void_p * len(self._ptrs))()
        ctypes.memmove(new._ptrs, self._ptrs, ctypes.sizeof(self._ptrs))
        new._env = list(self._env)
        new.sizes = {s: int(values[s]) for s in sym.symbols}
        new._sizes = (ctypes.c_int64 * max(len(sym.symbols), 1))(*[new.sizes[s] for s in sym.symbols])
        if self._varying_io is None:  # (which of the bound inputs and fresh outputs change type)
            varying = {s for s, _ in sym.varying()}
            self._varying_io = ([k for k, (s, _, _) in enumerate(self._inputs) if s in varying],
                                [k for k, (s, _) in enumerate(self._fresh) if s in varying])
        new._inputs, new._fresh = list(self._inputs), list(self._fresh)
        for k in self._varying_io[0]:
            s, i, _ = self._inputs[k]
            new._inputs[k] = (s, i, slots[s].type)
        for k in self._varying_io[1]:
            s = self._fresh[k][0]
            new._fresh[k] = (s, slots[s].type)
        new._ptrs_bound, new.calls, new.run_s = None, 0, 0.0
        new._step_s = [0.0] * len(self.steps)
        new.collectives = collectives.Pending()
        new._runners = [new._make_runner(st) for st in self.steps]
        return new

    def _placed_slots(self, plan: Any) -> list[SlotSpec]:
        """This symbolic program's slots with the arena offsets of `plan` (a bucket's placement):
        arena slots at their planned offsets, scratch slots at the arena's end."""
        sym = self.symbolic
        slots = list(self.slots)
        for s, v in sym.arena_values.items():
            slots[s] = copy_slot(self.slots[s])
            slots[s].index = plan.offsets[v]
        arena = (plan.arena_bytes + 63) // 64 * 64
        for s in sym.scratch:
            slots[s] = copy_slot(self.slots[s])
            slots[s].index = arena
        return slots

    def _materialize(self, arena: torch.Tensor | None = None) -> None:
        """Allocate the arena (or use `arena`: the shared one, or a private one for a nested
        call) and bind fixed slots (at the first call: a build may run under a fake-tensor mode,
        e.g. inside torch.compile, where no real memory can be allocated)."""
        bucket = self._bucket
        self._inputs, self._written, self._fresh = [], [], []
        if arena is not None:
            self.arena = arena
        elif bucket is None:
            self.arena = torch.empty(self._arena_bytes, dtype=torch.uint8)
        else:  # the sizes of one bucket share an arena (grown to the largest scratch seen)
            if bucket.arena is None or bucket.arena.numel() < self._arena_bytes:
                bucket.arena = torch.empty(self._arena_bytes, dtype=torch.uint8)
            self.arena = bucket.arena
        base = self.arena.data_ptr()
        viewed = self._slots_read_as_tensors()
        for s, spec in enumerate(self.slots):
            if spec.kind == "sized" and spec.tensor is None:  # (a causal mask: see `at`)
                self._ptrs[s] = None
            elif spec.kind in ("const", "sized"):
                t = spec.tensor
                assert t is not None, "a program with symbolic sizes runs through at()"
                if not t.is_contiguous() or t.dtype != spec.type.dtype:
                    t = t.to(spec.type.dtype).contiguous()
                spec.tensor = t
                self._env[s] = t
                self._ptrs[s] = t.data_ptr()
            elif spec.kind in ("arena", "scratch"):
                self._ptrs[s] = base + spec.index
                if viewed is None or s in viewed:  # (generated code needs the address alone)
                    buf = self.arena[spec.index:spec.index + spec.type.nbytes]
                    self._env[s] = buf.view(spec.type.dtype).view(spec.type.shape)
            elif spec.kind == "input":
                self._inputs.append((s, spec.index, spec.type))
                if spec.written:
                    self._written.append(spec.index)
            elif spec.kind == "fresh":
                self._fresh.append((s, spec.type))
        out_slots = [o.slot for o in self.outputs if o.kind == "slot"]
        issue = {id(self.steps[i]) for i in collectives.async_steps(self.steps, out_slots)}
        self._runners = [self._collective_runner(st, issue) or self._make_runner(st) for st in self.steps]
        if self._profiling:
            self._runners = [self._timed(i, r) for i, r in enumerate(self._runners)]
        self._out_slots = [o.slot for o in self.outputs] if all(o.kind == "slot" for o in self.outputs) else None
        self._ready = True

    def _slots_read_as_tensors(self) -> set[int] | None:
        """Slots a step outside the generated code or an output reads as a tensor (None: all
        of them, for an observer that checks every kernel's values)."""
        if self.observer is not None:
            return None
        used = {o.slot for o in self.outputs if o.kind == "slot"}
        for st in self.steps:
            if st.kind != "seg":
                used.update(s for s, _ in st.operands)
                used.update(st.ins)
                used.update(st.outs)
                used.add(st.out)
        return used

    # ------------------------------------------------------------------------ steps
    def _collective_runner(self, st: StepSpec, issue: set[int]) -> Callable[[], None] | None:
        """An asynchronous collective's issue or wait step (runtime/collectives.py), else None."""
        target = collectives.step_collective(st)
        if target is None:
            return None
        if id(st) in issue:
            return collectives.issue_runner(st, self._env, self.collectives)
        if collectives.plain_wait(st):
            return collectives.wait_runner(st, self._env, self.collectives, self._make_runner(st))
        return None

    def _make_runner(self, st: StepSpec) -> Callable[[], None]:
        env = self._env
        if st.kind == "seg":
            assert self.lib is not None
            fn = getattr(self.lib, st.seg)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            ptrs = ctypes.cast(self._ptrs, ctypes.c_void_p)
            sizes = ctypes.cast(self._sizes, ctypes.c_void_p)
            label, sites = st.label, st.sites

            def run_seg() -> None:
                rc = fn(ptrs, sizes)
                if rc:  # the failing launch's position + 1
                    where = sites[rc - 1] if 0 < rc <= len(sites) else f"a generated kernel ({label})"
                    raise KernelIndexError(f"index out of range in {where}")

            return run_seg
        fixed = all(self.slots[s].kind in ("const", "arena", "scratch") for s, _ in st.operands)
        out, out_shape = st.out, tuple(st.attrs.get("out_shape", ()))
        if st.kind == "matmul":
            (sa, la), (sb, lb) = st.operands
            if st.attrs.get("out_dtype") is not None:  # int8 x int8 summed exactly in int32

                def run_int_mm() -> None:
                    exact_int_matmul(_view(env[sa], la), _view(env[sb], lb), out=env[out].view(out_shape))

                return run_int_mm
            if fixed and self.slots[out].kind in ("arena", "scratch") and env[sa].dtype == env[sb].dtype:
                a, b, o = _view(env[sa], la), _view(env[sb], lb), env[out].view(out_shape)

                def run_mm_fixed() -> None:
                    torch.matmul(a, b, out=o)

                return run_mm_fixed

            def run_mm() -> None:
                a, b = _view(env[sa], la), _view(env[sb], lb)
                # (a weight-only int8 B, ir/ops/matmul.py: converted per call, as eager does)
                torch.matmul(a, b if b.dtype == a.dtype else b.to(a.dtype), out=env[out].view(out_shape))

            return run_mm
        if st.kind == "sdpa":
            ops = st.operands
            scale, causal, gqa = st.attrs["scale"], st.attrs["causal"], st.attrs["gqa"]
            sdpa = torch.nn.functional.scaled_dot_product_attention

            def run_sdpa() -> None:
                q, k, v = (_view(env[s], lay) for s, lay in ops[:3])
                mask = _view(env[ops[3][0]], ops[3][1]) if len(ops) == 4 else None
                r = sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
                env[out].view(out_shape).copy_(r)

            return run_sdpa
        assert st.kind == "torch" and st.body is not None
        body, ins, outs = st.body, st.ins, st.outs
        if st.attrs.get("inplace_target"):  # the extern's in-place form on the input's own buffer
            target = st.attrs["inplace_target"]
            fast = make_inplace_runner(body, ins, env, target)
            if fast is not None:
                return fast
            nodes = [(m, OPS[m.op].impl if not m.op.startswith("extern") else None) for m in body.nodes]
            inputs = [(bi.value, s) for bi, s in zip(body.inputs, ins, strict=True)]

            def run_inplace() -> None:
                vals = {v: env[s] for v, s in inputs}
                for m, impl in nodes:
                    args = [vals[v] for v in m.inputs]
                    if impl is None:
                        call_extern(target, m.attrs["spec"], args)  # args[0]: the input's buffer
                    else:
                        vals[m.outputs[0]] = impl(args, m.attrs)

            return run_inplace

        # an ATen call relative to its argument's storage (as_strided) must see each IR value in
        # a storage of its own, as the interpreter does: an arena or scratch value is a view of
        # the whole arena, so it is copied first (fuzz seed 805659 read another buffer's bytes)
        own = {s for s in ins if self.slots[s].kind in ("arena", "scratch")} if storage_relative(body) else set()

        run_body = prepare(body)

        def run_torch() -> None:
            res = run_body([env[s].clone() if s in own else env[s] for s in ins])
            for s, r in zip(outs, res, strict=True):
                env[s].copy_(r)

        return run_torch

    def release_arena(self) -> None:
        """Drop every reference to the arena (the shared one grew, or a nested call's private
        one is done): the next call binds the slots again."""
        self._ready = False
        self._runners = []
        self.arena = torch.empty(0, dtype=torch.uint8)
        for s, spec in enumerate(self.slots):
            if spec.kind in ("arena", "scratch"):
                self._env[s] = None

    @property
    def arena_shared(self) -> bool:
        return self._shared is not None

    # ------------------------------------------------------------------------- call
    def run(self, inputs: Sequence[torch.Tensor], bound: BoundInputs | None = None) -> list[torch.Tensor]:
        """One call. `bound`: `bind_inputs(inputs)` of these same tensors, made before (a loop
        that calls the program again and again on inputs it updates in place)."""
        if self.refiner is not None:
            return self.refiner.run(self, inputs)
        return self.call_timed(inputs, bound=bound)

    def bind_inputs(self, inputs: Sequence[torch.Tensor]) -> BoundInputs | None:
        """What each call checks and binds of `inputs`, done once, for calls that pass these same
        tensors again, with their memory unchanged (updated in place only: a decode loop's
        token, cache and the parameters during one generate()). None where a call must bind
        them itself: an input that is not contiguous or not of the program's type, or one that
        shares memory with an input a kernel writes (those are bound as copies)."""
        if len(inputs) != self.n_inputs:
            return None
        written = [spec.index for spec in self.slots if spec.kind == "input" and spec.written]
        if written and self._shared_written_inputs(inputs, written):
            return None
        slots = []
        for s, spec in enumerate(self.slots):
            if spec.kind == "input":
                t = inputs[spec.index]
                if not t.is_contiguous() or t.dtype != spec.type.dtype or t.shape != spec.type.shape:
                    return None
                slots.append((s, t, t.data_ptr()))
        return BoundInputs(slots)

    def call_timed(self, inputs: Sequence[torch.Tensor], launch_s: list[float] | None = None,
                   bound: BoundInputs | None = None) -> list[torch.Tensor]:
        """One call; with `launch_s` (a program whose glue has launch timers), the seconds of
        each generated launch of this call are appended to it (the timers are on for this call
        alone, under the program's lock)."""
        if len(inputs) != self.n_inputs:
            raise TypeError(f"compiled program takes {self.n_inputs} inputs, got {len(inputs)}")
        if launch_s is not None:
            with self._lock:
                before = self._launch_totals()
                self.lib.nf_prof_set(1)
                try:
                    return self._run_locked(inputs, bound)
                finally:
                    self.lib.nf_prof_set(0)
                    launch_s.extend(b - a for a, b in zip(before, self._launch_totals(), strict=True))
        return self._run_locked(inputs, bound)

    def _launch_totals(self) -> list[float]:
        n = len(self.info.get("launch_keys") or ())
        if self.lib is None or not n:
            return []
        fn = self.lib.nf_profile
        fn.restype = ctypes.POINTER(ctypes.c_double)
        return fn()[:n]

    def _run_locked(self, inputs: Sequence[torch.Tensor], bound: BoundInputs | None = None) -> list[torch.Tensor]:
        with self._lock:
            shared = self._shared
            if shared is None:
                return self._run(inputs, bound)
            if shared.held_here():  # called from inside another program's call: a private arena
                self.release_arena()
                try:
                    self._materialize(torch.empty(self._arena_bytes, dtype=torch.uint8))
                    return self._run(inputs, bound)
                finally:
                    self.release_arena()
            with shared.lock:
                shared.owner = threading.get_ident()
                try:
                    buf = shared.buffer(self._arena_bytes)
                    if not self._ready or self.arena is not buf:
                        shared.users.add(self)
                        self._materialize(buf)
                    return self._run(inputs, bound)
                finally:
                    shared.owner = None

    def _run(self, inputs: Sequence[torch.Tensor], bound: BoundInputs | None = None) -> list[torch.Tensor]:
        """One call (the program's lock, and the shared arena's if it uses it, held)."""
        t_run = time.perf_counter()
        if not self._ready:
            self._materialize()
        env, ptrs = self._env, self._ptrs
        if bound is None:
            self._ptrs_bound = None
            self._bind_call_inputs(inputs)
        else:
            for s, t, _ in bound.slots:
                env[s] = t
            if bound is not self._ptrs_bound:  # (the addresses stay from the last call on the same binding)
                for s, _, p in bound.slots:
                    ptrs[s] = p
                self._ptrs_bound = bound
        for s, ty in self._fresh:
            t = torch.empty(ty.shape, dtype=ty.dtype)
            env[s] = t
            ptrs[s] = t.data_ptr()
        if self.observer is None:
            for r in self._runners:
                r()
        else:
            self.observer(self._runners, env)
        if self._out_slots is not None:
            result = [env[s] for s in self._out_slots]
        else:
            result = [self._output(o, inputs) for o in self.outputs]
        for s, _, _ in self._inputs:
            env[s] = None
        for s, _ in self._fresh:
            env[s] = None
        self.calls += 1
        self.run_s += time.perf_counter() - t_run
        return result

    def _bind_call_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        """Bind one call's inputs to their slots (a contiguous copy of a strided one; a copy of
        one written in place whose memory another input shares)."""
        env, ptrs = self._env, self._ptrs
        shared = self._shared_written_inputs(inputs, self._written) if self._written else ()
        for s, i, ty in self._inputs:
            t = inputs[i]
            if not t.is_contiguous():
                t = t.contiguous()
            elif i in shared:  # written in place but another input reads the same memory
                t = t.clone()
            if t.dtype != ty.dtype or t.shape != ty.shape:
                raise TypeError(f"input {i}: expected {ty}, got {t.dtype}{list(t.shape)}")
            env[s] = t
            ptrs[s] = t.data_ptr()

    @staticmethod
    def _shared_written_inputs(inputs: Sequence[torch.Tensor], written: Sequence[int]) -> set[int]:
        """Inputs written in place (positions `written`) whose storage another input shares (the
        caller passed one tensor twice, or views of one): those are bound as copies, so that no
        kernel reads memory an in-place kernel has already overwritten; the write-back stores
        the copy."""
        ptrs = [storage_ptr(t) for t in inputs]
        owners: dict[int, int] = {}
        for p in ptrs:
            owners[p] = owners.get(p, 0) + 1
        return {i for i in written if ptrs[i] and owners[ptrs[i]] > 1}

    def _output(self, o: OutputSpec, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        if o.kind == "slot":
            t = self._env[o.slot]
            assert t is not None
            return t
        if o.kind == "const":
            assert o.tensor is not None
            return o.tensor.clone()  # a program-owned constant: each call's result is its own
        t = inputs[o.input]
        for n in o.views:
            t = OPS[n.op].impl([t], n.attrs)
        return t

    def _timed(self, i: int, runner: Callable[[], None]) -> Callable[[], None]:
        acc = self._step_s

        def run_timed() -> None:
            t0 = time.perf_counter()
            runner()
            acc[i] += time.perf_counter() - t0

        return run_timed

    def timings(self) -> ProgramTimings | None:
        """Cumulative step and launch times (programs built with profile=True, else None).
        Library and torch steps are timed in Python around the call and belong to their
        kernel; a segment step's time minus its launches' (timed in C) is glue overhead."""
        if not self._profiling:
            return None
        steps = [(st.kind, st.kernel, self._step_s[i]) for i, st in enumerate(self.steps)]
        kernels = self.info.get("launch_kernels") or []
        launches = [(kernels[i] if i < len(kernels) else -1, lab, s) for i, (lab, s) in enumerate(self.profile())]
        return ProgramTimings(self.calls, self.run_s, steps, launches)

    def profile(self) -> list[tuple[str, float]]:
        """(kernel, total seconds) per generated launch, for programs built with options
        profile=True (each launch in the glue is timed with omp_get_wtime)."""
        labels = self.info.get("launch_labels") or []
        if self.lib is None or not labels:
            return []
        fn = self.lib.nf_profile
        fn.restype = ctypes.POINTER(ctypes.c_double)
        arr = fn()
        return [(lab, arr[i]) for i, lab in enumerate(labels)]

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for st in self.steps:
            kinds[st.kind] = kinds.get(st.kind, 0) + 1
        where = " (shared)" if self._shared is not None else ""
        return (f"CpuProgram: {len(self.slots)} slots, arena {self._arena_bytes} bytes{where}, steps "
                + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))

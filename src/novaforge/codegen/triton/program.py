"""The Triton backend's runtime Program: one arena, a flat list of steps, CUDA-graph replay.

Invariant: `TritonProgram.run(inputs)` computes what `runtime.interpret.interpret(graph,
inputs)` computes (outputs, then mutated inputs' new values). Every intermediate value lives at
its planned offset of one arena allocated once per program (`graph.meta.memory_plan`);
escaping values (graph outputs, mutation write-backs) are fresh tensors of each call, never
views of the arena, so the next call cannot overwrite what a caller holds. Steps are prepared at
build time (argument slots, grids, launch options), so a call does little Python work per
kernel. On CUDA a program whose options allow it is captured as a CUDA graph on its second call
and replayed afterwards: user inputs are copied into static buffers, parameters must keep their
addresses (else the graph is recaptured), and outputs are returned as clones of the graph's
static outputs. A capture failure disables graphs for the program (with a warning), never
the program. `info()` says what ran: the launcher, graph captures and replays, each generated
kernel's schedule and binary resources (shared memory, registers, spills, read when the kernel
was loaded at build), each user Triton kernel the program launches (`user` steps,
user_launch.py: the user's grid and arguments as written, outputs in the arena) and each step
that runs through torch with its reason.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

from ...ir import OPS, Graph, Value
from ...ir.symbolic import hint
from ...ir.types import contiguous_strides
from ...runtime.interpret import interpret, storage_relative
from ...runtime.shared_arena import SharedArena
from ...runtime.state import storage_ptr


class StepKind(StrEnum):
    TRITON = "triton"  # a generated kernel launch
    TORCH = "torch"  # a kernel body through torch
    VIEW = "view"  # a top-level view of a buffer
    USER = "user"  # a user Triton kernel launch (user_launch.py): its grid and arguments as written


@dataclass
class Step:
    kind: StepKind
    title: str
    args: list[int]  # slots read
    outs: list[int]  # slots written
    contiguous: list[bool] = field(default_factory=list)  # per arg: make it contiguous first (views)
    launch: Callable[..., Any] | None = None  # triton: fn[grid] with launch options bound; user: user_launch
    body: Graph | None = None  # torch: the kernel body run by the interpreter
    node: Any = None  # view: the IR node; triton: the JIT function
    preallocated: list[bool] = field(default_factory=list)  # torch: does the out slot hold a buffer to fill
    source: Any = None  # triton: the KernelSource
    reason: str = ""  # torch: why this kernel is not generated (or why its generated code was dropped)
    resources: dict[str, Any] = field(default_factory=dict)  # triton on a GPU: shared, n_regs, n_spills

    def __post_init__(self) -> None:
        self.kind = StepKind(self.kind)


class TritonProgram:
    def __init__(self, graph: Graph, device: str, *, cuda_graphs: bool = True, interpret_mode: bool = False) -> None:
        self.graph = graph
        self.device = torch.device(device)
        self.interpret_mode = interpret_mode
        self.steps: list[Step] = []
        self.slot_of: dict[Value, int] = {}
        self.n_slots = 0
        self.template: list[Any] = []  # persistent slot contents: consts and arena views
        self.input_slots: list[int] = []  # slot of each non-const graph input, in order
        self.input_kinds: list[str] = []
        self.fresh: list[tuple[int, tuple[int, ...], torch.dtype]] = []
        self.view_slots: set[int] = set()
        self.arena: torch.Tensor | None = None  # (None for a program that runs in the shared arena)
        self.arena_bytes = 0
        self.arena_slots: set[int] = set()  # slots holding a view of the arena
        self.arena_shared = False  # use the device's shared arena instead of an own one (see allocate)
        self._shared: dict[tuple, SharedArena] = {}  # (device, stream) -> the shared arena this program used
        self._arena_views: list[tuple[int, int, torch.dtype, tuple[int, ...]]] = []  # slot, offset, dtype, shape
        self.notes: dict[str, Any] = {}  # build facts for info(): precompile, pre-transposed weights
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graph_runner: _CudaGraphRunner | None = None
        self.calls = 0

    def stop_graphs(self, reason: str) -> None:
        """Run without a CUDA graph from now on (`reason` goes to info()); a large arena moves to
        the shared one (see allocate), since no graph needs its addresses any more."""
        self.use_graphs = False
        self.notes["cuda_graphs_off"] = reason
        if self.arena is not None and self.arena_bytes > SHARED_ARENA_OVER:
            self.arena_shared, self.arena = True, None
            for s, _, dtype, _ in self._arena_views:
                self.template[s] = torch.empty(0, dtype=dtype, device=self.device)

    def inputs_written(self) -> set[int]:
        """Positions of the inputs whose buffers kernels write (mutated inputs updated in place)."""
        written = {o for st in self.steps for o in st.outs}
        return {i for i, s in enumerate(self.input_slots) if s in written}

    def output_bytes_copied(self) -> int:
        """Bytes of the outputs a graph replay clones: all but the mutated inputs' new values
        written in their inputs' own buffers (their slot is the input's)."""
        inputs = set(self.input_slots)
        return sum(hinted_bytes(v) for v in list(self.graph.outputs) + [new for _, new in self.graph.mutations]
                   if self.slot_of.get(v) not in inputs)

    # -- construction (used by the backend) --------------------------------------------------
    def slot(self, v: Value) -> int:
        s = self.slot_of.get(v)
        if s is None:
            s = self.n_slots
            self.slot_of[v] = s
            self.n_slots += 1
            self.template.append(None)
        return s

    def bind_inputs(self) -> None:
        for gi in self.graph.inputs:
            s = self.slot(gi.value)
            if gi.kind == "const":
                t = gi.tensor
                if t.device != self.device:
                    t = t.to(self.device)
                self.template[s] = t.contiguous()
            else:
                self.input_slots.append(s)
                self.input_kinds.append(gi.kind)

    def transposed_const(self, slot: int) -> int:
        """A slot holding the constant in `slot` stored as the transpose of its last two dims
        ([..., K, N] -> [..., N, K] contiguous), made once per constant (a K-major weight copy)."""
        cache = self.notes.setdefault("_transposed", {})
        if slot not in cache:
            t = self.template[slot]
            new = self.n_slots
            self.n_slots += 1
            self.template.append(t.transpose(-1, -2).contiguous())
            cache[slot] = new
            w = self.notes.setdefault("transposed_weights", {"count": 0, "bytes": 0})
            w["count"] += 1
            w["bytes"] += t.numel() * t.element_size()
        return cache[slot]

    def allocate(self, plan: Any, in_place: dict[Value, Value] | None = None) -> None:
        """Arena views for planned buffers; the input's own slot for a mutated input's new value
        written in place (`in_place`: output -> input); fresh (per call) outputs for the rest.

        A program that runs without a CUDA graph and plans more than SHARED_ARENA_OVER bytes has no
        arena of its own: each call runs in the arena shared by such programs on its device and
        stream (`SharedArena`, as large as the largest), as eager reuses freed memory: a training
        step's forward and backward programs then use one arena, not one each for the whole step
        (GPT-124M bf16 at 16 x 1024: 4.7 and 1.9 GiB). Calls on one stream run in order, so the
        programs never overlap in it. A graph's replay needs fixed addresses: captured programs
        keep their own."""
        offsets = getattr(plan, "offsets", {}) if plan is not None else {}
        arena_bytes = getattr(plan, "arena_bytes", 0) if plan is not None else 0
        self.arena_bytes = -(-max(arena_bytes, 1) // 8) * 8  # (a whole number of 8-byte elements)
        self.arena_shared = not self.use_graphs and arena_bytes > SHARED_ARENA_OVER
        # (a shared arena's slots hold placeholders, so the template still says which are planned)
        self.arena = torch.empty(0 if self.arena_shared else self.arena_bytes, dtype=torch.uint8,
                                 device=self.device)
        for n in self.graph.nodes:
            if n.op != "kernel":
                continue
            for o in n.outputs:
                if in_place and o in in_place:
                    self.slot_of[o] = self.slot(in_place[o])
                    continue
                s = self.slot(o)
                if o in offsets:
                    off, nbytes = offsets[o], o.type.nbytes
                    buf = self.arena[off:off + nbytes].view(o.type.dtype) if nbytes and not self.arena_shared \
                        else torch.empty(0, dtype=o.type.dtype, device=self.device)
                    self.template[s] = buf if self.arena_shared else buf.view(o.type.shape)
                    self.arena_slots.add(s)
                    if nbytes:
                        self._arena_views.append((s, off, o.type.dtype, tuple(o.type.shape)))
                else:
                    self.fresh.append((s, o.type.shape, o.type.dtype))
        if self.arena_shared:
            self.arena = None

    def _shared_arena(self) -> SharedArena:
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        key = (str(self.device), stream)
        arena = self._shared.get(key)
        if arena is None:
            arena = self._shared[key] = SharedArena.of(key)
        return arena

    def _bind_arena(self, env: list[Any], shared: SharedArena) -> None:
        """Views of the shared buffer in the planned slots (made again only when the buffer grew)."""
        views = shared.views.get(self)
        if views is None:
            buf = shared.buffer(self.arena_bytes)
            bases: dict[torch.dtype, torch.Tensor] = {}
            views = []
            for _, off, dtype, shape in self._arena_views:
                base = bases.get(dtype)
                if base is None:
                    base = bases[dtype] = buf.view(dtype)
                size = dtype.itemsize
                if off % size:  # (the plan aligns every buffer; keep exact for any that is not)
                    views.append(buf[off:off + math.prod(shape) * size].view(dtype).view(shape))
                else:
                    views.append(base.as_strided(shape, contiguous_strides(shape), off // size))
            shared.views[self] = views
        for (s, _, _, _), view in zip(self._arena_views, views, strict=True):
            env[s] = view

    @property
    def kernels(self) -> list[Any]:
        """The KernelSource of each generated launch, in order (for inspection and tests)."""
        return [st.source for st in self.steps if st.kind == "triton"]

    def add_step(self, step: Step) -> None:
        step.contiguous = [a in self.view_slots for a in step.args]
        self.steps.append(step)

    # -- execution ---------------------------------------------------------------------------
    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.calls += 1
        if self.use_graphs:
            if self._graph_runner is None:
                self._graph_runner = _CudaGraphRunner(self)
            return self._graph_runner.run(inputs)
        return self.run_eager(inputs)

    def run_eager(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not self.arena_shared:
            return self._run(inputs)
        shared = self._shared_arena()
        with shared.lock:
            return self._run(inputs, shared)

    def _run(self, inputs: Sequence[torch.Tensor], shared: SharedArena | None = None) -> list[torch.Tensor]:
        if len(inputs) != len(self.input_slots):
            raise ValueError(f"program expects {len(self.input_slots)} inputs, got {len(inputs)}")
        env = list(self.template)
        copies: set[int] = set()  # storages of the program's own contiguous copies of inputs
        for s, x in zip(self.input_slots, inputs, strict=True):
            if x.device != self.device:
                raise ValueError(f"input on {x.device}, program compiled for {self.device}")
            env[s] = x if x.is_contiguous() else x.contiguous()
            if env[s] is not x and x.numel():
                copies.add(storage_ptr(env[s]))
        if shared is not None:
            self._bind_arena(env, shared)
        for s, shape, dtype in self.fresh:
            env[s] = torch.empty(shape, dtype=dtype, device=self.device)
        for st in self.steps:
            if st.kind == "triton" or st.kind == "user":
                args = [env[a].contiguous() if c else env[a] for a, c in zip(st.args, st.contiguous, strict=True)]
                st.launch(*args, *[env[o] for o in st.outs])
            elif st.kind == "view":
                env[st.outs[0]] = OPS[st.node.op].impl([env[st.args[0]]], st.node.attrs)
            else:  # (an as_strided of a planned buffer must not see the arena around it)
                own = self.arena_slots if storage_relative(st.body) else ()
                res = interpret(st.body, [env[a].clone() if a in own else env[a] for a in st.args])
                for o, t, pre in zip(st.outs, res, st.preallocated, strict=True):
                    if pre:
                        env[o].copy_(t)
                    else:
                        env[o] = t.contiguous()
        g = self.graph
        outs = [env[self.slot_of[v]] for v in g.outputs] + [env[self.slot_of[new]] for _, new in g.mutations]
        return [own_copy_contiguous(o, copies) for o in outs] if copies else outs

    def info(self) -> dict[str, Any]:
        """What this program runs and what ran (for reports, gpu_check and tests)."""
        r = self._graph_runner
        kernels = []
        for st in self.steps:
            if st.kind == "triton":
                k = st.source
                kernels.append({"title": st.title, "kind": k.kind, "grid": list(k.grid), "num_warps": k.num_warps,
                                "num_stages": k.num_stages, "schedule": k.schedule.key(), **st.resources})
        return {
            "device": str(self.device),
            "launcher": "interpreter" if self.interpret_mode else "gpu",
            "calls": self.calls,
            "arena": {"bytes": self.arena_bytes, "shared": self.arena_shared},
            "cuda_graphs": {"enabled": self.use_graphs, "captures": r.captures if r else 0,
                            "replays": r.replays if r else 0, "failed": r.failed if r else False},
            "kernels": kernels,
            "fallbacks": [{"title": st.title, "reason": st.reason} for st in self.steps if st.kind == "torch"],
            "user_kernels": [{"title": st.title, "grid": list(st.source.grid)}
                             for st in self.steps if st.kind == "user"],
            **{k: v for k, v in self.notes.items() if not k.startswith("_")},
        }

    def describe(self) -> str:
        """One line per step: what runs, on which executor (the program's listing for dumps)."""
        lines = [f"# triton program on {self.device}: {len(self.steps)} steps, arena "
                 f"{self.arena_bytes / 2**20:.2f} MiB{' (shared)' if self.arena_shared else ''}, "
                 f"cuda graphs {'on' if self.use_graphs else 'off'}"]
        for st in self.steps:
            if st.kind == "triton":
                k = st.source
                res = " ".join(f"{a}={b}" for a, b in st.resources.items())
                lines.append(f"{st.title:32s} triton {k.kind:10s} grid={k.grid} warps={k.num_warps} "
                             f"stages={k.num_stages} {k.schedule.key()}" + (f" {res}" if res else ""))
            elif st.kind == "torch":
                lines.append(f"{st.title:32s} torch  ({st.reason})" if st.reason else f"{st.title:32s} torch")
            elif st.kind == "user":
                lines.append(f"{st.title:32s} user   grid={st.source.grid} (user Triton kernel, as written)")
            else:
                lines.append(f"{st.title:32s} {st.kind}")
        return "\n".join(lines)


class TorchCuda:
    """The torch.cuda calls the graph runner makes (one seam, so tests can run the runner's logic
    on the CPU with a stand-in)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def run_on_side_stream(self, fn: Callable[[], Any]) -> None:
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        return g, out

    def replay(self, graph: Any) -> None:
        graph.replay()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


GRAPH_COPY_LIMIT = 256 << 20  # bytes of user inputs + outputs above which a program runs without a CUDA graph
SHARED_ARENA_OVER = 64 << 20  # arena bytes above which a program without a CUDA graph uses the shared arena


def hinted_bytes(v: Value) -> int:
    """A value's bytes at its size hints (symbolic sizes: their hints)."""
    return int(hint(v.type.numel)) * v.type.dtype.itemsize


class _CudaGraphRunner:
    """Warm up once, capture on the second call, replay after (see the module invariant).

    A user input at the same address on the first two calls (a training step's parameters and
    optimizer state, passed as arguments) is read in place by the graph, not copied into a
    static buffer; if it moves later, the graph is recaptured with that input copied from then
    on. A mutated input updated in place by the program is returned as itself, not cloned. If
    the bytes to copy per replay (moving inputs and cloned outputs) exceed GRAPH_COPY_LIMIT, the
    program runs without a graph (a forward whose outputs are the saved activations: copying
    them cost more memory and time than the launches it saves)."""

    def __init__(self, program: TritonProgram, cuda: Any = None) -> None:
        self.p = program
        self.cuda = cuda if cuda is not None else TorchCuda(program.device)
        self.graph: Any = None
        self.static: dict[int, torch.Tensor] = {}
        self.ref_ptrs: dict[int, int] = {}
        self.stable: set[int] = set()  # user inputs the graph reads in place (at their address)
        self.outputs: list[torch.Tensor] = []
        self.first_ptrs: list[int] = []
        self.moved: set[int] = set()  # user inputs seen at another address: copied
        self.out_kinds: list[tuple[str, int]] = []  # per output: ("input", i) | ("contiguous", 0) | ("clone", 0)
        self.failed = False
        self.warm = False
        self.captures = 0
        self.replays = 0

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.failed:
            return self.p.run_eager(inputs)
        if not self.warm:
            self.warm = True
            self.first_ptrs = [x.data_ptr() for x in inputs]
            return self.p.run_eager(inputs)
        if self.graph is not None and not self._refs_moved(inputs):
            for i, buf in self.static.items():
                buf.copy_(inputs[i])
            self.cuda.replay(self.graph)
            self.replays += 1
            return self._fresh(inputs)
        return self._capture(inputs)

    def _refs_moved(self, inputs: Sequence[torch.Tensor]) -> bool:
        moved = [i for i, p in self.ref_ptrs.items() if inputs[i].data_ptr() != p
                 or (i in self.stable and not inputs[i].is_contiguous())]
        self.moved.update(i for i in moved if i in self.stable)
        return bool(moved)

    def _capture(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        p = self.p
        self.graph = None
        user = [i for i, kind in enumerate(p.input_kinds) if kind == "user"]
        stable = {i for i in user if i not in self.moved and inputs[i].is_contiguous() and inputs[i].numel()
                  and inputs[i].data_ptr() == self.first_ptrs[i]}
        copied = sum(inputs[i].numel() * inputs[i].element_size() for i in user if i not in stable)
        copied += p.output_bytes_copied()
        if copied > GRAPH_COPY_LIMIT:
            return self._give_up(inputs, f"{copied / 2**20:.0f} MiB of inputs and outputs to copy per replay: "
                                 "more than a graph's launches cost")
        self.static = {i: inputs[i].contiguous().clone() for i in user if i not in stable}
        self.stable = stable  # (no reference kept: a replay runs only when the call's input is at that address)
        args = [self.static.get(i, x) for i, x in enumerate(inputs)]
        for i, kind in enumerate(p.input_kinds):
            if kind != "user" and not args[i].is_contiguous():  # a graph would copy them on every replay
                return self._give_up(inputs, "a parameter is not contiguous")
        self.ref_ptrs = {i: args[i].data_ptr() for i, kind in enumerate(p.input_kinds)
                         if kind != "user" or i in stable}
        # the warm-up before a capture runs for real: inputs the program updates in place are
        # given copies there, so this call updates them once (by the replay), not twice
        written = p.inputs_written()
        self.cuda.run_on_side_stream(lambda: p.run_eager([a.clone() if i in written else a
                                                          for i, a in enumerate(args)]))
        try:
            g, outs = self.cuda.capture(lambda: p.run_eager(args))
        except Exception as e:  # a step that cannot be captured: run this program eagerly from now on
            warnings.warn(f"novaforge: CUDA graph capture failed ({type(e).__name__}: {e}); running eagerly",
                          stacklevel=3)
            self.cuda.synchronize()
            return self._give_up(inputs, f"capture failed: {type(e).__name__}")
        self.graph, self.outputs = g, outs
        self.out_kinds = [self._out_kind(o, args) for o in outs]
        self.captures += 1
        self.cuda.replay(g)
        self.replays += 1
        return self._fresh(inputs)

    def _give_up(self, inputs: Sequence[torch.Tensor], reason: str) -> list[torch.Tensor]:
        """No graph for this program from now on (the static copies are released, not kept for nothing)."""
        self.failed = True
        self.static, self.ref_ptrs, self.stable = {}, {}, set()
        self.p.stop_graphs(reason)
        return self.p.run_eager(inputs)

    def _out_kind(self, o: torch.Tensor, args: list[torch.Tensor]) -> tuple[str, int]:
        """How a replay returns a captured output: a stable input updated in place (exactly its
        layout), as the call's input itself; one that views a static input buffer (a view of an
        input: eager's result there is a fresh tensor, contiguous where eager's is), a contiguous
        copy; any other, a copy."""
        for i in self.stable:
            x = args[i]
            if (o.data_ptr(), o.shape, o.stride(), o.dtype) == (x.data_ptr(), x.shape, x.stride(), x.dtype):
                return ("input", i)
        static = {storage_ptr(b) for b in self.static.values()} - {0}
        return ("contiguous", 0) if storage_ptr(o) in static else ("clone", 0)

    def _fresh(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """A replay's outputs as `_out_kind` decided at the capture."""
        return [inputs[i] if kind == "input" else o.clone(memory_format=torch.contiguous_format)
                if kind == "contiguous" else o.clone()
                for o, (kind, i) in zip(self.outputs, self.out_kinds, strict=True)]


def own_copy_contiguous(t: torch.Tensor, copies: set[int]) -> torch.Tensor:
    """`t`, or a contiguous copy where it is a view of one of the program's own contiguous
    copies of a strided input (`x.t().contiguous()`, `x.expand(..)` of such an input): the
    frontend sees no input there, and eager's result is a fresh tensor, contiguous where
    eager's is (fuzz seed 910314)."""
    return t.contiguous() if storage_ptr(t) in copies else t

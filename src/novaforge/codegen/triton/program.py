"""The Triton backend's runtime Program: one arena, a flat list of steps, CUDA-graph replay.

Invariant: `TritonProgram.run(inputs)` computes what `runtime.interpret.interpret(graph,
inputs)` computes (outputs, then mutated inputs' new values). Every intermediate value lives at
its planned offset of one arena allocated once per program (`graph.meta["memory_plan"]`);
escaping values (graph outputs, mutation write-backs) are fresh tensors of each call, never
views of the arena, so the next call cannot overwrite what a caller holds. Steps are prepared at
build time (argument slots, grids, launch options), so a call does little Python work per
kernel. On CUDA a program whose options allow it is captured as a CUDA graph on its second call
and replayed afterwards: user inputs are copied into static buffers, parameters must keep their
addresses (else the graph is recaptured), and outputs are returned as clones of the graph's
static outputs. A capture failure disables graphs for the program (with a warning), never
the program.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...ir import OPS, Graph, Value
from ...runtime.interpret import interpret


@dataclass
class Step:
    kind: str  # triton | torch | view
    title: str
    args: list[int]  # slots read
    outs: list[int]  # slots written
    contiguous: list[bool] = field(default_factory=list)  # per arg: make it contiguous first (views)
    launch: Callable[..., Any] | None = None  # triton: fn[grid] with launch options bound
    body: Graph | None = None  # torch: the kernel body run by the interpreter
    node: Any = None  # view: the IR node; triton: the JIT function
    preallocated: list[bool] = field(default_factory=list)  # torch: does the out slot hold a buffer to fill
    source: Any = None  # triton: the KernelSource


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
        self.arena: torch.Tensor | None = None
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graph_runner: _CudaGraphRunner | None = None
        self.calls = 0

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

    def allocate(self, plan: Any) -> None:
        """Arena views for planned buffers; fresh (per call) outputs for everything else."""
        offsets = getattr(plan, "offsets", {}) if plan is not None else {}
        arena_bytes = getattr(plan, "arena_bytes", 0) if plan is not None else 0
        self.arena = torch.empty(max(arena_bytes, 1), dtype=torch.uint8, device=self.device)
        for n in self.graph.nodes:
            if n.op != "kernel":
                continue
            for o in n.outputs:
                s = self.slot(o)
                if o in offsets:
                    off, nbytes = offsets[o], o.type.nbytes
                    buf = self.arena[off:off + nbytes].view(o.type.dtype) if nbytes else \
                        torch.empty(0, dtype=o.type.dtype, device=self.device)
                    self.template[s] = buf.view(o.type.shape)
                else:
                    self.fresh.append((s, o.type.shape, o.type.dtype))

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
        if len(inputs) != len(self.input_slots):
            raise ValueError(f"program expects {len(self.input_slots)} inputs, got {len(inputs)}")
        env = list(self.template)
        for s, x in zip(self.input_slots, inputs, strict=True):
            if x.device != self.device:
                raise ValueError(f"input on {x.device}, program compiled for {self.device}")
            env[s] = x if x.is_contiguous() else x.contiguous()
        for s, shape, dtype in self.fresh:
            env[s] = torch.empty(shape, dtype=dtype, device=self.device)
        for st in self.steps:
            if st.kind == "triton":
                args = [env[a].contiguous() if c else env[a] for a, c in zip(st.args, st.contiguous, strict=True)]
                st.launch(*args, *[env[o] for o in st.outs])
            elif st.kind == "view":
                env[st.outs[0]] = OPS[st.node.op].impl([env[st.args[0]]], st.node.attrs)
            else:
                res = interpret(st.body, [env[a] for a in st.args])
                for o, t, pre in zip(st.outs, res, st.preallocated, strict=True):
                    if pre:
                        env[o].copy_(t)
                    else:
                        env[o] = t.contiguous()
        g = self.graph
        return [env[self.slot_of[v]] for v in g.outputs] + [env[self.slot_of[new]] for _, new in g.mutations]

    def describe(self) -> str:
        """One line per step: what runs, on which executor (the program's listing for dumps)."""
        lines = [f"# triton program on {self.device}: {len(self.steps)} steps, arena "
                 f"{(self.arena.numel() if self.arena is not None else 0) / 2**20:.2f} MiB, "
                 f"cuda graphs {'on' if self.use_graphs else 'off'}"]
        for st in self.steps:
            if st.kind == "triton":
                k = st.source
                lines.append(f"{st.title:32s} triton {k.kind:10s} grid={k.grid} warps={k.num_warps} "
                             f"stages={k.num_stages} {k.schedule.key()}")
            else:
                lines.append(f"{st.title:32s} {st.kind}")
        return "\n".join(lines)


class _CudaGraphRunner:
    """Warm up once, capture on the second call, replay after (see the module invariant)."""

    def __init__(self, program: TritonProgram) -> None:
        self.p = program
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[int, torch.Tensor] = {}
        self.ref_ptrs: dict[int, int] = {}
        self.outputs: list[torch.Tensor] = []
        self.failed = False
        self.warm = False

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.failed:
            return self.p.run_eager(inputs)
        if not self.warm:
            self.warm = True
            return self.p.run_eager(inputs)
        if self.graph is not None and not self._refs_moved(inputs):
            for i, buf in self.static.items():
                buf.copy_(inputs[i])
            self.graph.replay()
            return [o.clone() for o in self.outputs]
        return self._capture(inputs)

    def _refs_moved(self, inputs: Sequence[torch.Tensor]) -> bool:
        return any(inputs[i].data_ptr() != p for i, p in self.ref_ptrs.items())

    def _capture(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        p = self.p
        self.graph = None
        self.static = {i: x.contiguous().clone() for i, (x, kind) in enumerate(zip(inputs, p.input_kinds, strict=True))
                       if kind == "user"}
        args = [self.static.get(i, x) for i, x in enumerate(inputs)]
        for i, kind in enumerate(p.input_kinds):
            if kind != "user" and not args[i].is_contiguous():  # a graph would copy them on every replay
                self.failed = True
                return p.run_eager(inputs)
        self.ref_ptrs = {i: args[i].data_ptr() for i, kind in enumerate(p.input_kinds) if kind != "user"}
        side = torch.cuda.Stream(device=p.device)
        side.wait_stream(torch.cuda.current_stream(p.device))
        with torch.cuda.stream(side):
            p.run_eager(args)
        torch.cuda.current_stream(p.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                outs = p.run_eager(args)
        except Exception as e:  # a step that cannot be captured: run this program eagerly from now on
            self.failed = True
            warnings.warn(f"novaforge: CUDA graph capture failed ({type(e).__name__}: {e}); running eagerly",
                          stacklevel=3)
            torch.cuda.synchronize(p.device)
            return p.run_eager(inputs)
        self.graph, self.outputs = g, outs
        g.replay()
        return [o.clone() for o in outs]

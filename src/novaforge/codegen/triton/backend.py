"""TritonBackend: fused GPU kernels in Triton, scheduled analytically, run from one arena.

Invariant: `build(graph, options)` returns a `TritonProgram` that computes what the reference
interpreter computes for the same graph; for a graph with symbolic sizes, a `SizedTritonProgram`
whose `at(values)` is such a program at those sizes (its kernels rendered and compiled once with
the sizes as arguments, schedules planned at the symbols' hints: sized.py).

Each `kernel` node runs as generated Triton code when
`analysis.analyze` accepts its body (pointwise, row reductions, matmul with prologue views and
elementwise epilogue, flash attention, take/cat gathers), as the user's own Triton kernel when
it is one user kernel launch (a `triton_op`'s or Dynamo-captured `@triton.jit` kernel, launched
with its grid and arguments as written into arena buffers: user_launch.py), else through torch on the same device
(executor "torch": other index ops, scans, externs, anything the analysis rejects; the reason is
kept in `reasons`). Schedules come from schedule/gpu.py (no benchmarking). Compiled kernels are cached
in memory by (structural key, schedule, target, mode): identical layers share one kernel.

On a CUDA graph the kernels run on the GPU; on a CPU graph they run in Triton's interpreter
(TRITON_INTERPRET=1, set by the loader around each import), which is how the tests run them.

Options (novaforge.compile(..., **options)): tf32 (True: float32 matmuls and attention on TF32
tensor cores), cuda_graphs (True: capture and replay static-shape programs), matmul_loader
("pointer", the default until TMA is measured on hardware; "tma"; "auto": TMA on Hopper where the
operands allow it), dump_dir (copy generated sources there; also $NOVAFORGE_DEBUG),
max_reduction_block (tests: cap a reduction's column block, forcing the looped form),
parallel_compile (True: compile all new kernels of a program at build time in compile_threads
threads; False: one thread), matmul_executor ("triton", or "torch" to run matmul kernels as
torch.matmul (cuBLAS) plus unfused epilogue ops: a comparison point), matmul_persistent ("auto": the
configurator decides; "on"/"off" force the form where it exists), matmul_tf32_round (round float32
operands to the nearest TF32 before the dot, as cuBLAS's error suggests it does; a candidate
measured on the GPU, off by default), and test knobs matmul_tile,
matmul_programs, matmul_subtile (force the tile, a persistent grid size and epilogue subtiles).

On a GPU, every new kernel is compiled *and loaded* at build (`_precompile`): loading is where
Triton raises OutOfResources (shared memory, threads), so a kernel that compiles but cannot run
falls back to torch with its reason instead of failing at its first launch; each loaded kernel's
shared memory, registers and spills are kept on its step (`TritonProgram.info()`).

Weight layout for TF32: Hopper's wgmma reads float32 operands only K-major from shared memory,
so a row-major B ([K, N], N contiguous) would be transposed through registers. A float32 matmul
on TF32 whose B is such a *constant* (a frozen weight, e.g. GPT-2's Conv1D [in, out]) reads a
copy transposed once at build ([N, K] contiguous, made once per constant and program); nn.Linear
weights ([N, K]) are K-major already. 16-bit operands have no such restriction (no copy).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ...ir import OPS, Graph, Kernel, Value
from ...ir.specialize import specialize
from ...ir.symbolic import (
    SYMBOL_PREFIX,
    context_signature,
    formatting,
    graph_symbols,
    hint,
    is_symbolic,
    provably,
    substitute,
    symbol,
    upper,
)
from ...options import Options
from ...schedule import gpu as sched_gpu
from ..inplace_updates import pointwise_updates
from ..sources import sources_digest
from . import loader
from .analysis import BodyInfo, Unsupported, analyze
from .program import Step, TritonProgram
from .render import KernelSource, render_pointwise, render_reduction
from .render_attention import render_attention
from .render_gather import render_gather
from .render_matmul import MatmulLayout, render_matmul
from .user_launch import UserLaunch, user_launch

VERSION = "triton-backend-1"


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:  # pragma: no cover - triton is an optional dependency
        return "absent"


class TritonBackend:
    name = "triton"
    symbolic_programs = True  # builds one program for a range of sizes (a graph with symbolic sizes)

    def __init__(self) -> None:
        self._target: sched_gpu.GpuTarget | None = None
        self._infos: dict[tuple[str, frozenset[int]], BodyInfo | None] = {}
        self.reasons: dict[str, str] = {}  # structural key -> why the kernel runs through torch
        self._kernels: dict[tuple, tuple[KernelSource, Any]] = {}
        self.compiled = 0  # kernels rendered and loaded (cache misses)

    # -- protocol -----------------------------------------------------------------------------
    def target(self) -> sched_gpu.GpuTarget:
        if self._target is None:
            self._target = sched_gpu.default_target()
        return self._target

    def hash(self) -> str:
        """The Triton version and a digest of every source the generated code depends on (this
        backend's folder, the IR, the shared body analysis, the GPU configurator)."""
        digest = sources_digest("codegen/triton", "codegen/body.py", "ir", "schedule/gpu.py")[:20]
        return f"{VERSION}|triton-{_triton_version()}|{digest}"

    def executor_for(self, kernel: Kernel) -> str:
        return "triton" if self.info(kernel) is not None else "torch"

    def info(self, kernel: Kernel, transposed: frozenset[int] = frozenset()) -> BodyInfo | None:
        """The body analysis (None: the kernel runs through torch, `reasons` says why);
        `transposed`: body inputs stored as the transpose of their last two dims."""
        key = (kernel.structural_key, transposed)
        if key not in self._infos:
            try:
                self._infos[key] = analyze(kernel, transposed)
            except Unsupported as e:
                self._infos[key] = None
                if not transposed:
                    self.reasons[kernel.structural_key] = f"{kernel.name}: {e}"
        return self._infos[key]

    def reason(self, kernel: Kernel) -> str:
        return self.reasons.get(kernel.structural_key, "")

    # -- schedules ----------------------------------------------------------------------------
    def schedule(self, info: BodyInfo, target: sched_gpu.GpuTarget, options: Options) -> Any:
        tf32 = options.use_tf32()
        if info.kind == "gather":
            widest = max([t.itemsize for t in info.outputs] or [4])
            return sched_gpu.pointwise_schedule(hint(math.prod(info.space)), 2 * widest, widest, target)
        if info.kind == "pointwise":
            read = _bytes_read(info)
            widest = max([t.itemsize for t in info.inputs + info.outputs] or [4])
            return sched_gpu.pointwise_schedule(hint(math.prod(info.space)), read, widest, target)
        if info.kind == "reduction":
            rows = math.prod(s for d, s in enumerate(info.space) if d not in info.red_axes)
            cols = math.prod(info.space[d] for d in info.red_axes)
            live = min(8, 2 + sum(1 for leaf in info.used_leaves().values() if leaf.kind == "load" and
                                  any(info.space_strides(leaf)[d] for d in info.red_axes)))
            widest = max([t.itemsize for t in info.inputs + info.outputs] or [4])
            s = _reduction_schedule(rows, cols, live, widest, target)
            tile = options.reduction_outer_tile
            if tile and not is_symbolic(rows) and not is_symbolic(cols) and _outer_axis_reduction(info):
                br, bc = min(tile, sched_gpu.pow2_ceil(rows)), min(tile, sched_gpu.pow2_ceil(cols))
                s = sched_gpu.ReductionSchedule(br, bc, True, 4, sched_gpu.cdiv(rows, br))
            cap = options.max_reduction_block
            if cap and s.block_cols > cap:  # a test knob: force looped rows with small chunks
                s = dataclasses.replace(s, block_rows=1, block_cols=sched_gpu.pow2_floor(cap), looped=True,
                                        programs=rows)
            return s
        if info.kind == "matmul":
            lay = MatmulLayout(info)
            choice = options.matmul_loader
            tma_ok = lay.tma_operands() is not None and (choice == "tma" or (choice == "auto" and target.hopper
                                                                                 and not target.interpret))
            extra = sum(t.nbytes for t in info.inputs) - _operand_bytes(info, lay)  # epilogue reads
            form = {"auto": None, "on": True, "off": False, True: True, False: False, None: None}[
                options.matmul_persistent]
            s = sched_gpu.matmul_schedule(hint(lay.batch), hint(lay.rows), hint(lay.n), hint(lay.k), lay.dtype,
                                          target, tf32=tf32, tma_ok=tma_ok, extra_bytes=max(0, hint(extra)),
                                          persistent=form)
            if choice == "tma" and tma_ok and s.loader != "tma":
                s = dataclasses.replace(s, loader="tma")
            if options.matmul_tile:  # a test knob: force (BLOCK_M, BLOCK_N)
                bm, bn = options.matmul_tile
                s = dataclasses.replace(s, block_m=bm, block_n=bn, group_m=1, num_warps=4, num_stages=2)
            if options.matmul_tf32_round and s.input_precision == "tf32" and lay.dtype == torch.float32:
                s = dataclasses.replace(s, input_precision="tf32rn")  # (measured on the GPU, not yet default)
            if options.matmul_programs:  # a test knob: a persistent grid of this many programs
                tiles = hint(lay.batch * sched_gpu.cdiv(lay.rows, s.block_m) * sched_gpu.cdiv(lay.n, s.block_n))
                sub = options.matmul_subtile if options.matmul_subtile is not None else s.subtile
                s = dataclasses.replace(s, programs=max(1, min(options.matmul_programs, tiles)),
                                        subtile=sub if s.block_n // sub >= 16 else 1)
            return s
        a = info.anchor
        q, k, v = a.inputs[:3]
        bh = math.prod(q.type.shape[:-2])
        return sched_gpu.attention_schedule(hint(bh), hint(q.type.shape[-2]), hint(k.type.shape[-2]),
                                            q.type.shape[-1], v.type.shape[-1], q.type.dtype, target, tf32=tf32)

    # -- render / compile ---------------------------------------------------------------------
    def render(self, kernel: Kernel, schedule: Any, transposed: frozenset[int] = frozenset()) -> KernelSource:
        info = self.info(kernel, transposed)
        if info is None:
            raise Unsupported(self.reasons.get(kernel.structural_key, kernel.name))
        render = {"pointwise": render_pointwise, "reduction": render_reduction, "gather": render_gather,
                  "matmul": render_matmul}.get(info.kind, render_attention)
        if not _symbolic_body(kernel):
            return render(info, schedule)
        with formatting() as fmt:  # sizes print as expressions of the kernel's size arguments
            src = render(info, schedule)
        return dataclasses.replace(src, symbols=fmt.args())

    def compile(self, source: KernelSource, interpret: bool) -> Any:
        return loader.load_kernel(source.source, interpret)

    def kernel_for(self, kernel: Kernel, target: sched_gpu.GpuTarget, options: Options,
                   interpret: bool, transposed: frozenset[int] = frozenset()) -> tuple[KernelSource, Any]:
        info = self.info(kernel, transposed)
        assert info is not None
        schedule = self.schedule(info, target, options)
        key = (kernel.structural_key, tuple(sorted(transposed)), schedule.key(), target.key(), interpret,
               context_signature() if _symbolic_body(kernel) else "")
        hit = self._kernels.get(key)
        if hit is None:
            src = self.render(kernel, schedule, transposed)
            hit = (src, self.compile(src, interpret))
            self._kernels[key] = hit
            self.compiled += 1
        return hit

    def _fall_back(self, prog: TritonProgram, failed: dict[int, str]) -> None:
        """Kernels Triton could not compile or load run through torch (correct, slower), with a
        warning and the reason on the step."""
        for st in prog.steps:
            if st.kind == "triton" and id(st.node) in failed:
                msg = failed[id(st.node)]
                warnings.warn(f"novaforge: Triton failed to compile {msg[:500]}; this kernel runs through torch",
                              stacklevel=4)
                self.reasons[f"compile failed: {st.title}"] = msg
                st.kind, st.launch, st.node, st.source = "torch", None, None, None
                st.reason = f"compile failed: {msg}"

    def _tf32_not_k_major(self, kernel: Kernel, transposed: frozenset[int], options: Options) -> str:
        """Why a float32 matmul on TF32 runs on cuBLAS (a torch step), or "": an operand that is not
        K-major (a row-major B [K, N], a column-major A) -- wgmma reads TF32 operands from shared
        memory K-major only, and Triton's other path measured 0.25x cuBLAS on the H200 (87 against
        353 TFLOP/s at 4096^3); training's dX and dW GEMMs are all of this kind. Constant weights
        are transposed at build instead (_k_major_weight)."""
        info = self.info(kernel)
        if info is None or info.kind != "matmul" or not options.use_tf32():
            return ""
        lay = MatmulLayout(info if not transposed else self.info(kernel, transposed))
        if lay.dtype != torch.float32 or min(hint(lay.m), hint(lay.n), hint(lay.k)) < 64:
            return ""  # (small: layout costs little next to the launch)
        if lay.a_sk != 1:
            return "TF32 matmul with A not K-major: cuBLAS (wgmma reads TF32 operands K-major only)"
        if lay.b_sk != 1:
            return "TF32 matmul with B not K-major: cuBLAS (wgmma reads TF32 operands K-major only)"
        return ""

    def _k_major_weight(self, kernel: Kernel, inputs: list, consts: set, tf32: bool) -> frozenset[int]:
        """{i}: read body input i (a constant, B of a float32 matmul on TF32, stored row-major [K, N])
        from a copy transposed at build, so that B is K-major; else the empty set."""
        info = self.info(kernel)
        if info is None or info.kind != "matmul" or not tf32:
            return frozenset()
        lay = MatmulLayout(info)
        i = lay.lb.buf
        if lay.dtype != torch.float32 or i is None or i == lay.la.buf or inputs[i] not in consts:
            return frozenset()
        if lay.b_sn != 1 or lay.b_sk == 1 or inputs[i].type.rank < 2 or lay.n < 2:
            return frozenset()
        if any(v is inputs[i] for j, v in enumerate(inputs) if j != i):
            return frozenset()
        t = frozenset({i})
        alt = self.info(kernel, t)
        return t if alt is not None and MatmulLayout(alt).b_sk == 1 else frozenset()

    # -- build --------------------------------------------------------------------------------
    def build(self, graph: Graph, options: Options | dict[str, Any] | None = None) -> Any:
        """The program of an optimized graph: a TritonProgram, or for a graph with symbolic
        sizes a SizedTritonProgram (its kernels rendered once, instantiated per size by `at`)."""
        options = Options.of(options)
        chosen = self._choose_kernels(graph, options)
        if graph_symbols(graph):
            from .sized import SizedTritonProgram

            return SizedTritonProgram(self, graph, options, chosen)
        return self.program(graph, options, graph.meta.memory_plan, chosen)

    def _interpret_target(self, graph: Graph) -> tuple[bool, sched_gpu.GpuTarget]:
        interpret = _graph_device(graph) == "cpu"
        target = self.target()
        if interpret and not target.interpret:
            target = sched_gpu.interpreter_target()
        return interpret, target

    def _choose_kernels(self, graph: Graph, options: Options) -> dict[int, Any]:
        """Per kernel node (by index): its generated kernel (source, function, transposed body
        inputs), or the reason it runs through torch (a str); nodes whose outputs are all empty
        are absent (nothing to write)."""
        interpret, target = self._interpret_target(graph)
        consts = {gi.value for gi in graph.inputs if gi.kind == "const"}
        chosen: dict[int, Any] = {}
        for i, n in enumerate(graph.nodes):
            if n.op != "kernel":
                continue
            k: Kernel = n.attrs["kernel"]
            user = user_launch(k)
            if user is not None:  # a user Triton kernel: the program launches it as written
                chosen[i] = user
                continue
            library = k.kind == "matmul" and options.matmul_executor == "torch"
            transposed = self._k_major_weight(k, n.inputs, consts, options.use_tf32()) if not library else frozenset()
            slow = self._tf32_not_k_major(k, transposed, options) if not library else ""
            if slow:
                self.reasons[k.structural_key] = f"{k.name}: {slow}"
                chosen[i] = slow
                continue
            if self.info(k) is not None and not library and all(provably(lambda v=v: v.type.numel > 0)
                                                                 for v in n.outputs):
                try:
                    src, fn = self.kernel_for(k, target, options, interpret, transposed)
                except Unsupported as e:  # (found while rendering: the kernel runs through torch)
                    self.reasons[k.structural_key] = f"{k.name}: {e}"
                    chosen[i] = str(e)
                    continue
                chosen[i] = (src, fn, transposed)
            elif not all(provably(lambda v=v: v.type.numel == 0) for v in n.outputs):
                chosen[i] = "matmul_executor='torch'" if library else (self.reason(k) or "not generated")
        return chosen

    def program(self, graph: Graph, options: Options, plan: Any, chosen: dict[int, Any],
                values: dict | None = None) -> TritonProgram:
        """The runnable program of a static graph with the kernels `_choose_kernels` chose; with
        `values`, the graph is a symbolic graph specialized at these sizes and `chosen` its
        kernels for a range of sizes (launched with the sizes as arguments)."""
        device = _graph_device(graph)
        interpret, _ = self._interpret_target(graph)
        prog = TritonProgram(graph, device, cuda_graphs=options.cuda_graphs, interpret_mode=interpret)
        prog.bind_inputs()
        prog.allocate(plan, _in_place(graph, chosen) if options.inplace else {})
        dump = loader.dump_dir(options) if values is None else None
        uses_tma = False
        warm: dict[int, tuple[Any, KernelSource, list[torch.dtype]]] = {}
        for i, n in enumerate(graph.nodes):
            if n.op != "kernel":
                if not OPS[n.op].has("view"):
                    raise Unsupported(f"top-level {n.op} node: the triton backend runs kernels and views")
                out = prog.slot(n.outputs[0])
                prog.view_slots.add(out)
                prog.add_step(Step("view", n.op, [prog.slot(n.inputs[0])], [out], node=n))
                continue
            if i not in chosen:
                continue  # nothing to write: empty outputs are allocated and stay empty
            k: Kernel = n.attrs["kernel"]
            args = [prog.slot(v) for v in n.inputs]
            outs = [prog.slot(v) for v in n.outputs]
            pre = [prog.template[o] is not None or any(o == s for s, _, _ in prog.fresh) for o in outs]
            if isinstance(chosen[i], UserLaunch):
                user = chosen[i]
                prog.add_step(Step("user", user.name, args, outs, launch=user.launcher(), body=k.body,
                                   preallocated=pre, node=user.kernel, source=user))
                continue
            if isinstance(chosen[i], str):
                body = k.body if values is None else specialize(k.body, values)
                prog.add_step(Step("torch", k.name, args, outs, body=body, preallocated=pre, reason=chosen[i]))
                continue
            src, fn, transposed = chosen[i]
            if transposed:
                (t,) = transposed
                args[t] = prog.transposed_const(args[t])
            warm[id(fn)] = (fn, src, [v.type.dtype for v in n.inputs] + [v.type.dtype for v in n.outputs])
            uses_tma |= src.uses_tma
            if dump is not None:
                loader.dump_source(dump, k.name, src.source)
            prog.add_step(Step("triton", k.name, args, outs, launch=_launcher(fn, src, interpret, values), body=k.body,
                               preallocated=pre, node=fn, source=src))
        if uses_tma:
            _install_tma_allocator(device)
        if not interpret and values is None:  # (kernels for a range of sizes compile at their first launch)
            loaded: dict[int, Any] = {}
            failed, resources, note = _precompile(warm, options, loaded)
            prog.notes["precompile"] = note
            for st in prog.steps:
                if st.kind == "triton" and id(st.node) in resources:
                    st.resources = resources[id(st.node)]
                if st.kind == "triton" and id(st.node) in loaded:
                    st.launch = _direct_launcher(loaded[id(st.node)], st.launch, st.source)
            if failed:
                self._fall_back(prog, failed)
        if dump is not None:
            (dump / "program.txt").write_text(prog.describe() + "\n")
        return prog


def _in_place(graph: Graph, chosen: dict[int, Any]) -> dict[Value, Value]:
    """Mutated inputs' new values that their generated pointwise kernels or matmul epilogues write
    into the input's own buffer (output -> input; codegen/inplace_updates.py): an optimizer
    step's parameters and moments are updated in place (a weight's update is its dW GEMM's
    epilogue), with no fresh buffer and no copy at the write-back."""
    inputs = {gi.value for gi in graph.inputs if gi.kind != "const"}
    updates = pointwise_updates(graph, inputs, ("pointwise", "matmul"))
    return {o: x for i, n in enumerate(graph.nodes) if isinstance(chosen.get(i), tuple)
            for o, x in updates.get(id(n), {}).items()}


def _outer_axis_reduction(info: BodyInfo) -> bool:
    """Does every load that varies along the reduced axes have its unit stride on a kept axis (a
    column sum over tokens: bias and LayerNorm-weight gradients)? The default schedule then reads
    one output column per program at the row pitch, uncoalesced (~7x over the bandwidth bound on
    the H200); the `reduction_outer_tile` option tiles both axes instead (experimental, off)."""
    found = False
    for leaf in info.used_leaves().values():
        if leaf.kind != "load":
            continue
        strides = info.space_strides(leaf)
        if not any(strides[d] for d in info.red_axes):
            continue
        unit = [d for d, st in enumerate(strides) if st == 1]
        if not unit or any(d in info.red_axes for d in unit):
            return False
        found = True
    return found


def _reduction_schedule(rows: Any, cols: Any, live: int, widest: int,
                        target: sched_gpu.GpuTarget) -> sched_gpu.ReductionSchedule:
    """The configurator's reduction schedule; for symbolic sizes, planned at the hints, single
    pass only where one block covers the longest row the ranges allow (else looped)."""
    if not is_symbolic(cols):
        return sched_gpu.reduction_schedule(hint(rows), cols, live, widest, target)
    top = upper(cols)
    if top is not None:
        s = sched_gpu.reduction_schedule(hint(rows), top, live, widest, target)
        if not s.looped and s.block_cols <= 4 * sched_gpu.pow2_ceil(hint(cols)):
            return s  # (a single block a few times the planned row: not mostly masked lanes)
    s = sched_gpu.reduction_schedule(hint(rows), max(hint(cols), 1 << 20), live, widest, target)
    assert s.looped
    return dataclasses.replace(s, block_cols=min(s.block_cols, max(128, sched_gpu.pow2_ceil(hint(cols)))))


def _symbolic_body(kernel: Kernel) -> bool:
    """Does the kernel's body have symbolic sizes (a program for a range of sizes)?"""
    body = kernel.body
    return (any(is_symbolic(gi.value.type) for gi in body.inputs) or any(is_symbolic(v.type) for v in body.outputs)
            or any(is_symbolic(o.type) or is_symbolic(n.attrs) for n in body.nodes for o in n.outputs))


def _bytes_read(info: BodyInfo) -> int:
    total = 0
    for leaf in info.used_leaves().values():
        if leaf.kind == "load" and any(info.space_strides(leaf)):
            total += leaf.dtype.itemsize
    return max(1, total)


def _operand_bytes(info: BodyInfo, lay: MatmulLayout) -> int:
    return info.inputs[lay.la.buf].nbytes + (info.inputs[lay.lb.buf].nbytes if lay.lb.buf != lay.la.buf
                                                else 0)


def _graph_device(graph: Graph) -> str:
    devs = {gi.value.type.device for gi in graph.inputs} | {v.type.device for v in graph.outputs}
    cuda = sorted(d for d in devs if d.startswith("cuda"))
    if len(cuda) > 1:
        raise Unsupported(f"graph spans several devices: {cuda}")
    return cuda[0] if cuda else "cpu"


def _launcher(fn: Any, src: KernelSource, interpret: bool, values: dict | None = None):
    """fn launched over its grid; a kernel for a range of sizes over its grid at `values`, with
    its size arguments."""
    grid = src.grid if values is None else tuple(int(substitute(g, values)) for g in src.grid)
    sizes = tuple(int(values[symbol(int(a[len(SYMBOL_PREFIX):]))]) for a in src.symbols) if src.symbols else ()
    launch = fn[grid]
    opts = {"num_warps": src.num_warps, "num_stages": src.num_stages}
    if interpret:
        return lambda *args: launch(*args, *sizes, UPCAST=True)
    return lambda *args: launch(*args, *sizes, UPCAST=False, **opts)


def _direct_launcher(compiled: Any, jit_launch: Callable[..., Any], src: KernelSource) -> Callable[..., Any]:
    """A precompiled kernel launched through its binary's launcher (`CompiledKernel[grid]`, what
    `JITFunction.run` ends in), without the JIT's per-call argument binding, specialization key
    and cache lookup (~20-30 us a launch: most of a training step's host time at ~600 kernels).
    `_precompile` compiled it for 16-byte-aligned pointers (Triton's default specialization of
    a warmup); a call with any other tensor goes through `jit_launch`, which specializes anew."""
    grid = tuple(src.grid) + (1,) * (3 - len(src.grid))
    run = compiled[grid]

    def launch(*args: Any) -> None:
        for a in args:
            if a.data_ptr() % 16:
                return jit_launch(*args)
        run(*args, False)  # (UPCAST, the last parameter: a constexpr the launcher skips)
        return None

    return launch


def _precompile(kernels: dict[int, tuple[Any, KernelSource, list[torch.dtype]]],
                options: Options | dict[str, Any], loaded: dict[int, Any] | None = None,
                ) -> tuple[dict[int, str], dict[int, dict[str, Any]], dict[str, Any]]:
    """Compile every new kernel of the program now, in parallel threads (Triton's compiler
    releases the GIL in its passes and runs ptxas as a subprocess), then load each binary
    (`CompiledKernel._init_handles`, what the first launch would do: it raises OutOfResources when
    the kernel needs more shared memory or threads than the device has). The first call then only
    launches. Returns ({id(fn): error} for kernels that failed to compile or load, {id(fn):
    resources} for loaded ones, a note of what ran). If this Triton lacks the hook (or it
    misbehaves), kernels compile lazily at their first launch instead."""
    failed: dict[int, str] = {}
    resources: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    options = Options.of(options)
    workers = options.compile_threads or min(16, os.cpu_count() or 4)
    if not options.parallel_compile:
        workers = 1
    note: dict[str, Any] = {"ran": False, "kernels": len(kernels), "threads": workers}
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode

        futures = {}
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, AsyncCompileMode(pool, ignore_errors=True):
            for key, (fn, src, dtypes) in kernels.items():
                futures[key] = (fn.warmup(*dtypes, grid=src.grid, UPCAST=False, num_warps=src.num_warps,
                                          num_stages=src.num_stages), src)
    except Exception as e:  # the private hook changed: compile at first launch
        warnings.warn(f"novaforge: parallel Triton compile unavailable ({type(e).__name__}: {e})", stacklevel=3)
        note["error"] = f"{type(e).__name__}: {e}"
        return {}, {}, note
    for key, (fut, src) in futures.items():
        compiled, error = _compiled_of(fut)
        if error is None:
            res, error = kernel_resources(compiled)
            resources[key] = res
            if error is None and loaded is not None:
                loaded[key] = compiled
        if error is not None:
            failed[key] = f"{src.title}: {error}"
    note.update(ran=True, failed=len(failed), seconds=round(time.perf_counter() - t0, 3))
    return failed, resources, note


def _compiled_of(fut: Any) -> tuple[Any, str | None]:
    """The CompiledKernel behind what `warmup` returned (a FutureKernel under AsyncCompileMode),
    or the compile error."""
    inner = getattr(fut, "future", None)
    if inner is None:  # compiled synchronously
        return fut, None
    if getattr(fut, "kernel", None) is None:
        exc = inner.exception() if inner.done() else None
        if exc is not None:
            return None, f"{type(exc).__name__}: {exc}"
        try:
            return fut.result(), None
        except Exception as e:
            return None, f"{type(e).__name__}: {e}"
    return fut.kernel, None


def kernel_resources(compiled: Any) -> tuple[dict[str, Any], str | None]:
    """Load a compiled kernel's binary on the current device (as its first launch would) and read
    its resources: shared memory bytes (metadata.shared), registers per thread and spills. Returns
    (resources, None) or (what is known, the error: OutOfResources, a driver error)."""
    error = None
    try:
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    md = getattr(compiled, "metadata", None)
    res = {"shared": getattr(md, "shared", None), "n_regs": getattr(compiled, "n_regs", None),
           "n_spills": getattr(compiled, "n_spills", None)}
    return res, error


_allocator_installed = False


def _install_tma_allocator(device: str) -> None:
    """Device-side tensor descriptors need scratch memory from Triton's allocator hook."""
    global _allocator_installed
    if _allocator_installed:
        return
    import triton

    def alloc(size: int, alignment: int, stream: Any) -> torch.Tensor:
        dev = device if device != "cpu" else "cpu"
        return torch.empty(size, dtype=torch.int8, device=dev)

    triton.set_allocator(alloc)
    _allocator_installed = True

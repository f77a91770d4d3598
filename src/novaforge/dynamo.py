"""`torch.compile(model, backend="novaforge")`: the Dynamo backend (the package's entry point
`torch_dynamo_backends: novaforge = novaforge.dynamo:novaforge_backend`).

It sits in the entry layer beside `novaforge.compile` (api.py) because it calls both capture's
lowering (frontend/) and a backend (codegen/, chosen by `compile_stats.resolve_backend`);
capture itself knows no backend (tests/test_import_layers.py).

Dynamo hands us one FX graph per graph-break-free region; AOTAutograd functionalizes it to
ATen (forward, and for training a backward graph too) and calls the compiler on each. Every
ATen graph is lowered to the IR, optimized by the same pass pipeline and built by the same
backends as `novaforge.compile`. AOTAutograd owns the calling convention around our graph:
it applies input mutations (returned by the graph as extra outputs), regenerates outputs that
alias inputs or other outputs, and unwraps subclasses, so the graph we see is functional and
returns plain tensors and, in dynamic graphs, SymInts.

What the compiler sees and how it is handled:

* Example inputs are fake tensors and SymInts, and the compiler is called while Dynamo's fake
  mode is active. All our compile work (constant folding, lowering constants) happens with
  that mode switched off, so `get_attr` / lifted constants stay real tensors bound at run time.
* A graph with static example inputs compiles at once, unless it is a recompile of a frame
  (its sizes or other guards changed: Dynamo's automatic dynamic usually follows with one graph
  for every size, as `generate()`'s first decode step shows): that one runs as its ATen graph
  until its calls have cost one build (`runtime/tiering.py`). A graph Dynamo made dynamic (SymInt
  inputs or symbolic sizes) is lowered once with symbolic sizes and, on a backend that builds
  programs for a range of sizes (the CPU backend), built once at its first call: every size
  the symbol table admits then runs that program (`CpuProgram.at`, no build per size). Where
  that build fails, or on a backend that specializes on shapes, the lowering is specialized
  per concrete input signature (tensor shapes, dtypes and the integer arguments); a new
  signature then runs as Dynamo's ATen graph (eager) until its calls have cost one build
  (`runtime/tiering.py`; `options={"tiered": False}` builds at once).
* Outputs that are not tensors computed by the graph (constants, SymInts that become Python
  numbers after specialization) are re-inserted at run time; an opaque input returned as it came
  (a tensor-parallel forward saves its DTensor's mesh / process-group object for the backward)
  is the call's own argument (`InputPassthrough`). Functional collectives (`_c10d_functional`,
  from DTensor or FSDP2) are extern calls into torch, completed as they are called
  (ir/extern.py; novaforge/distributed.py).
* Anything novaforge cannot compile (an unsupported op or dtype, a data-dependent shape, a
  lowering failure) never crashes the user's run: the graph runs as the ATen graph Dynamo
  gave (eager semantics), and the fallback is logged with the op and the reason and recorded
  in `FALLBACKS` (tests assert on it). `options={"fallback": "raise"}` raises instead.

Invariant: the callable returned for an ATen graph computes exactly what the graph computes
(outputs in the graph's order), for every input signature it is called with.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from . import logs
from .frontend.dynamo_io import (
    InputPassthrough,
    constant_output,
    is_opaque_input,
    is_tensor_node,
    sized_arguments,
    symbolic_output,
)
from .frontend.static_parts import time_in_parts
from .gc_pause import paused_gc
from .ir.symbolic import Sym, SymbolicDecision
from .options import Options
from .runtime.tiering import Tiering, build_estimate, record_build

log = logs.get_logger("dynamo")

# Decompositions applied while AOTAutograd traces: torch's core-ATen table, minus the ops we
# lower better ourselves (attention stays one op).
_KEEP = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu")


@dataclass(frozen=True)
class Fallback:
    """One ATen graph (or one of its input signatures) that runs uncompiled, and why."""

    graph: str  # the graph's first ATen ops, to recognise it
    reason: str  # the exception: it names the op and the user's source line


FALLBACKS: list[Fallback] = []  # every fallback of this process, in order
PROGRAMS_BUILT = [0]  # novaforge programs built by this backend in this process (tests read it)
SYMBOLIC_LOWERINGS = [0]  # dynamic graphs lowered once with symbolic sizes
STATIC_RETRACES = [0]  # programs of dynamic graphs built from a static re-trace instead
TIERED_EAGER_CALLS = [0]  # calls of dynamic graphs run eagerly while their signature had no program yet
STATIC_PARTS = [0]  # static parts of dynamic graphs compiled for their eager tier (frontend/static_parts.py)
SHARED_PROGRAMS = [0]  # dynamic graphs built once for all their sizes (one program for a range)
SHARED_INSTANCES_MADE = [0]  # sizes a shared program was instantiated at (CpuProgram.at: no build)
SHARED_INSTANCES = 8  # sizes of one shared program kept instantiated (a large arena is the process's shared one)
_FALLBACK_LOCK = threading.Lock()
FALLBACK_MODES = ("eager", "raise")


def _decompositions() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in list(table):
        name = getattr(op, "__name__", str(op))
        if any(k in str(name) for k in _KEEP):
            del table[op]
    return table


def _is_recompile() -> bool:
    """Is Dynamo compiling a frame it compiled before (a guard failed: new sizes, dtypes, ...)?"""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return cid is not None and (getattr(cid, "frame_compile_id", 0) or 0) > 0
    except Exception:  # noqa: BLE001 - (an older or newer torch without it: build at once, as before)
        return False


def _is_static(inputs: Sequence[Any]) -> bool:
    for x in inputs:
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return False
        if isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape):
            return False
    return True


def _signature(args: Sequence[Any]) -> tuple:
    """What a compiled program of this graph specializes on: tensor shapes, dtypes, devices,
    and the values of non-tensor arguments (SymInts at trace time, ints at run time)."""
    # (torch.Size and torch.device hash and compare as the tuples they stand for: no copies made)
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a).__name__, a) for a in args)


def _describe_graph(gm: torch.fx.GraphModule) -> str:
    ops = [str(n.target).replace("aten.", "") for n in gm.graph.nodes if n.op == "call_function"]
    head = ", ".join(ops[:4])
    return f"{len(ops)} ops: {head}{', ...' if len(ops) > 4 else ''}"


def _no_fake_mode():
    """Switch Dynamo's active fake mode off: our compile work uses real constants."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


class _AtenGraphProgram:
    """A compiled ATen graph: one novaforge program per concrete input signature, or the graph
    itself (eager) where novaforge cannot compile it."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | Options,
                 part: bool = False, donated: Sequence[int] = ()) -> None:
        from .frontend.rng_hops import unwrap_rng_free

        unwrap_rng_free(gm)  # activation checkpointing's RNG wrappers around ops that draw no random numbers
        self.gm = gm
        self.part = part  # a static part of a dynamic graph (counted in STATIC_PARTS, not PROGRAMS_BUILT)
        # placeholders (a backward's saved activations) whose buffers the program may overwrite
        # after their last read; a backward that keeps its graph (retain_graph) passes copies
        self.donated = sorted(donated)
        self.options = Options.of(options)
        self.fallback_mode = self.options.fallback
        if self.fallback_mode not in FALLBACK_MODES:
            raise ValueError(f"option fallback must be one of {FALLBACK_MODES}, got {self.fallback_mode!r}")
        self.programs: dict[tuple, Any] = {}
        self.symbolic: Any = None  # the graph lowered once with symbolic sizes (dynamic graphs), or why not
        self._sized_args: list | None = None  # the arguments that carry its sizes (`_sized_arguments`)
        self.shared: Any = None if self.options.symbolic_programs else False  # one program for every size
        self.instances: OrderedDict[tuple, _Runner] = OrderedDict()  # the last sizes made of the shared program
        self.parts: Any = None  # dynamic graphs: the graph with its static parts compiled, or False (none)
        self.stats: list[Any] = []
        self.fallbacks: list[Fallback] = []
        self._lock = threading.Lock()
        static = _is_static(example_inputs)
        # a static recompile of a frame (its sizes changed; Dynamo's automatic dynamic usually
        # follows with a graph for every size, as generate's first decode step shows) builds
        # once its eager calls cost one build, like a new size of a dynamic graph
        self.deferred = static and not part and self.options.tiered and _is_recompile()
        self.tiering = Tiering(self.options.tiered and (not static or self.deferred))
        log.info("graph received (%s), %s inputs%s", _describe_graph(gm), len(example_inputs),
                 "" if not static else ", a recompile: built once its calls cost one build" if self.deferred
                 else "")
        if self.deferred:
            self.shared = self.parts = False  # (no symbolic lowering, no static parts: eager until built)
        elif static:
            self.programs[_signature(example_inputs)] = self._build_or_fallback(gm)

    def _build_or_fallback(self, gm: torch.fx.GraphModule) -> Any:
        try:
            with _no_fake_mode(), paused_gc():
                return self._build(gm)
        except Exception as e:
            if self.fallback_mode == "raise":
                raise
            return self._fallback(e)

    def _fallback(self, e: BaseException) -> Any:
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        fb = Fallback(_describe_graph(self.gm), reason)
        with _FALLBACK_LOCK:
            FALLBACKS.append(fb)
        self.fallbacks.append(fb)
        log.warning("novaforge: running a graph uncompiled (%s): %s", fb.graph, reason)
        return _EagerRunner(self.gm)

    def _lower(self, gm: torch.fx.GraphModule, symbolic: bool = False):
        """(IR graph, lowering context, placeholder specs, output args, constant outputs); with
        `symbolic`, the graph keeps Dynamo's symbolic sizes (constant outputs are IR dims)."""
        from .frontend.dynamic import SymbolConverter
        from .frontend.lower import InputSpec, lower_fx
        from .ir.ops.random import random_mode

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        specs = [InputSpec("user" if isinstance(n.meta.get("val"), torch.Tensor) else "skip", n.name)
                 for n in placeholders]
        out_args = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        tensor_outs = [a for a in out_args if is_tensor_node(a)]
        conv = SymbolConverter() if symbolic else None
        position = {n: i for i, n in enumerate(placeholders)}
        with conv if conv is not None else contextlib.nullcontext(), random_mode(self.options.random):
            constants = {i: (InputPassthrough(position[a]) if is_opaque_input(a)
                             else symbolic_output(a, conv) if conv is not None else constant_output(a))
                         for i, a in enumerate(out_args) if not is_tensor_node(a)}
            graph, ctx = lower_fx(gm, specs, output_nodes=tensor_outs)
        aten = sum(1 for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))
        graph.meta["aten_ops"] = aten
        if self.donated:
            graph.meta.donated = frozenset(placeholders[i].name for i in self.donated)
        sizes = [conv.dim(n.meta["val"]) if conv is not None and isinstance(n.meta.get("val"), torch.SymInt) else None
                 for n in placeholders]
        return graph, ctx, specs, out_args, constants, (conv.finish() if conv is not None else None), sizes

    def _build(self, gm: torch.fx.GraphModule, lowered: Any = None):
        from .codegen.registry import get_backend
        from .compile_stats import CompileStats, resolve_backend
        from .frontend.capture import Captured
        from .passes.pipeline import run_pipeline

        graph, ctx, specs, out_args, constants, _, _ = lowered if lowered is not None else self._lower(gm)
        aten = graph.meta["aten_ops"]
        backend = resolve_backend(self.options.backend, graph)
        be = get_backend(backend)
        opts = self.options.replace(backend=backend)
        t0 = time.perf_counter()
        optimized, records = run_pipeline(graph, options=opts, target=be.target(), backend=be)
        program = be.build(optimized, opts)
        if not self.part:  # (a part's build says little about a whole graph's: not in the estimate)
            record_build(time.perf_counter() - t0)
            with _FALLBACK_LOCK:
                PROGRAMS_BUILT[0] += 1
        captured = Captured(graph, None, [], aten, ctx.externs)
        self.stats.append(CompileStats(captured, optimized, records, {}, backend, program))
        tensor_pos = [i for i, s in enumerate(specs) if s.kind == "user"]
        return _Runner(program, optimized, constants, len(out_args), tensor_pos)

    def __call__(self, *args: Any) -> list[Any]:
        if self.donated and torch._C._autograd._get_current_graph_task_keep_graph():
            args = _copies_of(args, self.donated)  # (the saved tensors serve another backward)
        key = _signature(args)
        runner = self.programs.get(key)
        if runner is None and self.shared is not False:
            runner = self._shared_runner(args, key)
        if runner is None:
            if not self.tiering.should_build(key):
                if key not in self.tiering.rent:
                    log.info("dynamic graph (%s): a new signature runs as its ATen graph until its calls cost one "
                             "build (%.2f s)", _describe_graph(self.gm), build_estimate())
                tier = self._eager_tier()  # not worth a build yet: Dynamo's ATen graph, eagerly
                t0, in_parts = time.perf_counter(), time_in_parts()
                out = list(tier(*args))
                # the rent is what a program could save: the time outside the compiled static parts
                self.tiering.charge(key, time.perf_counter() - t0 - (time_in_parts() - in_parts))
                with _FALLBACK_LOCK:
                    TIERED_EAGER_CALLS[0] += 1
                return out
            with self._lock:  # concurrent first calls of one signature compile it once
                runner = self.programs.get(key)
                if runner is None:
                    runner = self._build_or_fallback(self.gm) if self.deferred else self._specialize(args)
                    self.tiering.built(key)
                    self.programs[key] = runner
        return runner(args)

    def _eager_tier(self) -> torch.fx.GraphModule:
        """What a signature without a program runs: the ATen graph with its static parts compiled
        once (the same programs for every size), or the ATen graph itself."""
        if self.parts is None:
            with self._lock:
                if self.parts is None:
                    self.parts = self._split_static_parts()
        return self.parts or self.gm

    def _split_static_parts(self) -> Any:
        from .frontend.static_parts import split, structure_key

        if not self.options.static_parts:
            return False

        shared: dict[str, _AtenGraphProgram] = {}  # equal parts (a model's layers) share one program

        def build_part(part: torch.fx.GraphModule, examples: list[Any]) -> Any:
            key = structure_key(part)
            program = shared.get(key)
            if program is None:
                program = shared[key] = _AtenGraphProgram(part, examples, self.options, part=True)
            (runner,) = program.programs.values()  # a part is static: its one program, called directly
            return runner

        try:
            result = split(self.gm, build_part)
        except Exception as e:  # noqa: BLE001 - the whole graph then runs eagerly, as before
            if self.fallback_mode == "raise":
                raise
            log.info("dynamic graph (%s): no static parts (%s: %s)", _describe_graph(self.gm), type(e).__name__, e)
            return False
        if result is None:
            return False
        split_gm, count = result
        with _FALLBACK_LOCK:
            STATIC_PARTS[0] += count
        log.info("dynamic graph (%s): %d static parts (%d programs) compiled once for every size; the rest runs "
                 "as ATen ops", _describe_graph(self.gm), count, len(shared))
        return split_gm

    def _specialize(self, args: Sequence[Any]) -> Any:
        """A program for the concrete signature of `args`: the graph lowered once with symbolic
        sizes, specialized to these sizes; where that is not possible, re-traced statically."""
        from torch.fx.experimental.proxy_tensor import make_fx

        lowered = self._specialized_lowering(args)
        if lowered is not None:
            try:
                with _no_fake_mode():
                    return self._build(self.gm, lowered)
            except Exception as e:
                if self.fallback_mode == "raise":
                    raise
                return self._fallback(e)
        with _FALLBACK_LOCK:
            STATIC_RETRACES[0] += 1
        try:
            with _no_fake_mode():
                static = make_fx(self.gm, tracing_mode="fake")(*args)
        except Exception as e:
            if self.fallback_mode == "raise":
                raise
            return self._fallback(e)
        return self._build_or_fallback(static)


    def _shared_runner(self, args: Sequence[Any], key: tuple) -> _Runner | None:
        """The shared program (built for the graph's symbolic sizes, once) at the sizes of
        `args` (signature `key`), or None: no shared program (it could not be built: logged
        once), or sizes its symbol table does not admit. Runners of the last sizes made are kept."""
        runner = self.instances.get(key)  # (the oldest size made is dropped first)
        if runner is not None:
            return runner
        with self._lock:
            if self.shared is None:
                self.shared = self._build_shared()
            if self.shared is False:
                return None
            lowered = self._symbol_values(args)
            if lowered is None:
                return None
            values, consts = lowered
            program, graph, specs, n_out = self.shared
            tensor_pos = [i for i, s in enumerate(specs) if s.kind == "user"]
            # (a graph whose sizes all dropped out, e.g. an integer argument it never reads, built a
            # static program: the same one serves every size)
            try:
                sized = program.at(values) if getattr(program, "symbolic", None) is not None else program
            except SymbolicDecision as e:  # a size it cannot evaluate: compiled per size from now on
                if self.fallback_mode == "raise":
                    raise
                log.info("dynamic graph (%s): the program for all sizes cannot be placed at %s (%s); compiled "
                         "per size", _describe_graph(self.gm), values, e)
                self.shared = False
                return None
            runner = _Runner(sized, graph, consts, n_out, tensor_pos, values)
            self.instances[key] = runner
            while len(self.instances) > SHARED_INSTANCES:
                self.instances.popitem(last=False)
            with _FALLBACK_LOCK:
                SHARED_INSTANCES_MADE[0] += 1
        return runner

    def _build_shared(self) -> Any:
        """(program, symbolic graph, input specs, number of outputs) for every size the symbolic
        lowering admits, or False (logged: the graph is then compiled per size, as before)."""
        from .codegen.registry import get_backend
        from .compile_stats import CompileStats, resolve_backend
        from .frontend.capture import Captured
        from .passes.pipeline import run_pipeline

        if self.symbolic is None:
            self._lower_symbolic()
        if isinstance(self.symbolic, str):
            return False
        graph, ctx, specs, out_args, _, table, _ = self.symbolic
        backend = resolve_backend(self.options.backend, graph)
        be = get_backend(backend)
        if not getattr(be, "symbolic_programs", False):
            log.info("dynamic graph: the %s backend builds per size", backend)
            return False
        opts = self.options.replace(backend=backend)
        t0 = time.perf_counter()
        try:
            with _no_fake_mode(), table.ranges_context():
                optimized, records = run_pipeline(graph, options=opts, target=be.target(), backend=be)
                program = be.build(optimized, opts)
        except Exception as e:  # noqa: BLE001 - per-size programs then (the graph may still compile statically)
            if self.fallback_mode == "raise":
                raise
            log.info("dynamic graph (%s): no program for all sizes (%s: %s); compiled per size",
                     _describe_graph(self.gm), type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            return False
        record_build(time.perf_counter() - t0)
        with _FALLBACK_LOCK:
            PROGRAMS_BUILT[0] += 1
            SHARED_PROGRAMS[0] += 1
        captured = Captured(graph, None, [], graph.meta["aten_ops"], ctx.externs)
        self.stats.append(CompileStats(captured, optimized, records, {}, backend, program))
        log.info("dynamic graph (%s): one program for %s (%.2f s)", _describe_graph(self.gm), table.describe(),
                 time.perf_counter() - t0)
        return program, graph, specs, len(out_args)

    def _lower_symbolic(self) -> None:
        try:
            with _no_fake_mode():
                self.symbolic = self._lower(self.gm, symbolic=True)
            with _FALLBACK_LOCK:
                SYMBOLIC_LOWERINGS[0] += 1
            log.info("dynamic graph lowered once with %s", self.symbolic[5].describe())
        except Exception as e:  # noqa: BLE001 - the static re-trace handles (and reports) it
            self.symbolic = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            log.info("dynamic graph re-traced per signature (no symbolic lowering: %s)", self.symbolic[:900])

    def _symbol_values(self, args: Sequence[Any]) -> tuple[dict, dict] | None:
        """(symbol values, constant outputs) of a call of the symbolic lowering, or None when
        its sizes do not fit the lowering's table."""
        from .ir.symbolic import bind_symbols

        graph, _, specs, _, constants, table, sizes = self.symbolic
        if self._sized_args is None:
            self._sized_args = sized_arguments(graph, specs, sizes)
        pattern = []
        for i, rank, dims in self._sized_args:
            a = args[i]
            if rank is None:
                pattern.append((dims, int(a)))
                continue
            if not isinstance(a, torch.Tensor) or a.dim() != rank:
                return None
            shape = a.shape
            pattern.extend((d, shape[k]) for k, d in dims)
        values = bind_symbols(pattern)
        if isinstance(values, str) or table.admits(values) is not None:
            return None
        return values, {i: (c.subs(values) if isinstance(c, Sym) else c) for i, c in constants.items()}

    def _specialized_lowering(self, args: Sequence[Any]) -> Any:
        """The symbolic lowering specialized at the sizes of `args`, or None (logged once: the
        graph could not be lowered symbolically; or these sizes fall outside its table)."""
        from .frontend.dynamic import specialize

        if self.symbolic is None:
            self._lower_symbolic()
        if isinstance(self.symbolic, str):
            return None
        bound = self._symbol_values(args)
        if bound is None:
            return None
        values, consts = bound
        graph, ctx, specs, out_args, _, _, sizes = self.symbolic
        return specialize(graph, values), ctx, specs, out_args, consts, None, sizes


class _Runner:
    """Runs one program (static, or a shared program at one call's sizes: `values`); re-inserts
    outputs that tracing turned into constants."""

    def __init__(self, program: Any, graph: Any, constants: dict[int, Any], n_out: int,
                 tensor_pos: list[int], values: dict | None = None) -> None:
        self.program = program
        self.graph = graph  # (symbolic with `values`: the lowered graph, specialized where interpreted)
        self.constants = constants
        self.n_out = n_out
        self.tensor_pos = tensor_pos
        self.values = values

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        from .runtime.interpret import interpret

        tensors = [args[i] for i in self.tensor_pos]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            from .ir.specialize import specialize

            outs = interpret(specialize(self.graph, self.values) if self.values else self.graph, tensors)
        else:
            outs = self.program.run(tensors)
            if getattr(self.program, "outputs_fresh", False):
                tensors = []
        if tensors:  # results must be fresh: AOTAutograd rebuilds the aliases eager has
            from .runtime.state import fresh_outputs

            owned = [gi.tensor for gi in self.graph.inputs if gi.kind == "const" and gi.tensor is not None]
            outs = fresh_outputs(outs, tensors, [], owned)
        if not self.constants:
            return outs
        it = iter(outs)
        return [(args[c.index] if isinstance(c := self.constants[i], InputPassthrough) else c)
                if i in self.constants else next(it) for i in range(self.n_out)]


class _EagerRunner:
    """The ATen graph itself, run op by op by torch: eager semantics for what we cannot compile."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        return list(self.gm(*args))


def _copies_of(args: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    out = list(args)
    for i in positions:
        if i < len(out) and isinstance(out[i], torch.Tensor):
            out[i] = out[i].clone()
    return out


def _compile_id() -> str:
    """Dynamo's id of the frame being compiled ("[0/0] "), or ""."""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return f"[{cid}] " if cid is not None else ""
    except Exception:  # noqa: BLE001 - (a torch without it)
        return ""


def _take_donated() -> list[int]:
    """The backward's placeholders that AOTAutograd found donated (saved activations that alias
    no input, user output or gradient: `collect_bw_donated_buffer_idxs`), read from the tracing
    context; its own list is then emptied, so that a later `backward(retain_graph=True)` is not
    refused: this program copies those inputs itself whenever the graph is kept."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    idxs = list(getattr(meta, "bw_donated_idxs", None) or [])
    if meta is not None and idxs:
        meta.bw_donated_idxs = []
    return idxs


class DoubleBackwardError(RuntimeError):
    """A backward with `create_graph=True` (double backward: a gradient penalty, a Hessian-vector
    product) through a graph novaforge compiled: its backward program is not differentiable."""


def _in_double_backward() -> bool:
    """Is this backward program called by AOTAutograd's double-backward wrapper, i.e. inside a
    backward run with `create_graph=True`? (AOTAutograd would compute the first gradients and
    fail at the second backward with an internal message.) Read from the caller frames: the
    wrapper's `_double_backward` is a few frames up; a torch that names it otherwise gets
    AOTAutograd's own error, still an error."""
    import sys

    frame, depth = sys._getframe(1), 0
    while frame is not None and depth < 16:
        if frame.f_code.co_name == "_double_backward" and "aot_autograd" in frame.f_code.co_filename:
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def _double_backward_error(name: str) -> DoubleBackwardError:
    return DoubleBackwardError(
        f"novaforge: double backward (a backward with create_graph=True, as torch.autograd.grad(..., "
        f"create_graph=True) for a gradient penalty or loss.backward(create_graph=True)) through {name} is not "
        "supported: its compiled backward program is not differentiable. Run the part that needs second-order "
        "gradients uncompiled (call the original module, or wrap it in torch.compiler.disable)")


def _compile_aten(options: dict[str, Any], programs: list | None = None, backward: bool = False,
                  name: str | None = None):
    """An AOTAutograd graph compiler; each compiled graph's _AtenGraphProgram is appended to
    `programs` when given (forward first, then backward). `backward`: the backward compiler,
    which may overwrite the donated saved activations (`_take_donated`); its program raises
    DoubleBackwardError, naming `name` (or the graph), in a backward with create_graph=True."""
    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        from torch._functorch.aot_autograd import make_boxed_func

        logs.configure()  # NOVAFORGE_LOGS applies to the Dynamo entry point too
        donated = _take_donated() if backward and Options.of(options).inplace else []
        program = _AtenGraphProgram(gm, example_inputs, options, donated=donated)
        if programs is not None:
            programs.append(program)
        what = name or f"the graph compiled by torch.compile(backend='novaforge') ({_compile_id()}backward: " \
                       f"{_describe_graph(gm)})"

        def run(*args: Any):
            if backward and _in_double_backward():
                raise _double_backward_error(what)
            return program(*args)

        run.novaforge = program  # type: ignore[attr-defined]
        return make_boxed_func(run)

    return compiler


def partition_for(options: Mapping[str, Any]) -> dict[str, Any]:
    """AOTAutograd's partition_fn for `memory_budget` (as keyword arguments): always its min-cut
    partitioner (as Inductor), which saves the cheapest cut between forward and backward and
    lets the backward recompute fusible pointwise values (a bf16 GPT-42M step at 16 x 1024
    saves the bf16 logits, 1 GiB, instead of two float32 [T, vocab] values, 4 GiB); below 1.0
    with `activation_memory_budget` set to the budget (the backward then recomputes more forward
    values, cheapest first, until what the forward saves fits)."""
    budget = Options.of(options).memory_budget  # (validated there)
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition(joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any):
        with functorch_config.patch(activation_memory_budget=float(budget)):
            return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)

    return {"partition_fn": partition}


def output_dependencies(gm: torch.fx.GraphModule, outputs: slice | None = None) -> list[int]:
    """Per output of `gm` (the `outputs` slice of them), the placeholders it depends on, as a bit
    mask over placeholder positions (data flow: a superset of what autograd reaches)."""
    deps: dict[torch.fx.Node, int] = {}
    position = 0
    out_args: list[Any] = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            deps[n] = 1 << position
            position += 1
        elif n.op == "output":
            out_args = list(torch.fx.node.map_arg(n.args[0], lambda a: a) if isinstance(n.args[0], tuple | list)
                            else [n.args[0]])
        else:
            mask = 0
            for a in n.all_input_nodes:
                mask |= deps.get(a, 0)
            deps[n] = mask
    out_args = out_args[outputs] if outputs is not None else out_args
    return [deps.get(a, 0) if isinstance(a, torch.fx.Node) else 0 for a in out_args]


class UnreachedGrads:
    """Keeps `.grad` None, as eager does, for a parameter that only outputs left out of the loss
    depend on: autograd hands an autograd.Function zeros for its unused outputs (materialized
    tangents), so AOTAutograd's backward returned a zero gradient for such a parameter (and
    AdamW then decayed it). `deps`: per flat output, the mask of inputs it depends on; each call's
    compiled node gets a post hook that drops the gradients of the parameters whose outputs all
    got no gradient. Parameters every differentiable output depends on (most models: one loss)
    cost nothing."""

    def __init__(self, deps: list[int], inputs: Sequence[Any]) -> None:
        self.risk: list[tuple[int, list[int]]] = []  # (input position, the outputs depending on it)
        for j, x in enumerate(inputs):
            if not (isinstance(x, torch.nn.Parameter) and x.requires_grad):
                continue
            outs = [i for i, mask in enumerate(deps) if mask >> j & 1]
            if outs and len(outs) < len(deps):
                self.risk.append((j, outs))

    def params(self, inputs: Sequence[Any]) -> list[Any]:
        """The call's parameters at the risky positions (read before a boxed call clears its inputs)."""
        return [inputs[j] if j < len(inputs) else None for j, _ in self.risk]

    def install(self, outs: Sequence[Any], params: Sequence[Any]) -> None:
        """Hooks this call's compiled node; `params`: `self.params(inputs)`."""
        if not self.risk:
            return
        node = None
        for o in outs:
            if isinstance(o, torch.Tensor) and o.grad_fn is not None and "CompiledFunction" in o.grad_fn.name():
                node = o.grad_fn
                break
        if node is None:
            return
        watch: dict[int, list[int]] = {}  # id(parameter) -> output_nr of the outputs depending on it
        for (_, deps), param in zip(self.risk, params, strict=True):
            nrs = []
            for i in deps:
                o = outs[i] if i < len(outs) else None
                if not isinstance(o, torch.Tensor) or not o.requires_grad:
                    continue
                if o.grad_fn is not node:  # (an alias AOTAutograd regenerated: unknown, so kept)
                    break
                nrs.append(o.output_nr)
            else:
                if param is not None:
                    watch[id(param)] = nrs
        if not watch:
            return

        def drop_unreached(grad_inputs: tuple, grad_outputs: tuple) -> tuple | None:
            drop = {key for key, nrs in watch.items() if all(grad_outputs[n] is None for n in nrs)}
            if not drop:
                return None
            new = list(grad_inputs)
            for k, (fn, _) in enumerate(node.next_functions):
                if id(getattr(fn, "variable", None)) in drop:
                    new[k] = None
            return tuple(new)

        node.register_hook(drop_unreached)


def novaforge_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any):
    """The function registered as Dynamo backend 'novaforge' (entry point torch_dynamo_backends)."""
    from torch._dynamo.backends.common import aot_autograd

    opts = dict(options.get("options") or {})
    compiled = aot_autograd(fw_compiler=_compile_aten(opts), bw_compiler=_compile_aten(opts, backward=True),
                            decompositions=_decompositions(), **partition_for(opts))(gm, example_inputs)
    n_in = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if len(example_inputs) != n_in:
        return compiled
    unreached = UnreachedGrads(output_dependencies(gm), example_inputs)
    if not unreached.risk:
        return compiled

    def call(*args: Any) -> Any:  # (a boxed call passes one list of inputs, which it clears)
        boxed = len(args) == 1 and isinstance(args[0], list)
        params = unreached.params(args[0] if boxed else args)
        outs = compiled(*args)
        if torch.is_grad_enabled():
            unreached.install(list(outs) if isinstance(outs, list | tuple) else [outs], params)
        return outs

    call.__dict__.update(compiled.__dict__)  # (its calling convention, as Dynamo reads it)
    return call

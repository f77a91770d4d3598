"""The CPU backend: planned graph -> one shared library + a CpuProgram.

`build(graph, options)`:

1. plans every kernel (`kernels.plan_kernel`, memoized by structural key: the identical
   layers of a model are planned, rendered and compiled once);
2. assigns a slot to every buffer (constants, inputs, arena offsets from the memory plan,
   fresh outputs, one shared scratch region for library results that need one);
3. lays out the steps: runs of consecutive generated kernels become one C entry point
   `nf_seg_<i>(void** slots, const int64_t* sizes)` (one ctypes call per run), library and torch steps sit between;
4. keys the library by sha256(version, backend hash, target, compiler and flags, the unique
   kernels' structural keys + schedules, the glue) and loads it from the cache or renders
   and compiles it (split into translation units compiled in parallel);
5. returns a `CpuProgram`.

Invariant: the program computes what `interpret(graph)` computes; every kernel the backend
does not generate runs through torch (and is reported as such by `executor_for`).
"""

from __future__ import annotations

import ctypes
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from ... import logs
from ...cache.store import cache_key, library_cache
from ...ir import OPS, Graph, Kernel, Value
from ...ir.symbolic import SymbolicDecision, context_signature, graph_symbols, hint, is_symbolic
from ...ir.types import TensorType
from ...options import Options
from ...runtime import check_numerics
from ...runtime.cpu_program import CpuProgram, OutputSpec, SlotSpec, StepSpec
from ...runtime.state import version_of
from ...runtime.symbolic_layout import SymbolicLayout
from ...schedule.cpu import gemm_predicted_ns, predicted_ns, schedule_variant
from ...schedule.target import CpuTarget, detect_cpu_target
from ..inplace_updates import mutated_input_uses, pointwise_updates
from ..sources import sources_digest
from .analysis import Unsupported
from .build import compile_flags, compile_library, compiler, compiler_version
from .kernels import KernelPlan, kernel_flops, plan_kernel
from .loops import GenKernel
from .refine_store import stored_variants

PRELUDE = '#include "nf_cpu.h"\n#include <limits>\n#define NF_KERNEL extern "C" __attribute__((visibility("hidden")))\n'
EXPORT = 'extern "C" __attribute__((visibility("default")))'
_log_codegen = logs.get_logger("codegen")
_log_schedule = logs.get_logger("schedule")


def backend_hash() -> str:
    """A digest of every source the generated code depends on: this backend's folder (nf_gemm
    included), the IR, the shared body analysis and the CPU configurator."""
    return "cpu-" + sources_digest("codegen/cpu", "codegen/body.py", "ir", "schedule/cpu.py", "schedule/target.py")[:20]


class CpuBackend:
    """C++/OpenMP code generation for CPU graphs (`backend='cpu'`)."""

    name = "cpu"
    symbolic_programs = True  # builds one program for a range of sizes (a graph with symbolic sizes)
    # fresh outputs exist before the program runs and inputs are bound to slots: an intermediate
    # may live in a fresh output's or a donated input's memory (plan_memory's into_output, into_input)
    intermediates_in_io = True

    def __init__(self) -> None:
        self._plans: dict[str, KernelPlan] = {}
        self._unrenderable: dict[str, str] = {}  # function name -> why its rendering failed

    def target(self) -> CpuTarget:
        return detect_cpu_target()

    def plan(self, kernel: Kernel, target: CpuTarget | None = None,
             const_bufs: frozenset[int] = frozenset(), written_outs: frozenset[int] = frozenset(),
             inplace: str | None = None, variant: int = 0) -> KernelPlan:
        """How `kernel` runs; `variant` k > 0: with the configurator's k-th schedule candidate
        (refinement, schedule/cpu.py `candidates`)."""
        target = target or self.target()
        key = (f"{kernel.structural_key}|{target.key()}|{sorted(const_bufs)}|{sorted(written_outs)}"
               f"|{context_signature()}|{inplace}|{variant}")
        p = self._plans.get(key)
        if p is None:
            if len(self._plans) > 4096:  # a long-running process compiling many graphs
                self._plans.clear()
            record: list = []
            with schedule_variant(variant, record):
                p = plan_kernel(kernel, target, const_bufs, written_outs, inplace)
            p.predicted_ns = sum(predicted_ns(shape, sched, target) for shape, sched, _ in record)
            p.variants = max((n for _, _, n in record), default=1)
            self._plans[key] = p
        bad = [self._unrenderable[g.fn] for g in (p.gen, getattr(p, "anchor_gen", None))
               if g is not None and g.fn in self._unrenderable]
        if bad:  # its source could not be generated (found at render time): run it through torch
            return KernelPlan("torch", reason=bad[0])
        return p

    def executor_for(self, kernel: Kernel) -> str:
        return self.plan(kernel).executor

    def hash(self) -> str:
        return backend_hash()

    # -------------------------------------------------------------------------- build
    def build(self, graph: Graph, options: Options | dict[str, Any] | None = None,
              variants: dict[str, int] | None = None) -> CpuProgram:
        """The program for `graph`. A kernel whose source turns out not to be renderable (an op
        form the analysis accepted but the C++ renderer cannot express) runs through torch:
        the build is redone without it, so such a kernel never fails the compile. `variants`:
        kernel structural key -> schedule variant (refinement; the others: variant 0, or with
        `options.refine` the variant refinement stored for them)."""
        options = Options.of(options)
        if is_symbolic([gi.value.type for gi in graph.inputs]) and not context_signature():
            raise ValueError("a graph with symbolic sizes is built inside its symbol table's ranges_context()")
        for _ in range(8):
            try:
                program = self._build(graph, options, variants)
                break
            except _Unrenderable as e:
                _log_codegen.info("cpu: %s cannot be generated (%s); it runs through torch", e.fn, e.reason)
                self._unrenderable[e.fn] = f"not generated: {e.reason}"
        else:
            program = self._build(graph, options, variants)
        if options.refine and variants is None:
            from .refine import attach

            attach(self, graph, options, program)
        return program

    def _build(self, graph: Graph, options: Options, variants: dict[str, int] | None = None) -> CpuProgram:
        t0 = time.perf_counter()
        target = self.target()
        layout = _Layout(graph, inplace=options.inplace)
        steps: list[StepSpec] = []
        segments: list[tuple[str, list[tuple[str, list[int]]]]] = []
        gens: dict[str, GenKernel] = {}
        current: list[tuple[str, list[int]]] = []
        current_sites: list[str] = []  # per launch of `current`: what an out-of-range index there names
        counts = {"generated": 0, "gemm": 0, "library": 0, "torch": 0}
        use_packing = options.pack_weights
        profile = options.profile
        timers = profile or options.refine  # launch timers in the glue (refinement switches them on per call)
        stored = stored_variants(target) if options.refine else {}
        launch_labels: list[str] = []
        launch_kernels: list[int] = []  # per generated launch: the kernel's ordinal (profiling)
        launch_keys: list[str] = []  # per generated launch: the kernel's structural key (refinement)
        kernel_plans: dict[str, tuple[float, int, int]] = {}  # structural key -> (predicted ns, variants, variant)
        fallbacks: list[str] = []
        schedules: dict[str, str] = {}  # kernel structural key -> how it runs (for explain)
        per_kernel = check_numerics.enabled(options)  # one entry point per kernel, observed (numerics check)
        kernel_slots: list[tuple[list[int], list[int]]] = []  # per kernel ordinal: input and output slots

        def flush(kernel: int = -1) -> None:
            nonlocal current, current_sites
            if current:
                name = f"nf_seg_{len(segments)}"
                segments.append((name, current))
                steps.append(StepSpec("seg", seg=name, label=", ".join(fn for fn, _ in current[:3]), kernel=kernel,
                                      sites=current_sites,
                                      attrs={"slots": sorted({a for _, args in current for a in args})}))
                current, current_sites = [], []

        def launch(fn: str, args: list[int]) -> None:
            current.append((fn, args))
            current_sites.append(_index_sites(kernel))

        ordinal = -1
        for n in graph.nodes:
            if n.op != "kernel":
                continue
            ordinal += 1
            kernel: Kernel = n.attrs["kernel"]
            ins = [layout.slot_of(v) for v in n.inputs]
            outs = [layout.slot_of(o) for o in n.outputs]
            consts = frozenset(i for i, s in enumerate(ins) if layout.slots[s].kind == "const")
            # outputs computed into a mutated input's buffer: the library never writes raw results there
            written = frozenset(j for j, s in enumerate(outs) if layout.slots[s].kind == "input")
            skey = kernel.structural_key
            variant = (variants or {}).get(skey, stored.get(skey, 0))
            # an int8 x int8 product's constant weight is always packed (int8 panels: its bytes once more)
            int8_product = kernel.anchor_node is not None and kernel.anchor_node.attrs.get("out_dtype") is not None
            plan = self.plan(kernel, target, consts if use_packing or int8_product else frozenset(), written,
                             layout.inplace.get(id(n)), variant)
            if timers and plan.kind == "gemm" and consts and not use_packing and not int8_product:
                # a GEMM's variants are its B layouts: 0 as planned (the weight read in place), 1 packed
                # panels of the constant weight (what pack_weights does for every GEMM), for this kernel
                packed = self.plan(kernel, target, consts, written, layout.inplace.get(id(n)))
                if packed.kind == "gemm" and packed.gemm is not None and packed.gemm.pack is not None:
                    kernel_plans[skey] = (gemm_predicted_ns(kernel_flops(kernel), target), 2, min(variant, 1))
                    plan = packed if variant >= 1 else self.plan(kernel, target, frozenset(), written,
                                                                 layout.inplace.get(id(n)))  # (epilogue: variant 0)
            refinable = plan.kind == "gen" or (plan.kind == "attention" and plan.anchor_gen is not None
                                               and plan.gen is None)
            if refinable:
                kernel_plans[skey] = (plan.predicted_ns, plan.variants, variant)
            desc = _describe_plan(plan)
            if kernel.structural_key not in schedules:
                _log_schedule.info("%s [%s]: %s", kernel.name, kernel.kind, desc)
            schedules[kernel.structural_key] = desc
            if plan.kind == "gemm":
                gp = plan.gemm
                assert gp is not None and plan.gen is not None
                if gp.dst == "direct":
                    dst = outs[0]
                elif gp.dst == "inplace":
                    assert gp.inplace is not None
                    dst = outs[gp.inplace]
                elif gp.dst == "local":  # C is never stored: p0 is unused
                    dst = outs[0]
                else:
                    dst = layout.scratch(gp.scratch)
                args = [dst] + ins + outs
                if gp.pack is not None:
                    args.append(layout.packed(n.inputs[gp.pack.buf], gp.pack, gp.pack_layout))
                gens[plan.gen.fn] = plan.gen
                launch(plan.gen.fn, args)
                launch_labels.append(kernel.name)
                launch_kernels.append(ordinal)
                launch_keys.append(skey)
                counts["generated"] += 1
                counts["gemm"] += 1
            elif plan.kind == "gen":
                assert plan.gen is not None
                gens[plan.gen.fn] = plan.gen
                launch(plan.gen.fn, ins + outs)
                launch_labels.append(kernel.name)
                launch_kernels.append(ordinal)
                launch_keys.append(skey)
                counts["generated"] += 1
            elif plan.kind in ("matmul", "attention"):
                assert plan.anchor_type is not None
                if plan.direct is not None:
                    dst = outs[plan.direct]
                elif plan.inplace is not None:
                    dst = outs[plan.inplace]
                else:
                    dst = layout.scratch(plan.anchor_type)
                if plan.anchor_gen is not None:
                    gens[plan.anchor_gen.fn] = plan.anchor_gen
                    launch(plan.anchor_gen.fn, [dst] + ins + outs)
                    launch_labels.append(kernel.name)
                    launch_kernels.append(ordinal)
                    launch_keys.append(skey)
                    counts["generated"] += 1
                else:
                    flush()
                    attrs = dict(plan.anchor_attrs)
                    attrs["out_shape"] = plan.anchor_type.shape
                    steps.append(StepSpec("matmul" if plan.kind == "matmul" else "sdpa",
                                          operands=[(ins[o.buf], o.layout) for o in plan.operands], out=dst,
                                          attrs=attrs, label=kernel.name, kernel=ordinal))
                    counts["library"] += 1
                if plan.gen is not None:
                    gens[plan.gen.fn] = plan.gen
                    launch(plan.gen.fn, [dst] + ins + outs)
                    launch_labels.append(kernel.name + " (epilogue)")
                    launch_kernels.append(ordinal)
                    launch_keys.append(skey)
                    counts["generated"] += 1
            else:
                flush()
                attrs = {"inplace_target": layout.inplace[id(n)]} if id(n) in layout.inplace else {}
                steps.append(StepSpec("torch", body=kernel.body, ins=ins, outs=outs, label=kernel.name, kernel=ordinal,
                                      attrs=attrs))
                counts["torch"] += 1
                fallbacks.append(f"{kernel.name}: {plan.reason}")
            kernel_slots.append((ins, outs))
            if per_kernel:
                flush(ordinal)
        flush()
        _mark_causal_masks(layout.slots, gens, segments, steps)
        layout.pack_all(target.threads)
        outputs = [layout.output_spec(v) for v in list(graph.outputs) + [new for _, new in graph.mutations]]
        t1 = time.perf_counter()
        lib, how, key = (None, "none", "")
        if segments:
            lib, how, key = self._library(target, gens, segments, uses_gemm=counts["gemm"] > 0, profile=timers,
                                          timers_on=profile)
        t2 = time.perf_counter()
        src_dir = str(library_cache("cpu").entry_dir(key) / "src") if key else ""
        info = {"library_key": key, "cache": how, "source_dir": src_dir, "plan_s": t1 - t0, "library_s": t2 - t1,
                "unique_functions": len(gens), "segments": len(segments), "fallbacks": fallbacks, **counts,
                "launch_labels": launch_labels if timers else [], "launch_kernels": launch_kernels if timers else [],
                "launch_keys": launch_keys if timers else [], "kernel_plans": kernel_plans if timers else {},
                "profile": profile,
                "target": target.describe()}
        program = CpuProgram(lib, layout.slots, steps, outputs, layout.n_inputs, layout.total_bytes, info)
        symbols = graph_symbols(graph)
        if symbols:
            program.symbolic = SymbolicLayout(layout.plan, layout.arena_values, layout.scratch_slots, symbols)
        program.schedules = schedules
        program.kernel_slots = kernel_slots
        if per_kernel:
            check_numerics.install_cpu(program, graph)
        _log_codegen.info("cpu: %d kernels, %d distinct functions in %d segments, %d library and %d torch steps; "
                          "library %s in %.2f s (plan %.2f s)", ordinal + 1, len(gens), len(segments),
                          counts["library"], counts["torch"], how, t2 - t1, t1 - t0)
        return program

    def _library(self, target: CpuTarget, gens: dict[str, GenKernel],
                 segments: list[tuple[str, list[tuple[str, list[int]]]]],
                 uses_gemm: bool, profile: bool = False, timers_on: bool = True) -> tuple[ctypes.CDLL, str, str]:
        glue = _glue(gens, segments, profile, timers_on)
        cxx = compiler()
        extra, link, gemm_key = list(UNIT_FLAGS), [], ""
        if uses_gemm:
            from . import gemm

            logs.stage(f"codegen and build, {len(gens)} functions: nf_gemm library")
            gemm.load()  # our library links this exact build (same path: one instance, configured)
            extra.append(f"-I{gemm.include_dir()}")
            link = gemm.link_args()
            gemm_key = gemm.build.build_key()
        key = cache_key(self.hash(), target.key(), compiler_version(cxx), " ".join(compile_flags(target)),
                        gemm_key, "\n".join(sorted(g.key for g in gens.values())), glue, context_signature())
        seg_names = [s for s, _ in segments]

        def verify(lib: ctypes.CDLL) -> bool:
            try:
                fn = lib.nf_lib_key
                fn.restype = ctypes.c_char_p
                if fn() != key.encode():
                    return False
                return all(hasattr(lib, s) for s in seg_names)
            except AttributeError:
                return False

        def build(workdir: Path) -> tuple[Path, list[Path]]:
            units = _translation_units(gens, target, uses_gemm)
            logs.stage(f"build: compiling {len(gens)} kernel functions in {len(units)} C++ units")
            units[0] += glue + f'{EXPORT} const char* nf_lib_key() {{ return "{key}"; }}\n'
            out = workdir / "lib.so"
            compile_library(units, out, target, workdir, extra_flags=extra, link_flags=link)
            return out, sorted(workdir.glob("*.cpp"))

        lib, how = library_cache("cpu").load_or_build(key, build, verify)
        return lib, how, key


UNIT_FLAGS = ("-fvisibility=hidden",)  # the backend's flags beside compile_flags() (and nf_gemm's include path)


def start_background_builds() -> None:
    """nf_gemm and the precompiled nf_cpu.h compile in daemon threads while a model is captured."""
    from . import build
    from .gemm.build import start_background_build

    start_background_build()
    build.start_background_pch(detect_cpu_target(), list(UNIT_FLAGS))


def _glue(gens: dict[str, GenKernel], segments: list[tuple[str, list[tuple[str, list[int]]]]],
          profile: bool = False, timers_on: bool = True) -> str:
    """Entry points `nf_seg_<i>(void** slots, const int64_t* sizes)` (the symbols' values of
    the call, see loops.signature); with `profile`, while the timers are on (`timers_on` at
    load, then `nf_prof_set(on)`), each call's wall time is added to `nf_prof[launch]` (read
    with `nf_profile()`)."""
    lines = ["#include <omp.h>"] if profile else []
    for fn, g in sorted(gens.items()):
        lines.append(f'extern "C" int {fn}({", ".join(["void*"] * g.n_args + ["const int64_t*"])});')
    n_launch = sum(len(c) for _, c in segments)
    if profile:
        lines.append(f"static double nf_prof[{max(n_launch, 1)}];")
        lines.append(f"static int nf_prof_on = {int(timers_on)};")
        lines.append(f"{EXPORT} double* nf_profile() {{ return nf_prof; }}")
        lines.append(f"{EXPORT} void nf_prof_set(int on) {{ nf_prof_on = on; }}")
    k = 0
    for name, calls in segments:
        lines.append(f"{EXPORT} int {name}(void** s, const int64_t* nf_sym) {{")
        lines.append("  int rc;")
        for i, (fn, args) in enumerate(calls):  # a failing launch returns its position + 1 (StepSpec.sites)
            call = f"{fn}({', '.join([f's[{a}]' for a in args] + ['nf_sym'])})"
            if profile:
                lines.append(f"  if (nf_prof_on) {{ double t0 = omp_get_wtime(); rc = {call}; "
                             f"nf_prof[{k}] += omp_get_wtime() - t0; if (rc) return {i + 1}; }}")
                lines.append(f"  else if ((rc = {call})) return {i + 1};")
            else:
                lines.append(f"  if ((rc = {call})) return {i + 1};")
            k += 1
        lines.append("  return 0;")
        lines.append("}")
    return "\n".join(lines) + "\n"


def _translation_units(gens: dict[str, GenKernel], target: CpuTarget, uses_gemm: bool) -> list[str]:
    """Rendered kernels split into up to `threads` units of similar size (compiled in parallel)."""
    rendered = []
    for fn in sorted(gens):
        try:
            rendered.append(gens[fn].render())
        except (Unsupported, SymbolicDecision) as e:  # (a choice the sizes' ranges do not settle)
            raise _Unrenderable(fn, str(e)) from e
    n_units = max(1, min(target.threads, len(rendered) // 4 or 1))
    prelude = PRELUDE + ('#include "nf_gemm.h"\n' if uses_gemm else "")
    units = [prelude for _ in range(n_units)]
    sizes = [0] * n_units
    for text in sorted(rendered, key=len, reverse=True):
        i = sizes.index(min(sizes))
        units[i] += _export_last(text)
        sizes[i] += len(text)
    return units


class _Unrenderable(Exception):
    def __init__(self, fn: str, reason: str) -> None:
        super().__init__(f"{fn}: {reason}")
        self.fn, self.reason = fn, reason


def _export_last(text: str) -> str:
    """Multi-function kernels (cat): the last function is the entry, the others stay static."""
    idx = text.rfind("static int nf_")
    return text[:idx] + "NF_KERNEL int nf_" + text[idx + len("static int nf_"):]


_SHARED_PACKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class _Layout:
    """Slots of a graph's buffers: constants, inputs, arena offsets, fresh outputs, scratch."""

    def __init__(self, graph: Graph, inplace: bool = True) -> None:
        plan = graph.meta.memory_plan
        if plan is None:
            raise ValueError("the CPU backend needs a memory-planned graph (run the full pipeline)")
        self.graph = graph
        self.plan = plan
        self.slots: list[SlotSpec] = []
        self.arena_values: dict[int, Value] = {}  # arena slot -> its value (symbolic plans place per size)
        self.scratch_slots: list[int] = []
        self._slot: dict[Value, int] = {}
        self._input_pos: dict[Value, int] = {}
        self._const: dict[Value, Any] = {}
        self._packed: dict[tuple, int] = {}
        self._to_pack: list[tuple[torch.Tensor, torch.Tensor, str]] = []
        pos = 0
        for gi in graph.inputs:
            if gi.kind == "const":
                self._slot[gi.value] = self._add(SlotSpec("const", gi.value.type, tensor=gi.tensor))
                self._const[gi.value] = gi.tensor
            elif gi.kind == "size":  # evaluated per size by CpuProgram.at
                self._slot[gi.value] = self._add(SlotSpec("sized", gi.value.type, recipe=gi.recipe))
            else:
                self._input_pos[gi.value] = pos
                self._slot[gi.value] = self._add(SlotSpec("input", gi.value.type, index=pos))
                pos += 1
        self.n_inputs = pos
        self.arena_bytes = (plan.arena_bytes + 63) // 64 * 64
        self.scratch_bytes = 0
        fresh = 0
        self._views: dict[Value, tuple[Value, tuple]] = {}
        # kernels that update a mutated input in place (a KV cache's index_copy): kernel -> target
        self.inplace: dict[int, str] = {}
        self._inplace_of: dict[Value, Value] = {}
        fresh_slot: dict[Value, int] = {}  # fresh outputs an intermediate is computed into first
        updates = _inplace_updates(graph, self._input_pos)
        in_place = pointwise_updates(graph, self._input_pos, ("pointwise", "matmul")) if inplace else {}
        for n in graph.nodes:
            if n.op != "kernel":
                src, chain = self._views.get(n.inputs[0], (n.inputs[0], ()))
                self._views[n.outputs[0]] = (src, chain + (n,))
                continue
            if id(n) in updates:
                target, x = updates[id(n)]
                self.inplace[id(n)] = target
                self._slot[n.outputs[0]] = self._slot[x]
                self._inplace_of[n.outputs[0]] = x
                self.slots[self._slot[x]].written = True
                continue
            into = in_place.get(id(n), {})
            for o in n.outputs:
                if o in plan.into_input:  # an intermediate in a donated input's memory (a saved activation)
                    x = plan.into_input[o]
                    self._slot[o] = self._slot[x]
                    self.slots[self._slot[x]].written = True
                elif o in plan.into_output or o in fresh_slot:  # (an intermediate in an output's memory)
                    out = plan.into_output.get(o, o)
                    if out not in fresh_slot:
                        fresh_slot[out] = self._add(SlotSpec("fresh", out.type, index=fresh))
                        fresh += 1
                    self._slot[o] = fresh_slot[out]
                elif o in into:  # a mutated input's new value, computed into the input's own buffer
                    x = into[o]
                    self._slot[o] = self._slot[x]
                    self._inplace_of[o] = x
                    self.slots[self._slot[x]].written = True
                elif o in plan.fresh:
                    self._slot[o] = self._add(SlotSpec("fresh", o.type, index=fresh))
                    fresh += 1
                elif o in plan.offsets:
                    self._slot[o] = self._add(SlotSpec("arena", o.type, index=plan.offsets[o]))
                    self.arena_values[self._slot[o]] = o
                else:
                    raise ValueError(f"kernel output {o!r} has no buffer in the memory plan")

    def _add(self, spec: SlotSpec) -> int:
        self.slots.append(spec)
        return len(self.slots) - 1

    @property
    def total_bytes(self) -> int:
        return self.arena_bytes + self.scratch_bytes

    def slot_of(self, v: Value) -> int:
        s = self._slot.get(v)
        if s is None:
            raise ValueError(f"value {v!r} read by a kernel has no buffer (a top-level view?)")
        return s

    def packed(self, v: Value, op: Any, pack_layout: str = "f32") -> int:
        """A constant slot holding B packed for nf_gemm in `pack_layout` ("f32" panels, or "vnni" for
        the native bf16 path; once per weight, view and layout; the packing itself runs in `pack_all`)."""
        key = (v, op.layout, pack_layout)
        if key not in self._packed:
            from .gemm import ops

            t = self._const[v]
            view = t.as_strided(op.layout.shape, op.layout.strides, t.storage_offset() + op.layout.offset)
            # programs of the same model (other input shapes) share packed weights while they live
            shared_key = (view.data_ptr(), tuple(view.shape), tuple(view.stride()), view.dtype, version_of(t),
                          ops.lib().nf_sgemm_nr(), pack_layout)
            data = _SHARED_PACKED.get(shared_key)
            if data is None:
                data = ops.packed_buffer(view, pack_layout)
                self._to_pack.append((view, data, pack_layout))
                _SHARED_PACKED[shared_key] = data
            self._packed[key] = self._add(SlotSpec("const", TensorType(tuple(data.shape), data.dtype),
                                                   tensor=data))
        return self._packed[key]

    def pack_all(self, threads: int) -> None:
        """Pack every queued weight (the C packing routine releases the GIL: threads share it)."""
        from concurrent.futures import ThreadPoolExecutor

        from .gemm import ops

        def pack(item: tuple[torch.Tensor, torch.Tensor, str]) -> None:
            b, out, pack_layout = item
            ops.pack_into(b, out, pack_layout)

        if threads > 1 and len(self._to_pack) > 1:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(pack, self._to_pack))
        else:
            for item in self._to_pack:
                pack(item)
        self._to_pack.clear()

    def scratch(self, t: TensorType) -> int:
        """A slot at the start of the shared scratch region (one library result at a time)."""
        self.scratch_bytes = max(self.scratch_bytes, (hint(t.nbytes) + 63) // 64 * 64)
        self.scratch_slots.append(self._add(SlotSpec("scratch", t, index=self.arena_bytes)))
        return self.scratch_slots[-1]

    def output_spec(self, v: Value) -> OutputSpec:
        if v in self._views:
            src, chain = self._views[v]
            if src in self._const:
                from ...ir import OPS

                t = self._const[src]
                for n in chain:
                    t = OPS[n.op].impl([t], n.attrs)
                return OutputSpec("const", tensor=t)
            return OutputSpec("view", input=self._input_pos[src], views=chain)
        if v in self._const:
            return OutputSpec("const", tensor=self._const[v])
        if v in self._input_pos:
            return OutputSpec("input", input=self._input_pos[v])
        if v in self._inplace_of:  # the input's own (bound, contiguous) buffer, updated in place
            return OutputSpec("slot", slot=self.slot_of(v))
        s = self.slot_of(v)
        if self.slots[s].kind != "fresh":
            raise ValueError(f"output {v!r} lives in the arena")
        return OutputSpec("slot", slot=s)


def _inplace_updates(graph: Graph, input_pos: dict[Value, int]) -> dict[int, tuple[str, Value]]:
    """Kernel nodes (by id) that may write a mutated graph input in place: one extern (its other
    arguments possibly views) whose ATen op has an in-place form (`index_copy` -> `index_copy_`),
    whose first argument is the input itself, whose result is the input's new value, and after
    which nothing reads the old value. Then the new value is computed into the input's buffer
    and its write-back copies nothing (a static KV cache is updated by one row instead of
    copied twice per step)."""
    new_of, later_use, returned = mutated_input_uses(graph)
    out: dict[int, tuple[str, Value]] = {}
    for i, n in enumerate(graph.nodes):
        if n.op != "kernel" or len(n.outputs) != 1 or new_of.get(n.outputs[0]) is None:
            continue
        x = new_of[n.outputs[0]]
        body = n.attrs["kernel"].body
        ext = [m for m in body.nodes if m.op in ("extern", "extern_effect")]
        others_are_views = all(OPS[m.op].has("view") for m in body.nodes if m not in ext)
        if x not in input_pos or len(ext) != 1 or not others_are_views or later_use.get(x, -1) > i \
                or x in returned:
            continue
        e = ext[0]
        target = _inplace_target(e.attrs["target"])
        if target is None or body.outputs[0] is not e.outputs[0] or not e.inputs:
            continue
        k = next((j for j, bv in enumerate(body.inputs) if bv.value is e.inputs[0]), None)
        if k is None or n.inputs[k] is not x or sum(1 for v in n.inputs if v is x) != 1:
            continue
        out[id(n)] = (target, x)
    return out


def _inplace_target(target: str) -> str | None:
    """'aten.index_copy.default' -> 'aten.index_copy_.default' when that overload exists."""
    ns, _, rest = target.partition(".")
    name, _, overload = rest.partition(".")
    if ns != "aten" or name not in ("index_copy", "index_put", "scatter", "slice_scatter", "index_fill"):
        return None
    packet = getattr(torch.ops.aten, name + "_", None)
    return f"aten.{name}_.{overload}" if packet is not None and hasattr(packet, overload) else None


def _mark_causal_masks(slots: list[SlotSpec], gens: dict[str, GenKernel],
                       segments: list[tuple[str, list[tuple[str, list[int]]]]], steps: list[StepSpec]) -> None:
    """Sized slots that only flash attention kernels read, as their mask: where such a mask is
    the causal triangle at a call's sizes, `CpuProgram.at` passes null and the kernels run causal."""
    mask_uses: set[int] = set()
    other_uses: set[int] = set()
    for _, calls in segments:
        for fn, args in calls:
            m = gens[fn].mask_arg
            for i, a in enumerate(args):
                (mask_uses if i == m else other_uses).add(a)
    for st in steps:
        other_uses.update(s for s, _ in st.operands)
        other_uses.update(st.ins)
    for s in mask_uses - other_uses:
        if slots[s].kind == "sized":
            slots[s].causal = True


INDEXING_OPS = ("take", "gather", "scatter_add")  # the ops whose generated code checks its indices


def _index_sites(kernel: Kernel) -> str:
    """What an out-of-range index in `kernel` names: each indexing op's ATen op and source line."""
    sites = [f"{m.meta.get('aten', m.op)} at {m.meta['source']}" if m.meta.get("source") else m.meta.get("aten", m.op)
             for m in kernel.body.nodes if m.op in INDEXING_OPS]
    return f"{'; '.join(dict.fromkeys(sites))} (kernel {kernel.name})" if sites else f"kernel {kernel.name}"


def _describe_plan(plan) -> str:
    """One line on how a kernel runs: its generated function's frozen schedule, the GEMM
    call, or the fallback with its reason."""
    parts = [plan.kind]
    if plan.gemm is not None:
        parts.append("nf_gemm" + (" packed-B" if plan.gemm.pack is not None else "")
                     + (f" {plan.gemm.entry}" if plan.gemm.entry else ""))
    for g in (getattr(plan, "anchor_gen", None), plan.gen):
        if g is not None:
            parts.append(g.schedule.key())
    if plan.kind not in ("gen", "gemm", "matmul", "attention") and getattr(plan, "reason", ""):
        parts.append(f"({plan.reason})")
    return " ".join(parts)

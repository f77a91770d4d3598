"""`novaforge.compile`: the user-facing compiled callable.

A `CompiledModule` compiles on its first call for the given inputs and keeps one `Program`
per input signature (a guard over shapes, dtypes, devices, strides, requires-grad and the
non-tensor arguments); a call whose signature has no program compiles a new one. Parameters
and buffers are read from the module at every call (in-place updates are seen), unless
`freeze=True` made them constants of the program.

Gradients: a module call that needs them (grad mode on and an input or parameter requiring
grad) runs AOTAutograd's forward and backward graphs compiled by novaforge (train_entry.TrainEntry);
a plain function's call that needs them runs the optimized graph through the reference
interpreter with autograd recording, and one that reads tensors requiring grad from its closure
(constants of its program) runs eagerly, with a warning. Either way gradients are correct;
nothing silently detaches.
`dynamic=` traces chosen sizes once as symbols (frontend/symbolic_entry.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from . import logs, settings
from .compile_stats import BACKENDS, CompileStats, resolve_backend
from .frontend import pytrees
from .frontend.capture import Captured, autocast_modes, capture, has_meta_state
from .frontend.module_state import ModuleModes
from .frontend.subclass_state import flatten_state
from .frontend.symbolic_entry import SymbolicCaptures
from .gc_pause import paused_gc
from .ir import Graph
from .ir.types import contiguous_strides
from .options import Options
from .passes.pipeline import PassRecord, run_pipeline
from .runtime import check_numerics
from .runtime.entry import Entry
from .runtime.state import mutated_shares_memory, share_memory
from .runtime.tiering import Tiering, build_estimate, record_build


def _inside_a_trace() -> bool:
    """Is this thread tracing (Dynamo, novaforge's capture, or a make_fx / AOTAutograd trace, whose
    dispatch modes are on this thread's stack)? Thread-local checks only: torch.compiler.is_compiling()
    reads a process-wide flag that another thread's trace sets."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from .generation import _is_capturing

    return torch.compiler.is_dynamo_compiling() or _is_capturing() or bool(_get_current_dispatch_mode_stack())


def _dynamo_can_take(e: BaseException) -> bool:
    """A compile failure that Dynamo may get past (it splits graphs and replays side effects):
    what one graph cannot hold (`_beyond_one_graph`), or a training trace that failed
    (train_entry.TraceFailed; tried once through Dynamo)."""
    from .train_entry import TraceFailed

    return isinstance(e, TraceFailed) or _beyond_one_graph(e)


def _beyond_one_graph(e: BaseException | None) -> bool:
    """A capture or trace that failed on what one traced graph cannot hold: control flow or
    shapes depending on tensor values (ours, or torch's own exception from AOTAutograd's trace
    of a training call), tensors assigned to module attributes (state between calls), or Python
    the tracer cannot follow where eager runs."""
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from .frontend.capture import DataDependentError, HookedModuleError, StatefulForwardError, UntraceableError
    from .frontend.lower import DataDependentShapeError

    kinds = (DataDependentError, DataDependentShapeError, DataDependentOutputException, GuardOnDataDependentSymNode,
             StatefulForwardError, UntraceableError, HookedModuleError)
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, kinds):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _signature(flat: list[Any]) -> tuple:
    sig = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            sig.append(("T", x.shape, x.dtype, x.device, x.stride(), x.storage_offset(),  # (Size hashes as a tuple)
                        x.requires_grad))
        else:
            try:
                hash(x)
                sig.append(("C", type(x).__name__, x))
            except TypeError:
                sig.append(("C", type(x).__name__, repr(x)))
    return tuple(sig)


# nn.Module methods that return the module (transformers' overrides of them too)
_RETURN_SELF = frozenset(("train", "eval", "to", "cpu", "cuda", "xpu", "mps", "half", "float", "double", "bfloat16",
                          "type", "requires_grad_", "apply", "share_memory", "to_empty"))


class _ReturnsCompiled:
    """A bound method of the compiled module whose result, when it is the module itself, is the
    compiled callable (chained calls such as `novaforge.compile(m).to(device).eval()`)."""

    __slots__ = ("method", "module", "compiled")

    def __init__(self, method: Any, module: Any, compiled: Any) -> None:
        self.method, self.module, self.compiled = method, module, compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.method(*args, **kwargs)
        return self.compiled if out is self.module else out

    def __getattr__(self, name: str) -> Any:  # __name__, __doc__, ... of the method
        return getattr(self.method, name)

    @property
    def __signature__(self) -> Any:
        import inspect

        return inspect.signature(self.method)

    def __repr__(self) -> str:
        return repr(self.method)


class CompiledModule:
    """The callable returned by `novaforge.compile` (of an nn.Module: a CompiledNNModule, which is
    also an nn.Module; compiled_module.py)."""

    # the class of a compiled nn.Module: compiled_module.CompiledNNModule, a subclass of this one,
    # names itself here (this module cannot import it, it imports this one); novaforge/__init__
    # imports compiled_module, so it is set before anything compiles
    _nf_module_class: type | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is CompiledModule and args and isinstance(args[0], torch.nn.Module):
            sub = CompiledModule._nf_module_class
            if sub is None:
                raise RuntimeError("novaforge.compiled_module is not imported: import novaforge")
            return object.__new__(sub)
        return object.__new__(cls)

    def __init__(self, fn: Any, *, freeze: bool = False, backend: str = "auto",
                 options: dict[str, Any] | None = None, dynamic: Any = False) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.fn = fn
        self._modes = ModuleModes(fn)  # training flags and hooks: part of every call's key
        self.freeze = freeze
        self.options = Options.of(options)  # validated: an unknown option raises here
        self._dynamic_arg = dynamic
        self.dynamic = SymbolicCaptures(fn, dynamic, freeze, self.options.random) if dynamic else None
        self.backend = backend
        self.tiering = Tiering(bool(dynamic) and self.options.tiered)  # dynamic: new sizes run eagerly first
        self._programs: dict[tuple, Entry] = {}
        self._shared: dict[Any, Entry | bool] = {}  # symbolic capture -> its program for all sizes, or False
        self._instances: OrderedDict[tuple, Entry] = OrderedDict()  # the last sizes made of shared programs
        self._train_entries: dict[tuple, Any] = {}  # calls that need gradients (train_entry.TrainEntry)
        self._trainer: Any = None  # calls that need gradients at varying sizes (Dynamo, dynamic shapes)
        self._via_dynamo: Any = None  # every call, once capture met what one traced graph cannot hold
        self._warned_closure = False  # warned once that closure tensors requiring grad run eagerly
        self._lock = threading.RLock()  # concurrent first calls compile a signature once
        self.compilations = 0
        self.last_stats: CompileStats | None = None

    # copy.deepcopy (an EMA or teacher copy of a compiled model) and pickling carry what was
    # compiled and how, not the programs, locks and caches: a copy compiles on its first call
    # (from the kernel cache), for its own parameters
    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "freeze": self.freeze, "backend": self.backend, "options": self.options,
                "dynamic": self._dynamic_arg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["fn"], freeze=state["freeze"], backend=state["backend"], options=state["options"],
                      dynamic=state["dynamic"])

    # nn.Module conveniences. A method of the module that returns the module itself (`eval()`,
    # `train()`, `to(...)`, `float()`, `requires_grad_()`, ...) returns this compiled callable
    # instead, as torch.compile's OptimizedModule does: `model = novaforge.compile(m).eval()` keeps
    # the compiled model (it returned the uncompiled one: every later call ran eagerly, silently).
    def __getattr__(self, name: str) -> Any:
        fn = self.__dict__.get("fn")
        if fn is None:
            raise AttributeError(name)
        attr = getattr(fn, name)
        if name in _RETURN_SELF and getattr(attr, "__self__", None) is fn:
            return _ReturnsCompiled(attr, fn, self)
        return attr

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _inside_a_trace():
            # called inside an outer compile's trace (a compiled block in a model compiled as a
            # whole): the outer program takes the block's ops, traced from the module itself
            return self.fn(*args, **kwargs)
        if self._via_dynamo is not None:
            return self._dynamo_call(args, kwargs)
        try:
            return self._call(args, kwargs)
        except Exception as e:
            if self.options.fallback == "raise" or not _dynamo_can_take(e):
                raise
            error = e
        self._fall_back_to_dynamo(error)
        try:
            return self._dynamo_call(args, kwargs)
        except Exception as through_dynamo:
            # undone: eager raises too (a user error met by the training trace: Dynamo's is
            # eager's error), or Dynamo cannot trace it either (the capture's refusal says why)
            with self._lock:
                self._via_dynamo = None
                self._train_entries = {k: v for k, v in self._train_entries.items() if v.out_spec is not None}
            from .train_entry import TraceFailed

            if isinstance(error, TraceFailed):
                raise
            raise error from through_dynamo

    def _fall_back_to_dynamo(self, e: BaseException) -> None:
        """Capture met what one traced graph cannot hold (`_dynamo_can_take`: a branch on a tensor
        value such as transformers' dynamic RoPE `if seq_len > max_seq_len_cached`, a data-dependent
        shape, state assigned to module attributes, Python the tracer cannot follow): from now on
        every call goes through `torch.compile(fn, backend="novaforge")` with this module's
        options. Dynamo splits the graph there, replays attribute assignments, and novaforge
        compiles each piece (inference and training; a `generate()` forward too).
        `fallback="raise"` raises the capture error instead; so does a call that fails through
        Dynamo too (and the next call captures again)."""
        with self._lock:
            if self._via_dynamo is None:
                where = str(e).splitlines()[0] if str(e) else type(e).__name__
                _log_runtime.warning("novaforge: %s cannot be captured as one graph (%s); it is compiled through "
                                     "torch.compile(backend='novaforge') from now on, which splits the graph there%s",
                                     getattr(self.fn, "__name__", None) or type(self.fn).__name__, where,
                                     " (freeze=True does not apply there: parameters stay inputs)" if self.freeze
                                     else "")
                options = {**self.options, "backend": self.backend}
                self._via_dynamo = torch.compile(self.fn, backend="novaforge", options=options)
                self.compilations += 1

    def _dynamo_call(self, args: tuple, kwargs: dict) -> Any:
        from .generation import capturing

        with capturing(), (torch.no_grad() if self.freeze else contextlib.nullcontext()):
            return self._via_dynamo(*args, **kwargs)  # (a forward replaced by `generate` is the original)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        key, tensors, objs, flat = self._call_key(args, kwargs)
        if key[4] and key[4][0]:
            from .frontend.capture import HookedModuleError

            raise HookedModuleError(f"{key[4][0]} forward / backward hook(s) on the module tree or global: their "
                                    "Python side effects must run at every call")
        if key[2] and self._trains(tensors):
            if key not in self._train_entries and self._sizes_vary_in_training(key):
                return self._dynamic_trainer()(*args, **kwargs)
            return self._train_entry(key, args, kwargs).run(tensors, objs)
        entry = self._programs.get(key)
        if entry is None and self.dynamic is None and self.options.tiered:
            self._maybe_automatic_dynamic(key)
        shared = None
        if entry is None and self.dynamic is not None and self.options.symbolic_programs:
            entry = shared = self._shared_instance(key, args, kwargs, flat)  # (its binding refreshed)
        if entry is None and not self.tiering.should_build(key):
            return self._eager_tier(key, args, kwargs)
        if shared is None and (entry is None or not entry.binding.refresh()):
            with self._lock:
                entry = self._programs.get(key)
                if entry is None or not entry.binding.refresh():
                    # new signature, or a reassigned / re-laid-out / changed frozen parameter;
                    # traced on distinct tensors: a program never assumes two inputs are one
                    entry = self._compile(*_distinct(args, kwargs, tensors))
                    self._programs[key] = entry
                    self.tiering.built(key)
        if key[2] and not self.freeze and any(t.requires_grad for t in entry.captured.frozen):
            # the function closed over tensors that require grad (not parameters of a module): the
            # program holds them as constants, so only eager gives their gradients
            if not self._warned_closure:
                self._warned_closure = True
                _log_runtime.warning("novaforge: the compiled function reads tensors that require grad from its "
                                     "closure (not parameters of a module); with grad enabled its calls run eagerly "
                                     "so that those tensors get gradients. Pass them as arguments or compile an "
                                     "nn.Module to compile the backward too")
            return self._eager(args, kwargs)
        if entry.mut_targets and mutated_shares_memory(tensors, entry.binding.refs, entry.mut_targets):
            # the program mutates an input that another input (or a parameter) shares memory
            # with: its functional graph cannot see the second name change, eager can
            _log_runtime.warning("novaforge: the graph mutates an input that shares memory with another input: "
                                 "this call runs eagerly")
            return self._eager(args, kwargs)
        return entry.run(tensors, objs, self._needs_grad(tensors, entry))

    def _maybe_automatic_dynamic(self, key: tuple) -> None:
        """A third size of one input structure (the same arguments, ranks, dtypes, devices and
        grad mode, with programs for two other sizes): the dims that differ become dynamic, so
        new sizes are tiered (runtime/tiering.py) and share one symbolic trace. Two sizes do
        not: `generate()`'s prefill and decode step are two sizes of one structure."""
        if not settings.tiered_enabled():
            return
        same = [k for k in self._programs if _same_structure(k, key)]
        if len(same) < AUTOMATIC_DYNAMIC_AFTER:
            return
        with self._lock:
            if self.dynamic is not None:
                return
            dims: dict[int, dict[int, None]] = {}
            for k in same:
                for i, (a, b) in enumerate(zip(k[1], key[1], strict=True)):
                    for d, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
                        if x != y:
                            dims.setdefault(i, {})[d] = None
            self.dynamic = SymbolicCaptures(self.fn, dims, self.freeze, self.options.random)
            self.tiering = Tiering(True)
        _log_runtime.info("automatic dynamic: %s sizes of one input structure; dims %s are dynamic from now on "
                          "(new sizes run eagerly until they pay for a build)", len(same) + 1, dims)

    def _shared_instance(self, key: tuple, args: tuple, kwargs: dict, flat: Any = None) -> Entry | None:
        """The entry of this call's sizes from its structure's shared program (one program for
        every size of a symbolic capture, built on the structure's first call), or None (no
        shared program: the call is compiled per size, tiered). Entries of the last sizes made
        are kept."""
        entry = self._instances.get(key)
        if entry is not None and entry.binding.refresh():
            return entry
        with self._lock:
            bound = self.dynamic.bound(args, kwargs, flat)
            if bound is None:
                return None
            skey, cap, values = bound
            shared = self._shared.get(skey)
            if shared is not None and shared is not False and not shared.binding.refresh():
                shared = None  # a reassigned or changed frozen parameter: built again
            if shared is None:
                shared = self._shared[skey] = self._build_shared(cap, args, kwargs)
            if shared is False:
                return None
            entry = shared.at(values)
            self._instances[key] = entry
            while len(self._instances) > SHARED_INSTANCES:
                self._instances.popitem(last=False)
            self.dynamic.specializations += 1
        return entry

    def _build_shared(self, cap: Captured, args: tuple, kwargs: dict) -> Entry | bool:
        """The entry of a symbolic capture's one program for all sizes, or False (logged)."""
        from .codegen.registry import get_backend
        from .generation import capturing

        chosen = resolve_backend(self.backend, cap.graph)
        if not getattr(get_backend(chosen), "symbolic_programs", False):
            return False
        try:
            with capturing(), cap.symbols.ranges_context():
                stats = compile_graph(self.fn, args, kwargs, freeze=self.freeze, backend=self.backend,
                                      options=self.options, captured=cap)
        except Exception as e:  # noqa: BLE001 - per-size programs then (each compiles, or reports, on its own)
            _log_runtime.info("dynamic: no program for all sizes (%s: %s); compiled per size", type(e).__name__,
                              str(e).splitlines()[0] if str(e) else "")
            return False
        self.compilations += 1
        record_build(stats.times["total_s"])
        self.last_stats = stats
        _log_runtime.info("dynamic: one program for %s", cap.symbols.describe())
        return Entry(stats, self.fn)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        from .generation import capturing

        with capturing():  # a forward replaced by `generate` is the original again
            return self.fn(*args, **kwargs)

    def _eager_tier(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        """A dynamic call at a size whose program is not worth building yet (runtime/tiering.py)."""
        if key not in self.tiering.rent:
            self.dynamic.validate(args, kwargs)  # a wrong dynamic= option raises as a compile would
            _log_runtime.info("dynamic: new sizes %s run eagerly until their calls cost one build (%.2f s)",
                              [x[1] for x in key[1] if x[0] == "T"], build_estimate())
        t0 = time.perf_counter()
        out = self._eager(args, kwargs)
        self.tiering.charge(key, time.perf_counter() - t0)
        return out

    def _trains(self, tensors: list[torch.Tensor]) -> bool:
        """A call that needs gradients runs the differentiable (forward + backward) programs."""
        if self.freeze or not isinstance(self.fn, torch.nn.Module):
            return False
        return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in self.fn.parameters())

    def _train_entry(self, key: tuple, args: tuple, kwargs: dict) -> Any:
        from .train_entry import TrainEntry

        entry = self._train_entries.get(key)
        if entry is None:
            with self._lock:
                entry = self._train_entries.get(key)
                if entry is None:
                    if has_meta_state(self.fn):
                        raise RuntimeError("this model's parameters or buffers are on the meta device (no data): "
                                           "its programs can be compiled and inspected (compile_only, explain) "
                                           "but not run or trained")
                    entry = TrainEntry(self.fn, args, kwargs, {**self.options, "backend": self.backend})
                    self._train_entries[key] = entry
                    self.compilations += 1
        return entry

    def _sizes_vary_in_training(self, key: tuple) -> bool:
        """A call that needs gradients at a third size of one input structure (programs for two
        other sizes exist), or any size when `dynamic=` was given: training with varying lengths
        (dynamic padding) must not build a forward and backward per length, so such calls go to
        `_dynamic_trainer`. Two sizes do not (a last, smaller batch), as in `_maybe_automatic_dynamic`."""
        if not self.options.tiered:
            return False
        same = sum(1 for k in self._train_entries if _same_structure(k, key))
        return bool(self._dynamic_arg) or same >= AUTOMATIC_DYNAMIC_AFTER

    def _dynamic_trainer(self) -> Any:
        """`torch.compile(fn, backend="novaforge", dynamic=True)` with this module's options: Dynamo
        guards each graph's size assumptions and builds symbolic forward and backward programs (one
        for all sizes its guards admit; docs/dynamic-shapes.md), AOTAutograd differentiates them."""
        if self._trainer is None:
            with self._lock:
                if self._trainer is None:
                    options = {**self.options, "backend": self.backend}
                    self._trainer = torch.compile(self.fn, backend="novaforge", dynamic=True, options=options)
                    self.compilations += 1
                    _log_runtime.info("training at a new size of one input structure: varying sizes train through "
                                      "Dynamo with dynamic shapes from now on")
        return self._trainer

    def _needs_grad(self, tensors: list[torch.Tensor], entry: Entry) -> bool:
        if not torch.is_grad_enabled():
            return False
        return any(t.requires_grad for t in tensors) or any(t.requires_grad for t in entry.binding.refs)

    def _compile(self, args: tuple, kwargs: dict) -> Entry:
        from .generation import capturing

        with capturing():  # a forward replaced by `generate` traces the original
            captured = self.dynamic.specialized(args, kwargs) if self.dynamic is not None else None
            stats = compile_graph(self.fn, args, kwargs, freeze=self.freeze, backend=self.backend,
                                  options=self.options, captured=captured)
        self.compilations += 1
        record_build(stats.times["total_s"])
        _log_runtime.info("new input signature: program %d compiled", self.compilations)
        self.last_stats = stats
        return Entry(stats, self.fn)

    def stats(self) -> CompileStats | None:
        """The last compiled program's stats; for a module only ever called with gradients, its
        differentiable forward program's."""
        if self.last_stats is None:
            for entry in reversed(self._train_entries.values()):
                stats = entry.stats()
                if stats is not None:
                    return stats
        return self.last_stats

    def compile_only(self, *args: Any, **kwargs: Any) -> CompileStats:
        """Capture, optimize and generate/build the program for these inputs without running it
        and without data: parameters, buffers and inputs may be on the meta device (a model
        built under `torch.device("meta")`), and no arena or constant is allocated. Returns
        the compile stats (graph, pass records, kernels, program)."""
        from .generation import capturing

        with capturing():
            stats = compile_graph(self.fn, args, kwargs, freeze=False, backend=self.backend,
                                  options={**self.options, "compile_only": True})
        self.last_stats = stats
        return stats

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's `generate` with every forward call compiled (transformers models; a
        static KV cache by default, so decoding builds a bounded number of programs: see
        novaforge/generation.py)."""
        from .decode_loop import loop_installed
        from .generation import generate

        return generate(self, args, kwargs, loop_installed if self.options.decode_loop else None)

    def bind(self, args: tuple, kwargs: dict | None = None, *, state_each_call: bool = True) -> tuple[Any, Any]:
        """Call `self(*args, **kwargs)` once (compiling if needed) and return (again, the result):
        `again()` runs the same program on the same input objects, which the caller updates in
        place between calls (a decode loop's token, positions and cache), without flattening the
        inputs or checking their signature again. It sees reassigned or changed parameters (the
        binding is refreshed, and a stale one takes the full call, which recompiles) at every
        call, or with `state_each_call=False` only at the bind: for a loop during which the
        parameters cannot change (one `generate()` call; a frozen model's 148 tensors cost
        ~0.3 ms a token to check); the program's input bindings and the memory checks of the
        results are then made once, at the bind, too (`Entry.bind_call`: an int8 GPT-2's ~290
        inputs cost ~1.3 ms a token, 1.22x, bound per call). A call that does not run one plain
        program (training, Dynamo, an eager tier, a program for symbolic sizes, inputs sharing
        memory with a mutated one) gives `again` = the full call."""
        kwargs = kwargs or {}
        result = self(*args, **kwargs)
        key, tensors, objs, _ = self._call_key(args, kwargs)

        def full() -> Any:
            return self(*args, **kwargs)

        entry = self._programs.get(key)
        if entry is None or self._via_dynamo is not None or key[2] or self.dynamic is not None or \
                (entry.mut_targets and mutated_shares_memory(tensors, entry.binding.refs, entry.mut_targets)):
            return full, result

        once = None if state_each_call else entry.bind_call(tensors)  # (bound once: no per-call checks)

        def again() -> Any:
            now = self._programs.get(key)
            if now is None or (state_each_call and not now.binding.refresh()):
                return full()
            return now.run(tensors, objs, False, once if now is entry else None)

        return again, result

    def _call_key(self, args: tuple, kwargs: dict) -> tuple[tuple, list[torch.Tensor], list[Any], Any]:
        """(the program key of a call, its tensors, its other leaves, its flattening or None)."""
        flat = None
        if not kwargs and all(type(a) is torch.Tensor or type(a) is torch.nn.Parameter for a in args):
            # fast path (no pytree work): positional plain tensors or parameters (a compiled training step's
            # call); keyed apart from the general path
            tensors, objs, spec_key = list(args), [], len(args)
        else:
            flat = pytrees.flatten((tuple(args), dict(kwargs)))
            tensors, objs, spec_key = flat.leaves, flat.objs, flat.spec.key
        key = (spec_key, _signature(tensors), torch.is_grad_enabled(), autocast_modes(), self._modes.key())
        return key, tensors, objs, flat


AUTOMATIC_DYNAMIC_AFTER = 2  # programs of one input structure before a new size makes its dims dynamic
SHARED_INSTANCES = 8  # sizes of shared programs kept instantiated per compiled callable (a large arena is shared)


def _same_structure(a: tuple, b: tuple) -> bool:
    """Are two call keys (spec, per-tensor signature, grad mode, autocast and module modes) the same
    but for sizes? Every tensor keeps its rank, dtype, device, requires-grad and contiguity."""
    if a[0] != b[0] or a[2:] != b[2:] or len(a[1]) != len(b[1]) or a[1] == b[1]:
        return False
    for x, y in zip(a[1], b[1], strict=True):
        if x[0] != "T" or y[0] != "T":
            if x != y:
                return False
            continue
        if len(x[1]) != len(y[1]) or x[2:4] != y[2:4] or x[6] != y[6] or x[5] or y[5]:
            return False
        if x[4] != contiguous_strides(x[1]) or y[4] != contiguous_strides(y[1]):
            return False
    return True


def _distinct(args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> tuple[tuple, dict]:
    """`args, kwargs` with tensors copied where the call's tensors share memory."""
    if not share_memory(tensors, []):
        return args, kwargs
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), (args, kwargs))


def _probably_cpu(backend: str, args: tuple, kwargs: dict) -> bool:
    """The CPU backend will build this graph (a guess from the inputs before capture: a wrong guess
    only builds the GEMM library early)."""
    if backend == "auto":
        backend = settings.backend_override() or "auto"
    if backend != "auto":
        return backend == "cpu"
    leaves = pytree.tree_leaves((args, kwargs))
    return all(t.device.type == "cpu" for t in leaves if isinstance(t, torch.Tensor))


def _capture_cached(fn: Any, args: tuple, kwargs: dict, freeze: bool, options: Options,
                    fake: bool) -> Captured:
    """capture(), or its result from the captured-graph cache (frontend/graph_cache.py)."""
    from .frontend import graph_cache

    mode = options.capture
    key = None
    if mode == "fx" and graph_cache.enabled(options):  # (a fake capture keeps no constants: freeze is off)
        key = graph_cache.key_for(fn, pytrees.flatten((tuple(args), dict(kwargs))), freeze and not fake, options,
                                  fake=fake)
        hit = graph_cache.load(key, fn) if key is not None else None
        if hit is not None:
            hit.cache_key = key
            return hit
    captured = capture(fn, args, kwargs, freeze=freeze, mode=mode, fake=fake, random=options.random)
    if key is not None and graph_cache.store(key, captured, fn):
        captured.cache_key = key
    return captured


def _optimize(fn: Any, captured: Captured, opts: Options, be: Any) -> tuple[Graph, list[PassRecord], bool]:
    """run_pipeline, or its result from the optimized-graph cache (cache/pipeline_cache.py):
    (graph, records, whether it was a hit)."""
    from .cache import pipeline_cache

    target = be.target() if be is not None else None
    key = None
    if be is not None and captured.cache_key is not None and isinstance(fn, torch.nn.Module):
        state = set(flatten_state({**dict(fn.named_parameters(remove_duplicate=False)),
                                   **dict(fn.named_buffers(remove_duplicate=False))}))
        key = pipeline_cache.key_for(captured, state, opts, be, target)
    hit = pipeline_cache.load(key) if key is not None else None
    if hit is not None:
        return (*hit, True)
    graph, records = run_pipeline(captured.graph, options=opts, target=target, backend=be)
    if key is not None:
        pipeline_cache.store(key, graph, records)
    return graph, records, False


def compile_graph(fn: Any, args: tuple, kwargs: dict, *, freeze: bool, backend: str,
                  options: dict[str, Any], captured: Captured | None = None) -> CompileStats:
    """Capture, optimize and build a program for one input signature (with its log topics,
    progress line and dump folder: `novaforge.logs`). `captured`: a graph already captured for
    these inputs (a symbolic capture specialized to their sizes), used instead of tracing."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    with logs.compile_session(name) as session, paused_gc():
        stats = _compile_graph(fn, args, kwargs, freeze=freeze, backend=backend, options=options, session=session,
                               captured=captured)
    _log_runtime.info("compiled %s in %.2f s (%s backend)", name, stats.times["total_s"], stats.backend)
    return stats


_log_runtime = logs.get_logger("runtime")


def _compile_graph(fn: Any, args: tuple, kwargs: dict, *, freeze: bool, backend: str,
                   options: Options | dict[str, Any], session: logs.CompileSession,
                   captured: Captured | None = None) -> CompileStats:
    t0 = time.perf_counter()
    options = Options.of(options)
    session.stage("capture")
    if _probably_cpu(backend, args, kwargs):
        from .codegen.cpu.backend import start_background_builds

        start_background_builds()  # the GEMM library and the kernels' header compile while the model is captured
    fake = options.compile_only or has_meta_state(fn)
    if captured is None:
        with torch.no_grad() if freeze else contextlib.nullcontext():
            captured = _capture_cached(fn, args, kwargs, freeze, options, fake)
    t1 = time.perf_counter()
    chosen = resolve_backend(backend, captured.graph)
    from .codegen.registry import get_backend

    be = get_backend(chosen)
    opts = options.replace(backend=chosen) if options.backend == "auto" else options
    if session.dump is not None and not opts.dump_dir:
        opts = opts.replace(dump_dir=str(session.dump.path))  # the Triton backend writes its sources there
    graph, records, optimized_hit = _optimize(fn, captured, opts, be)
    t2 = time.perf_counter()
    session.stage(f"codegen and build, {sum(1 for n in graph.nodes if n.op == 'kernel')} kernels")
    program = be.build(graph, opts) if be is not None else None
    if program is not None and check_numerics.enabled(opts):  # every kernel against the interpreter
        program = check_numerics.maybe_wrap(program, graph, be, opts)
    t3 = time.perf_counter()
    times = dict(captured.times)
    times.update({"capture_s": t1 - t0, "passes_s": t2 - t1, "codegen_s": t3 - t2, "total_s": t3 - t0})
    if optimized_hit:
        times["optimized_cache_hit"] = 1.0
    if session.dump is not None:
        info = getattr(program, "info", None)
        src = info.get("source_dir") if isinstance(info, dict) else None  # the CPU backend's sources
        if src:
            session.dump.copy_tree(Path(src), "cpu", "generated C++ source")
        session.dump.finish(f"{chosen} backend, {len(graph.nodes)} nodes, compiled in {t3 - t0:.2f} s")
    return CompileStats(captured, graph, records, times, chosen, program)


def compile(model: Any = None, *, freeze: bool = False, backend: str = "auto", dynamic: Any = False,
            **options: Any):
    """Compile an nn.Module or function. Usable as `novaforge.compile(model)` or as a decorator.

    freeze: treat parameters and buffers as constants (inference; enables folding them).
    backend: 'auto' (cpu for CPU tensors, triton for CUDA), 'cpu', 'triton' or 'interpret'.
    dynamic: True (every dim > 1 of every tensor input), or {argument name or tensor index:
    {dim: (lo, hi) or None}}: those sizes are traced once as symbols and each new size is
    specialized from that one trace (frontend/dynamic.py; no re-trace per size).
    options: compiler options (see docs/options.md), e.g. capture='fx' (default) or 'export'.
    A model trained with torch.distributed (DistributedDataParallel, FSDP2's fully_shard, tensor
    parallel DTensor parameters) is compiled as `torch.compile(model, backend="novaforge")`
    (distributed.py: DDP's reducer and FSDP2's hooks run from Python at every call).
    """
    if model is None:
        return lambda m: compile(m, freeze=freeze, backend=backend, dynamic=dynamic, **options)
    from .distributed import distributed_style

    style = distributed_style(model)
    if style is not None:
        # DDP's reducer and FSDP2's / parallelize_module's hooks run Python at every call, which a
        # captured graph would skip: compile through Dynamo (which splits the graph at DDP's
        # gradient buckets and runs the hooks), with novaforge compiling each piece
        if freeze and style == "ddp":
            raise ValueError("freeze=True with DistributedDataParallel: DDP is for training; compile the "
                             "inner module for inference")
        if freeze:
            raise ValueError(f"freeze=True with a {style} model: its parameters are sharded state that "
                             "torch.distributed updates; compile without freeze")
        _log_runtime.info("%s model: compiled through torch.compile(backend='novaforge')", style)
        if style == "fsdp":
            _log_runtime.warning("FSDP2 model: its hooks are Dynamo graph breaks, so a forward that loops over "
                                 "FSDP-managed blocks runs its own ops (embedding, head, loss) eagerly and each "
                                 "block's forward compiled (TORCH_LOGS=graph_breaks shows where; docs/distributed.md)")
        return torch.compile(model, backend="novaforge", options={**options, "backend": backend})
    return CompiledModule(model, freeze=freeze, backend=backend, options=options, dynamic=dynamic)

"""Capture: nn.Module or function + example inputs -> IR graph, via torch.export (mode
'export') or make_fx over functional_call (mode 'fx', the default; see capture_fx.py).

`torch.export` (non-strict) traces the program to ATen. When the traced graph contains
in-place ops it is functionalized (`run_decompositions({})`), which turns buffer updates into
explicit outputs; otherwise that step is skipped, since it costs seconds on large models and
the traced graph is already functional. Parameters and buffers become `param`/`buffer` graph
inputs bound from the module at each call, or `const` inputs when `freeze=True`.

Invariant: `Captured.graph` computes exactly what the module computed for inputs of the
captured signature; any construct that cannot be captured raises `CaptureError` with the
module and the reason (data-dependent control flow names the user's source line).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import types
from typing import Any

import torch
import torch.utils._pytree as pytree

from .. import settings
from ..ir.ops.random import random_mode
from .captured import (  # noqa: F401 (re-exported: the errors and Captured are capture's API)
    Captured,
    CaptureError,
    DataDependentError,
    HookedModuleError,
    StatefulForwardError,
    UntraceableError,
    user_frame,
)
from .lower import InputSpec, UnsupportedError, lower_fx
from .module_state import freezable


class _FnModule(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _keep_source_lines_of(fn) -> None:
    """torch.export keeps stack frames of `forward` methods only; mark a plain function's frames
    as user code too, so errors and dumps can name its source lines."""
    anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if anchor is not None and hasattr(fn, "__code__"):
        anchor(fn)


def _mutating(gm: torch.fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        if n.op == "call_function" and schema is not None and schema.is_mutable:
            return True
    return False


def _export(module: torch.nn.Module, args: tuple, kwargs: dict):
    try:
        return torch.export.export(module, args, kwargs, strict=False)
    except Exception as e:  # export raises many types; keep the first lines, which name the cause
        msg = str(e).strip().splitlines()
        head = "\n".join(msg[:12])
        kind = "data-dependent" if "data-dependent" in str(e) or "GuardOnDataDependent" in type(e).__name__ else ""
        hint = (" (control flow or shapes that depend on tensor values cannot be compiled; "
                "move them out of the compiled region)") if kind else ""
        from .capture_fx import op_without_fake

        no_fake = op_without_fake(e)
        if no_fake is not None:
            hint = (f" ({no_fake} has no fake (meta) implementation: register one with "
                    f"`@torch.library.register_fake(\"{no_fake}\")`)")
        where = user_frame(e)
        raise CaptureError(f"torch.export could not capture {type(module).__name__}{hint}"
                           f"{' at ' + where if where else ''}: {type(e).__name__}: {head}") from e


CAPTURE_MODES = ("fx", "export")
# Tracing is not thread-safe (fake-tensor and proxy state, the process-wide `is_compiling`
# flag that capture_fx sets): one capture at a time per process; other threads' eager code
# keeps running.
_CAPTURE_LOCK = threading.RLock()
TRACING_LOCK = _CAPTURE_LOCK  # also held by other tracers of this package (training's AOTAutograd trace)


def shadow_module(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree that shares every parameter, buffer and attribute value but has
    its own parameter/buffer/submodule and hook tables (a library that installs hooks lazily at
    its first call, as transformers' output capturing does, must not install them twice on the
    user's module). Tracing swaps fake tensors into those tables
    (`functional_call`), so tracing the shadow leaves the user's module untouched for eager
    code running in other threads. A forward that `novaforge.generation` installed on an
    instance is dropped from the shadow (it traces the module's own forward). A forward set on
    an instance as a bound method of a module of the tree is rebound to that module's shadow; any
    other one (a closure, a functools.partial) may hold the user's module, so then the user's
    module itself is returned and traced."""
    memo: dict[int, torch.nn.Module] = {}
    originals: dict[int, torch.nn.Module] = {}

    def go(m: torch.nn.Module) -> torch.nn.Module:
        if id(m) in memo:
            return memo[id(m)]
        new = copy.copy(m)
        memo[id(m)] = new
        originals[id(m)] = m
        d = new.__dict__
        d["_parameters"] = dict(m._parameters)
        d["_buffers"] = dict(m._buffers)
        d["_modules"] = {k: (go(v) if v is not None else None) for k, v in m._modules.items()}
        for k, v in list(d.items()):  # hooks installed while tracing stay on the shadow
            if "hooks" in k and isinstance(v, dict):
                d[k] = type(v)(v)
        fwd = d.get("forward")
        if fwd is not None and getattr(fwd, "_novaforge_replaced", False):
            own = fwd._novaforge_own
            if own is None:
                del d["forward"]
            else:
                d["forward"] = own
        return new

    root = go(module)
    # a bound method of a module of the tree kept as an instance attribute (`m.forward = m.forward`,
    # what wrapping and unwrapping a forward leaves behind) is rebound to that module's shadow:
    # bound to the user's module it would read the user's parameters, not the traced ones
    for new in memo.values():
        for k, v in list(new.__dict__.items()):
            owner = getattr(v, "__self__", None) if isinstance(v, types.MethodType) else None
            if owner is not None and originals.get(id(owner)) is owner:
                new.__dict__[k] = types.MethodType(v.__func__, memo[id(owner)])
    # any other forward set on an instance (a closure or functools.partial around the original
    # forward, as patching libraries install) may hold the user's module itself, which no shadow
    # can redirect: then the user's module is traced (its tables hold the traced tensors during
    # the capture, like torch.func.functional_call's)
    # (not where novaforge.generation installed a forward: the user's module would run that one)
    if not any(getattr(m.__dict__.get("forward"), "_novaforge_replaced", False) for m in originals.values()):
        for new in memo.values():
            fwd = new.__dict__.get("forward")
            if fwd is not None and not (isinstance(fwd, types.MethodType) and id(fwd.__self__) in originals):
                return module
    return root


def _tensor_state(value: Any) -> Any:
    """What identifies an attribute value that holds tensors (a tensor, or a list / tuple of
    them) by identity; None for any other value."""
    if isinstance(value, torch.Tensor):
        return id(value)
    if isinstance(value, (list, tuple)) and value and any(isinstance(v, torch.Tensor) for v in value):
        return tuple(id(v) for v in value)
    return None


@contextlib.contextmanager
def tensor_attributes_watched(root: torch.nn.Module, name: str = ""):
    """Within the block (a trace of `root`), no module of the tree may assign a tensor (or a list
    of tensors) to a plain attribute, nor replace or drop one: on leaving, such an assignment
    raises StatefulForwardError naming the attributes, and every changed attribute gets its old
    value back (the traced tensors assigned are fakes or proxies)."""
    from .module_state import NN_INTERNAL

    modules = list(root.named_modules(remove_duplicate=True)) if isinstance(root, torch.nn.Module) else []
    before = [{k: v for k, v in m.__dict__.items() if k not in NN_INTERNAL} for _, m in modules]
    changed = []
    try:
        yield
    finally:
        for (path, m), old in zip(modules, before, strict=True):
            d = m.__dict__
            for k in set(d) | set(old):
                if k in NN_INTERNAL:
                    continue
                a, b = old.get(k), d.get(k)
                sa, sb = _tensor_state(a), _tensor_state(b)
                if (sa is None and sb is None) or sa == sb:
                    continue
                changed.append(f"{path + '.' if path else ''}{k}")
                if k in old:
                    d[k] = a
                else:
                    del d[k]
    if changed:
        raise StatefulForwardError(
            f"{name or type(root).__name__}'s forward assigns tensors to module attributes ({', '.join(changed[:4])}"
            f"{', ...' if len(changed) > 4 else ''}): state kept between calls outside parameters, buffers and "
            "arguments, which one compiled program would drop")


AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_modes() -> tuple:
    """The autocast modes a trace records ((device type, dtype) for each device where autocast is
    on): a capture under `torch.autocast` holds its casts, so every key a program is kept under
    (the compiled call's, a symbolic structure's, the graph cache's) includes these, and a call
    in another mode gets its own program, as eager's results follow the mode of each call."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES if torch.is_autocast_enabled(d))


def has_meta_state(module: Any) -> bool:
    """Whether a module's parameters or buffers live on the meta device (no data: compile only)."""
    if not isinstance(module, torch.nn.Module):
        return False
    return any(t.device.type == "meta" for t in (*module.parameters(), *module.buffers()))


def capture(module: Any, args: tuple, kwargs: dict | None = None, *, freeze: bool = False,
            mode: str = "fx", fake: bool = False, dynamic: list | None = None, random: str = "counter") -> Captured:
    """Capture `module(*args, **kwargs)`. mode 'fx' (default, fast: see capture_fx.py) or
    'export' (torch.export). fake=True traces without data (parameters, buffers and inputs as
    fake tensors, meta ones placed on the CPU): for compile-only use, the graph has no
    frozen constants. dynamic (mode 'fx'; per user tensor, {dim: (lo, hi)}, see
    frontend/dynamic.py) traces those dims as symbols: the graph's types hold `Sym`s and
    `Captured.symbols` their table. `random`: how random ATen ops lower (ir/ops/random.py).
    Captures are serialized process-wide."""
    with _CAPTURE_LOCK, random_mode(random):
        if dynamic is not None:
            from .capture_fx import capture_fx

            if mode != "fx" or fake:
                raise ValueError("symbolic capture (dynamic=) needs capture='fx' and real inputs")
            mod = shadow_module(module) if isinstance(module, torch.nn.Module) else _FnModule(module)
            if not isinstance(module, torch.nn.Module):
                _keep_source_lines_of(module)
            with tensor_attributes_watched(mod, type(module).__name__):
                return capture_fx(mod, tuple(args), kwargs or {}, freeze=freeze,
                                  is_function=not isinstance(module, torch.nn.Module), dynamic=dynamic)
        return _capture(module, args, kwargs, freeze=freeze, mode=mode, fake=fake)


def _capture(module: Any, args: tuple, kwargs: dict | None, *, freeze: bool, mode: str, fake: bool) -> Captured:
    if mode not in CAPTURE_MODES:
        raise ValueError(f"capture mode must be one of {CAPTURE_MODES}, got {mode!r}")
    kwargs = kwargs or {}
    mod = shadow_module(module) if isinstance(module, torch.nn.Module) else _FnModule(module)
    if not isinstance(module, torch.nn.Module):
        _keep_source_lines_of(module)
    if fake and mode != "fx":
        raise ValueError("compiling without data (meta parameters, compile_only) needs capture='fx'")
    if mode == "fx":
        from .capture_fx import capture_fx

        with tensor_attributes_watched(mod, type(module).__name__):
            return capture_fx(mod, tuple(args), kwargs, freeze=freeze and not fake,
                              is_function=not isinstance(module, torch.nn.Module), fake=fake,
                              replicate=mod is not module and settings.replicate_layers_enabled())
    t0 = time.perf_counter()
    with tensor_attributes_watched(mod, type(module).__name__):
        ep = _export(mod, tuple(args), kwargs)
    t1 = time.perf_counter()
    if _mutating(ep.graph_module):
        ep = ep.run_decompositions({})
    t2 = time.perf_counter()
    sig = ep.graph_signature
    from torch.export.graph_signature import InputKind, OutputKind

    params = dict(mod.named_parameters(remove_duplicate=False))
    buffers = dict(mod.named_buffers(remove_duplicate=False))
    specs: list[InputSpec] = []
    refs: list[torch.Tensor] = []
    frozen: list[torch.Tensor] = []
    user_index = 0
    ph_index: dict[str, int] = {}
    user_ph: list[int] = []
    for i, s in enumerate(sig.input_specs):
        ph_index[s.arg.name] = i
        if s.kind == InputKind.USER_INPUT and not isinstance(getattr(s.arg, "name", None), str):
            specs.append(InputSpec("skip", "constant"))
        elif s.kind == InputKind.USER_INPUT and not isinstance(_placeholder_val(ep, s.arg.name), torch.Tensor):
            specs.append(InputSpec("skip", s.arg.name))  # a non-tensor argument, specialized by export
        elif s.kind == InputKind.USER_INPUT:
            specs.append(InputSpec("user", f"input{user_index}"))
            user_ph.append(i)
            user_index += 1
        elif s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            t = params.get(s.target) if s.kind == InputKind.PARAMETER else buffers.get(s.target)
            if t is None:
                t = ep.state_dict.get(s.target, ep.constants.get(s.target))
            if t is None:
                raise CaptureError(f"cannot find {s.kind.name.lower()} {s.target}")
            if freeze and freezable(t):
                specs.append(InputSpec("const", s.target, t.detach()))
                frozen.append(t)
            else:
                specs.append(InputSpec("param" if s.kind == InputKind.PARAMETER else "buffer", s.target))
                refs.append(t)
        elif s.kind == InputKind.CONSTANT_TENSOR:
            specs.append(InputSpec("const", s.target, ep.constants[s.target].detach()))
        else:
            raise CaptureError(f"unsupported graph input kind {s.kind.name} ({s.target})")

    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0])
    outputs: list[Any] = []
    mutations: list[tuple[int, int]] = []
    mutated_user: list[int] = []
    for j, s in enumerate(sig.output_specs):
        if s.kind == OutputKind.USER_OUTPUT:
            outputs.append(out_args[j])
        elif s.kind == OutputKind.BUFFER_MUTATION:
            if freeze:
                raise CaptureError(f"freeze=True but the model updates buffer {s.target} (training-mode "
                                   "BatchNorm?); call model.eval() or compile without freeze")
            idx = next(i for i, ss in enumerate(sig.input_specs) if ss.target == s.target
                       and ss.kind == InputKind.BUFFER)
            outputs.append(out_args[j])
            mutations.append((idx, len(outputs) - 1))
        elif s.kind == OutputKind.USER_INPUT_MUTATION:
            idx = ph_index[s.target]
            outputs.append(out_args[j])
            mutations.append((idx, len(outputs) - 1))
            mutated_user.append(user_ph.index(idx))
        else:
            raise CaptureError(f"unsupported graph output kind {s.kind.name}")
    aten_ops = sum(1 for n in ep.graph.nodes if n.op == "call_function"
                   and isinstance(n.target, torch._ops.OpOverload)
                   and n.target is not torch.ops.aten._assert_tensor_metadata.default)
    try:
        graph, ctx = lower_fx(ep.graph_module, specs, output_nodes=outputs, mutations=mutations)
    except UnsupportedError as e:
        raise type(e)(f"{type(mod).__name__}: {e}") from None
    t3 = time.perf_counter()
    graph.meta["aten_ops"] = aten_ops
    return Captured(
        graph=graph,
        out_spec=ep.call_spec.out_spec,
        param_refs=refs,
        aten_ops=aten_ops,
        externs=ctx.externs,
        times={"export_s": t1 - t0, "functionalize_s": t2 - t1, "lower_s": t3 - t2},
        mutated_inputs=mutated_user,
        frozen=frozen,
    )


def _placeholder_val(ep, name: str):
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name == name:
            return n.meta.get("val")
    return None


def flatten_inputs(args: tuple, kwargs: dict) -> tuple[list[Any], Any]:
    return pytree.tree_flatten((tuple(args), dict(kwargs)))

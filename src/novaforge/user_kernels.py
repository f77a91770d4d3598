"""`novaforge.register_kernel`: a kernel of the user's own for an ATen op or a small pattern.

    rope = novaforge.register_kernel(apply_rope, example_inputs=(q, cos, sin), cpp=SOURCE,
                                     cost=dict(flops=3 * q.numel(), bytes=...))
    fast = novaforge.compile(model)     # each match of apply_rope whose cost wins calls SOURCE
    rope.calls, rope.unregister()       # (or `with novaforge.register_kernel(...):`)

The pattern is an ATen op overload (`torch.ops.aten.gelu.default`) or a function of tensors;
it is traced on `example_inputs` by novaforge's own capture and lowering, then canonicalized by
the graph passes that run before the `user_kernels` pass (passes/user_kernels.py), so it has the
form the model's graph has there. The pattern returns one tensor and reads only its arguments.

Implementations (docs/user-kernels.md):

* `cpp=`: C++ source defining `extern "C" void <name>(const T* in0, ..., T* out, const int64_t*
  sizes)`: one pointer per pattern argument (contiguous, in order), the contiguous output, and
  the sizes of every argument then of the output, each argument's rank fixed by the pattern.
  Compiled once per source and target with the CPU backend's compiler flags (codegen/cpu/build.py;
  cached under the kernel cache, `user_kernels/`).
* `triton=`, `grid=` (and `meta=`, its constexpr arguments): a `@triton.jit` kernel, launched as
  `kernel[grid](in0, ..., out, *sizes, **meta)` (`grid`: a tuple, or a callable of
  (in0, ..., out) returning one).

`cost=`: `dict(flops=..., bytes=...)` or `dict(ns=...)`, or a callable of the argument shapes
returning such a dict. The pass compares it, through the target's roofline (schedule/), with
what novaforge would generate for the match.

The kernel is a torch custom op `novaforge_user::<name>_<digest>` (a CPU kernel for C++, CPU and
CUDA kernels for Triton, a fake kernel from the pattern, and autograd through the pattern's
reference), so a replaced match is an ordinary `extern` node every backend and the interpreter
run. Invariants: a registration whose kernel differs from the pattern's reference on the example
inputs is refused; with `check=True` (default) the first call for each input signature is also
compared with the reference (`UserKernelMismatch`); `calls` counts the kernel's calls. Programs
compiled before a registration keep what they had, and so do programs compiled with a kernel
that is unregistered later (its op stays defined: each op name is defined once per process).
"""

from __future__ import annotations

import ctypes
import hashlib
import inspect
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import settings
from .ir.types import TensorType
from .passes import user_kernels as registry

__all__ = ["UserKernel", "UserKernelError", "UserKernelMismatch", "register_kernel", "registered_kernels",
           "unregister_kernel"]


class UserKernelError(ValueError):
    """A registration novaforge cannot use (the message names the problem)."""


class UserKernelMismatch(RuntimeError):
    """A user kernel computed something else than its pattern's reference."""


_LOCK = threading.Lock()
_HANDLES: dict[str, UserKernel] = {}
_OP_NAMES: set[str] = set()  # custom op names defined in this process: each once, and never removed
# (a program compiled with a kernel calls its op by name, ir/extern.py `resolve`, after an unregister too)
_LIBRARIES: list[torch.library.Library] = []


def _fresh_op_name(base: str) -> str:
    with _LOCK:
        name, i = base, 1
        while name in _OP_NAMES:
            i += 1
            name = f"{base}_{i}"
        _OP_NAMES.add(name)
        return name


CALL_NS = 500.0  # a kernel call's fixed cost in the roofline (both sides: generated and the user's)


# ------------------------------------------------------------------ tracing the pattern
def _canonical_passes() -> list:
    from .passes.pipeline import graph_passes

    passes = graph_passes()
    names = [n for n, _ in passes]
    return passes[:names.index("user_kernels")] if "user_kernels" in names else passes


def trace_pattern(fn: Callable, types: Sequence[TensorType]):
    """The pattern `fn` as IR at `types`, canonicalized like a model's graph at the pass."""
    from .frontend.capture import capture
    from .passes.context import PassContext

    args = tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in types)
    graph = capture(fn, args, fake=True).graph
    for _name, p in _canonical_passes():
        graph = p(graph, PassContext())
    return graph


def _check_pattern(name: str, graph) -> None:
    from .ir import OPS

    if len(graph.outputs) != 1:
        raise UserKernelError(f"register_kernel({name}): the pattern returns {len(graph.outputs)} tensors; "
                              "a pattern returns one tensor")
    for gi in graph.inputs:
        if gi.kind != "user":
            raise UserKernelError(f"register_kernel({name}): the pattern reads a tensor that is not one of its "
                                  f"arguments ({gi.kind} {gi.name!r}: a global or closure tensor)")
    used = {v for n in graph.nodes for v in n.inputs}
    for i, gi in enumerate(graph.inputs):
        if gi.value not in used:
            raise UserKernelError(f"register_kernel({name}): argument {i} is not used by the pattern")
    root = graph.producer(graph.outputs[0])
    if root is None or OPS[root.op].has("view"):
        raise UserKernelError(f"register_kernel({name}): the pattern's result is an argument or a view of one; "
                              "it must compute something")
    bad = [n.op for n in graph.nodes if OPS[n.op].has("random") or OPS[n.op].has("side_effect")]
    if bad:
        raise UserKernelError(f"register_kernel({name}): the pattern has random or side-effecting ops ({bad})")


# ------------------------------------------------------------------ cost
def estimate_ns(flops: float, nbytes: float, target: Any) -> float:
    """The roofline of one kernel call on the compile's target (schedule/: the CPU configurator's
    two-term model, or the GPU's DRAM bandwidth and fp32 peak), plus `CALL_NS`."""
    from .schedule.cpu import KernelShape
    from .schedule.cpu import estimate_ns as cpu_estimate
    from .schedule.gpu import GpuTarget
    from .schedule.target import CpuTarget, detect_cpu_target

    if isinstance(target, GpuTarget):
        return CALL_NS + 1e9 * (nbytes / target.mem_bandwidth + flops / target.peak("fp32"))
    if not isinstance(target, CpuTarget):
        target = detect_cpu_target()
    return CALL_NS + cpu_estimate(KernelShape("pointwise", 1, 1, flops=flops, bytes=nbytes), target)


def _cost_key(cost: Any) -> str:
    """What identifies a cost across processes: a dict's repr, a callable's code and the values
    it closes over; a random key where those cannot be read (no cache hit in another process)."""
    if not callable(cost):
        return repr(cost)
    try:
        cells = [c.cell_contents for c in (cost.__closure__ or ())]
        return inspect.getsource(cost) + repr(cost.__defaults__) + repr(cells)
    except (OSError, TypeError, ValueError, AttributeError):
        import uuid

        return uuid.uuid4().hex


def _cost_fn(name: str, cost: Any) -> Callable:
    def parse(d: Any) -> tuple[float, float] | float:
        if not isinstance(d, dict) or not (set(d) == {"ns"} or set(d) <= {"flops", "bytes"} and "bytes" in d):
            raise UserKernelError(f"register_kernel({name}): cost must be dict(flops=..., bytes=...) or dict(ns=...) "
                                  f"(or a callable of the argument shapes returning one), got {d!r}")
        return float(d["ns"]) if "ns" in d else (float(d.get("flops", 0.0)), float(d["bytes"]))

    if callable(cost):
        return lambda types, out: parse(cost(*(torch.Size(t.shape) for t in types)))
    fixed = parse(cost)
    return lambda types, out: fixed


# ------------------------------------------------------------------ implementations
def _build_cpp(name: str, source: str, digest: str) -> Callable:
    """The C++ function `name` from `source`, compiled (or loaded from the cache)."""
    from .codegen.cpu.build import CompileError, compile_library
    from .schedule.target import detect_cpu_target

    target = detect_cpu_target()
    tdigest = hashlib.sha256(target.key().encode()).hexdigest()[:8]
    folder = settings.cache_root() / "user_kernels" / f"{name}-{digest}-{tdigest}"
    lib_path = folder / "lib.so"
    if not lib_path.exists():
        prelude = "#include <cstdint>\n#include <cmath>\n#include <algorithm>\n"
        try:
            compile_library([prelude + source], lib_path, target, folder)
        except CompileError as e:
            raise UserKernelError(f"register_kernel({name}): the C++ source does not compile: {e}") from None
    lib = ctypes.CDLL(str(lib_path))
    try:
        fn = getattr(lib, name)
        fn.restype = None
        return fn
    except AttributeError:
        raise UserKernelError(f"register_kernel({name}): the C++ source defines no extern \"C\" function "
                              f"named {name!r}") from None


def _sizes(xs: Sequence[torch.Tensor], out: torch.Tensor) -> list[int]:
    return [d for x in (*xs, out) for d in x.shape]


class UserKernel:
    """A registered kernel: `calls` counts its calls; `unregister()` (or leaving a `with`)
    removes it from later compiles."""

    def __init__(self, name: str, fn: Callable, language: str, check: bool, digest: str) -> None:
        self.name, self.reference, self.language, self.check, self.digest = name, fn, language, check, digest
        self.calls = 0
        self.op_name = _fresh_op_name(f"{name}_{digest[:10]}")
        self.target = f"{registry.USER_OP_NAMESPACE}.{self.op_name}.default"
        self.launch: Callable[[list[torch.Tensor], torch.Tensor], None] | None = None
        self.library: torch.library.Library | None = None
        self._out: dict[tuple, tuple] = {}  # argument signature -> (output shape, dtype)
        self._checked: set[tuple] = set()
        self.cost_text = ""
        self.pattern_text = name
        self.dtypes: list[torch.dtype] = []  # the examples' dtypes and ranks: what the kernel is called with
        self.ranks: list[int] = []

    def __repr__(self) -> str:
        return f"UserKernel({self.name}, {self.language}, calls={self.calls})"

    def __enter__(self) -> UserKernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.unregister()

    def unregister(self) -> None:
        unregister_kernel(self)

    @property
    def registered(self) -> bool:
        return _HANDLES.get(self.name) is self

    def _out_like(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        sig = tuple((tuple(x.shape), x.dtype) for x in xs)
        if sig not in self._out:
            ref = self.reference(*(torch.empty(x.shape, dtype=x.dtype, device="meta") for x in xs))
            self._out[sig] = (tuple(ref.shape), ref.dtype)
        shape, dtype = self._out[sig]
        return torch.empty(shape, dtype=dtype, device=xs[0].device)

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        """Run the kernel (what the custom op's CPU/CUDA kernel does)."""
        if [x.dtype for x in xs] != self.dtypes or [x.dim() for x in xs] != self.ranks:
            raise TypeError(f"user kernel {self.name} takes {self.dtypes} of ranks {self.ranks} (its examples), "
                            f"got {[x.dtype for x in xs]} of ranks {[x.dim() for x in xs]}")
        xs = tuple(x.contiguous() for x in xs)
        out = self._out_like(xs)
        assert self.launch is not None
        self.launch(list(xs), out)
        self.calls += 1
        sig = tuple((tuple(x.shape), x.dtype) for x in xs)
        if self.check and sig not in self._checked:
            self._compare(xs, out)
            self._checked.add(sig)
        return out

    def _compare(self, xs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        with torch.no_grad():
            ref = self.reference(*xs)
        tol = 1e-4 if ref.dtype in (torch.float32, torch.float64) else 2e-2
        if ref.shape != out.shape or not torch.allclose(out, ref, rtol=tol, atol=tol, equal_nan=True):
            diff = (out.float() - ref.float()).abs().max().item() if ref.shape == out.shape else "shape"
            raise UserKernelMismatch(f"user kernel {self.name} ({self.language}) differs from its pattern's "
                                     f"reference on inputs {[tuple(x.shape) for x in xs]}: max |diff| {diff}")


def _make_op(k: UserKernel, n_args: int, devices: Sequence[str]) -> None:
    """The custom op `novaforge_user::<op_name>` running `k`."""
    ns = registry.USER_OP_NAMESPACE
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"{k.op_name}(" + ", ".join(f"Tensor x{i}" for i in range(n_args)) + ") -> Tensor")
    for dev in devices:
        lib.impl(k.op_name, lambda *xs: k(*xs), dev)
    qual = f"{ns}::{k.op_name}"

    def fake(*xs):
        ref = k.reference(*xs)
        return ref.new_empty(ref.shape)

    torch.library.register_fake(qual, fake, lib=lib)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):  # through the pattern's reference
        xs = [x.detach().requires_grad_(x.is_floating_point()) for x in ctx.saved_tensors]
        with torch.enable_grad():
            out = k.reference(*xs)
        wrt = [x for x in xs if x.requires_grad]
        gs = iter(torch.autograd.grad(out, wrt, grad, allow_unused=True))
        return tuple(next(gs) if x.requires_grad else None for x in xs)

    torch.library.register_autograd(qual, backward, setup_context=setup_context, lib=lib)
    k.library = lib
    _LIBRARIES.append(lib)  # (a Library removes its op when collected)


# ------------------------------------------------------------------ the API
def _pattern_fn(pattern: Any) -> tuple[Callable, str]:
    if isinstance(pattern, torch._ops.OpOverload):
        return (lambda *xs: pattern(*xs)), pattern._schema.name.split("::")[-1]
    if isinstance(pattern, torch._ops.OpOverloadPacket):
        raise UserKernelError(f"register_kernel: {pattern} is an op packet; name an overload "
                              f"({pattern}.default)")
    if callable(pattern):
        return pattern, getattr(pattern, "__name__", "pattern")
    raise UserKernelError(f"register_kernel: the pattern must be an ATen op overload or a function of tensors, "
                          f"got {type(pattern).__name__}")


def register_kernel(pattern: Any, *, example_inputs: Sequence[torch.Tensor], cost: Any, cpp: str | None = None,
                    triton: Any = None, grid: Any = None, meta: dict[str, Any] | None = None, name: str | None = None,
                    check: bool = True) -> UserKernel:
    """Register a kernel for `pattern` (module docstring; docs/user-kernels.md). Returns its handle."""
    fn, default_name = _pattern_fn(pattern)
    name = name or default_name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UserKernelError(f"register_kernel: name {name!r} is not an identifier (name the kernel with name=)")
    if (cpp is None) == (triton is None):
        raise UserKernelError(f"register_kernel({name}): give exactly one implementation, cpp= or triton=")
    if triton is not None and grid is None:
        raise UserKernelError(f"register_kernel({name}): a Triton kernel needs grid= (a tuple or a callable)")
    if name in _HANDLES:
        raise UserKernelError(f"register_kernel: a kernel named {name!r} is registered already "
                              "(unregister it, or pass name=)")
    xs = tuple(example_inputs)
    if not xs or not all(isinstance(x, torch.Tensor) for x in xs):
        raise UserKernelError(f"register_kernel({name}): example_inputs must be a non-empty tuple of tensors")
    cost_fn = _cost_fn(name, cost)
    try:
        n_params = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        n_params = len(xs)
    if n_params != len(xs) and not isinstance(pattern, torch._ops.OpOverload):
        raise UserKernelError(f"register_kernel({name}): the pattern takes {n_params} arguments, "
                              f"example_inputs has {len(xs)}")
    types = tuple(TensorType.of(x) for x in xs)
    try:
        graph = trace_pattern(fn, types)
    except Exception as e:
        raise UserKernelError(f"register_kernel({name}): cannot trace the pattern ({type(e).__name__}: {e})") from e
    _check_pattern(name, graph)
    impl_text = cpp if cpp is not None else getattr(triton, "src", None) or repr(triton)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(pattern)
    digest = hashlib.sha256("\0".join([name, src, str(graph), str(impl_text)]).encode()).hexdigest()[:16]
    k = UserKernel(name, fn, "C++" if cpp is not None else "Triton", check, digest)
    k.dtypes, k.ranks = [x.dtype for x in xs], [x.dim() for x in xs]
    k.pattern_text = str(pattern) if isinstance(pattern, torch._ops.OpOverload) else getattr(fn, "__qualname__", name)
    k.cost_text = repr(cost) if not callable(cost) else getattr(cost, "__name__", "callable")
    if cpp is not None:
        cfn = _build_cpp(name, cpp, digest)

        def launch(ins: list[torch.Tensor], out: torch.Tensor) -> None:
            flat = _sizes(ins, out)
            sizes = (ctypes.c_int64 * max(1, len(flat)))(*flat)
            cfn(*[ctypes.c_void_p(x.data_ptr()) for x in ins], ctypes.c_void_p(out.data_ptr()), sizes)
    else:
        def launch(ins: list[torch.Tensor], out: torch.Tensor) -> None:
            g = grid(*ins, out) if callable(grid) else grid
            triton[g](*ins, out, *_sizes(ins, out), **(meta or {}))
    k.launch = launch
    with _LOCK:
        if name in _HANDLES:
            raise UserKernelError(f"register_kernel: a kernel named {name!r} is registered already "
                                  "(unregister it, or pass name=)")
        # the kernel against the reference on the examples, before anything uses it
        k._compare(xs, _run_unchecked(k, xs))
        _make_op(k, len(xs), ["CPU"] if cpp is not None else ["CPU", "CUDA"])
        registry.register(registry.PatternKernel(
            name=name, target=k.target, language=k.language, pattern=graph,
            trace=lambda ts, fn=fn: trace_pattern(fn, ts), cost=cost_fn, estimate_ns=estimate_ns,
            digest=hashlib.sha256(f"{k.target}\0{_cost_key(cost)}".encode()).hexdigest(),
            devices=("cpu",) if cpp is not None else ("cpu", "cuda")))
        _HANDLES[name] = k
    return k


def _run_unchecked(k: UserKernel, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    ins = [x.contiguous() for x in xs]
    out = k._out_like(ins)
    assert k.launch is not None
    k.launch(ins, out)
    return out


def unregister_kernel(kernel: UserKernel | str) -> None:
    """Remove a registration (by handle or name); later compiles no longer use it."""
    name = kernel if isinstance(kernel, str) else kernel.name
    with _LOCK:
        k = _HANDLES.get(name)
        if k is None or (not isinstance(kernel, str) and k is not kernel):
            return
        del _HANDLES[name]
        registry.unregister(name)  # (its op stays defined: programs compiled with it keep calling it)


def registered_kernels() -> list[UserKernel]:
    return list(_HANDLES.values())


def user_kernel_of(target: str) -> UserKernel | None:
    """The registered kernel an extern target calls, if any (for reports)."""
    return next((k for k in _HANDLES.values() if k.target == target), None)

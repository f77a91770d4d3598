"""Fast capture: make_fx over a functionalized `functional_call`, with fake tensors.

This is the default capture (`capture="fx"`); `capture="export"` uses torch.export. Both give
a functional ATen graph with parameters and buffers as inputs; this path is 3-5x faster on
transformer models (GPT-2: ~1 s instead of ~5 s on our 2-core machine) because it skips
export's pre-dispatch trace, its guards and its verifier, which compile time cannot afford.

How it works: parameters, buffers and the tensor leaves of the call's (args, kwargs) become
the traced function's inputs, in that order; non-tensor leaves are specialized (they are part
of the runtime guard). Leaves come from `pytrees.flatten`, which also opens transformers cache
objects, so a KV cache passed in or returned is a set of graph inputs and outputs.
`torch.func.functionalize` turns in-place updates of inputs into trailing `copy_(input,
value)` nodes, which become `Graph.mutations` (buffer updates, user input mutations). The
output structure is recorded during tracing (`pytrees.Spec`, including which results are the
call's own input objects or tensors) and rebuilt at run time.
Invariant: the same as capture.py's — the graph computes what the module computes for inputs
of the captured signature, or capture raises a clear error.
"""

from __future__ import annotations

import contextlib
import linecache
import logging
import os
import re
import sys
import threading
import time
from typing import Any

import torch
import torch.utils._python_dispatch

from ..ir.ops.random import RngReplay, counter_mode, is_random_target, rng_replay
from . import pytrees
from .dynamic import SymbolConverter, symbolic_inputs
from .lower import InputSpec, UnsupportedError, lower_fx
from .module_state import freezable
from .replicate_layers import ReplayMismatch, replicated_layers
from .subclass_state import flatten_state, rebuild_state


@contextlib.contextmanager
def tracing_flags():
    """Tell libraries that a compiler is tracing (torch.compiler.is_compiling() and
    is_exporting() are True, as under torch.export), so they take their trace-friendly paths
    (e.g. transformers skips data-dependent mask checks)."""
    old = (torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag)
    try:
        torch.compiler._is_compiling_flag = True
        torch.compiler._is_exporting_flag = True
        yield
    finally:
        torch.compiler._is_compiling_flag, torch.compiler._is_exporting_flag = old


def _has_mutation(gm: torch.fx.GraphModule) -> bool:
    """Whether the plain trace needs functionalizing: any in-place op except a final
    `copy_(input, value)` (an input overwritten once, its old value not read afterwards), which
    already is the form functionalization produces. (A training step that writes its updated
    parameters back this way stays traceable: autograd.grad cannot be functionalized.)"""
    nodes = list(gm.graph.nodes)
    copied: set[torch.fx.Node] = set()
    for i, n in enumerate(nodes):
        schema = getattr(n.target, "_schema", None)
        if n.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        dst = n.args[0] if n.args else None
        final_copy = (n.target is torch.ops.aten.copy_.default and isinstance(dst, torch.fx.Node)
                      and dst.op == "placeholder" and dst not in copied and not n.users
                      and all(u is n or nodes.index(u) < i for u in dst.users))
        if not final_copy:
            return True
        copied.add(dst)
    return False


# backward ops that a traced `torch.autograd.grad` (compile_step) leaves in the graph: their
# decompositions are pointwise ops and reductions the passes fuse and the backends generate,
# where the ops themselves would run as ATen calls between kernels
_BACKWARD_DECOMPOSED = (
    "native_layer_norm_backward", "_fused_rms_norm_backward", "native_group_norm_backward", "gelu_backward",
    "silu_backward", "tanh_backward", "sigmoid_backward", "threshold_backward", "_log_softmax_backward_data",
    "_softmax_backward_data", "nll_loss_backward", "embedding_dense_backward", "native_dropout_backward",
    "mse_loss_backward", "select_backward", "slice_backward",
)


def _decompositions(symbolic: bool = False) -> dict:
    """Ops whose in-place effects functionalization cannot see unless they are decomposed
    (native_batch_norm updates running statistics without declaring it in its schema), and the
    backward ops of `_BACKWARD_DECOMPOSED`; with symbolic sizes also `constant_pad_nd`, whose
    fake-tensor kernel reads the concrete sizes (transformers' ForCausalLMLoss pads the labels:
    every size of a compile_step over a causal LM was specialized, then ran eagerly)."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    ops = [aten.native_batch_norm.default] + [getattr(aten, name) for name in _BACKWARD_DECOMPOSED
                                              if hasattr(aten, name)]
    table = get_decompositions(ops)
    if symbolic:
        table[aten.constant_pad_nd.default] = _pad_by_cat
    return table


def _pad_by_cat(x: torch.Tensor, pad: list, value: float = 0) -> torch.Tensor:
    """constant_pad_nd as narrow (negative pads) and cat with constant blocks: ops whose fake
    kernels keep sizes symbolic."""
    for i in range(len(pad) // 2):
        d = x.dim() - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0:
            x, lo = x.narrow(d, -lo, x.shape[d] + lo), 0
        if hi < 0:
            x, hi = x.narrow(d, 0, x.shape[d] + hi), 0
        parts = []
        for n in (lo, hi):
            shape = list(x.shape)
            shape[d] = n
            parts.append(x.new_full(shape, value) if n else None)
        pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
        x = torch.cat(pieces, d) if len(pieces) > 1 else x
    return x.clone() if not pad or all(p == 0 for p in pad) else x


def _storage(t: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(t.untyped_storage())
    except Exception:  # a tensor without storage (functional wrappers): never an alias
        return None


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()), int(t.storage_offset()))


def _spans(base: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether every element of `t`'s layout lies inside `base` (a contiguous tensor at offset 0
    of the same storage), so `t` can be rebuilt as `base.as_strided(...)`: the first chunk of a
    tensor is such a base for itself but not for the whole tensor returned after it."""
    if t.numel() == 0:
        return True
    last = int(t.storage_offset()) + sum((int(n) - 1) * int(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return last < int(base.numel())


def _dense(t: torch.Tensor) -> bool:
    """Whether `t` covers its elements' storage exactly once from offset 0 (contiguous in some
    order of its dimensions)."""
    if t.storage_offset() != 0:
        return False
    expected = 1
    for n, st in sorted(((int(n), int(st)) for n, st in zip(t.shape, t.stride(), strict=True) if n > 1),
                        key=lambda p: p[1]):
        if st != expected:
            return False
        expected *= n
    return True


def _can_rebuild(base: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether result `t` can be rebuilt as a view of result `base`: eager's base is dense and
    holds `t`'s elements. The program's base is viewed in its own layout where that gives
    eager's view (`pytrees.view_of_result`), else re-laid out as eager's base first
    (`pytrees.unflatten`), so the view is always contiguous where eager's is."""
    return _dense(base) and _spans(base, t)


def _alias_decisions(results: list[torch.Tensor], in_storage: dict[Any, int],
                     hidden: list[int] | None = None) -> list[pytrees.Spec | None]:
    """For each result tensor in flattening order: how eager's result aliases an input or another
    result (`in_view`, `out_ref`, `out_view`), or None for a fresh leaf. A view's base may come
    before it or after it (`(y[0], y)`): leaf numbers count only the results that stay leaves.
    Results that share the storage of an intermediate the program does not return (`y[0]` and
    `y[1:]` of an unreturned `y`) become views of that base, returned as a hidden leaf after
    all others: `hidden` receives, per hidden leaf, the number of a result whose `_base` it is."""
    n = len(results)
    kind: list[tuple | None] = [None] * n  # ("ref"|"view", result number) or ("in", input number)
    for k, t in enumerate(results):
        st = _storage(t)
        same = next((j for j in range(k) if results[j] is t), None)
        if same is not None:
            kind[k] = ("ref", same)
        elif st is not None and st in in_storage:
            kind[k] = ("in", in_storage[st])
    is_base = [False] * n
    for k, t in enumerate(results):
        st = _storage(t)
        if kind[k] is not None or st is None or is_base[k]:
            continue
        bases = [j for j in range(n) if j != k and kind[j] is None and results[j] is not t
                 and _storage(results[j]) == st and _can_rebuild(results[j], t)]
        earlier = [j for j in bases if j < k]
        if earlier:  # the first earlier base, as results are numbered
            kind[k] = ("view", earlier[0])
        elif bases:  # a later base: the largest one (the tensor the others are views of)
            j = max(bases, key=lambda j: results[j].numel())
            kind[k], is_base[j] = ("view", j), True
    hidden_of: dict[Any, int] = {}  # storage -> hidden leaf number
    for k, t in enumerate(results):
        st = _storage(t)
        if hidden is None or kind[k] is not None or st is None or is_base[k]:
            continue
        sharing = [j for j in range(n) if kind[j] is None and not is_base[j] and _storage(results[j]) == st
                   and results[j] is not t]
        base = t._base
        # results without elements share nothing observable (and a functionalized re-trace
        # could not view the base back from them)
        if not sharing or base is None or not all(_can_rebuild(base, results[j]) and results[j].numel()
                                                  for j in [k, *sharing]):
            continue
        if st not in hidden_of:
            hidden_of[st] = len(hidden)
            hidden.append(k)
        for j in [k, *sharing]:
            kind[j] = ("hidden", hidden_of[st])
    same_as: dict[int, int] = {}  # the same tensor again, where its first occurrence became a view
    for k in range(n):
        what = kind[k]
        if what is not None and what[0] == "ref" and kind[what[1]] is not None:
            kind[k], same_as[k] = kind[what[1]], what[1]
    leaf_no, count = {}, 0
    for k in range(n):
        if kind[k] is None:
            leaf_no[k], count = count, count + 1
    out: list[pytrees.Spec | None] = []
    for k, t in enumerate(results):
        what = kind[k]
        if k in same_as:  # one Spec object: unflatten rebuilds it once, so both are one tensor
            out.append(out[same_as[k]])
        elif what is None:
            out.append(None)
        elif what[0] == "ref":
            j = leaf_no[what[1]]
            out.append(pytrees.Spec("out_ref", index=j, key=("out_ref", j)))
        elif what[0] == "in":
            lay = _layout(t)
            out.append(pytrees.Spec("in_view", value=lay, index=what[1], key=("in_view", what[1], lay)))
        elif what[0] == "hidden":  # a view of the hidden leaf after the `count` plain ones
            j, lay = count + what[1], (_layout(t), _layout(t._base))
            out.append(pytrees.Spec("out_view", value=lay, index=j, key=("out_view", j, lay)))
        else:
            j, lay = leaf_no[what[1]], (_layout(t), _layout(results[what[1]]))
            out.append(pytrees.Spec("out_view", value=lay, index=j, key=("out_view", j, lay)))
    return out


def _alias_classifier(inputs: list[torch.Tensor], results: list[torch.Tensor], out_info: dict[str, Any]):
    """Which results eager returns as the call's input tensors themselves (`in_tensor`), as views
    of its inputs or of other results, or fresh (None: the program returns them fresh).
    `results` are all result tensors in flattening order, inputs included. The plain,
    non-functionalized trace sees real aliasing; a functionalized re-trace replays what the
    plain one found (there `x.add_(1).contiguous()` of a strided `x` would look like `x` itself,
    where eager's is a fresh tensor). `out_info["hidden"]` gets the bases returned as hidden
    leaves (see `_alias_decisions`): in a re-trace, the bases of the results at the same places."""
    if "aliases" not in out_info:
        in_ids = {id(t): i for i, t in enumerate(inputs)}
        in_storage: dict[Any, int] = {}
        for i, t in enumerate(inputs):
            st = _storage(t)
            if st is not None:
                in_storage.setdefault(st, i)
        others = [t for t in results if id(t) not in in_ids]
        hidden: list[int] = []
        at = {id(t): k for k, t in enumerate(results)}

        def decide(hidden_list: list[int] | None) -> list[pytrees.Spec | None]:
            found_others = iter(_alias_decisions(others, in_storage, hidden_list))
            return [pytrees.Spec("in_tensor", index=in_ids[id(t)], key=("in_tensor", in_ids[id(t)]))
                    if id(t) in in_ids else next(found_others) for t in results]

        out_info["aliases"] = decide(hidden)
        out_info["hidden_at"] = [at[id(others[k])] for k in hidden]
        out_info["hidden_layout"] = [_layout(others[k]._base) for k in hidden]
        # without hidden leaves: for a re-trace whose views lost their base (functionalized
        # traces): such results then come back as unshared copies with the right values
        out_info["aliases_unhidden"] = decide(None) if hidden else out_info["aliases"]
    bases = [results[k]._base for k in out_info["hidden_at"]]
    if any(b is None for b in bases):  # a functionalized re-trace: the base, viewed from its view
        bases = [results[k].as_strided(size, stride, 0)
                 for k, (size, stride, _) in zip(out_info["hidden_at"], out_info["hidden_layout"], strict=True)]
    if any(b is None for b in bases):
        out_info["aliases"], out_info["hidden_at"], bases = out_info["aliases_unhidden"], [], []
    out_info["hidden"] = bases
    found = iter(out_info["aliases"])
    return lambda t, leaves: next(found, None)


def _fake_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fake tensors of the same shapes, strides and dtypes (meta ones on the CPU), no memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    out = []
    for t in tensors:
        device = torch.device("cpu") if t.device.type == "meta" else t.device
        with mode:
            out.append(torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device))
    return out


_INTERNAL_DIRS = (os.path.dirname(torch.__file__) + os.sep,
                  os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                  os.path.dirname(contextlib.__file__) + os.sep)
_MODEL_DIRS = (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench") + os.sep,)
_internal_code: dict[Any, bool] = {}  # code object -> whether it is torch's, novaforge's or the stdlib's


def _innermost_user_frame() -> str:
    """'  File "path", line N, in fn\n    code' for the innermost frame outside torch, novaforge
    (its benchmark models, _MODEL_DIRS, count as the user's) and the standard library (the format
    of an FX stack trace, read by lower.source_line); '' if none."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        internal = _internal_code.get(code)
        if internal is None:
            internal = _internal_code[code] = (code.co_filename.startswith(_INTERNAL_DIRS)
                                               and not code.co_filename.startswith(_MODEL_DIRS)) or \
                code.co_filename.startswith("<")
        if not internal:
            line = linecache.getline(code.co_filename, f.f_lineno).strip()
            return f'  File "{code.co_filename}", line {f.f_lineno}, in {code.co_name}\n    {line}'
        f = f.f_back
    return ""


@contextlib.contextmanager
def _user_lines():
    """While make_fx traces, each call_function node records its innermost user frame as its
    stack_trace (one frame, no symbolization of the whole stack)."""
    from torch.fx.experimental.proxy_tensor import PythonKeyTracer

    original = PythonKeyTracer.create_node

    def create_node(self, kind, *args, **kwargs):
        node = original(self, kind, *args, **kwargs)
        if kind == "call_function" and "stack_trace" not in node.meta:
            node.meta["stack_trace"] = _innermost_user_frame()
        return node

    PythonKeyTracer.create_node = create_node
    try:
        yield
    finally:
        PythonKeyTracer.create_node = original


def capture_fx(mod: torch.nn.Module, args: tuple, kwargs: dict, *, freeze: bool, is_function: bool,
               fake: bool = False, dynamic: list | None = None, replicate: bool = False):
    """Capture a module without make_fx's stack traces (about a quarter of its time goes into
    symbolizing a whole stack per node): each node instead records its innermost user frame
    (`_user_lines`, a walk up the live frames), which is the provenance line the IR, the
    report and the bisector show. If lowering then fails, capture again with full stack traces,
    so the error names the user's source line. Plain functions are captured the same way (a
    compile_step's step is one: forward, backward and the optimizer, about 1.5 s of stack traces
    for GPT-42M). `replicate`: trace each distinct layer of the module's layer lists once
    (replicate_layers.py); only for a module tree no other thread runs (a shadow module)."""
    try:
        return _capture_fx(mod, args, kwargs, freeze=freeze, is_function=is_function, fake=fake, stacks=False,
                           dynamic=dynamic, replicate=replicate)
    except Exception as e:
        from .captured import CaptureError

        if isinstance(e, CaptureError) or getattr(e, "_nf_from_tracing", False):
            raise  # a tracing error: its message already names the user's frame
        return _capture_fx(mod, args, kwargs, freeze=freeze, is_function=is_function, fake=fake, stacks=True,
                           dynamic=dynamic)


class _CountRandom(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the RNG stream position of every random ATen op the trace runs."""

    def __init__(self, replay: RngReplay, position: list[int]) -> None:
        super().__init__()
        self.replay, self.position = replay, position

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if is_random_target(func):
            self.replay.positions.append(self.position[0])
            self.position[0] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _follow_rng(replay: RngReplay):
    """Trace with torch.get_rng_state / set_rng_state followed (RngReplay): a state taken at
    position p and set again later moves the trace's position back to p. The functions still do
    what they do; other threads see them unchanged."""
    position = [0]
    taken: dict[int, tuple[torch.Tensor, int]] = {}
    me = threading.get_ident()
    get0, set0 = torch.get_rng_state, torch.set_rng_state

    def get_rng_state() -> torch.Tensor:
        t = get0()
        if threading.get_ident() == me:
            taken[id(t)] = (t, position[0])
        return t

    def set_rng_state(new_state: torch.Tensor) -> None:
        if threading.get_ident() == me and id(new_state) in taken and taken[id(new_state)][0] is new_state:
            if position[0] != taken[id(new_state)][1]:
                replay.restored = True
            position[0] = taken[id(new_state)][1]
        set0(new_state)

    torch.get_rng_state, torch.set_rng_state = get_rng_state, set_rng_state
    try:
        with _CountRandom(replay, position):
            yield
    finally:
        torch.get_rng_state, torch.set_rng_state = get0, set0


def _functionalize_traced(gm: torch.fx.GraphModule, example: tuple) -> torch.fx.GraphModule:
    """The traced graph gm, functionalized: its in-place ops become functional ones, and writes
    to its inputs trailing `copy_` nodes. Used where the user's function cannot be traced again
    under functionalization: a compile_step whose model mutates intermediates (dropout's
    `bernoulli_` and `div_` on the CPU) calls autograd.grad, which functorch transforms refuse.
    Each node keeps its source line (the interpreter hands node metadata to the new trace)."""
    from torch.fx import traceback as fx_traceback
    from torch.utils import _pytree

    def run(*xs: Any) -> Any:
        return torch.fx.Interpreter(gm).run(*xs)

    custom = _mutates_in_custom_op(gm)
    fn = _python_functionalize(run) if custom else torch.func.functionalize(run, remove="mutations")
    return _fake_trace(fn, _pytree.tree_leaves(example), False, fx_traceback.preserve_node_meta())


def op_without_fake(e: BaseException | None) -> str | None:
    """The qualified name (`mylib::foo`) of the non-ATen op whose missing fake implementation
    failed the trace, if that is what `e` (or an exception it chains from) is."""
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    for _ in range(8):
        if e is None:
            return None
        op = getattr(e, "func", None) if isinstance(e, UnsupportedOperatorException) else None
        if isinstance(op, torch._ops.OpOverload) and op.namespace not in ("aten", "prims"):
            return op._schema.name
        custom = re.search(r"no fake impl registered for <CustomOpDef\(([\w.]+::[\w.]+)\)>", str(e))
        if isinstance(e, RuntimeError) and custom:  # (a torch.library.custom_op's own refusal)
            return custom.group(1)
        e = e.__cause__ or e.__context__
    return None


def _mutates_in_custom_op(gm: torch.fx.GraphModule) -> bool:
    """Whether the plain trace calls an op outside ATen that mutates its arguments (a custom op's
    `mutates_args`)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target.namespace not in ("aten", "prims") and n.target._schema.is_mutable
               for n in gm.graph.nodes)


def _python_functionalize(fn: Any) -> Any:
    """fn functionalized by torch's Python functionalization (AOTAutograd's and torch.export's):
    a custom op that mutates its arguments becomes `auto_functionalized_v2` (the op called on
    copies, lowered as one extern), in-place ATen ops functional ones, and each input fn
    mutates is written back by a trailing `copy_`, as `torch.func.functionalize` writes it."""
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch.utils import _pytree

    def unwrap(t: FunctionalTensor) -> torch.Tensor:
        torch._sync(t)
        return torch._from_functional_tensor(t.elem)

    def inner(*args: Any) -> Any:
        exclude = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        with exclude, FunctionalTensorMode():
            fargs = [FunctionalTensor.to_functional(a) if isinstance(a, torch.Tensor) else a for a in args]
            out = _pytree.tree_map_only(FunctionalTensor, unwrap, fn(*fargs))
            for a, fa in zip(args, fargs, strict=True):
                if isinstance(fa, FunctionalTensor):
                    torch._sync(fa)
                    if torch._functionalize_has_data_mutation(fa.elem):
                        a.copy_(torch._from_functional_tensor(fa.elem))
        return out

    return inner


def _fake_trace(fn: Any, args: Any, stacks: bool, context: Any, symbolic: bool = False) -> torch.fx.GraphModule:
    """make_fx of fn on fake tensors, with novaforge's decompositions, under `context`. The graph
    module's Python code is generated only if something calls it (lowering reads the graph; the
    code of a 70B model's graph takes ~0.2 s)."""
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad(), tracing_flags(), context, _use_lazy_graph_module(True):
        return make_fx(fn, tracing_mode="fake", record_stack_traces=stacks, _allow_non_fake_inputs=True,
                       decomposition_table=_decompositions(symbolic))(*args)


def _traced(exc: BaseException) -> BaseException:
    """Mark an error as raised while tracing, so the capture is not retried with stack traces."""
    exc._nf_from_tracing = True  # type: ignore[attr-defined]
    return exc


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """Fake-tensor mode logs every meta kernel that raises at ERROR, with its traceback, before
    the exception reaches the capture (a user's call with mismatched shapes printed 20 lines of
    torch internals above eager's error, which the compiled call then raises). The exception
    itself is kept and reported; only that log is silenced while tracing (traces are serialized
    by TRACING_LOCK, so the logger's level is not raced)."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    old = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(old)


def _eager_error(traced, example: tuple) -> BaseException | None:
    """The exception eager raises on the example inputs (None if it runs them). Only called after
    tracing failed: it tells "eager rejects these inputs" (the compiled call raises the same error)
    from "the tracer cannot follow eager here" (an UnsupportedError). It runs on copies of the
    tensors, so neither the caller's inputs nor the module's state change."""
    def copies(ts):
        return [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in ts]

    try:
        with torch.no_grad():
            traced(copies(example[0]), copies(example[1]), copies(example[2]))
    except Exception as e:  # noqa: BLE001 - eager's own verdict on the inputs
        return e
    return None


def _object_state(obj: Any) -> tuple:
    """What a cache object holds, shallowly: each attribute's tensor or object by identity (lists
    and tuples of them element by element), other values by value."""
    def one(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return tuple(one(x) for x in v)
        return ("id", id(v)) if isinstance(v, torch.Tensor) or pytrees.is_cache_object(v) else ("v", repr(v))
    return tuple((k, one(v)) for k, v in vars(obj).items())


def _check_objects_returned_if_updated(objs: list[Any], before: list[tuple], out_spec: Any, name: str) -> None:
    """A cache object the call receives and updates in place (a transformers decoder layer's
    `past_key_values.update(...)`) must be among the results, whose unflattening writes the update
    back into the caller's object; updated and not returned, one compiled program would drop the
    update: StatefulForwardError (then `novaforge.compile` goes through Dynamo, which replays it)."""
    covered: set[int] = set()

    def walk(spec: Any) -> None:
        if spec.kind == "in_obj":
            covered.update(id(o) for o in pytrees.flatten(objs[spec.value]).objs)
        for c in spec.children:
            walk(c)

    walk(out_spec)
    changed = [type(o).__name__ for o, b in zip(objs, before, strict=True)
               if id(o) not in covered and _object_state(o) != b]
    if changed:
        from .captured import StatefulForwardError

        raise StatefulForwardError(f"{name}'s forward updates the {changed[0]} passed to it in place without returning "
                                   "it: one compiled program would drop the update")


def _capture_fx(mod: torch.nn.Module, args: tuple, kwargs: dict, *, freeze: bool, is_function: bool,
                fake: bool, stacks: bool, dynamic: list | None = None, replicate: bool = False):

    from .captured import Captured, CaptureError, DataDependentError, UntraceableError

    # wrapper-subclass state (torchao weights) is bound as its inner tensors (frontend/subclass_state.py)
    state_now = {**dict(mod.named_parameters()), **dict(mod.named_buffers())}
    params, buffers = flatten_state(dict(mod.named_parameters())), flatten_state(dict(mod.named_buffers()))
    pnames, bnames = list(params), list(buffers)
    flat_in = pytrees.flatten((tuple(args), dict(kwargs)))
    out_info: dict[str, Any] = {}
    tracing = [False]  # traced() runs under make_fx (not on real tensors for eager's verdict)

    def traced(param_list, buffer_list, tensor_args):
        trace_objs: list[Any] = []  # the cache objects the traced call receives, by number
        a, k = pytrees.unflatten(flat_in.spec, list(tensor_args), objs_out=trace_objs)
        state = rebuild_state(state_now, {**dict(zip(pnames, param_list, strict=True)),
                                          **dict(zip(bnames, buffer_list, strict=True))})
        replay = RngReplay()
        before = [_object_state(o) for o in trace_objs]
        with _follow_rng(replay) if tracing[0] else contextlib.nullcontext():  # (not when eager's error is asked)
            out = torch.func.functional_call(mod, state, tuple(a), k, tie_weights=True, strict=False)
        if tracing[0]:
            out_info["rng"] = replay  # (set when the trace completes: a failed retrace keeps the first trace's)
        in_objs = {id(o): i for i, o in enumerate(trace_objs)}
        results: list[torch.Tensor] = []  # every result tensor, in flattening order
        pytrees.flatten(out, inputs_objs=in_objs, tensor_alias=lambda t, leaves: results.append(t))
        flat_out = pytrees.flatten(out, inputs_objs=in_objs,
                                   tensor_alias=_alias_classifier(tensor_args, results, out_info))
        _check_objects_returned_if_updated(trace_objs, before, flat_out.spec, type(mod).__name__)
        out_info["spec"] = flat_out.spec
        out_info["consts"] = pytrees.non_plain_consts(flat_out.spec)
        return [*flat_out.leaves, *out_info["hidden"]]  # hidden bases: leaves after the plain ones

    t0 = time.perf_counter()
    example = ([p.detach() for p in params.values()], list(buffers.values()), list(flat_in.leaves))
    if fake:  # no data: trace on fake tensors (meta ones placed on the CPU)
        n_p, n_b = len(example[0]), len(example[1])
        fakes = _fake_copies([*example[0], *example[1], *example[2]])
        example = (fakes[:n_p], fakes[n_p:n_p + n_b], fakes[n_p + n_b:])
    if dynamic is not None:  # symbolic sizes: the user tensors' chosen dims are symbols
        mode, sym_fakes = symbolic_inputs(example[2], dynamic)
        static = [mode.from_tensor(t, static_shapes=True) for t in (*example[0], *example[1])]
        example = (static[:len(example[0])], static[len(example[0]):], sym_fakes)

    def trace(functional: bool):
        fn = torch.func.functionalize(traced, remove="mutations") if functional else traced
        tracing[0] = True
        try:
            # (functionalize's wrappers hide the proxies a replay reads; a functional retrace is rare)
            enabled = replicate and not functional and dynamic is None
            for attempt in (enabled, False)[:2 if enabled else 1]:
                try:
                    with _quiet_fake_tensor_log(), replicated_layers(mod, enabled=attempt) as replication:
                        gm = _fake_trace(fn, example, stacks, contextlib.nullcontext() if stacks else _user_lines(),
                                         symbolic=dynamic is not None)
                    break
                except ReplayMismatch:  # (a layer's cache held another length: trace every layer)
                    continue
            out_info["replayed_layers"] = replication.replayed
            return replication.inline(gm)
        finally:
            tracing[0] = False

    try:
        # most models mutate nothing: trace once without functionalization, which is cheaper,
        # and trace again functionalized only when the graph contains in-place ops
        gm = trace(False)
        if _mutates_in_custom_op(gm):  # functorch's functionalize refuses them: torch's Python one
            gm = _functionalize_traced(gm, example)
        elif _has_mutation(gm):
            try:
                gm = trace(True)
            except Exception as first:
                try:  # (a traced autograd.grad, as compile_step's, cannot be functionalized; its graph can)
                    gm = _functionalize_traced(gm, example)
                except Exception:
                    raise first from None
            if _has_mutation(gm):  # in-place ops inside a composite that functionalize traced through
                gm = _functionalize_traced(gm, example)  # (SDPA's math path: dropout's bernoulli_, div_)
    except Exception as e:
        head = "\n".join(str(e).strip().splitlines()[:12])
        dd = "data-dependent" in str(e) or "_local_scalar_dense" in str(e) or "GuardOnDataDependent" in type(e).__name__
        hint = (" (control flow or shapes that depend on tensor values cannot be compiled; move them out of "
                "the compiled region)") if dd else ""
        from .captured import user_frame

        where = user_frame(e)
        at = f" at {where}" if where else ""
        msg = f"could not capture {type(mod).__name__}{hint}{at}: {type(e).__name__}: {head}"
        eager_exc = None if fake else _eager_error(traced, example)
        if eager_exc is not None:  # eager raises on these inputs too: raise as eager does
            raise _traced(eager_exc) from None
        no_fake = op_without_fake(e)
        if no_fake is not None:  # a clear refusal: Dynamo would only split the graph there
            raise _traced(UnsupportedError(
                f"{no_fake}{at} has no fake (meta) implementation, so novaforge cannot trace it into its graph: "
                f"register one with `@torch.library.register_fake(\"{no_fake}\")` (a function of fake tensors "
                "that returns outputs of the right shapes, dtypes and devices), or "
                "`.register_fake` on a `torch.library.custom_op`")) from e
        if dd:
            raise _traced(DataDependentError(msg)) from e
        if not fake:  # eager runs these inputs, the tracer cannot: a clear refusal, not a crash
            raise _traced(UntraceableError(msg)) from e
        raise CaptureError(msg) from e
    t1 = time.perf_counter()
    if out_info.get("consts"):
        raise CaptureError(f"{type(mod).__name__} returns values novaforge cannot rebuild {out_info['consts'][:3]}; "
                           "compiled functions return tensors, Python numbers and transformers caches "
                           "(in any pytree)")

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_p, n_b = len(pnames), len(bnames)
    specs: list[InputSpec] = []
    refs: list[torch.Tensor] = []
    frozen: list[torch.Tensor] = []
    for j, _ph in enumerate(placeholders):
        if j < n_p + n_b:
            name = pnames[j] if j < n_p else bnames[j - n_p]
            t = params[name] if j < n_p else buffers[name]
            if freeze and freezable(t):
                specs.append(InputSpec("const", name, t.detach()))
                frozen.append(t)
            else:
                specs.append(InputSpec("param" if j < n_p else "buffer", name))
                refs.append(t)
        else:
            specs.append(InputSpec("user", f"input{j - n_p - n_b}"))

    # trailing copy_(input, value) nodes are functionalized input mutations
    ph_index = {ph: j for j, ph in enumerate(placeholders)}
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = list(out_node.args[0])
    n_user_out = len(outputs)
    mutations: list[tuple[int, int]] = []
    mutated_user: list[int] = []
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in ph_index:
            j = ph_index[n.args[0]]
            if j < n_p:
                raise CaptureError(f"{type(mod).__name__} modifies parameter {pnames[j]} in place")
            if freeze and j < n_p + n_b:
                raise CaptureError(f"freeze=True but the model updates buffer {bnames[j - n_p]} (training-mode "
                                   "BatchNorm?); call model.eval() or compile without freeze")
            outputs.append(n.args[1])
            mutations.append((j, len(outputs) - 1))
            if j >= n_p + n_b:
                mutated_user.append(j - n_p - n_b)
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
    # tensors the function closed over (not parameters of `mod`) were traced as constants
    for n in gm.graph.nodes:
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor):
            frozen.append(getattr(gm, n.target))
    aten_ops = sum(1 for n in gm.graph.nodes if n.op == "call_function"
                   and isinstance(n.target, torch._ops.OpOverload)
                   and n.target is not torch.ops.aten._assert_tensor_metadata.default)
    converter = SymbolConverter() if dynamic is not None else contextlib.nullcontext()
    try:
        try:
            replay = out_info.get("rng")
            if replay is not None and replay.restored and not counter_mode() and any(
                    is_random_target(n.target) for n in gm.graph.nodes):
                raise UnsupportedError("random ops under activation checkpointing (its "
                                       "recompute restores the RNG state) with random='eager': ATen's calls would "
                                       "draw other numbers in the recompute; use random='counter'")
            with converter, rng_replay(replay):
                graph, ctx = lower_fx(gm, specs, output_nodes=outputs, mutations=mutations)
        except RuntimeError as e:
            if not getattr(e, "_nf_arg_check", False) or fake or dynamic is not None:
                raise
            eager_exc = _eager_error(traced, example)  # eager's verdict on the inputs the check refused
            if eager_exc is not None:
                raise _traced(eager_exc) from None
            # eager runs them: the check met an op of a traced decomposition that is stricter than
            # eager's own route (the `mm` that a zero-size mixed-dtype `matmul` folds to; eager's
            # result dtype there follows its route, which the trace does not show): refuse clearly
            raise UnsupportedError(f"{e} (eager accepts these inputs by another route; not compiled)") from None
    except UnsupportedError as e:
        raise type(e)(f"{type(mod).__name__}: {e}") from None  # (a DataDependentShapeError stays one)
    t2 = time.perf_counter()
    graph.meta["aten_ops"] = aten_ops
    del n_user_out
    return Captured(
        graph=graph,
        out_spec=out_info["spec"],
        param_refs=refs,
        aten_ops=aten_ops,
        externs=ctx.externs,
        times={"export_s": t1 - t0, "functionalize_s": 0.0, "lower_s": t2 - t1,
               "layers_replayed": out_info.get("replayed_layers", 0)},
        mutated_inputs=mutated_user,
        frozen=frozen,
        symbols=converter.finish() if dynamic is not None else None,
    )

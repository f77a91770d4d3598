"""Lowering: a functional ATen FX graph -> novaforge IR.

One table (`frontend/table.py`) maps each ATen overload to a builder. A builder receives a
`LowerCtx` and the FX node's arguments and returns IR values. The driver then checks every
result against the FX node's recorded fake value (shape and dtype): a mismatch is a lowering
bug and raises, so a wrong lowering can never produce a silently wrong program.

Each call is handled by the first of (`_lower_call`): an in-place op on a fresh intermediate
nothing aliases becomes its functional form (such ops survive functionalization inside
composite decompositions); outputs with no elements become zero-size fills; the op's rule;
for a composite op without a rule, the CompositeImplicitAutograd decomposition eager itself
runs, traced on fake inputs and lowered piece by piece; else an `extern` node (an ATen call
with its arguments kept as is), counted and reported. An op that cannot be handled at all
(a mutation that is not provably local, a non-tensor output, a data-dependent shape) raises
`UnsupportedError` naming the op and the user's source line.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..ir import Graph, GraphInput, TensorType, Value
from ..ir.extern import FUNCTIONALIZED, USER_TRITON, encode, user_triton_key
from ..ir.types import DTYPE_SHORT, opmath_dtype
from .dynamic import active_converter
from .lower_ctx import (
    ARG_CHECKS,
    DataDependentShapeError,
    InputSpec,
    LowerCtx,
    UnsupportedError,
    _size_value,
    _with_sizes,
    fake_types,
    source_line,
)

__all__ = ["ARG_CHECKS", "COMPOSITES", "DataDependentShapeError", "InputSpec", "LowerCtx", "UnsupportedError",
           "lower_fx", "opmath_dtype", "source_line"]


def _is_mutating(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def lower_fx(
    gm: torch.fx.GraphModule,
    inputs: Sequence[InputSpec],
    *,
    output_nodes: Sequence[Any] | None = None,
    mutations: Sequence[tuple[int, int]] = (),
) -> tuple[Graph, LowerCtx]:
    """Lower an FX graph. `inputs` describe the placeholders in order. `output_nodes` are the
    FX values returned (default: the graph's output args); `mutations` pairs (placeholder
    index, output index) whose output is written back to that input."""
    from .table import LOWERINGS

    ctx = LowerCtx()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise ValueError(f"{len(placeholders)} placeholders, {len(inputs)} input specs")
    graph_inputs: list[GraphInput] = []
    for ph, spec in zip(placeholders, inputs, strict=True):
        if spec.kind == "skip":  # a non-tensor placeholder (e.g. a specialized SymInt)
            conv = active_converter()
            if conv is not None and isinstance(ph.meta.get("val"), torch.SymInt):
                ctx.env[ph] = conv.dim(ph.meta["val"])  # a size argument of a symbolic graph
                continue
            if any(u.op != "output" for u in ph.users):  # (returned as it came: the caller's business)
                raise UnsupportedError(f"input {ph.name}: non-tensor graph inputs are not supported")
            continue
        bad = _unsupported_dtypes(ph.meta.get("val"))
        if bad:
            raise UnsupportedError(f"input {spec.name}: {bad[0]} tensors are not supported by novaforge")
        types = fake_types(ph.meta.get("val"))
        if spec.tensor is not None:
            t = TensorType.of(spec.tensor)
        elif types is not None and len(types) == 1:
            t = types[0]
        else:
            raise UnsupportedError(f"input {ph.name}: not a tensor with a static shape")
        v = Value(t, hint=ph.name[:24])
        ctx.env[ph] = v
        graph_inputs.append(GraphInput(v, spec.kind, spec.name, spec.tensor if spec.kind == "const" else None))

    out_args: Any = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            out_args = n.args[0]
            continue
        if n.op == "get_attr":
            attr = getattr(gm, n.target)
            if not isinstance(attr, torch.Tensor):
                raise UnsupportedError(f"get_attr {n.target}: not a tensor")
            v = Value(TensorType.of(attr), hint="c")
            graph_inputs.append(GraphInput(v, "const", str(n.target), attr.detach()))
            ctx.env[n] = v
            if attr.dim() == 0 and attr.device.type == "cpu" and attr.dtype in DTYPE_SHORT:
                ctx.cpu_scalars[v.id] = (attr.item(), attr.dtype)
            continue
        if n.op != "call_function":
            raise UnsupportedError(f"FX node {n.name}: {n.op} is not supported (expected a functional ATen graph)")
        ctx.source = source_line(n)
        ctx.env[n] = _lower_call(ctx, n, LOWERINGS)

    outs = out_args if output_nodes is None else output_nodes
    flat_outs = list(outs) if isinstance(outs, list | tuple) else [outs]
    out_values: list[Value] = []
    for o in flat_outs:
        if isinstance(o, torch.fx.Node) and isinstance(ctx.env.get(o), Value):
            out_values.append(ctx.env[o])
        else:
            raise UnsupportedError(f"graph output {o!r} is not a tensor computed by the graph")
    muts = []
    for in_idx, out_idx in mutations:
        muts.append((graph_inputs[in_idx].value, out_values[out_idx]))
    keep = [v for i, v in enumerate(out_values) if i not in {o for _, o in mutations}]
    graph = Graph(graph_inputs + ctx.extra_inputs, ctx.nodes, keep, muts)
    return graph, ctx


def _lower_call(ctx: LowerCtx, n: torch.fx.Node, rules: dict[Any, Any]) -> Any:
    """The IR value(s) of one call_function node, by the first that applies: a getitem; an
    in-place op on a fresh intermediate (as its functional form); a zero-size fill; the
    node's rule; its CompositeImplicitAutograd decomposition; an extern."""
    ctx.fx_node = n
    if n.target is operator.getitem:
        seq, idx = n.args
        return ctx.env[seq][idx] if isinstance(ctx.env[seq], list | tuple | dict) else None  # (dict: a user kernel's)
    size = _size_value(n)
    if size is not None:  # symbolic capture: a size computation is an IR dim, not a node
        return size
    target = ctx.target = n.target
    bad = _unsupported_dtypes(n.meta.get("val"))
    if bad:
        raise UnsupportedError(ctx.describe(f"produces {', '.join(map(str, bad))} tensors, which novaforge does not "
                                            "compile (supported: float, integer and bool dtypes)"))
    if _is_mutating(target):
        target = _functional_form(n)
        if target is None:
            raise UnsupportedError(ctx.describe("mutates its input; novaforge needs a functionalized graph"))
        ctx.target = target
    rule = rules.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = rules.get(target.overloadpacket)
    args, kwargs = (_with_sizes(ctx, n.args), _with_sizes(ctx, n.kwargs)) if active_converter() else (n.args, n.kwargs)
    check = ARG_CHECKS.get(target)
    if check is not None:  # eager's argument checks, which decompositions and zero-size fills skip
        try:
            check(ctx, *args, **kwargs)
        except RuntimeError as e:
            e._nf_arg_check = True  # type: ignore[attr-defined]  # the capture confirms it with eager
            raise
    if _all_outputs_empty(n):
        result = _empty_results(ctx)
    elif rule is not None:
        result = rule(ctx, *args, **kwargs)
    elif target in COMPOSITES:
        result = _lower_decomposed(ctx, n, target, rules, COMPOSITES[target])
    elif target is torch.ops.higher_order.auto_functionalized_v2:
        result = _lower_functionalized(ctx, n)
    elif getattr(target, "__name__", None) in _USER_TRITON_HOPS:
        result = _lower_user_triton(ctx, n)
    elif not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedError(ctx.describe("is not an ATen operator; cannot compile it"))
    elif _has_decomposition(target):
        result = _lower_decomposed(ctx, n, target, rules)
    elif (triton_op := _triton_op_decomposition(n, target)) is not None:
        result = _lower_decomposed(ctx, n, target, rules, triton_op, cache=False)  # (kernel ids: per trace)
    else:
        result = ctx.extern()
    _check_result(ctx, n, result)
    if target is not n.target:  # the in-place op's later readers see the new value
        ctx.env[n.args[0]] = result
    return result


def _lower_functionalized(ctx: LowerCtx, n: torch.fx.Node) -> Any:
    """`auto_functionalized_v2(op, **kwargs)`, functionalization's form of an op that mutates its
    arguments (a custom op's `mutates_args`): one extern that clones the bases the op writes,
    calls it on the clones and returns its results and the clones (ir/extern.py, `resolve`).
    Readers of the mutated values read the clones; a mutated graph input is written back by the
    trailing `copy_` functionalization adds."""
    (op,) = n.args
    return ctx.extern("mutates its arguments: called on copies", call=(f"{FUNCTIONALIZED}({op})", (), n.kwargs, op))


_USER_TRITON_HOPS = ("triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation")


def _lower_user_triton(ctx: LowerCtx, n: torch.fx.Node) -> dict[str, Value]:
    """`triton_kernel_wrapper_functional(kernel_idx, constant_args_idx, grid, kwargs,
    tensors_to_clone)`, torch's functional form of a user `@triton.jit` launch (Dynamo's capture
    of `kernel[grid](...)`, or a `triton_op`'s body): one `user_triton` extern (ir/extern.py)
    returning the copies of `tensors_to_clone` the kernel wrote, by argument name. Its grid is
    the one the trace evaluated (a `lambda meta: ...` already called on the meta-parameters),
    its arguments as written. What the launch cannot reproduce exactly raises UnsupportedError
    naming the kernel: an autotuned kernel, several grids, TMA descriptors, symbolic sizes, a
    tensor argument that is a strided view or a view into a larger tensor (the kernel computes
    addresses from eager's pointer and strides; novaforge passes each tensor as a contiguous
    buffer of its own), or an argument of another type."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    kw = n.kwargs
    if getattr(n.target, "__name__", "") == "triton_kernel_wrapper_mutation" or "tensors_to_clone" not in kw:
        raise UnsupportedError(ctx.describe("a user Triton kernel launch that was not functionalized"))
    kernel = kernel_side_table.get_kernel(kw["kernel_idx"])
    name = getattr(getattr(kernel, "fn", None), "__name__", type(kernel).__name__)

    def refuse(why: str) -> UnsupportedError:
        return UnsupportedError(ctx.describe(f"user Triton kernel {name}: {why}"))

    if not (hasattr(kernel, "fn") and hasattr(kernel, "src") and hasattr(kernel, "arg_names")):
        raise refuse(f"a {type(kernel).__name__} (triton.autotune / triton.heuristics) is not supported yet; "
                     "launch the @triton.jit kernel with its meta-parameters")
    if kw.get("tma_descriptor_metadata"):
        raise refuse("TMA descriptor arguments are not supported")
    grids = list(kw["grid"])
    if len(grids) != 1 or not all(type(g) is int for g in grids[0]):
        raise refuse(f"grid {grids} is not one tuple of static ints (symbolic sizes are not supported)")
    args = {**kernel_side_table.get_constant_args(kw["constant_args_idx"]), **kw["kwargs"]}
    for k, v in args.items():
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
        if isinstance(v, torch.fx.Node) and not isinstance(val, torch.Tensor):
            raise refuse(f"argument {k} is a traced {type(val).__name__} (symbolic sizes are not supported)")
        if isinstance(val, torch.Tensor) and not all(type(d) is int for d in val.shape):
            raise refuse(f"argument {k} has symbolic sizes (not supported: the grid and sizes are as traced)")
        if isinstance(val, torch.Tensor) and (fake_types(val) is None or not val.is_contiguous()):
            raise refuse(f"argument {k} is a strided view (sizes {tuple(val.shape)}, strides {tuple(val.stride())}); "
                         "novaforge passes kernels contiguous buffers (pass x.contiguous())")
        if isinstance(val, torch.Tensor) and (val.storage_offset() or val.untyped_storage().nbytes() != val.nbytes):
            raise refuse(f"argument {k} is a view into a larger tensor (the kernel may address memory around it; "
                         "novaforge passes it as a buffer of its own: pass x.contiguous() or the whole tensor)")
        if val is None and not (v is None or type(v) in (int, float, bool, str)):
            raise refuse(f"argument {k} of type {type(v).__name__} is not supported")
    clone = tuple(kw["tensors_to_clone"])
    types = [fake_types(n.meta["val"][c])[0] for c in clone]
    tensors: list[Any] = []
    spec = encode(([], {"grid": tuple(grids[0]), "kwargs": args, "clone": clone}), tensors,
                  lambda x: isinstance(x, torch.fx.Node))
    target, reason = f"{USER_TRITON}({user_triton_key(kernel)})", f"user Triton kernel {name}"
    node = ctx.emit_node("extern", [ctx.val(t) for t in tensors], {"target": target, "spec": spec,
                         "out_types": tuple(types), "reason": reason, "keep": None}, types)
    ctx.externs.append((target, reason))
    return dict(zip(clone, node.outputs, strict=True))


def _triton_op_decomposition(n: torch.fx.Node, target: Any) -> Callable[..., Any] | None:
    """For a `torch.library.triton_op` without a kernel registered for its tensors' device
    (`register_kernel`), its Python function, functionalized: lowered in place, its
    `wrap_triton` launches become user Triton kernel externs (`_lower_user_triton`) and its
    torch ops are lowered and fused as any. (AOTAutograd decomposes it the same way, so both
    entry points agree.) An op with such a kernel stays one call to the op: that kernel runs,
    as in eager. Else None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    from torch._library.custom_ops import OPDEFS
    from torch._library.triton import triton_ops_to_kernels

    name = target._schema.name
    opdef = OPDEFS.get(name)
    fn = getattr(opdef, "_abstract_fn", None)  # (a triton_op's fake implementation is its function)
    if name not in triton_ops_to_kernels or fn is None:
        return None
    devices = {a.meta["val"].device.type for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)}
    if any(d in getattr(opdef, "_backend_fns", {}) for d in devices):
        return None

    def on_copies(*args: Any, **kwargs: Any) -> Any:  # (its launches write copies, never the op's inputs)
        args, kwargs = pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
        return fn(*args, **kwargs)

    return torch.func.functionalize(on_copies, remove="mutations")  # (views stay views: see _lower_user_triton)


def _unsupported_dtypes(val: Any) -> list[torch.dtype]:
    vals = val if isinstance(val, list | tuple) else [val]
    return sorted({v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype not in DTYPE_SHORT}, key=str)


def _returns_alias(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _functional_form(n: torch.fx.Node) -> Any:
    """The out-of-place overload for an in-place `op_(x, ...)` that only writes `x`, when `x` is
    a fresh intermediate nothing else aliases: produced by a non-view op (or by an in-place op
    handled the same way) and not viewed before `n`. Such ops survive functionalization inside
    composite decompositions (rms_norm's `add_`, matmul's `squeeze_`); replacing them by their
    functional form and rebinding `x` is then exact. Anything else: None."""
    schema = n.target._schema
    writes = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    name = schema.name.split("::")[-1]
    if writes != [0] or not name.endswith("_") or schema.overload_name.startswith("out"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
    x = n.args[0] if n.args else None
    if functional is None or not isinstance(x, torch.fx.Node) or x.op != "call_function":
        return None
    if _returns_alias(x.target) and not (_is_mutating(x.target) and _functional_form(x) is not None):
        return None
    for u in x.users:
        if u is not n and _returns_alias(u.target) and _before(u, n):
            return None
    return functional


def _before(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    node = a.next
    while node.op != "root":
        if node is b:
            return True
        node = node.next
    return False


# novaforge's own composite ops: torch.library custom ops that a trace records as one node each (the
# optimizer update of a parameter, `training.py`), -> the Python function of ATen ops that computes
# them. Lowered as a CompositeImplicitAutograd op is: that function is traced once per argument
# types and its ops lowered in place, so 100 parameters of a few shapes cost a few traces, not
# 100 x ~20 traced ops.
COMPOSITES: dict[Any, Callable[..., Any]] = {}


def _has_decomposition(target: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


_DECOMPOSITIONS: dict[Any, torch.fx.GraphModule] = {}  # traced decompositions by op and argument types


def _decomposition_key(target, flat: list, spec: Any, where: list[int], vals: list[Value]) -> Any:
    """(op, argument structure, tensor types and non-tensor arguments), or None if unhashable:
    the 32 identical layers of a model trace each decomposition once."""
    leaves = list(flat)
    for i, v in zip(where, vals, strict=True):
        leaves[i] = v.type
    key = (target, str(spec), tuple((type(x), x) for x in leaves))  # types: 1, 1.0 and True promote differently
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _lower_decomposed(ctx: LowerCtx, n: torch.fx.Node, target: torch._ops.OpOverload, rules: dict,
                      decompose: Callable[..., Any] | None = None, cache: bool = True) -> Any:
    """Lower a composite op without a rule through the decomposition eager itself runs (its
    CompositeImplicitAutograd kernel, or `decompose` for novaforge's own `COMPOSITES`), traced
    on fake inputs of the node's shapes once per argument types (every time with `cache=False`:
    a `triton_op`'s trace names its kernels by Dynamo's kernel table, which a reset renumbers);
    the ops it produces are lowered in place (with their own rules, or as externs)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = pytree.tree_flatten((n.args, n.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
    vals = [ctx.val(flat[i]) for i in where]

    def run(*tensors):
        leaves = list(flat)
        for i, t in zip(where, tensors, strict=True):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return (decompose or target.decompose)(*args, **kwargs)

    key = _decomposition_key(target, flat, spec, where, vals) if cache else None
    sub = _DECOMPOSITIONS.get(key) if key is not None else None
    if sub is None:
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                examples = [torch.empty(v.type.shape, dtype=v.type.dtype, device=v.type.device) for v in vals]
            sub = make_fx(run, tracing_mode="fake")(*examples)
        except Exception as e:  # a decomposition that cannot be traced statically stays an ATen call
            return ctx.extern(f"no lowering rule; its decomposition failed to trace ({type(e).__name__})")
        if key is not None:
            if len(_DECOMPOSITIONS) >= 512:
                _DECOMPOSITIONS.clear()
            _DECOMPOSITIONS[key] = sub
    env = ctx.env
    phs = [m for m in sub.graph.nodes if m.op == "placeholder"]
    for ph, v in zip(phs, vals, strict=True):
        env[ph] = v
    result: Any = None
    for m in sub.graph.nodes:
        if m.op == "get_attr":
            t = getattr(sub, m.target)
            val = Value(TensorType.of(t), hint="c")
            ctx.extra_inputs.append(GraphInput(val, "const", f"{target}.{m.target}", t.detach()))
            env[m] = val
        elif m.op == "call_function":
            env[m] = _lower_call(ctx, m, rules)
        elif m.op == "output":
            outs = m.args[0]
            result = tuple(env[o] for o in outs) if isinstance(outs, list | tuple) else env[outs]
    ctx.fx_node, ctx.target = n, target
    if isinstance(result, tuple) and not isinstance(n.meta.get("val"), list | tuple):
        result = result[0]
    return result


def _all_outputs_empty(n: torch.fx.Node) -> bool:
    """Whether every output of `n` is a tensor with no elements (and `n` draws no random numbers)."""
    types = fake_types(n.meta.get("val"))
    if not types or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
        return False
    return all(t.numel == 0 for t in types)


def _empty_results(ctx: LowerCtx) -> Any:
    """Outputs without elements hold no data: any producer is a zero-size fill."""
    outs = tuple(ctx.expand(ctx.scalar(0, t.dtype, t.device), t.shape) for t in ctx.out_types)
    return outs if isinstance(ctx.fx_node.meta.get("val"), list | tuple) else outs[0]


def _check_result(ctx: LowerCtx, n: torch.fx.Node, result: Any) -> None:
    val = n.meta.get("val")
    if isinstance(val, dict) and isinstance(result, dict):  # a user Triton kernel's copies, by argument name
        val, result = list(val.values()), [result.get(k) for k in val]
    if result is None:
        if val is None or (isinstance(val, list | tuple) and not val):
            return
        raise UnsupportedError(ctx.describe("lowering produced nothing for a node with outputs"))
    got = list(result) if isinstance(result, list | tuple) else [result]
    want = val if isinstance(val, list | tuple) else [val]
    if len(got) != len(want):
        raise AssertionError(ctx.describe(f"lowering gave {len(got)} outputs, ATen has {len(want)}"))
    for g, w in zip(got, want, strict=True):
        if g is None or w is None or not isinstance(w, torch.Tensor):
            continue
        types = fake_types(w)
        if types is None:
            raise DataDependentShapeError(ctx.describe("output shape depends on tensor data (data-dependent shape)"))
        if g.type.shape != types[0].shape or g.type.dtype != types[0].dtype:
            raise AssertionError(ctx.describe(f"lowering bug: IR gives {g.type}, ATen gives {types[0]}"))

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
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..ir import Graph, GraphInput, Node, TensorType, Value, make_node
from ..ir.extern import encode
from ..ir.ops.matmul import same_dtype_check
from ..ir.symbolic import Sym
from ..ir.types import DTYPE_SHORT, is_float, normalize_axis, normalize_device, opmath_dtype
from .dynamic import active_converter

__all__ = ["InputSpec", "LowerCtx", "UnsupportedError", "lower_fx", "opmath_dtype"]


class UnsupportedError(NotImplementedError):
    """An op or construct novaforge cannot compile; the message names the op and source line."""


class DataDependentShapeError(UnsupportedError):
    """An op whose output shape depends on tensor data (nonzero, a boolean mask): one graph of
    static or symbolic sizes cannot hold it (`novaforge.compile` then goes through Dynamo,
    which splits the graph there, unless `fallback="raise"`)."""


def source_line(fx_node: torch.fx.Node) -> str:
    """The innermost user-code line of an FX node's stack trace ('file.py:12 in forward: code')."""
    st = fx_node.meta.get("stack_trace") or ""
    if not st:  # traced without stack traces: the module the op ran in ('h.3.attn (GPT2Attention)')
        stack = fx_node.meta.get("nn_module_stack") or {}
        if stack:
            path, cls = list(stack.values())[-1]
            name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
            return f"{path} ({name.rsplit('.', 1)[-1]})" if path else name.rsplit(".", 1)[-1]
        return ""
    lines = [ln.strip() for ln in st.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if ln.startswith("File "):
            try:
                path = ln.split('"')[1]
                lineno = ln.split("line ")[1].split(",")[0]
                fn = ln.split(" in ")[-1]
            except IndexError:
                return ln
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            short = "/".join(path.split("/")[-2:])
            return f"{short}:{lineno} in {fn}: {code}".rstrip(": ")
    return ""


def fake_types(val: Any) -> list[TensorType] | None:
    """TensorTypes of an FX node's meta['val'] (None when it is not a tensor or tensor tuple)."""
    vals = val if isinstance(val, list | tuple) else [val]
    out = []
    for v in vals:
        if not isinstance(v, torch.Tensor):
            return None
        shape = []
        conv = active_converter()
        for s in v.shape:
            if not isinstance(s, int):
                if conv is not None:  # a symbolic capture: keep the size symbolic
                    s = conv.dim(s)
                    if s is None:
                        return None
                else:
                    try:
                        s = int(s)
                    except Exception:
                        return None
            shape.append(s)
        out.append(TensorType(tuple(shape), v.dtype, normalize_device(v.device)))
    return out


def has_symbolic_shape(val: Any) -> bool:
    """Does a fake value have a size that is not an int (a data-dependent size; in a symbolic
    capture, any symbolic size, since extern calls run with static shapes)?"""
    vals = val if isinstance(val, list | tuple) else [val]
    return any(isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape) for v in vals)


def _size_value(n: torch.fx.Node) -> Any:
    """The IR dim of an FX node that computes a size (sym_size, arithmetic on SymInts) in a
    symbolic capture, or None when `n` is not such a node."""
    conv = active_converter()
    val = n.meta.get("val")
    if conv is None or not isinstance(val, torch.SymInt):
        return None
    d = conv.dim(val)
    if d is None:
        raise DataDependentShapeError(f"{n.name}: a size that depends on tensor data; novaforge compiles static "
                                      "shapes")
    return d


def _with_sizes(ctx: LowerCtx, args: Any) -> Any:
    """FX arguments with size nodes replaced by their IR dims (lists and tuples included)."""
    if isinstance(args, torch.fx.Node):
        d = ctx.env.get(args)
        return d if isinstance(d, int | Sym) else args
    if isinstance(args, list | tuple):
        return type(args)(_with_sizes(ctx, a) for a in args)
    if isinstance(args, dict):
        return {k: _with_sizes(ctx, a) for k, a in args.items()}
    return args


@dataclass
class InputSpec:
    """How one FX placeholder becomes a graph input."""

    kind: str  # user | param | buffer | const | skip (an unused non-tensor placeholder)
    name: str
    tensor: torch.Tensor | None = None


_SIZE_QUERIES = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                 torch.ops.aten.sym_storage_offset.default)


class LowerCtx:
    """What a lowering builder sees: emit IR nodes, look up values, read the FX node's meta."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.fx_node: torch.fx.Node | None = None
        self.target: Any = None  # the op being lowered: fx_node.target, or the functional form of an in-place op
        self.source = ""
        self.externs: list[tuple[str, str]] = []
        self.extra_inputs: list[GraphInput] = []  # constants created while lowering (decompositions)
        self._scalars: dict[tuple, Value] = {}
        self.cpu_scalars: dict[int, tuple[Any, torch.dtype]] = {}  # Value id -> (number, dtype): 0-d CPU constants

    # -- facts about the node being lowered -------------------------------------------------
    @property
    def out_types(self) -> list[TensorType]:
        types = fake_types(self.fx_node.meta.get("val"))
        if types is None:
            raise UnsupportedError(self.describe("has no static tensor output"))
        return types

    @property
    def out_type(self) -> TensorType:
        return self.out_types[0]

    @property
    def device(self) -> str:
        return self.out_type.device

    def used_outputs(self) -> set[int]:
        """Indices of the current multi-output node's results that the graph reads."""
        used = set()
        for u in self.fx_node.users:
            if u.target is operator.getitem and isinstance(u.args[1], int):
                if any(w.target not in _SIZE_QUERIES for w in u.users):  # a size query reads no data
                    used.add(u.args[1])
            else:
                return set(range(len(self.out_types)))
        return used

    def unsupported(self, problem: str, data_dependent: bool = False) -> UnsupportedError:
        """The error a rule raises for a case it cannot compile (`raise ctx.unsupported(...)`);
        `data_dependent`: its output shape depends on tensor data (DataDependentShapeError)."""
        return (DataDependentShapeError if data_dependent else UnsupportedError)(self.describe(problem))

    def describe(self, problem: str) -> str:
        target = _target_name(self.target) if self.fx_node is not None else "?"
        where = f" at {self.source}" if self.source else ""
        return f"{target}{where}: {problem}"

    # -- values -----------------------------------------------------------------------------
    def val(self, a: Any) -> Value:
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if not isinstance(v, Value):
                raise UnsupportedError(self.describe(f"argument {a.name} is not a single tensor"))
            if v.id in self.cpu_scalars:
                return self._on_node_device(v)
            return v
        raise UnsupportedError(self.describe(f"expected a tensor argument, got {a!r}"))

    def _on_node_device(self, v: Value) -> Value:
        """A constant 0-d CPU tensor read by an op on another device: eager treats it as a
        number, so it becomes a scalar on that device (else a CUDA program would copy it from
        the host at every call, which CUDA-graph capture refuses; seen on the H200 in
        cross-entropy's `where(target != ignore_index, loss, 0)`)."""
        vals = self.fx_node.meta.get("val") if self.fx_node is not None else None
        for t in vals if isinstance(vals, list | tuple) else [vals]:
            if isinstance(t, torch.Tensor):
                dev = normalize_device(t.device)
                if dev != v.type.device:
                    value, dtype = self.cpu_scalars[v.id]
                    return self.scalar(value, dtype, dev)
                break
        return v

    def is_tensor(self, a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and isinstance(self.env.get(a), Value)

    def emit(self, op: str, inputs: Sequence[Value] = (), **attrs: Any) -> Value:
        return self.emit_node(op, inputs, attrs).out

    def emit_node(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any], out_types=None) -> Node:
        meta = {"source": self.source, "aten": _target_name(self.target)} if self.fx_node is not None else {}
        hint = self.fx_node.name if self.fx_node is not None else ""
        try:
            node = make_node(op, list(inputs), attrs, meta, out_types, hint=hint[:24])
        except (TypeError, ValueError) as e:
            raise UnsupportedError(self.describe(f"cannot build {op}: {e}")) from e
        self.nodes.append(node)
        return node

    def scalar(self, value: Any, dtype: torch.dtype, device: str | None = None) -> Value:
        dev = device or self.device
        if isinstance(value, Sym):  # a size as a number: substituted when the graph is specialized
            pass
        elif is_float(dtype):
            value = float(value)
        elif dtype == torch.bool:
            value = bool(value)
        else:
            value = int(value)
        key = (value, dtype, dev, repr(value))
        v = self._scalars.get(key)
        if v is None:
            v = self.emit("scalar", (), value=value, dtype=dtype, device=dev)
            self._scalars[key] = v
            if dev == "cpu" and not isinstance(value, Sym):
                self.cpu_scalars[v.id] = (value, dtype)
        return v

    def cast(self, v: Value, dtype: torch.dtype) -> Value:
        return v if v.type.dtype == dtype else self.emit("cast", [v], dtype=dtype)

    def opmath(self, v: Value) -> Value:
        """`v` in the dtype ATen computes composite math in: float32 for 16-bit floats (ATen's
        opmath type), else unchanged. Composite rules compute there and cast the result back,
        so they round once, as the eager kernel does."""
        return self.cast(v, opmath_dtype(v.type.dtype))

    def tensor(self, a: Any, dtype: torch.dtype) -> Value:
        """A tensor argument, an IR value or a Python number as an IR value of `dtype`."""
        if isinstance(a, Value):
            return self.cast(a, dtype)
        if isinstance(a, torch.fx.Node):
            return self.cast(self.val(a), dtype)
        if isinstance(a, bool | int | float | Sym):
            return self.scalar(a, dtype)
        raise UnsupportedError(self.describe(f"unsupported argument {a!r}"))

    def fake(self, a: Any) -> Any:
        """The argument's fake tensor (for dtype promotion), or the Python number itself."""
        if isinstance(a, torch.fx.Node):
            return a.meta["val"]
        return a

    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(s if isinstance(s, Sym) else int(s) for s in shape)
        return v if v.type.shape == shape else self.emit("reshape", [v], shape=shape)

    def permute(self, v: Value, perm: Sequence[int]) -> Value:
        perm = tuple(perm)
        return v if perm == tuple(range(len(perm))) else self.emit("permute", [v], perm=perm)

    def expand(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        return v if v.type.shape == shape else self.emit("expand", [v], shape=shape)

    def axis(self, d: int, rank: int) -> int:
        return normalize_axis(d, rank)

    def extern(self, reason: str = "") -> Any:
        """Keep the current FX node as an ATen call."""
        n = self.fx_node
        if has_symbolic_shape(n.meta.get("val")):
            conv = active_converter()
            vals = n.meta.get("val") if isinstance(n.meta.get("val"), list | tuple) else [n.meta.get("val")]
            sizes = [d for v in vals if isinstance(v, torch.Tensor) for d in v.shape]
            if conv is None or not all(conv.dim(d) is not None for d in sizes):
                raise DataDependentShapeError(self.describe("output shape depends on tensor data (data-dependent "
                                                            "shape); novaforge compiles static shapes only"))
            # output sizes are expressions of the capture's symbols: the call runs on each call's
            # tensors with its types specialized per size, unless a size is one of its arguments
            if any(not isinstance(a.meta.get("val"), torch.Tensor) for a in n.all_input_nodes):
                raise UnsupportedError(self.describe("an ATen call kept as such (extern) with a size argument "
                                                     "and symbolic output sizes is not supported yet: compiled "
                                                     "per size"))
        val = n.meta.get("val")
        keep = None  # results that ATen leaves None (convolution_backward's unrequested gradients)
        if isinstance(val, list | tuple) and any(v is None for v in val):
            keep = tuple(i for i, v in enumerate(val) if v is not None)
            types = fake_types([val[i] for i in keep])
            if types is None:
                raise UnsupportedError(self.describe("has no static tensor output"))
        else:
            types = self.out_types
        tensors: list[Value] = []
        spec = encode((list(n.args), dict(n.kwargs)), tensors, lambda x: isinstance(x, torch.fx.Node))
        ins = [self.val(t) for t in tensors]
        target = _target_name(self.target)
        tags = getattr(self.target, "tags", ())
        effect = torch.Tag.nondeterministic_seeded in tags
        op = "extern_effect" if effect else "extern"
        node = self.emit_node(op, ins, {"target": target, "spec": spec, "out_types": tuple(types),
                                        "reason": reason or "no lowering rule", "keep": keep}, types)
        self.externs.append((target, reason or "no lowering rule"))
        if keep is not None:
            results: list[Value | None] = [None] * len(val)
            for i, o in zip(keep, node.outputs, strict=True):
                results[i] = o
            return tuple(results)
        return tuple(node.outputs) if isinstance(val, list | tuple) else node.out


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


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
            if ph.users:
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


def _index_add_dtypes(ctx: LowerCtx, x, dim, index, source, *args, **kwargs) -> None:
    a, b = ctx.val(x).type.dtype, ctx.val(source).type.dtype
    if a != b:
        names = {torch.float64: "Double", torch.float32: "Float", torch.bfloat16: "BFloat16",
                 torch.float16: "Half", torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool"}
        raise RuntimeError(ctx.describe(f"index_add_(): self ({names.get(a, a)}) and source ({names.get(b, b)}) "
                                        "must have the same scalar type"))


def _index_put_dtypes(ctx: LowerCtx, x, indices, values, *args, **kwargs) -> None:
    a, b = ctx.val(x).type.dtype, ctx.val(values).type.dtype
    if a != b:  # eager's CPU kernel checks it (the op's meta function does not: a dead index_put raises too)
        names = {torch.float64: "Double", torch.float32: "Float", torch.bfloat16: "BFloat16",
                 torch.float16: "Half", torch.int64: "Long", torch.int32: "Int", torch.bool: "Bool"}
        raise RuntimeError(ctx.describe(f"Index put requires the source and destination dtypes match, got "
                                        f"{names.get(a, a)} for the destination and {names.get(b, b)} for the source."))


# ATen op -> eager's argument check (raises as eager does), run before any lowering of the op
ARG_CHECKS: dict[Any, Any] = {
    torch.ops.aten.index_add.default: _index_add_dtypes,
    torch.ops.aten.index_put.default: _index_put_dtypes,
    **{op: same_dtype_check for op in (
        torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.matmul.default,
        torch.ops.aten.mv.default, torch.ops.aten.dot.default, torch.ops.aten.addmm.default,
        torch.ops.aten.baddbmm.default, torch.ops.aten.addmv.default, torch.ops.aten.linear.default)},
}


def _lower_call(ctx: LowerCtx, n: torch.fx.Node, rules: dict[Any, Any]) -> Any:
    """The IR value(s) of one call_function node, by the first that applies: a getitem; an
    in-place op on a fresh intermediate (as its functional form); a zero-size fill; the
    node's rule; its CompositeImplicitAutograd decomposition; an extern."""
    ctx.fx_node = n
    if n.target is operator.getitem:
        seq, idx = n.args
        return ctx.env[seq][idx] if isinstance(ctx.env[seq], list | tuple) else None
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
    elif not isinstance(target, torch._ops.OpOverload):
        raise UnsupportedError(ctx.describe("is not an ATen operator; cannot compile it"))
    elif _has_decomposition(target):
        result = _lower_decomposed(ctx, n, target, rules)
    else:
        result = ctx.extern()
    _check_result(ctx, n, result)
    if target is not n.target:  # the in-place op's later readers see the new value
        ctx.env[n.args[0]] = result
    return result


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
                      decompose: Callable[..., Any] | None = None) -> Any:
    """Lower a composite op without a rule through the decomposition eager itself runs (its
    CompositeImplicitAutograd kernel, or `decompose` for novaforge's own `COMPOSITES`), traced
    on fake inputs of the node's shapes once per argument types; the ops it produces are lowered
    in place (with their own rules, or as externs)."""
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

    key = _decomposition_key(target, flat, spec, where, vals)
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

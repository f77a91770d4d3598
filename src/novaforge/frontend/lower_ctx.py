"""What a lowering rule sees: `LowerCtx` (emit IR nodes, look up values, read the FX node's
meta), `InputSpec`, the errors a lowering raises (`UnsupportedError`, `DataDependentShapeError`)
and `ARG_CHECKS` (eager's argument checks, run before an op's rule).

Split from lower.py (the driver, `lower_fx`) so that the rule files (lower_elementwise,
lower_nn, lower_shape) import this module and the driver imports the table they fill
(table.py), with no import cycle between them.

Invariant: every node a LowerCtx emits carries its output types (inferred from the op table
unless given) and the source line and ATen target of the FX node being lowered.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..ir import GraphInput, Node, TensorType, Value, make_node
from ..ir.extern import encode
from ..ir.ops.matmul import same_dtype_check
from ..ir.symbolic import Sym
from ..ir.types import is_float, normalize_axis, normalize_device, opmath_dtype
from .dynamic import active_converter


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

    def extern(self, reason: str = "", *, call: tuple[str, tuple, dict, Any] | None = None) -> Any:
        """Keep the current FX node as an ATen call; `call` = (target name, args, kwargs, op whose
        tags count) replaces the node's own target and arguments (a functionalized custom op)."""
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
        target, args, kwargs, tagged = call or (_target_name(self.target), n.args, n.kwargs, self.target)
        spec = encode((list(args), dict(kwargs)), tensors, lambda x: isinstance(x, torch.fx.Node))
        ins = [self.val(t) for t in tensors]
        tags = getattr(tagged, "tags", ())
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

"""Lowering: a functional ATen FX graph -> novaforge IR.

One table (`frontend/table.py`) maps each ATen overload to a builder. A builder receives a
`LowerCtx` and the FX node's arguments and returns IR values. The driver then checks every
result against the FX node's recorded fake value (shape and dtype): a mismatch is a lowering
bug and raises, so a wrong lowering can never produce a silently wrong program.

An ATen op without a builder becomes an `extern` node (an ATen call with its arguments kept
as is) when it is functional and its output shapes are static; it is counted and reported. An
op that cannot be handled at all (mutation, non-tensor output, data-dependent shape) raises
`UnsupportedError` naming the op and the user's source line.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..ir import Graph, GraphInput, Node, TensorType, Value, make_node
from ..ir.extern import encode
from ..ir.types import is_float, normalize_axis, normalize_device


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen kernels compute 16-bit float math in (float32); other dtypes are unchanged."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class UnsupportedError(NotImplementedError):
    """An op or construct novaforge cannot compile; the message names the op and source line."""


def source_line(fx_node: torch.fx.Node) -> str:
    """The innermost user-code line of an FX node's stack trace ('file.py:12 in forward: code')."""
    st = fx_node.meta.get("stack_trace") or ""
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
        for s in v.shape:
            if not isinstance(s, int):
                try:
                    s = int(s)
                except Exception:
                    return None
            shape.append(s)
        out.append(TensorType(tuple(shape), v.dtype, normalize_device(v.device)))
    return out


def has_symbolic_shape(val: Any) -> bool:
    vals = val if isinstance(val, list | tuple) else [val]
    return any(isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape) for v in vals)


@dataclass
class InputSpec:
    """How one FX placeholder becomes a graph input."""

    kind: str  # user | param | buffer | const | skip (an unused non-tensor placeholder)
    name: str
    tensor: torch.Tensor | None = None


class LowerCtx:
    """What a lowering builder sees: emit IR nodes, look up values, read the FX node's meta."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self.fx_node: torch.fx.Node | None = None
        self.source = ""
        self.externs: list[tuple[str, str]] = []
        self._scalars: dict[tuple, Value] = {}

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
                used.add(u.args[1])
            else:
                return set(range(len(self.out_types)))
        return used

    def describe(self, problem: str) -> str:
        target = _target_name(self.fx_node.target) if self.fx_node is not None else "?"
        where = f" at {self.source}" if self.source else ""
        return f"{target}{where}: {problem}"

    # -- values -----------------------------------------------------------------------------
    def val(self, a: Any) -> Value:
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if not isinstance(v, Value):
                raise UnsupportedError(self.describe(f"argument {a.name} is not a single tensor"))
            return v
        raise UnsupportedError(self.describe(f"expected a tensor argument, got {a!r}"))

    def is_tensor(self, a: Any) -> bool:
        return isinstance(a, torch.fx.Node) and isinstance(self.env.get(a), Value)

    def emit(self, op: str, inputs: Sequence[Value] = (), **attrs: Any) -> Value:
        return self.emit_node(op, inputs, attrs).out

    def emit_node(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any], out_types=None) -> Node:
        meta = {"source": self.source, "aten": _target_name(self.fx_node.target)} if self.fx_node is not None else {}
        hint = self.fx_node.name if self.fx_node is not None else ""
        try:
            node = make_node(op, list(inputs), attrs, meta, out_types, hint=hint[:24])
        except (TypeError, ValueError) as e:
            raise UnsupportedError(self.describe(f"cannot build {op}: {e}")) from e
        self.nodes.append(node)
        return node

    def scalar(self, value: Any, dtype: torch.dtype, device: str | None = None) -> Value:
        dev = device or self.device
        if is_float(dtype):
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
        if isinstance(a, bool | int | float):
            return self.scalar(a, dtype)
        raise UnsupportedError(self.describe(f"unsupported argument {a!r}"))

    def fake(self, a: Any) -> Any:
        """The argument's fake tensor (for dtype promotion), or the Python number itself."""
        if isinstance(a, torch.fx.Node):
            return a.meta["val"]
        return a

    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
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
            raise UnsupportedError(self.describe("output shape depends on tensor data (data-dependent "
                                                 "shape); novaforge compiles static shapes only"))
        types = self.out_types
        tensors: list[Value] = []
        spec = encode((list(n.args), dict(n.kwargs)), tensors, lambda x: isinstance(x, torch.fx.Node))
        ins = [self.val(t) for t in tensors]
        target = _target_name(n.target)
        tags = getattr(n.target, "tags", ())
        effect = torch.Tag.nondeterministic_seeded in tags
        op = "extern_effect" if effect else "extern"
        node = self.emit_node(op, ins, {"target": target, "spec": spec, "out_types": tuple(types),
                                        "reason": reason or "no lowering rule"}, types)
        self.externs.append((target, reason or "no lowering rule"))
        val = n.meta.get("val")
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
            if ph.users:
                raise UnsupportedError(f"input {ph.name}: non-tensor graph inputs are not supported")
            continue
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
            continue
        if n.op != "call_function":
            raise UnsupportedError(f"FX node {n.name}: {n.op} is not supported (expected a functional ATen graph)")
        ctx.fx_node = n
        ctx.source = source_line(n)
        if n.target is operator.getitem:
            seq, idx = n.args
            ctx.env[n] = ctx.env[seq][idx] if isinstance(ctx.env[seq], list | tuple) else None
            continue
        if _is_mutating(n.target):
            raise UnsupportedError(ctx.describe("mutates its input; novaforge needs a functionalized graph"))
        rule = LOWERINGS.get(n.target)
        if rule is None and isinstance(n.target, torch._ops.OpOverload):
            rule = LOWERINGS.get(n.target.overloadpacket)
        if _all_outputs_empty(n):
            result = _empty_results(ctx)
        elif rule is None:
            if not isinstance(n.target, torch._ops.OpOverload):
                raise UnsupportedError(ctx.describe("is not an ATen operator; cannot compile it"))
            result = ctx.extern()
        else:
            result = rule(ctx, *n.args, **n.kwargs)
        _check_result(ctx, n, result)
        ctx.env[n] = result

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
    graph = Graph(graph_inputs, ctx.nodes, keep, muts)
    return graph, ctx


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
            raise UnsupportedError(ctx.describe("output shape depends on tensor data (data-dependent shape)"))
        if g.type.shape != types[0].shape or g.type.dtype != types[0].dtype:
            raise AssertionError(ctx.describe(f"lowering bug: IR gives {g.type}, ATen gives {types[0]}"))

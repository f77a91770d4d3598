"""Graph, Node and Value: the value-semantic SSA IR.

Invariants (checked by `ir.verify`):
* A `Value` is assigned exactly once: it is either a graph input or an output of exactly one
  node. Values know only their type; producers and users are derived per graph.
* `Node`s are immutable: op name, input values, frozen attributes, output values, and a `meta`
  dict for provenance (source line, ATen target) that never affects semantics or keys.
* A `Graph` is immutable once built: inputs, nodes in a valid topological order, outputs.
  Passes build new graphs (with `Rewriter`) and may share unchanged nodes and values with the
  old graph, so a pass never changes the graph it was given.
* No node mutates a value. A mutation of a graph input (a buffer update) is an explicit pair
  (input value, new value) in `Graph.mutations`, written back by the runtime at the boundary.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .attrs import Attrs
from .types import TensorType

_ids = itertools.count()


class Value:
    """An SSA virtual register holding one tensor."""

    __slots__ = ("id", "type", "hint")

    def __init__(self, type: TensorType, hint: str = "") -> None:
        self.id = next(_ids)
        self.type = type
        self.hint = hint

    def __repr__(self) -> str:
        return f"%{self.hint or 'v'}{self.id}:{self.type}"


class Node:
    __slots__ = ("op", "inputs", "attrs", "outputs", "meta")

    def __init__(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: Attrs,
        outputs: Sequence[Value],
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.op = op
        self.inputs: tuple[Value, ...] = tuple(inputs)
        self.attrs = attrs
        self.outputs: tuple[Value, ...] = tuple(outputs)
        self.meta: dict[str, Any] = meta if meta is not None else {}

    @property
    def out(self) -> Value:
        """The single output (most ops have exactly one)."""
        assert len(self.outputs) == 1, f"{self.op} has {len(self.outputs)} outputs"
        return self.outputs[0]

    def with_inputs(self, inputs: Sequence[Value]) -> Node:
        return Node(self.op, inputs, self.attrs, self.outputs, self.meta)

    def __repr__(self) -> str:
        ins = ", ".join(f"%{v.id}" for v in self.inputs)
        outs = ", ".join(f"%{v.id}" for v in self.outputs)
        return f"{outs} = {self.op}({ins}{', ' if ins and self.attrs else ''}{self.attrs!r})"


INPUT_KINDS = ("user", "param", "buffer", "const", "size")


@dataclass(frozen=True)
class GraphInput:
    """A graph input. `const` inputs carry their tensor (frozen parameters, folded constants);
    `param`/`buffer` inputs are bound from the module at each call; `user` inputs are the
    call's arguments in order; `size` inputs (graphs with symbolic sizes only) are values that
    depend on the sizes alone, computed once per size by their `recipe` (a graph without
    user inputs, passes/hoist_size_only.py)."""

    value: Value
    kind: str
    name: str
    tensor: torch.Tensor | None = field(default=None, compare=False)
    recipe: Graph | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        assert self.kind in INPUT_KINDS, self.kind
        assert (self.kind == "const") == (self.tensor is not None) or self.kind != "const"
        assert (self.kind == "size") == (self.recipe is not None)


class GraphMeta(MutableMapping):
    """What stages hand on about a whole graph, as typed fields: the ATen op count of the
    captured program (capture), the executor of every node and the number of transitions
    (place), the memory plan (plan_memory), the names of the inputs whose buffers the program may
    overwrite once it no longer reads them (`donated`: a backward's saved activations that nothing
    else holds; AOTAutograd's donated buffers). Writers set attributes (`meta.memory_plan = plan`);
    the mapping interface (`meta.get("memory_plan")`, `meta["aten_ops"]`, `dict(meta)`) serves
    readers and serializers and accepts only these names. An unset field is absent."""

    FIELDS = ("aten_ops", "placement", "transitions", "memory_plan", "donated")
    __slots__ = FIELDS

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        for k in self.FIELDS:
            object.__setattr__(self, k, None)
        for k, v in dict(values or {}).items():
            self[k] = v

    aten_ops: int | None
    placement: dict[Any, str] | None  # Node -> executor ("cpu", "triton", "torch", "view")
    transitions: int | None
    memory_plan: Any  # passes.plan_memory.MemoryPlan
    donated: frozenset[str] | None  # input names the program may overwrite after their last read

    def copy(self) -> GraphMeta:
        return GraphMeta(self)

    def __getitem__(self, key: str) -> Any:
        v = getattr(self, key, None) if key in self.FIELDS else None
        if v is None:
            raise KeyError(key)
        return v

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.FIELDS:
            raise KeyError(f"graph meta has no field {key!r} (fields: {', '.join(self.FIELDS)})")
        object.__setattr__(self, key, value)

    def __delitem__(self, key: str) -> None:
        self[key] = None

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.FIELDS if getattr(self, k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"GraphMeta({', '.join(f'{k}=...' for k in self)})"


class Graph:
    """An immutable IR graph. Producer/user maps are computed lazily and cached."""

    def __init__(
        self,
        inputs: Sequence[GraphInput],
        nodes: Sequence[Node],
        outputs: Sequence[Value],
        mutations: Sequence[tuple[Value, Value]] = (),
        meta: GraphMeta | Mapping[str, Any] | None = None,
    ) -> None:
        self.inputs: tuple[GraphInput, ...] = tuple(inputs)
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.outputs: tuple[Value, ...] = tuple(outputs)
        self.mutations: tuple[tuple[Value, Value], ...] = tuple(mutations)
        self.meta: GraphMeta = GraphMeta(meta)
        self._producers: dict[Value, Node] | None = None
        self._users: dict[Value, list[Node]] | None = None
        self._input_of: dict[Value, GraphInput] | None = None

    # -- derived maps -------------------------------------------------------------------
    def producer(self, v: Value) -> Node | None:
        if self._producers is None:
            self._producers = {o: n for n in self.nodes for o in n.outputs}
        return self._producers.get(v)

    def users(self, v: Value) -> list[Node]:
        if self._users is None:
            users: dict[Value, list[Node]] = {}
            for n in self.nodes:
                for i in dict.fromkeys(n.inputs):
                    users.setdefault(i, []).append(n)
            self._users = users
        return self._users.get(v, [])

    def input_of(self, v: Value) -> GraphInput | None:
        if self._input_of is None:
            self._input_of = {gi.value: gi for gi in self.inputs}
        return self._input_of.get(v)

    def is_output(self, v: Value) -> bool:
        return v in self.outputs or any(new is v for _, new in self.mutations)

    def const_tensor(self, v: Value) -> torch.Tensor | None:
        gi = self.input_of(v)
        return gi.tensor if gi is not None and gi.kind == "const" else None

    @property
    def user_inputs(self) -> list[GraphInput]:
        return [gi for gi in self.inputs if gi.kind == "user"]

    def values(self) -> Iterable[Value]:
        for gi in self.inputs:
            yield gi.value
        for n in self.nodes:
            yield from n.outputs

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def with_nodes(self, nodes: Sequence[Node], outputs: Sequence[Value] | None = None) -> Graph:
        return Graph(self.inputs, nodes, self.outputs if outputs is None else outputs, self.mutations, self.meta)

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)


class Rewriter:
    """Builds a new graph from an old one, node by node, without touching the old graph.

    `keep(node)` re-emits a node (rebuilt only if an input was substituted), `emit(...)`
    appends a new node (types inferred from the op table), `replace(old, new)` substitutes a
    value for all later uses and in the outputs. `finish()` returns the new Graph.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list[Node] = []
        self.subst: dict[Value, Value] = {}
        self.new_inputs: list[GraphInput] = []

    def get(self, v: Value) -> Value:
        while v in self.subst:
            v = self.subst[v]
        return v

    def replace(self, old: Value, new: Value) -> None:
        if old is not new:
            if old.type != new.type:
                raise TypeError(f"replacing {old} with {new}: types differ")
            self.subst[old] = new

    def keep(self, node: Node) -> Node:
        ins = tuple(self.get(v) for v in node.inputs)
        if any(a is not b for a, b in zip(ins, node.inputs, strict=True)):
            node = node.with_inputs(ins)
        self.nodes.append(node)
        return node

    def emit(
        self,
        op: str,
        inputs: Sequence[Value],
        attrs: Mapping[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        out_types: Sequence[TensorType] | None = None,
        hint: str = "",
        **attr_kw: Any,
    ) -> Node:
        if attr_kw:
            attrs = {**dict(attrs or {}), **attr_kw}
        node = make_node(op, [self.get(v) for v in inputs], attrs, meta, out_types, hint)
        self.nodes.append(node)
        return node

    def add_const(self, tensor: torch.Tensor, name: str) -> Value:
        v = Value(TensorType.of(tensor), hint="c")
        self.new_inputs.append(GraphInput(v, "const", name, tensor))
        return v

    def finish(self, outputs: Sequence[Value] | None = None) -> Graph:
        g = self.graph
        outs = [self.get(v) for v in (g.outputs if outputs is None else outputs)]
        muts = [(i, self.get(v)) for i, v in g.mutations]
        return Graph(list(g.inputs) + self.new_inputs, self.nodes, outs, muts, g.meta)


def make_node(
    op: str,
    inputs: Sequence[Value],
    attrs: Mapping[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    out_types: Sequence[TensorType] | None = None,
    hint: str = "",
) -> Node:
    """Create a node, inferring output types from the op table unless given."""
    from .ops import OPS

    opdef = OPS[op]
    a = attrs if isinstance(attrs, Attrs) else opdef.check_attrs(dict(attrs or {}))
    if out_types is None:
        out_types = opdef.infer([v.type for v in inputs], a)
    outs = [Value(t, hint) for t in out_types]
    return Node(op, inputs, a, outs, meta)

"""Hoisting values that depend on the sizes alone out of a graph with symbolic sizes.

A static capture folds everything computed from constants and sizes (a causal mask built
from `arange`, transformers' packed-sequence detection: `cumsum` of position differences,
`index`): constant folding evaluates it once. In a symbolic graph those values change with the
sizes, so they stayed in the graph and ran at every call, partly through torch (no CPU code for
`cumsum` or multi-axis `index`), and the attention received an explicit mask where the static
graph had `causal=True`.

This pass cuts every such value at its frontier (a size-only value read by a node that also
reads data) into a `size` graph input whose `recipe` is the subgraph computing it. A program
for a range of sizes evaluates each recipe once per size (`CpuProgram.at`; on the per-size
path, `specialize` turns it into a const input, which is what a static capture would have
folded). Size-only means: computed without user inputs, parameters, buffers, random or
side-effect ops, from constants, generators and sizes.

Left in place: values that cost nothing to recompute (generators, views of constants or
generators: kernels read them as leaves), graph outputs (computed per call: each call returns
its own tensor), and values whose planning-hint size exceeds the option `fold_max_elements`.

Invariant: the graph computes what it computed; each `size` input's recipe computes, at any
sizes the symbol table admits, the value it replaced. A graph without symbols is returned
unchanged.
"""

from __future__ import annotations

from ..ir import OPS, Graph, GraphInput, Rewriter, Value
from ..ir.symbolic import hint, is_symbolic
from .context import PassContext, describe


def hoist_size_only(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    if not is_symbolic([gi.value.type for gi in graph.inputs]):
        return graph
    producer = {o: n for n in graph.nodes for o in n.outputs}
    consts = {gi.value: gi for gi in graph.inputs if gi.kind == "const"}
    only: set[Value] = set(consts)  # size-only values
    computed: set[Value] = set()  # size-only values with a computation (not a view or generator) in their cone
    for n in graph.nodes:
        d = OPS[n.op]
        if d.has("random") or d.has("side_effect") or n.op.startswith("extern") or d.has("fused"):
            continue
        if all(v in only for v in n.inputs):
            only.update(n.outputs)
            if not (d.has("view") or d.has("generator")) or any(v in computed for v in n.inputs):
                computed.update(n.outputs)
    frontier: list[Value] = []
    readers_outside = {v for n in graph.nodes if not all(o in only for o in n.outputs) for v in n.inputs}
    for v in [o for n in graph.nodes for o in n.outputs]:
        if v in computed and v in readers_outside and hint(v.type.numel) <= ctx.options.fold_max_elements:
            frontier.append(v)
    if not frontier:
        return graph
    rw = Rewriter(graph)
    hoisted = 0
    for v in frontier:
        if not ctx.take_fuel(lambda v=v: f"hoist_size_only: {describe(producer[v])} computed once per size"):
            continue
        recipe = _recipe(v, producer, consts)
        new = Value(v.type, v.hint)
        rw.new_inputs.append(GraphInput(new, "size", f"size.{producer[v].op}.{v.id}", recipe=recipe))
        rw.replace(v, new)
        hoisted += 1
    for n in graph.nodes:
        rw.keep(n)
    ctx.count("hoisted", hoisted)
    return rw.finish() if hoisted else graph  # (dce then drops the nodes only the recipes use)


def _recipe(v: Value, producer: dict, consts: dict) -> Graph:
    """The subgraph computing `v` from constants and sizes (its const inputs included)."""
    need: set = set()
    stack = [v]
    inputs: dict[Value, GraphInput] = {}
    while stack:
        x = stack.pop()
        if x in consts:
            inputs[x] = consts[x]
            continue
        n = producer[x]
        if n in need:
            continue
        need.add(n)
        stack.extend(n.inputs)
    order = [n for n in producer.values() if n in need]
    nodes = list(dict.fromkeys(order))  # (a node with several outputs appears once per output)
    return Graph(list(inputs.values()), nodes, [v])

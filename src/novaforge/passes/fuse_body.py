"""Building a fused kernel's body graph from a fusion group (used by `fuse`).

Body contract, which every backend relies on:

* Body inputs are the buffers the kernel reads (graph inputs or other kernels' outputs), each
  once, in first-use order. Views of inputs and generators (scalars, iota, fills, and cats of
  generators read by pointwise kernels) are replicated into the body; views of inputs are
  always expressible with strides.
* In pointwise, reduction and epilogue code every computed value has a shape that broadcasts
  to the kernel's space (for matmul/attention kernels: the anchor's output shape). Ops that
  fusion joined "through a reshape" are rebuilt in the space: their other operands get
  expand+reshape views, and the kernel output is a reshape of the space-shaped value
  (a store view: same element order).
* A pointwise body may contain `cat` nodes whose inputs are (views of) body inputs or
  generators, never values the body computes: they are loads with piecewise addressing along
  the cat axis (element i of the output reads the piece that holds i). A cat's output has the
  kernel's space shape and is never viewed inside the body; reduction, matmul and attention
  bodies hold no cat.
* Reduction kernels reduce the same axes of the same space everywhere, with keepdim=True.
* Body outputs are the values other kernels or the graph use, in group order.
"""

from __future__ import annotations

from ..ir import OPS, Graph, GraphInput, Kernel, Node, Value, make_node


def make_kernel(group, outs: list[Value], defs: dict[Value, Node], grouper, graph: Graph) -> tuple[Kernel, list[Value]]:
    member = set(group.nodes)
    nodes: list[Node] = []
    body_inputs: list[GraphInput] = []
    ext: list[Value] = []
    body_val: dict[Value, Value] = {}
    canon: dict[Value, Value] = {}

    def emit(op, ins, attrs, meta=None) -> Node:
        node = make_node(op, ins, attrs, meta)
        nodes.append(node)
        return node

    def get(v: Value) -> Value:
        bv = body_val.get(v)
        if bv is not None:
            return bv
        p = defs.get(v)
        if p is not None and p not in member and (OPS[p.op].has("view") or OPS[p.op].has("generator")
                                                  or p in grouper.replicated):
            node = emit(p.op, [get(i) for i in p.inputs], p.attrs, p.meta)
            body_val[v] = node.outputs[0]
            return node.outputs[0]
        if p is not None and p in member:
            raise AssertionError(f"internal value {v!r} used before it was built")
        bv = Value(v.type, hint=v.hint)
        body_inputs.append(GraphInput(bv, "user", ""))
        ext.append(v)
        body_val[v] = bv
        return bv

    def canon_of(v: Value) -> Value:
        if v in canon:
            return canon[v]
        p = defs[v]
        if p in member:
            return body_val[v]
        inner = p.inputs[0]  # a reshape of a space-shaped member value
        return canon[inner] if inner in canon else body_val[inner]

    space = group.space
    for n in group.nodes:
        shape = n.outputs[0].type.shape if n.outputs else ()
        in_space = group.kind in ("pointwise", "matmul") and (
            n.outputs[0] in group.reshaped or any(_is_reshaped_rel(grouper, group, v) for v in n.inputs))
        if not in_space:
            node = emit(n.op, [get(v) for v in n.inputs], n.attrs, n.meta)
            for o, bo in zip(n.outputs, node.outputs, strict=True):
                body_val[o] = bo
            continue
        ins = []
        for v in n.inputs:
            if _is_reshaped_rel(grouper, group, v):
                ins.append(canon_of(v))
                continue
            bv = get(v)
            if bv.type.rank:
                if bv.type.shape != shape:
                    bv = emit("expand", [bv], {"shape": shape}).outputs[0]
                if bv.type.shape != space:
                    bv = emit("reshape", [bv], {"shape": space}).outputs[0]
            ins.append(bv)
        node = emit(n.op, ins, n.attrs, n.meta)
        canon[n.outputs[0]] = node.outputs[0]
        if shape == space:
            body_val[n.outputs[0]] = node.outputs[0]

    body_outs = []
    for o in outs:
        if o in canon and o.type.shape != canon[o].type.shape:
            body_outs.append(emit("reshape", [canon[o]], {"shape": o.type.shape}).outputs[0])
        else:
            body_outs.append(body_val[o])
    body = Graph(body_inputs, nodes, body_outs)
    anchor = next((i for i, n in enumerate(nodes) if OPS[n.op].has("anchor")), None)
    return Kernel(kernel_name(group.kind, nodes), group.kind, body, anchor), ext


def _is_reshaped_rel(grouper, group, v: Value) -> bool:
    rel = grouper.internal_input(group, v)
    return rel is not None and rel[0] == "reshaped"


_SKIP = {"scalar", "full", "iota", "reshape", "permute", "expand", "slice", "copy"}


def kernel_name(kind: str, nodes: list[Node]) -> str:
    ops = [n.op for n in nodes]
    if kind == "reduction":
        sums, maxes = ops.count("sum"), ops.count("max")
        if maxes and sums and "exp" in ops:
            return "softmax" if "log" not in ops else "log_softmax"
        if sums >= 2 and "rsqrt" in ops:
            return "layernorm"
        if sums == 1 and "rsqrt" in ops:
            return "rmsnorm"
    seen: list[str] = []
    for op in ops:
        if op not in _SKIP and op not in seen:
            seen.append(op)
    if not seen:
        seen = ["copy"]
    name = "_".join(seen[:4]) + ("_etc" if len(seen) > 4 else "")
    return name

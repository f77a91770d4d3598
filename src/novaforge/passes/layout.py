"""Layout optimization on the IR: canonical view chains, identity views and copies removed.

* identity views (reshape to the same shape, identity permute, expand to the same shape, a
  slice covering its axis) are removed;
* permute(permute(x)) becomes one permute (or nothing), reshape(reshape(x)) one reshape,
  expand(expand(x)) one expand, reshape(expand(scalar)) an expand of the scalar;
* `cat` of a single value is that value.

What remains are views that fusion folds into its consumers' indexing as strides (a transposed
weight read by a matmul, a head split read by attention): views never copy unless a consumer
needs a layout strides cannot express.
"""

from __future__ import annotations

from ..ir import Graph, Rewriter, Value
from .context import PassContext, describe


def layout(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    rw = Rewriter(graph)
    defs: dict[Value, object] = {}
    changed = 0
    for n in graph.nodes:
        first_new = len(rw.nodes)
        ins = [rw.get(v) for v in n.inputs]
        out = n.outputs[0] if n.outputs else None
        repl: Value | None = None
        src = defs.get(ins[0]) if ins else None
        if n.op in ("reshape", "expand") and ins[0].type.shape == out.type.shape:
            repl = ins[0]
        elif n.op == "permute" and tuple(n.attrs["perm"]) == tuple(range(len(n.attrs["perm"]))):
            repl = ins[0]
        elif n.op == "slice" and n.attrs["start"] == 0 and n.attrs["step"] == 1 \
                and n.attrs["stop"] >= ins[0].type.shape[n.attrs["axis"]]:
            repl = ins[0]
        elif n.op == "cat" and len(ins) == 1:
            repl = ins[0]
        elif n.op == "permute" and src is not None and src.op == "permute":
            inner, outer = src.attrs["perm"], n.attrs["perm"]
            perm = tuple(inner[p] for p in outer)
            base = src.inputs[0]
            repl = base if perm == tuple(range(len(perm))) else rw.emit("permute", [base], perm=perm).out
        elif n.op == "reshape" and src is not None and src.op == "reshape":
            base = src.inputs[0]
            repl = base if base.type.shape == out.type.shape else rw.emit(
                "reshape", [base], shape=out.type.shape).out
        elif n.op == "expand" and src is not None and src.op == "expand":
            repl = rw.emit("expand", [src.inputs[0]], shape=out.type.shape).out
        elif n.op in ("reshape", "expand") and src is not None and src.op == "expand" \
                and src.inputs[0].type.rank == 0:
            repl = rw.emit("expand", [src.inputs[0]], shape=out.type.shape).out
        if repl is not None and repl.type == out.type \
                and not ctx.take_fuel(lambda n=n: f"layout: folded {describe(n)}"):
            del rw.nodes[first_new:]  # without fuel: keep the view as it was
            repl = None
        if repl is not None and repl.type == out.type:
            rw.replace(out, repl)
            changed += 1
            for node in rw.nodes[-1:]:
                for o in node.outputs:
                    defs.setdefault(o, node)
            continue
        node = rw.keep(n)
        for o in node.outputs:
            defs[o] = node
    for node in rw.nodes:
        for o in node.outputs:
            defs.setdefault(o, node)
    ctx.count("views_folded", changed)
    return rw.finish() if changed else graph

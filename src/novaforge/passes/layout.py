"""Layout optimization on the IR: canonical view chains, identity views removed (a rule table,
`LAYOUT`, see rules.py).

* identity views (reshape to the same shape, identity permute, expand to the same shape, a
  slice covering its axis: each op's record says when, `OpDef.returns_input`) are removed;
* permute(permute(x)) becomes one permute (or nothing), reshape(reshape(x)) one reshape,
  expand(expand(x)) one expand, reshape(expand(scalar)) an expand of the scalar;
* `cat` of a single value is that value.

What remains are views that fusion folds into its consumers' indexing as strides (a transposed
weight read by a matmul, a head split read by attention): views never copy unless a consumer
needs a layout strides cannot express.
"""

from __future__ import annotations

from ..ir import OPS, Graph, Node, Rewriter, Value
from .context import PassContext, describe
from .rules import Match, RuleTable

LAYOUT = RuleTable("layout")


@LAYOUT.rule(when=lambda m: OPS[m.op].returns_input is not None and OPS[m.op].returns_input(m.node))
def identity_view(m: Match) -> Value | None:  # the op's record says this node is its input
    return m.ins[0]


def _src_is(op: str):
    return lambda m: m.src() is not None and m.src().op == op


@LAYOUT.rule("permute", when=_src_is("permute"))
def permute_of_permute(m: Match) -> Value | None:
    src = m.src()
    inner, outer = src.attrs["perm"], m.attrs["perm"]
    perm = tuple(inner[p] for p in outer)
    base = src.inputs[0]
    return base if perm == tuple(range(len(perm))) else m.emit("permute", [base], perm=perm)


@LAYOUT.rule("reshape", when=_src_is("reshape"))
def reshape_of_reshape(m: Match) -> Value | None:
    base = m.src().inputs[0]
    return base if base.type.shape == m.out.type.shape else m.emit("reshape", [base], shape=m.out.type.shape)


@LAYOUT.rule("expand", when=_src_is("expand"))
def expand_of_expand(m: Match) -> Value | None:
    return m.emit("expand", [m.src().inputs[0]], shape=m.out.type.shape)


@LAYOUT.rule("reshape", "expand", when=lambda m: _src_is("expand")(m) and m.src().inputs[0].type.rank == 0)
def view_of_expanded_scalar(m: Match) -> Value | None:
    return m.emit("expand", [m.src().inputs[0]], shape=m.out.type.shape)


def layout(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    rw = Rewriter(graph)
    defs: dict[Value, Node] = {}
    changed = 0
    for n in graph.nodes:
        first_new = len(rw.nodes)
        out = n.outputs[0] if n.outputs else None
        _, repl = LAYOUT.apply(Match(n, [rw.get(v) for v in n.inputs], defs, rw, graph))
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

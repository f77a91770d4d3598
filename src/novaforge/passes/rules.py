"""Local rewrites as data: a table of (ops, pattern, rewrite) rules, in the style of tinygrad's
PatternMatcher, shared by simplify.py and layout.py.

A pass walks the graph in order and, for each node, builds a `Match` (the node, its inputs
in the rewritten graph, their producers) and asks its `RuleTable` for a replacement. The
table tries the rules registered for the node's op (and those for every op) in registration
order; the first rule whose *pattern* holds decides: its rewrite returns the replacement value
(which may be built from new nodes, `Match.emit`) or None (keep the node). So a table reads
like the if/elif chain it replaces, one rule per line, each testable on its own.

Invariant: a rewrite returns a value of the node's exact type or None; it emits nodes only
through `Match.emit`, and the pass discards what it emitted when the rewrite is not taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph, Node, Rewriter, Value

Pattern = Callable[["Match"], bool]
Rewrite = Callable[["Match"], "Value | None"]


@dataclass
class Match:
    node: Node  # the node of the input graph
    ins: list[Value]  # its inputs in the rewritten graph
    defs: dict[Value, Node]  # value -> its producer in the rewritten graph
    rw: Rewriter
    graph: Graph  # the input graph (users, outputs)

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def attrs(self) -> Any:
        return self.node.attrs

    @property
    def out(self) -> Value:
        return self.node.outputs[0]

    def src(self, i: int = 0) -> Node | None:
        """The producer of input i (None for a graph input)."""
        return self.defs.get(self.ins[i]) if i < len(self.ins) else None

    def emit(self, op: str, ins: list[Value], **attrs: Any) -> Value:
        return self.rw.emit(op, ins, **attrs).out

    def same_as(self, v: Value) -> Value | None:
        """v standing for the node's output: v itself, or an expand of it when the node's
        result is broadcast to a larger shape; None when the dtype or device differ."""
        out = self.out
        if v.type == out.type:
            return v
        if v.type.dtype == out.type.dtype and v.type.device == out.type.device:
            try:
                return self.rw.emit("expand", [v], shape=out.type.shape).outputs[0]
            except ValueError:
                return None
        return None


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pattern
    rewrite: Rewrite


@dataclass
class RuleTable:
    name: str
    rules: dict[str, list[Rule]] = field(default_factory=dict)  # op ("*": any op) -> rules in order
    order: list[Rule] = field(default_factory=list)

    def rule(self, *ops: str, when: Pattern = lambda m: True) -> Callable[[Rewrite], Rewrite]:
        """Register `rewrite` for nodes of `ops` (none given: every op) whose match satisfies `when`."""

        def deco(fn: Rewrite) -> Rewrite:
            r = Rule(fn.__name__, when, fn)
            self.order.append(r)
            for op in ops or ("*",):
                self.rules.setdefault(op, []).append(r)
            return fn

        return deco

    def candidates(self, op: str) -> list[Rule]:
        mine, anyop = self.rules.get(op, []), self.rules.get("*", [])
        return sorted(mine + anyop, key=self.order.index) if anyop and mine else mine or anyop

    def apply(self, m: Match) -> tuple[Rule | None, Value | None]:
        """(the rule whose pattern matched, its replacement or None)."""
        for r in self.candidates(m.op):
            if r.pattern(m):
                return r, r.rewrite(m)
        return None, None

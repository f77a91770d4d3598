"""PassContext: what a pass may read besides the graph (options, target) and where it reports.

`options` is the compile's typed `Options` (novaforge/options.py); passes read its fields.

Passes count what they did with `ctx.count(name, n)`; the pipeline stores the counters beside
each pass's time and node counts. Tests assert on these counters.

Fuel (for `novaforge.bisect`): every rewrite or fusion decision a pass makes goes through
`ctx.take_fuel(what)` first. With `fuel=None` (the default) every decision is taken; with
`fuel=n` only the first n are, and each later one returns False, in which case the pass keeps
that part of the graph as it was (a node not merged, not folded, not fused, not placed in
place). Invariant: a pass returns a valid graph that computes the same values for any fuel,
and with fuel 0 it changes nothing it is allowed to leave unchanged. `decisions` counts every
decision asked for (taken or not); with `trace` a list, each taken decision appends its
description (`what` may be a callable, evaluated only then).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..options import Options


@dataclass
class PassContext:
    options: Options = field(default_factory=Options)
    target: Any = None
    backend: Any = None
    counters: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    fuel: int | None = None  # decisions this pass may take (None: unlimited)
    decisions: int = 0  # decisions asked for so far
    trace: list[str] | None = None  # descriptions of the decisions taken (when a list)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def take_fuel(self, what: str | Callable[[], str] = "") -> bool:
        """One rewrite or fusion decision: True when the pass may make it."""
        n = self.decisions
        self.decisions = n + 1
        if self.fuel is not None and n >= self.fuel:
            return False
        if self.trace is not None:
            self.trace.append(what() if callable(what) else what)
        return True


def describe(node: Any) -> str:
    """A node as one line for decision traces: `%3 = mul(%1, %2)  # model.py:12 in forward`."""
    src = node.meta.get("source", "") if getattr(node, "meta", None) else ""
    if node.op == "kernel":
        k = node.attrs["kernel"]
        ops = " ".join(n.op for n in k.body.nodes[:8]) + (" ..." if len(k.body.nodes) > 8 else "")
        text = f"kernel {k.name} [{k.kind}: {ops}]"
    else:
        text = repr(node)
    return text + (f"  # {src}" if src else "")

"""PassContext: what a pass may read besides the graph (options, target) and where it reports.

Passes count what they did with `ctx.count(name, n)`; the pipeline stores the counters beside
each pass's time and node counts. Tests assert on these counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassContext:
    options: dict[str, Any] = field(default_factory=dict)
    target: Any = None
    backend: Any = None
    counters: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

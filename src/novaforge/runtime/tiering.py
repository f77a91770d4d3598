"""Tiered execution of dynamic graphs: a size is compiled once it has paid for its build.

Today every program is built for concrete sizes (docs/dynamic-shapes.md), so a dynamic graph
called at a new size costs a C++ or Triton build (about a second on this CPU for a small
model). Called once per size, as in `generate()` with transformers' growing `DynamicCache`
or a server seeing every sequence length, that is a build per call. `Tiering` decides, per
input signature of one dynamic graph, when the build is worth it, by the ski-rental rule:

* a signature without a program runs eagerly (the caller's eager function: the user's module
  on the direct path, Dynamo's own ATen graph on `torch.compile`), and its eager time is
  added to the signature's *rent*;
* once the rent reaches the expected build time (`build_estimate()`: the median of the last
  builds of this process, `FIRST_BUILD_S` before any), the next call builds its program, and
  every later call of that signature runs it.

So the time spent eagerly at a size never exceeds one build time more than building at once
would have cost, and a size seen once never builds. A graph builds at most `MAX_PROGRAMS`
programs this way (a server generating from many prompts would otherwise, in time, pay for a
program at every cache length): later sizes stay in the eager tier, logged once.

`Options.tiered=False` builds every signature on its first call, as before; so does
`$NOVAFORGE_TIERED=0`, which the test suite sets (its tests of dynamic graphs at several sizes
check programs, not the eager tier). The counters (`eager_calls`, `builds`) are what the
report and the tests read.

Invariant: the eager tier computes exactly what eager computes (it *is* eager), so tiering
changes when a program is built, never what a call returns.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from typing import Any

from .. import logs, settings

FIRST_BUILD_S = 1.0  # the expected build time before any build was measured (a small model, this CPU)
MAX_PROGRAMS = 16  # programs one dynamic graph builds through the tiers

_log = logs.get_logger("runtime")
_BUILD_TIMES: deque[float] = deque(maxlen=8)
_LOCK = threading.Lock()


def record_build(seconds: float) -> None:
    """A program was built in `seconds` (any entry point; it informs the estimate)."""
    with _LOCK:
        _BUILD_TIMES.append(float(seconds))


def build_estimate() -> float:
    with _LOCK:
        return statistics.median(_BUILD_TIMES) if _BUILD_TIMES else FIRST_BUILD_S


class Tiering:
    """The rent of every signature of one dynamic graph (see the module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and settings.tiered_enabled()
        self.rent: dict[Any, float] = {}
        self.eager_calls = 0
        self.builds = 0
        self.capped = False
        self._lock = threading.Lock()

    def should_build(self, key: Any) -> bool:
        """Build the program of `key` now (else run this call eagerly and `charge` it)."""
        if not self.enabled:
            return True
        with self._lock:
            if self.builds >= MAX_PROGRAMS:
                if not self.capped:
                    self.capped = True
                    _log.warning("dynamic graph: %d programs built; new sizes stay in the eager tier", self.builds)
                return False
            return self.rent.get(key, 0.0) >= build_estimate()

    def charge(self, key: Any, seconds: float) -> None:
        with self._lock:
            self.rent[key] = self.rent.get(key, 0.0) + seconds
            self.eager_calls += 1

    def built(self, key: Any) -> None:
        """`key` has its program now (the builder reports its time with `record_build`)."""
        with self._lock:
            self.rent.pop(key, None)
            self.builds += 1

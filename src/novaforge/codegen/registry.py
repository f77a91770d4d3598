"""Backend registry: name -> Backend factory.

A Backend has capability methods and turns a planned graph into a Program:
`target()` (the hardware description schedules are derived from), `executor_for(kernel)`
(which executor runs a kernel: its own generated code or the `torch` fallback),
`build(graph, options) -> Program` and `hash()` (part of every cache key). A Program has
`run(inputs) -> list[Tensor]` taking the graph's non-const inputs in order and returning the
outputs followed by mutated inputs' new values.
"""

from __future__ import annotations

from typing import Any

from ..ir import Graph, Kernel
from ..runtime.interpret import interpret
from .sources import sources_digest  # noqa: F401  (re-exported: a backend's hash)


class InterpretProgram:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, inputs):
        return interpret(self.graph, inputs)


class InterpretBackend:
    """Runs every kernel through the reference interpreter (the oracle; `backend='interpret'`)."""

    name = "interpret"

    def target(self) -> Any:
        return None

    def executor_for(self, kernel: Kernel) -> str:
        return "torch"

    def build(self, graph: Graph, options: dict[str, Any]) -> InterpretProgram:
        return InterpretProgram(graph)

    def hash(self) -> str:
        return "interpret-1"


def _cpu():
    from .cpu.backend import CpuBackend

    return CpuBackend()


def _triton():
    from .triton.backend import TritonBackend

    return TritonBackend()


FACTORIES = {"interpret": InterpretBackend, "cpu": _cpu, "triton": _triton}
_instances: dict[str, Any] = {}


def get_backend(name: str):
    if name not in FACTORIES:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(FACTORIES)}")
    if name not in _instances:
        _instances[name] = FACTORIES[name]()
    return _instances[name]

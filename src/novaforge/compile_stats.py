"""What one compilation is made of, shared by the two entry points that compile graphs:
`novaforge.compile` (api.py) and `torch.compile(backend="novaforge")` (dynamo.py).

* `BACKENDS`: the backend names a caller may pass;
* `resolve_backend(backend, graph)`: the backend that builds a captured graph ("auto": `triton`
  for a graph with CUDA inputs, else `cpu`, unless `NOVAFORGE_BACKEND` says otherwise);
* `CompileStats`: what one compilation did (the captured and optimized graphs, pass records,
  times, the backend and its program).

The backend is chosen here, in the entry layer, which calls both capture and a backend: capture
and the IR know no backend (tests/test_import_layers.py).

Invariant: `resolve_backend` returns a name `codegen.registry.get_backend` knows for every graph,
and the same name for graphs whose inputs are on the same devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import settings
from .frontend.capture import Captured
from .ir import Graph
from .passes.pipeline import PassRecord

BACKENDS = ("auto", "interpret", "cpu", "triton")


@dataclass
class CompileStats:
    """What one compilation did: times, pass records, the graphs before and after."""

    captured: Captured
    graph: Graph
    records: list[PassRecord]
    times: dict[str, float]
    backend: str
    program: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_backend(backend: str, graph: Graph) -> str:
    if backend != "auto":
        return backend
    env = settings.backend_override()
    if env:
        return env
    devices = {gi.value.type.device for gi in graph.inputs}
    if any(d.startswith("cuda") for d in devices):
        return "triton"
    return "cpu"

"""What capture returns and raises: `Captured`, the capture errors, and `user_frame` (the user's
source line an error names). Its own module so that capture.py and capture_fx.py (which capture
calls) both import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import Graph
from .lower_ctx import UnsupportedError


class CaptureError(RuntimeError):
    """The model could not be traced into a graph."""


class UntraceableError(CaptureError, UnsupportedError):
    """The tracer could not follow a forward that eager runs on the same inputs (Python that
    behaves differently under tracing: transformers' compile-time branches, a library call on a
    traced value): `novaforge.compile` then goes through Dynamo, which runs such Python as
    bytecode and splits the graph where it must (unless `fallback="raise"`)."""


class StatefulForwardError(CaptureError, UnsupportedError):
    """The forward assigns tensors to module attributes (state kept between calls outside the
    parameters, buffers and arguments: RecurrentGemma's recurrent and convolution states): a
    compiled program, a pure function of its inputs, would drop those assignments, so the next
    call would read stale state. `novaforge.compile` then goes through Dynamo, which replays
    such side effects (unless `fallback="raise"`)."""


class HookedModuleError(CaptureError, UnsupportedError):
    """The module tree has forward, forward-pre or backward hooks (its own or global ones): a
    hook's tensor results trace into a program, but its Python side effects (features appended to
    a list, logged statistics) would run at the trace only, so later calls would leave them stale.
    `novaforge.compile` then goes through Dynamo, which runs hooks' side effects at every call
    (unless `fallback="raise"`)."""


class DataDependentError(CaptureError, UnsupportedError):
    """Control flow or shapes that depend on tensor values: not traceable, and a clear refusal
    (an UnsupportedError) rather than a failure of the tracer."""


def user_frame(exc: BaseException) -> str:
    """The innermost traceback frame of `exc` in user code (outside torch, novaforge and the
    standard library), as 'dir/file.py:line in fn: code', or '' if there is none."""
    import os
    import traceback

    skip = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)),
            os.path.dirname(os.__file__)]
    frames = traceback.extract_tb(exc.__traceback__)
    for f in reversed(frames):
        if f.filename.startswith("<") or any(f.filename.startswith(d + os.sep) for d in skip):
            continue
        short = "/".join(f.filename.split(os.sep)[-2:])
        return f"{short}:{f.lineno} in {f.name}: {(f.line or '').strip()}".rstrip(": ")
    return ""


@dataclass
class Captured:
    graph: Graph
    out_spec: Any
    param_refs: list[torch.Tensor]  # tensors bound to the graph's param/buffer inputs, in order
    aten_ops: int
    externs: list[tuple[str, str]]
    times: dict[str, float] = field(default_factory=dict)
    mutated_inputs: list[int] = field(default_factory=list)
    frozen: list[torch.Tensor] = field(default_factory=list)  # module tensors baked in as constants
    symbols: Any = None  # a SymbolTable when the graph has symbolic sizes (frontend/dynamic.py)
    cache_key: str | None = None  # its captured-graph cache key (graph_cache.py), when it has one

"""What a runner gets and gives back inside a worker process.

A runner turns (model or operands, RunContext) into a `Prepared`: a zero-argument `call` that
does one timed unit of work (one forward, one training step, one matmul), a `to_tensor` that
turns what `call` returned into a torch tensor on the CPU (for the comparison with eager),
and `info` (setup breakdown, runner-specific notes). Everything a runner does before the
worker's first `call` is setup, and so is that first call (compilation happens there for the
JIT runners); the worker times both.

Invariant: `call` leaves its device work complete or leaves the worker's `sync` to complete
it; `to_tensor` never runs inside the timed region.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class RunContext:
    device: str  # cpu / cuda
    dtype: str  # float32 / bfloat16 / int8-weight / int8-dynamic (a quantization of the float32 model)
    threads: int
    workdir: Path  # a private scratch folder of this process
    nf_backend: str = "auto"
    tf32: bool = False

    @property
    def quantization(self) -> str | None:
        """The int8 mode (`novaforge.quantize`'s name) when `dtype` is one, else None."""
        return self.dtype if self.dtype.startswith("int8-") else None

    @property
    def torch_dtype(self) -> torch.dtype:
        """The float type of activations and unquantized weights (float32 under an int8 mode)."""
        return torch.float32 if self.quantization else getattr(torch, self.dtype)

    def autocast(self):
        """bf16 training runs under autocast (the master weights stay float32)."""
        if self.dtype == "bfloat16":
            return torch.autocast(device_type=self.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()


@dataclass
class Prepared:
    call: Callable[[], Any]
    to_tensor: Callable[[Any], torch.Tensor] = field(default=lambda out: main_tensor(out))
    info: dict[str, Any] = field(default_factory=dict)
    # called once after the first call: compiler metrics and the like, merged into the result
    after_first: Callable[[], dict[str, Any]] | None = None
    # the runner's own peak-memory reading in MiB (e.g. JAX's allocator); default: the worker's
    peak_memory_mb: Callable[[], float | None] | None = None


def output_is_logits(out: Any) -> bool:
    """Whether `main_tensor(out)` is the `logits` of a transformers output (then top-1 agreement means something)."""
    logits = getattr(out, "logits", None)
    return isinstance(logits, torch.Tensor) and main_tensor(out) is logits


def main_tensor(out: Any) -> torch.Tensor:
    """The tensor to compare: `last_hidden_state` of a transformers output, else the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    hidden = getattr(out, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple) and out:
        return main_tensor(out[0])
    raise TypeError(f"cannot find an output tensor in {type(out).__name__}")

"""The novaforge runner: `novaforge.compile(model, freeze=True, backend=...)` for inference,
`novaforge.compile(model)` (parameters live, gradients flow) for training, and a compiled
`lambda a, b: a @ b` for the matmul sweep. `NovaforgePackedRunner` ("novaforge-packed") is the
same inference with `pack_weights=True` on the CPU backend: a packed copy of every weight (faster
GEMM, about twice the weights' memory), measured beside the default in the same run.

Calls run under `torch.no_grad()` (not `inference_mode`, which the torch runners use): a frozen
program has no autograd state either way, and capture must not depend on the caller's mode.
The first call compiles; the worker times it as setup. Compiler metrics
(`novaforge.report.metrics.metrics`) are collected right after it and land in the results.
The disk cache is whatever `$NOVAFORGE_CACHE_DIR` the harness gave this process: empty for
the first process of a case (cold), reused by the next (warm).

Invariant: nothing here changes how novaforge compiles; the runner only calls the public API.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Prepared, RunContext
from .torch_runners import training_call


def _gemm_paths() -> dict[str, int]:
    """nf_gemm's calls so far per low-precision path (which instructions ran: the report names them)."""
    from ...codegen.cpu import gemm

    try:
        counts = {f"bf16 {k}": v for k, v in gemm.bf16_counts().items()}
        counts.update({f"int8-weight {k}": v for k, v in gemm.i8_counts().items()})
        counts.update({f"int8 x int8 {k}": v for k, v in gemm.s8_counts().items()})
    except OSError:  # (no C++ compiler: the library is unavailable)
        return {}
    return counts


def _metrics_of(compiled: Any, paths_before: dict[str, int] | None = None) -> dict[str, Any]:
    from ...report.metrics import metrics

    stats = compiled.stats()
    if stats is None:
        return {}
    out: dict[str, Any] = {"metrics": metrics(stats)}
    if paths_before is not None:
        now = _gemm_paths()
        out["gemm_paths"] = {k: v - paths_before.get(k, 0) for k, v in now.items() if v > paths_before.get(k, 0)}
    return out


class NovaforgeRunner:
    options: dict[str, Any] = {}

    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import novaforge

        compiled = novaforge.compile(model, freeze=True, backend=ctx.nf_backend, **self.options)
        paths = _gemm_paths() if ctx.nf_backend in ("auto", "cpu") else None

        def call() -> Any:
            with torch.no_grad():
                return compiled(*inputs)

        return Prepared(call, info={"backend_requested": ctx.nf_backend},
                        after_first=lambda: _metrics_of(compiled, paths))

    def training(self, model: torch.nn.Module, batches: list, ctx: RunContext) -> Prepared:
        import novaforge

        compiled = novaforge.compile(model, backend=ctx.nf_backend)
        return Prepared(training_call(compiled, model, batches, ctx), info={"backend_requested": ctx.nf_backend},
                        after_first=lambda: _metrics_of(compiled))

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        import novaforge

        from .torch_runners import generate_call

        compiled = novaforge.compile(model, freeze=True, backend=ctx.nf_backend, **self.options)
        return Prepared(generate_call(compiled.generate, ids, new_tokens), to_tensor=lambda out: out,
                        info={"backend_requested": ctx.nf_backend, "cache": "static"},
                        after_first=lambda: {**_metrics_of(compiled), "programs": compiled.compilations})

    def matmul(self, a: torch.Tensor, b: torch.Tensor, ctx: RunContext) -> Prepared:
        import novaforge

        compiled = novaforge.compile(lambda x, y: x @ y, backend=ctx.nf_backend)

        def call() -> torch.Tensor:
            with torch.no_grad():
                return compiled(a, b)

        return Prepared(call, info={"backend_requested": ctx.nf_backend}, after_first=lambda: _metrics_of(compiled))


class NovaforgeStepRunner:
    """The whole training step as one program: novaforge.compile_step(model, AdamW) (forward,
    loss, backward and the update; the same AdamW hyperparameters as the other runners)."""

    def training(self, model: torch.nn.Module, batches: list, ctx: RunContext) -> Prepared:
        import novaforge

        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        step = novaforge.compile_step(model, opt, backend=ctx.nf_backend)
        n = [0]

        def call() -> torch.Tensor:
            idx, targets = batches[n[0] % len(batches)]
            n[0] += 1
            with ctx.autocast():
                return step(idx, targets).detach()

        return Prepared(call, info={"backend_requested": ctx.nf_backend, "programs": "one step program"},
                        after_first=lambda: {"programs": step.compilations})


class NovaforgeDynamicCacheRunner:
    """generate() with transformers' default DynamicCache on `novaforge.compile(model,
    dynamic=True)`: the cache grows every step, and one program for a range of sizes serves
    every cache length (the prefill and the decode step: two programs)."""

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        from transformers import DynamicCache

        import novaforge

        from .torch_runners import generate_call

        compiled = novaforge.compile(model, freeze=True, dynamic=True, backend=ctx.nf_backend)

        def generate(*args: Any, **kwargs: Any) -> Any:  # a fresh cache for every generation
            return compiled.generate(*args, past_key_values=DynamicCache(), **kwargs)

        return Prepared(generate_call(generate, ids, new_tokens), to_tensor=lambda out: out,
                        info={"backend_requested": ctx.nf_backend, "cache": "dynamic"},
                        after_first=lambda: {**_metrics_of(compiled), "programs": compiled.compilations})


class NovaforgePackedRunner(NovaforgeRunner):
    options = {"pack_weights": True}


class NovaforgeRefineRunner(NovaforgeRunner):
    """`novaforge.compile(model, freeze=True, refine=True)`: after the first call (setup), up to
    REFINE_CALLS untimed calls let refinement measure, try and swap schedules (codegen/cpu/
    refine.py; its background builds are joined, so the count does not depend on the machine's
    speed); each of their results is compared with the first call's. The timed calls then run
    the refined program. The next process of the case finds the stored choices in the shared
    cache and starts with them (its `early_ms`: calls 2-9, before any refinement)."""

    options = {"refine": True, "refine_sample_every": 2}  # (sampling costs ~nothing: benchmarks/refine_overhead.py)
    REFINE_CALLS = 300

    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import time

        import novaforge

        from ...codegen.cpu.refine import close, wait_idle
        from .base import main_tensor

        compiled = novaforge.compile(model, freeze=True, backend=ctx.nf_backend, **self.options)

        def call() -> Any:
            with torch.no_grad():
                return compiled(*inputs)

        def refine() -> dict[str, Any]:
            first = main_tensor(call()).clone()
            early, wrong, calls = [], 0, 1
            refiner = getattr(compiled.stats().program, "refiner", None)
            while calls < self.REFINE_CALLS:
                t0 = time.perf_counter()
                out = main_tensor(call())
                if calls < 9:
                    early.append((time.perf_counter() - t0) * 1e3)
                calls += 1
                wrong += bool(close([out], [first]))
                wait_idle(compiled.stats().program)
                if refiner is None or refiner.phase == "done":
                    break
            info = {**_metrics_of(compiled), "early_ms": early, "refine_calls": calls, "wrong_results": wrong}
            if refiner is not None:
                info["refine"] = {"phase": refiner.phase, "events": refiner.events,
                                  "kernels": [{"label": r.label, "predicted_us": r.predicted_ns / 1e3,
                                               "measured_us": r.measured_ns / 1e3, "kept": r.kept,
                                               "tried_us": {v: ns / 1e3 for v, ns in r.tried.items()}, "note": r.note}
                                              for r in refiner.rows() if r.tried or r.note.startswith("decided")]}
            return info

        return Prepared(call, info={"backend_requested": ctx.nf_backend}, after_first=refine)

"""PyTorch runners: eager, torch.compile, torch.compile with freezing.

Inference calls run inside `torch.inference_mode()` (the freezing runner needs it, and the
others get the same context so that like is compared with like). Training steps are
forward + cross-entropy (inside the model) + backward + `torch.optim.AdamW(lr=3e-4)` step +
`zero_grad(set_to_none=True)`; for bf16 the forward runs under autocast.

Invariant: the model passed in is used as built (same weights in every runner); a runner
never changes global state another runner in the same process would see, except inductor's
`freezing` flag, which only the freezing runner sets and each worker process runs one runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import Prepared, RunContext


def _inference_call(fn: Callable[..., Any], inputs: tuple) -> Callable[[], Any]:
    def call() -> Any:
        with torch.inference_mode():
            return fn(*inputs)

    return call


def training_call(forward: Callable[..., torch.Tensor], model: torch.nn.Module,
                  batches: list[tuple[torch.Tensor, torch.Tensor]], ctx: RunContext) -> Callable[[], torch.Tensor]:
    """One AdamW training step per call, cycling through `batches`; returns the (detached) loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step = [0]

    def call() -> torch.Tensor:
        idx, targets = batches[step[0] % len(batches)]
        step[0] += 1
        with ctx.autocast():
            loss = forward(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return call


def generate_call(generate: Callable[..., Any], ids: torch.Tensor, new_tokens: int,
                  **kwargs: Any) -> Callable[..., torch.Tensor]:
    """A call generating exactly `n` tokens greedily (default `new_tokens`; `min_new_tokens`
    keeps an end-of-sequence token from stopping early), under no_grad."""

    def call(n: int = new_tokens) -> torch.Tensor:
        with torch.no_grad():
            return generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)

    return call


class EagerRunner:
    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        return Prepared(_inference_call(model, inputs))

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        return Prepared(generate_call(model.generate, ids, new_tokens), to_tensor=lambda out: out)

    def training(self, model: torch.nn.Module, batches: list, ctx: RunContext) -> Prepared:
        return Prepared(training_call(model, model, batches, ctx))

    def matmul(self, a: torch.Tensor, b: torch.Tensor, ctx: RunContext) -> Prepared:
        return Prepared(lambda: torch.matmul(a, b))


class TorchCompileRunner:
    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        return Prepared(_inference_call(torch.compile(model), inputs), info={"mode": "default"})

    def training(self, model: torch.nn.Module, batches: list, ctx: RunContext) -> Prepared:
        return Prepared(training_call(torch.compile(model), model, batches, ctx), info={"mode": "default"})

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        model.forward = torch.compile(model.forward)  # the usual recipe: the forward compiled, generate as is
        return Prepared(generate_call(model.generate, ids, new_tokens), to_tensor=lambda out: out,
                        info={"mode": "default", "cache": "dynamic"})


class TorchCompileStaticRunner:
    """torch.compile of the forward with transformers' static KV cache (its recommended recipe
    for compiled decoding: fixed shapes every step)."""

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        model.forward = torch.compile(model.forward)
        return Prepared(generate_call(model.generate, ids, new_tokens, cache_implementation="static"),
                        to_tensor=lambda out: out, info={"mode": "default", "cache": "static"})


class TorchCompileNovaforgeRunner:
    """novaforge through Dynamo, as users reach it: torch.compile(model, backend="novaforge");
    generate compiles model.forward and keeps transformers' default DynamicCache (the cache
    length is dynamic to Dynamo from its second value: runtime/tiering.py decides what builds)."""

    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        return Prepared(_inference_call(torch.compile(model, backend="novaforge"), inputs), info={"mode": "dynamo"})

    def generate(self, model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, ctx: RunContext) -> Prepared:
        from ... import dynamo

        model.forward = torch.compile(model.forward, backend="novaforge")
        return Prepared(generate_call(model.generate, ids, new_tokens), to_tensor=lambda out: out,
                        info={"mode": "dynamo", "cache": "dynamic"},
                        after_first=lambda: {"programs": dynamo.PROGRAMS_BUILT[0],
                                             "eager_tier_calls": dynamo.TIERED_EAGER_CALLS[0]})


class TorchCompileFreezeRunner:
    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        return Prepared(_inference_call(torch.compile(model), inputs), info={"mode": "default", "freezing": True})

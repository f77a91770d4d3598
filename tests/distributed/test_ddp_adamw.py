"""DistributedDataParallel compiled by novaforge equals eager DDP over 20 AdamW steps.

(tests/test_ddp.py checks DDP's gradients with SGD; this adds the optimizer and compile_step.)
One process group of 2 gloo processes, each rank with its own batches: `torch.compile(DDP(m),
backend="novaforge")`, `novaforge.compile(DDP(m))` and `novaforge.compile_step(DDP(m), opt)`
(stepped per call: DDP's reducer all-reduces the compiled backward's gradients, the optimizer
steps eagerly; novaforge/distributed.py), each against eager DDP on the same weights and batches.
"""

from __future__ import annotations

import pytest

from distributed.nf_dist_workers import Built, batches, build, loss_diff, param_diff, run_group, train

STEPS, SHORT = 20, 6
TOL = 1e-5


def _checks(rank: int) -> dict:
    import torch

    import novaforge

    built = Built()
    data = batches(rank, STEPS)
    ref = build("ddp")
    ref_losses, _ = train(ref, ref, data)
    out: dict = {}
    options = {"backend": "cpu", "fallback": "raise"}
    runs = {
        "torch_compile": (lambda m: torch.compile(m, backend="novaforge", options=options), None, STEPS),
        "novaforge_compile": (lambda m: novaforge.compile(m, **options), None, SHORT),
        "compile_step": (None, lambda m, opt: novaforge.compile_step(m, opt, **options), SHORT),
    }
    short = build("ddp")
    short_losses, _ = train(short, short, data[:SHORT])
    for name, (call, step, n) in runs.items():
        torch._dynamo.reset()  # (Dynamo would reuse the last model's graphs: each check compiles its own)
        built.mark()
        m = build("ddp")
        losses, _ = train(call(m) if call else None, m, data[:n], step=step)
        reference, reference_losses = (ref, ref_losses) if n == STEPS else (short, short_losses)
        apart = param_diff(m, reference)
        out[name] = {"loss": loss_diff(losses, reference_losses), "param_norm": apart["norm"],
                     "param_max": apart["max"], **built.since()}
    return out


@pytest.fixture(scope="module")
def results():
    return run_group(_checks)


@pytest.mark.parametrize("name", ["torch_compile", "novaforge_compile", "compile_step"])
def test_ddp_adamw_equals_eager(results, name):
    for rank, res in enumerate(results):
        r = res[name]
        assert r["programs"] > 0, f"rank {rank}: novaforge built no program"
        assert not r["fallbacks"], f"rank {rank}: graphs ran uncompiled: {r['fallbacks']}"
        assert r["loss"] <= TOL, f"rank {rank}: losses differ from eager DDP's by {r['loss']:.2e}"
        assert r["param_norm"] <= TOL, f"rank {rank}: parameters differ from eager DDP's by {r['param_norm']:.2e}"


def test_ddp_report(results):  # (printed with -s: the measured differences)
    for rank, res in enumerate(results):
        print(rank, res)

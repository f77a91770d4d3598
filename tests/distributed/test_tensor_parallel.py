"""Tensor parallel (`parallelize_module`, Megatron-style on a Llama block) compiled by
novaforge equals eager tensor parallel.

One process group of 2 gloo processes runs every check (`_checks`) against eager tensor
parallel on the same weights and batches, AdamW: `torch.compile(model, backend="novaforge")`,
`novaforge.compile(model)`, `novaforge.compile_step(model, opt)`, sequence parallel (the norms
on sequence shards), and the compiled model's `state_dict()` against eager's. The parameters are
DTensors; AOTAutograd unwraps them and novaforge compiles the plain graph with its
`_c10d_functional` collectives kept as extern calls into torch. Every compile uses
fallback="raise", and each check asserts that novaforge built programs and logged no fallback.
"""

from __future__ import annotations

import pytest

from distributed.nf_dist_workers import Built, batches, build, loss_diff, param_diff, run_group, state_check, train

STEPS = 6
TOL = 1e-5


def _checks(rank: int) -> dict:
    import torch

    import novaforge

    built = Built()
    data = batches(0, STEPS)  # (tensor parallel: every rank takes the same batch)
    out: dict = {}
    ref = build("tp")
    ref_losses, _ = train(ref, ref, data)

    def run(name, model, call=None, step=None, reference=ref, reference_losses=ref_losses):
        torch._dynamo.reset()  # (Dynamo would reuse the last model's graphs: each check compiles its own)
        built.mark()
        losses, _ = train(call(model) if call else None, model, data, step=step)
        apart = param_diff(model, reference)
        out[name] = {"loss": loss_diff(losses, reference_losses), "param_norm": apart["norm"],
                     "param_max": apart["max"], **built.since()}
        return model

    options = {"backend": "cpu", "fallback": "raise"}
    compiled = torch.compile(build("tp"), backend="novaforge", options=options)
    run("torch_compile", compiled._orig_mod, call=lambda m: compiled)
    out["state_dict"] = state_check(compiled, ref)
    run("novaforge_compile", build("tp"), call=lambda m: novaforge.compile(m, **options))
    run("compile_step", build("tp"), step=lambda m, opt: novaforge.compile_step(m, opt, **options))

    ref_sp = build("tp", sequence_parallel=True)
    ref_sp_losses, _ = train(ref_sp, ref_sp, data)
    out["sequence_parallel_eager_vs_tp"] = loss_diff(ref_sp_losses, ref_losses)
    run("sequence_parallel", build("tp", sequence_parallel=True), reference=ref_sp, reference_losses=ref_sp_losses,
        call=lambda m: torch.compile(m, backend="novaforge", options=options))
    return out


@pytest.fixture(scope="module")
def results():
    return run_group(_checks)


@pytest.mark.parametrize("name", ["torch_compile", "novaforge_compile", "compile_step", "sequence_parallel"])
def test_tensor_parallel_equals_eager(results, name):
    for rank, res in enumerate(results):
        r = res[name]
        assert r["programs"] > 0, f"rank {rank}: novaforge built no program"
        assert not r["fallbacks"], f"rank {rank}: graphs ran uncompiled: {r['fallbacks']}"
        assert r["loss"] <= TOL, f"rank {rank}: losses differ from eager tensor parallel's by {r['loss']:.2e}"
        assert r["param_norm"] <= TOL, \
            f"rank {rank}: parameters differ from eager tensor parallel's by {r['param_norm']:.2e}"


def test_tensor_parallel_state_dict_equals_eager(results):
    for rank, res in enumerate(results):
        for how, r in res["state_dict"].items():
            assert r["keys"] and r["layouts"], f"rank {rank}: {how}: keys or DTensor layouts differ: {r}"
            assert r["dtensors"] > 0, f"rank {rank}: {how}: no DTensor in the state"
            assert r["diff"] <= TOL, f"rank {rank}: {how}: local shards differ by {r['diff']:.2e}"


def test_tensor_parallel_report(results):  # (printed with -s: the measured differences)
    for rank, res in enumerate(results):
        print(rank, {k: (v["loss"], v["param_norm"], v["param_max"]) if isinstance(v, dict) and "loss" in v else v
                     for k, v in res.items()})

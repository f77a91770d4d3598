"""torch.distributed.checkpoint (DCP) round trips through a compiled model.

One process group of 2 gloo processes, for FSDP2 and for tensor parallel in turn: a model
compiled by novaforge (`torch.compile(..., backend="novaforge")`) trains SAVE_AT AdamW steps
and saves its model and optimizer state with DCP (`get_state_dict` of the compiled model,
`dcp.save`); then

* the compiled model goes on training (`continued`);
* a fresh UNcompiled model and optimizer load the checkpoint (`dcp.load`, `set_state_dict`) and
  train the same batches: their losses equal `continued`'s within 1e-5 (`resumed_eager`);
* a fresh compiled model does the same (`resumed_compiled`).

Invariant checked: the checkpoint holds the compiled model's whole state (parameters and AdamW
moments, as DTensors), under the same keys as an uncompiled model's, so training resumes where
it stopped in either.
"""

from __future__ import annotations

import pytest

from distributed.nf_dist_workers import Built, batches, build, loss_diff, run_group

SAVE_AT, RESUME = 3, 3
TOL = 1e-5


def _round_trip(rank: int, style: str, folder: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    built = Built()
    data = batches(0 if style == "tp" else rank, SAVE_AT + RESUME)
    options = {"backend": "cpu", "fallback": "raise"}

    def compiled(m):
        torch._dynamo.reset()
        return torch.compile(m, backend="novaforge", options=options)

    def steps(call, opt, batch):
        losses = []
        for x, y in batch:
            loss = call(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return losses

    m = build(style)
    cm = compiled(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    steps(cm, opt, data[:SAVE_AT])
    model_sd, optim_sd = get_state_dict(cm, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    keys = sorted(model_sd)
    continued = steps(cm, opt, data[SAVE_AT:])

    out = {"keys": keys, "continued": continued}
    for name, wrap in (("resumed_eager", lambda m: m), ("resumed_compiled", compiled)):
        fresh = build(style)
        call = wrap(fresh)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        model_sd, optim_sd = get_state_dict(call, fresh_opt)
        same_keys = sorted(model_sd) == keys
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(call, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        out[name] = {"loss": loss_diff(steps(call, fresh_opt, data[SAVE_AT:]), continued),
                     "keys": same_keys}
    out.update(built.since())
    return out


def _checks(rank: int, folder: str) -> dict:
    import os

    return {style: _round_trip(rank, style, os.path.join(folder, style)) for style in ("fsdp", "tp")}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_group(_checks, str(tmp_path_factory.mktemp("dcp")))


@pytest.mark.parametrize("style", ["fsdp", "tp"])
@pytest.mark.parametrize("resumed", ["resumed_eager", "resumed_compiled"])
def test_dcp_round_trip_resumes_training(results, style, resumed):
    for rank, res in enumerate(results):
        r = res[style]
        assert r["programs"] > 0 and not r["fallbacks"], f"rank {rank}: {r['programs']} programs, {r['fallbacks']}"
        assert r[resumed]["keys"], f"rank {rank}: the loaded model's state keys differ from the saved ones"
        assert r[resumed]["loss"] <= TOL, \
            f"rank {rank}: resumed losses differ from the compiled model's by {r[resumed]['loss']:.2e}"

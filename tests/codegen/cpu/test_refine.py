"""Refinement from measured run times (`refine=True`, codegen/cpu/refine.py).

* every schedule candidate the configurator offers computes eager's values (another summation
  order at most): the model is built with every kernel at variant 1, 2 and 3 (a GEMM's variant 1:
  its constant weight in packed panels);
* with a planted slow schedule (the model's schedule of one kernel is measured 1 s slower than
  it is: times are planted, so the test does not depend on this machine's load), the refiner
  builds the alternatives, checks them, swaps the faster one in between calls, stores the
  choice, and a new compile starts with it; results stay eager's throughout;
* failure paths: a build error, outputs that differ, alternatives that are slower, a busy
  machine: nothing changes (or nothing is stored) and the refiner says why;
* programs that write their inputs are not refined.
"""

from __future__ import annotations

import logging

import pytest
import torch

import novaforge
from novaforge.codegen.cpu import refine, refine_store
from novaforge.codegen.registry import get_backend
from novaforge.report.refinement import format_refinement, refiner_of
from novaforge.schedule.target import detect_cpu_target


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 192)
        self.ln = torch.nn.LayerNorm(64)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.fc(self.ln(x)).view(x.shape[0], x.shape[1], 3, 4, 16).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=True)
        h = x + self.out(a.transpose(1, 2).reshape(x.shape))
        return torch.softmax(torch.nn.functional.gelu(h) * 3, dim=-1)


@pytest.fixture()
def store(tmp_path, monkeypatch):
    path = tmp_path / "refined.json"
    monkeypatch.setattr(refine_store, "store_path", lambda target: path)
    monkeypatch.setattr(refine, "load_per_core", lambda: 0.0)  # a quiet machine unless a test says otherwise
    return path


def _model_and_input():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(2, 48, 64)


def _drive(c, x, ref, calls: int = 400) -> None:
    """Call until the refiner is done, joining its background builds so that the call count
    does not depend on the machine's speed; every result equals eager's."""
    program = c.stats().program if c.stats() is not None else None
    for _ in range(calls):
        with torch.no_grad():
            torch.testing.assert_close(c(x), ref, atol=2e-5, rtol=1e-4)
        program = c.stats().program
        refine.wait_idle(program)
        if program.refiner is None or program.refiner.phase == "done":
            return
    raise AssertionError(f"not done after {calls} calls: {program.refiner.phase}")


def _plant_slow(monkeypatch, label: str, slower: bool = True):
    """The model's schedule (variant 0) of the kernels named `label` is measured 1 s slower than
    it runs (and, with slower=False, every alternative 2 s slower)."""
    real = refine.Refiner._per_kernel

    def planted(self, program, samples):
        out = real(self, program, samples)
        labels = dict(zip(program.info["launch_keys"], program.info["launch_labels"], strict=True))
        for key, (_, _, variant) in program.info["kernel_plans"].items():
            if labels.get(key) == label and key in out:
                out[key] += 1e9 if variant == 0 else (0.0 if slower else 2e9)
        return out

    monkeypatch.setattr(refine.Refiner, "_per_kernel", planted)


def _softmax_key(program) -> str:
    labels = dict(zip(program.info["launch_keys"], program.info["launch_labels"], strict=True))
    return next(k for k in program.info["kernel_plans"] if labels[k] == "softmax")


def test_every_candidate_computes_eagers_values():
    m, x = _model_and_input()
    with torch.no_grad():
        ref = m(x)
        c = novaforge.compile(m, backend="cpu", freeze=True, refine=True, refine_sample_every=1000)
        c(x)
    program = c.stats().program
    plans = program.info["kernel_plans"]
    assert plans and any(n > 1 for _, n, _ in plans.values()), plans
    backend, graph = get_backend("cpu"), c.stats().graph
    changed = 0
    for k in (1, 2, 3):
        alt = backend.build(graph, c.options, variants={key: k for key in plans})
        assert alt.refiner is None  # (a trial is never refined itself)
        changed += alt.schedules != program.schedules
        gemms = [key for key in plans if key.endswith("|matmul")]
        assert gemms and all(alt.info["kernel_plans"][key][2] == 1 for key in gemms)  # packed B
        assert all("packed-B" in alt.schedules[key] for key in gemms), alt.schedules
        with torch.no_grad():
            (got,) = alt.run([x])
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert changed >= 1


@pytest.mark.skipif(detect_cpu_target().threads < 2, reason="the planted kernel's alternatives need 2 threads")
def test_planted_slow_schedule_is_replaced_stored_and_reused(store, monkeypatch, caplog):
    m, x = _model_and_input()
    with torch.no_grad():
        ref = m(x)
    _plant_slow(monkeypatch, "softmax")
    c = novaforge.compile(m, backend="cpu", refine=True, refine_sample_every=2)
    with caplog.at_level(logging.INFO, logger="novaforge.refine"):
        _drive(c, x, ref)
    program = c.stats().program
    refiner = program.refiner
    key = _softmax_key(program)
    row = refiner.kernels[key]
    assert row.kept not in (None, 0) and row.variant == row.kept and row.tried, row
    assert refiner.current is not program and refiner.current_variants[key] == row.kept
    assert refiner.current.info["kernel_plans"][key][2] == row.kept  # the serving program has it
    assert any("swapped in" in e for e in refiner.events), refiner.events
    assert "swapped in" in caplog.text
    text = format_refinement(refiner_of(c))
    assert "softmax" in text and f"v{row.kept}" in text
    assert refine_store.stored_variants(detect_cpu_target())[key] == row.kept
    # the next compile (as the next process would) starts with the stored variant
    c2 = novaforge.compile(m, backend="cpu", refine=True, refine_sample_every=2)
    _drive(c2, x, ref)
    p2 = c2.stats().program
    assert p2.info["kernel_plans"][key][2] == row.kept
    assert p2.refiner.kernels[key].note == "decided before (stored)"
    # without refine, the stored choice is not used
    c3 = novaforge.compile(m, backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(c3(x), ref, atol=2e-5, rtol=1e-4)
    assert c3.stats().program.refiner is None and "kernel_plans" not in c3.stats().program.info \
        or not c3.stats().program.info["kernel_plans"]


@pytest.mark.skipif(detect_cpu_target().threads < 2, reason="the planted kernel's alternatives need 2 threads")
@pytest.mark.parametrize("failure", ["build", "mismatch", "slower", "busy"])
def test_failed_refinement_changes_nothing(store, monkeypatch, failure):
    m, x = _model_and_input()
    with torch.no_grad():
        ref = m(x)
    _plant_slow(monkeypatch, "softmax", slower=failure != "slower")  # (slower: the alternatives are)
    if failure == "build":
        real_build = type(get_backend("cpu")).build

        def failing(self, graph, options=None, variants=None):
            if variants is not None:
                raise RuntimeError("planted build error")
            return real_build(self, graph, options, variants)

        monkeypatch.setattr(type(get_backend("cpu")), "build", failing)
    elif failure == "mismatch":
        monkeypatch.setattr(refine, "close", lambda got, ref: "planted difference")
    elif failure == "busy":
        monkeypatch.setattr(refine, "load_per_core", lambda: 3.0)
    c = novaforge.compile(m, backend="cpu", refine=True, refine_sample_every=2)
    _drive(c, x, ref)
    program = c.stats().program
    refiner = program.refiner
    events = " / ".join(refiner.events)
    if failure == "busy":  # the swap happens, but is not stored
        assert refiner.current is not program and "not stored" in events
        assert not store.exists()
        return
    assert refiner.current is program, events
    expected = {"build": "build failed", "mismatch": "outputs differ",
                "slower": "no alternative was faster"}[failure]
    assert expected in events
    key = _softmax_key(program)
    if failure == "slower":  # the decision (keep the model's schedule) is stored
        assert refine_store.stored_variants(detect_cpu_target())[key] == 0
    else:
        assert not store.exists()


def test_programs_that_write_their_inputs_are_not_refined(store, caplog):
    def step(x, buf):
        buf.mul_(0.5).add_(x)
        return torch.softmax(buf * 2, -1)

    x, buf = torch.randn(64, 64), torch.randn(64, 64)
    b2 = buf.clone()
    c = novaforge.compile(step, backend="cpu", refine=True, refine_sample_every=1)
    with caplog.at_level(logging.INFO, logger="novaforge.refine"):
        got = c(x, buf)
    torch.testing.assert_close(got, step(x, b2))
    torch.testing.assert_close(buf, b2)
    assert c.stats().program.refiner is None
    assert "writes its inputs" in caplog.text

"""Random programs (tests/test_random_graphs.py's generator) compiled with backend='cpu' against
eager: fuzzes the CPU code generator with random fusion shapes, views, broadcasts and dtypes."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import novaforge
from test_random_graphs import programs


def _check(prog, inputs, rtol: float, atol: float) -> None:
    want = prog.run(*inputs)
    compiled = novaforge.compile(prog.run, backend="cpu")
    got = compiled(*inputs)
    info = compiled.stats().program.info
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(w.abs().max())) if w.numel() and w.is_floating_point() else 1.0
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * scale, equal_nan=True,
                                   msg=lambda m: f"{m}\nprogram:\n{prog}\nfallbacks: {info['fallbacks']}")


SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(st.data())
def test_random_programs_cpu_float32(data: st.DataObject) -> None:
    prog, inputs = data.draw(programs(torch.float32), label="program")
    _check(prog, inputs, rtol=1e-4, atol=1e-5)


@SETTINGS
@given(st.data())
def test_random_programs_cpu_bfloat16(data: st.DataObject) -> None:
    prog, inputs = data.draw(programs(torch.bfloat16), label="program")
    _check(prog, inputs, rtol=5e-2, atol=5e-2)

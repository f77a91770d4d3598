"""A slice of the OpInfo sweep (novaforge.bench.opinfo) in CI: PyTorch's own op samples through
torch.compile(backend="novaforge"), every verdict compiled or a clear fallback, never wrong or
a crash. The whole sweep (702 entries, ~30 min here) runs with `python -m novaforge.bench.opinfo`."""

from __future__ import annotations

import pytest

pytest.importorskip("expecttest")

from novaforge.bench import opinfo  # noqa: E402

OPS = ["add", "tril", "linspace", "roll", "lerp", "nn.functional.pad", "cumsum", "where", "empty_permuted", "fft.rfft"]


def test_opinfo_slice_has_no_wrong_results_or_crashes():
    db = opinfo._op_db()
    indices = [i for i, op in enumerate(db) if op.name in OPS]
    results = opinfo.run_sweep(indices, samples=1, batch=len(indices))
    summary = opinfo.summarize(results)
    bad = [r for r in results if r.verdict in ("wrong", "crash")]
    assert bad == [], bad
    assert summary["compiled"] >= len(results) - 2, summary  # fft.rfft falls back (complex); the rest compile
    assert any(r.name == "fft.rfft" and r.verdict == "fallback" and "complex64" in r.detail for r in results)

"""Decoding a bf16 model (issue 44): the few-row products of a decode step read the bf16 weights in
place on nf_gemm's streaming path (nf_gemv.cpp: half of float32's bytes, converted in registers),
for both weight layouts (nn.Linear W [N, K]; a row-major [K, N] weight, transformers' Conv1D), and
`generate()` on a default-config transformers model in bf16 gives eager's tokens through both entry
points.

The oracle is eager PyTorch on the same bf16 model. Greedy tokens of two correct bf16 programs may
part where two logits are within bf16's rounding of each other (their sums run in another order):
where the tokens differ, the test asserts that eager's own logits at that step are such a near tie.
"""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.bench.workloads import build_generation_model, input_ids
from novaforge.codegen.cpu.gemm import ops

from .test_bf16_models import Block, _close

NEAR_TIE = 0.05  # logits of a ~unit-scale bf16 model this close may swap under another summation order


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_decode_rows_stream_the_bf16_weights(rows):
    """rows <= 8 take the streaming path (the same values as with it switched off, and as eager)."""
    torch.manual_seed(4)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(1, rows, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        f = novaforge.compile(model, freeze=True)
        f(x)
        before = ops.bf16_counts()["stream"]
        streamed = f(x)
        # fc (W [N, K]: up to 8 rows) and proj ([K, N]: up to 4 rows, 8 on AVX-512 builds)
        assert ops.bf16_counts()["stream"] - before == 1 + (rows <= 4 or ops.isa() == "avx512")
        with ops.gemv_path(False):
            blocked = f(x)
    _close(streamed, ref)
    _close(streamed, blocked)


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> int | None:
    diff = (got != want).any(0).nonzero()
    return None if len(diff) == 0 else int(diff[0, 0])


def _assert_same_or_near_tie(model, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    p = _first_difference(got, want)
    if p is None:
        return
    with torch.no_grad():
        logits = model(got[:, :p], use_cache=False).logits[0, -1].float()
    gap = (logits[want[0, p]] - logits[got[0, p]]).abs().item()
    assert gap < NEAR_TIE, f"tokens differ at {p} where eager's logits differ by {gap:.3g} (no near tie)"


@pytest.mark.parametrize("workload,entry", [("gpt2-generate-tiny", "torch.compile"),  # Conv1D: [K, N] weights
                                            ("llama-generate-tiny", "novaforge.compile")])  # nn.Linear
def test_bf16_generate_matches_eager(workload, entry):
    model, vocab = build_generation_model(workload)
    model.to(torch.bfloat16)
    ids = input_ids(vocab, 1, 12)
    kw = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        if entry == "novaforge.compile":
            got = novaforge.compile(model, freeze=True).generate(ids, **kw)
        else:
            model.forward = torch.compile(model.forward, backend="novaforge")
            try:
                got = model.generate(ids, **kw)
            finally:
                del model.forward
    _assert_same_or_near_tie(model, got, want)

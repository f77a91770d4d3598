"""Training's attention kernels against ATen's: the flash forward with its logsumexp
(`attention_lse`, codegen/cpu/attention.py) and the flash backward (attention_backward.py).

Each case compiles a call of `_scaled_dot_product_flash_attention_for_cpu` (logsumexp used) or
of its `_backward` (what autograd records for SDPA on the CPU) with the CPU backend; the results
must equal eager's and the kernel must be generated (no torch fallback). Then SDPA trained
through both entry points gives eager's gradients, with no ATen attention call left.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check

import novaforge

aten = torch.ops.aten


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def _case(q, k, v, causal=False, mask=None, scale=None, dtype=torch.float32, atol=1e-5, rtol=1e-4):
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    g = torch.randn(o.shape).to(dtype)

    def fn(g, q, k, v, o, lse, *m):
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, o, lse, 0.0, causal, attn_mask=m[0] if m else None, scale=scale)

    args = (g, q, k, v, o, lse) + ((mask,) if mask is not None else ())
    c, got = check(fn, *args, atol=atol, rtol=rtol)
    kinds = [n.attrs["kernel"].name for n in c.stats().graph.nodes if n.op == "kernel"]
    assert any("attention_backward" in k for k in kinds), kinds
    return got


def _forward_case(q, k, v, causal=False, mask=None, scale=None, atol=1e-5, rtol=1e-4):
    def fn(q, k, v, *m):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m[0] if m else None,
                                                               scale=scale)

    c, got = check(fn, q, k, v, *((mask,) if mask is not None else ()), atol=atol, rtol=rtol)
    kinds = [n.attrs["kernel"].name for n in c.stats().graph.nodes if n.op == "kernel"]
    assert any("attention_lse" in k for k in kinds), kinds


@pytest.mark.parametrize("L,S,causal", [(100, 100, True), (37, 150, False), (1, 65, False), (70, 70, True)])
def test_forward_with_logsumexp_matches_aten(L, S, causal):
    _forward_case(_r(2, 3, L, 64), _r(2, 3, S, 64), _r(2, 3, S, 64), causal=causal)


def test_forward_with_logsumexp_masks_views_gqa_bf16():
    qkv = _r(2, 90, 3 * 4 * 64)
    q, k, v = qkv.view(2, 90, 3, 4, 64).permute(2, 0, 3, 1, 4)
    _forward_case(q, k, v, causal=True, scale=0.3)
    mask = torch.randn(2, 1, 33, 70)
    mask[:, :, 5] = float("-inf")  # a query row with no key: output 0 and logsumexp 0, as ATen gives
    _forward_case(_r(2, 2, 33, 16), _r(2, 2, 70, 16), _r(2, 2, 70, 16), mask=mask)
    _forward_case(_r(1, 6, 50, 64), _r(1, 2, 50, 64), _r(1, 2, 50, 64), causal=True)
    _forward_case(*(_r(1, 2, 70, 32, dtype=torch.bfloat16) for _ in range(3)), causal=True, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("L,S,E,causal", [(100, 100, 64, True), (40, 40, 16, False), (37, 150, 64, False),
                                          (150, 37, 32, True), (70, 70, 48, True), (1, 65, 64, False)])
def test_backward_matches_aten(L, S, E, causal):
    q, k, v = _r(2, 3, L, E), _r(2, 3, S, E), _r(2, 3, S, E)
    _case(q, k, v, causal=causal)


def test_backward_from_strided_views_and_scale():
    # q, k, v as the permuted views of one packed projection (what a GPT block passes)
    qkv = _r(2, 90, 3 * 4 * 64)
    q, k, v = qkv.view(2, 90, 3, 4, 64).permute(2, 0, 3, 1, 4)
    _case(q, k, v, causal=True, scale=0.3)


def test_backward_float_masks_with_fully_masked_rows():
    q, k, v = _r(2, 2, 33, 64), _r(2, 2, 70, 64), _r(2, 2, 70, 64)
    mask = torch.randn(2, 1, 33, 70)
    mask[torch.rand(2, 1, 33, 70) < 0.3] = float("-inf")
    mask[:, :, 5] = float("-inf")  # a query row with no key: zero gradients, as in eager
    _case(q, k, v, mask=mask)
    _case(q, k, v, mask=torch.randn(33, 70))  # broadcast over batch and heads


def test_backward_grouped_query_heads():
    q, k, v = _r(1, 6, 50, 64), _r(1, 2, 50, 64), _r(1, 2, 50, 64)
    _case(q, k, v, causal=True)


def test_backward_bf16():
    q, k, v = (_r(1, 2, 70, 32, dtype=torch.bfloat16) for _ in range(3))
    _case(q, k, v, causal=True, dtype=torch.bfloat16, atol=3e-2, rtol=3e-2)


class _Attend(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(128, 3 * 128)

    def forward(self, x):
        q, k, v = self.proj(x).view(2, 48, 3, 2, 64).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(-1).pow(2).mean()


@pytest.mark.parametrize("entry", ["novaforge", "torch.compile"])
def test_sdpa_trains_through_the_generated_backward(entry):
    torch.manual_seed(0)
    x = torch.randn(2, 48, 128)
    model = _Attend()
    model(x).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    fn = novaforge.compile(model) if entry == "novaforge" else torch.compile(model, backend="novaforge")
    fn(x).backward()
    for p, r in zip(model.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r, atol=1e-5, rtol=1e-4)


def test_training_step_runs_no_aten_attention():
    from novaforge.bench.nanogpt import CONFIGS, GPT

    torch.manual_seed(0)
    cfg = CONFIGS["gpt-tiny"]
    model = GPT(cfg)
    step = novaforge.compile_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    step(x, x)
    program = next(iter(step._compiled.values())).stats()
    ops = [b.op for n in program.graph.nodes if n.op == "kernel" for b in n.attrs["kernel"].body.nodes]
    assert ops.count("attention_lse") == ops.count("attention_backward") == cfg.n_layer
    assert "extern" not in ops and "extern_effect" not in ops, "an attention call is left to ATen"

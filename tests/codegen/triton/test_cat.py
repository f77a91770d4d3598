"""Cats read inside generated Triton pointwise kernels (masked loads per piece, selected by the
coordinate along the cat axis), in the CPU interpreter, against eager: last and inner axes,
2-3 pieces, odd sizes, strided / broadcast / fill / iota pieces, bf16; HF Llama's RoPE is one
kernel per q / k."""

from __future__ import annotations

import pytest
import torch
import transformers
from nf_triton_testing import check, kernel_kinds


def kernels(c):
    return [n.attrs["kernel"] for n in c.stats().graph.nodes if n.op == "kernel"]


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def assert_fused(c, count=1, gathers=0):
    ks = kernels(c)
    assert not any(k.kind == "single" and "cat" in k.ops() for k in ks), [(k.name, k.kind) for k in ks]
    assert sum(1 for k in ks if k.kind == "pointwise" and "cat" in k.ops()) == count
    assert kernel_kinds(c).get("gather", 0) == gathers  # (the embedding lookup is one)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_three_pieces_odd_sizes(dim):
    def fn(a, b, c):
        return torch.sigmoid(torch.cat((a, b, c), dim=dim)) * 3 - 1

    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for s, n in zip(shapes, (2, 1, 5), strict=True):
        s[dim] = n
    assert_fused(check(fn, *(torch.randn(*s) for s in shapes)))


def test_rope_rotate_half_one_kernel():
    def fn(q, cos, sin):
        q = q.transpose(1, 2)
        return q * cos + rotate_half(q) * sin

    c = check(fn, torch.randn(2, 9, 3, 14), torch.randn(9, 14), torch.randn(9, 14))
    assert_fused(c)
    assert len(kernels(c)) == 1 and "neg" not in kernels(c)[0].ops()


def test_strided_broadcast_fill_and_iota_pieces():
    def fn(x, y, i):
        a = x.transpose(0, 1)[..., 1:]        # [5, 3, 9]
        b = y[::2].expand(5, 3, 4)
        f = torch.cat((a, b, torch.full((5, 3, 2), 0.5)), dim=2) * 2
        n = torch.cat((torch.arange(4), i, torch.arange(3, 9, 2)), dim=0) * 3
        return f, n

    c = check(fn, torch.randn(3, 5, 10), torch.randn(1, 3, 4), torch.randint(-9, 9, (5,)))
    assert_fused(c, count=2)


def test_two_cats_on_different_axes_in_one_kernel():
    def fn(a, b, c, d, e):
        return torch.cat((a, b), 0) * torch.cat((c, d.transpose(0, 1)), 1) + e

    c = check(fn, torch.randn(2, 7), torch.randn(3, 7), torch.randn(5, 4), torch.randn(3, 5), torch.randn(7))
    assert_fused(c)


def test_bf16_pieces():
    a, b = torch.randn(4, 6, 5).to(torch.bfloat16), torch.randn(4, 3, 5).to(torch.bfloat16)
    assert_fused(check(lambda a, b: torch.cat((b, a[:, ::2]), 1).float() * 2, a, b))


def test_llama_rope_is_one_kernel_per_q_and_k():
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=128, use_cache=False)
    torch.manual_seed(0)
    m = transformers.LlamaModel(cfg).eval()
    ids = torch.randint(0, 128, (2, 16))
    c = check(lambda x: m(x).last_hidden_state, ids, atol=1e-5, rtol=1e-5, options={"freeze": True})
    ks = kernels(c)
    assert not any(set(k.ops()) <= {"neg", "slice", "permute", "reshape", "expand"} for k in ks)
    assert_fused(c, count=2 * 2, gathers=1)

"""Cats read inside generated pointwise loops (codegen/cpu/pieces.py) against eager: last and
inner axes, 2-3 pieces, odd sizes, strided and broadcast pieces, fills and iota pieces, bf16,
bool, empty pieces; both loop layouts (inner split, separate boxes); HF Llama's RoPE is one
vectorized kernel per q / k."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from cpu_check import check

from novaforge.codegen.cpu.backend import PRELUDE
from novaforge.codegen.cpu.build import vectorization_report
from novaforge.codegen.cpu.pieces import has_pieces
from novaforge.codegen.registry import get_backend


def kernels(c):
    return [n.attrs["kernel"] for n in c.stats().graph.nodes if n.op == "kernel"]


def plans(c):
    be = get_backend("cpu")
    return [(k, be.plan(k, be.target())) for k in kernels(c)]


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def assert_piecewise(c, count=1):
    """`count` pointwise kernels read cats inside generated loops; no cat runs alone."""
    ps = plans(c)
    assert not any(k.kind == "single" and "cat" in k.ops() for k, _ in ps), [(k.name, k.kind) for k, _ in ps]
    n = sum(1 for k, p in ps if p.gen is not None and p.gen.info is not None and has_pieces(p.gen.info))
    assert n == count, [(k.name, k.kind, p.kind) for k, p in ps]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_three_pieces_odd_sizes(dim):
    def fn(a, b, c):
        return torch.sigmoid(torch.cat((a, b, c), dim=dim)) * 3 - 1

    shapes = [[3, 5, 7], [3, 5, 7], [3, 5, 7]]
    for s, n in zip(shapes, (2, 1, 5), strict=True):
        s[dim] = n
    c, _ = check(fn, *(torch.randn(*s) for s in shapes), expect_kinds={"pointwise": 1})
    assert_piecewise(c)


def test_strided_and_broadcast_pieces():
    def fn(x, y, z):
        a = x.transpose(0, 1)[..., 1:]        # [5, 3, 9]: permuted, sliced
        b = y[::2].expand(5, 3, 4)            # step and broadcast
        return torch.cat((a, b, z * 2), dim=2) + x.sum()

    x, y, z = torch.randn(3, 5, 10), torch.randn(1, 3, 4), torch.randn(5, 3, 2)
    c, _ = check(fn, x, y, z)
    assert_piecewise(c, count=1)


def test_rope_rotate_half_one_kernel():
    def fn(q, cos, sin):
        q = q.transpose(1, 2)
        return q * cos + rotate_half(q) * sin

    q, cos, sin = torch.randn(2, 9, 3, 14), torch.randn(9, 14), torch.randn(9, 14)
    c, _ = check(fn, q, cos, sin, expect_kinds={"pointwise": 1})
    assert_piecewise(c)
    (k,) = kernels(c)
    assert "neg" not in k.ops()


def rendered(c) -> str:
    return "".join(p.gen.render() for _, p in plans(c) if p.gen is not None)


def test_cut_on_the_outermost_dim_and_few_rows_use_separate_boxes():
    # cut on dim 0: each box is a loop nest of its own
    c, _ = check(lambda a, b: torch.cat((a, b), 0) * 2, torch.randn(3, 33), torch.randn(5, 33))
    assert "_box1(" in rendered(c)
    # one long row: the boxes get the configurator's inner blocks and threads
    c, _ = check(lambda a, b: (torch.cat((a, b[:, 1:]), 1) + 1).relu(), torch.randn(1, 150001),
                 torch.randn(1, 70002))
    assert_piecewise(c)
    assert "_box1(" in rendered(c)
    # rows: one parallel loop, the boxes inside it
    c, _ = check(lambda a, b: torch.cat((a, b), 1) * 2, torch.randn(9, 5), torch.randn(9, 4))
    assert "/* box 1" in rendered(c) and "_box" not in rendered(c)


def test_two_cats_on_different_axes_in_one_kernel():
    def fn(a, b, c, d, e):
        return torch.cat((a, b), 0) * torch.cat((c, d.transpose(0, 1)), 1) + e

    c, _ = check(fn, torch.randn(2, 7), torch.randn(3, 7), torch.randn(5, 4), torch.randn(3, 5), torch.randn(7),
                 expect_kinds={"pointwise": 1})
    assert_piecewise(c)
    c, _ = check(lambda x, y, z: torch.cat((x, y), 1) - torch.cat((z[..., 3:], z[..., :3]), 2), torch.randn(2, 3, 6),
                 torch.randn(2, 1, 6), torch.randn(2, 4, 6), expect_kinds={"pointwise": 1})
    assert "/* box 3" in rendered(c)  # 2 x 2 boxes inside the parallel loop over dim 0


def test_fill_and_iota_pieces_and_empty_inputs():
    def fn(x, i, e):
        f = torch.cat((x, torch.zeros(4, 3), torch.full((4, 2), 7.0), e), dim=1)
        n = torch.cat((torch.arange(5), i, torch.arange(3, 9, 2)), dim=0)
        return f * 2, n * 3

    check(fn, torch.randn(4, 5), torch.randint(-9, 9, (6,)), torch.randn(4, 0))


def test_bf16_and_bool():
    a, b = torch.randn(4, 6, 5).to(torch.bfloat16), torch.randn(4, 3, 5).to(torch.bfloat16)
    c, _ = check(lambda a, b: torch.cat((b, a[:, ::2]), 1).float() * 2, a, b)
    assert_piecewise(c)
    check(lambda a, b: torch.cat((a > 0, b < 0), -1) & (torch.cat((a, b), -1) > -1),
          torch.randn(3, 4), torch.randn(3, 7))


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=128, use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaModel(cfg).eval()


def test_llama_rope_is_one_kernel_per_q_and_k():
    m = _llama()
    ids = torch.randint(0, 128, (2, 16))
    c, _ = check(lambda x: m(x).last_hidden_state, ids, atol=1e-5, rtol=1e-5)
    ks = kernels(c)
    assert not any("cat" in k.ops() and k.kind == "single" for k in ks)
    assert not any(set(k.ops()) <= {"neg", "slice", "permute", "reshape", "expand"} for k in ks)
    rope = [k for k in ks if "cat" in k.ops()]
    assert len(rope) == 2 * 2 and all(k.kind == "pointwise" for k in rope)
    assert_piecewise(c, count=4)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_piecewise_loops_vectorize(tmp_path):
    def fn(q, cos, sin, a, b):
        q = q.transpose(1, 2)
        return q * cos + rotate_half(q) * sin, torch.exp(torch.cat((a, b[:, ::2]), 0))

    args = (torch.randn(2, 16, 4, 64), torch.randn(16, 64), torch.randn(16, 64), torch.randn(5, 40),
            torch.randn(7, 80))
    c, _ = check(fn, *args)
    sources = [p.gen.render() for _, p in plans(c) if p.gen is not None]
    target = get_backend("cpu").target()
    report = vectorization_report(PRELUDE + "".join(sources), target, tmp_path)
    assert len(report) >= 4
    missed = [line for line, ok in report.items() if not ok]
    assert not missed, f"omp simd loops not vectorized at lines {missed}"

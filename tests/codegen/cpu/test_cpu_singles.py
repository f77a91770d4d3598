"""Generated gathers (embedding / index_select), scatters (scatter_add, accumulating index_put) and cat
against eager; out-of-range indices raise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check, compile_cpu, program


def test_embedding_gather():
    w = torch.randn(37, 13)
    check(lambda i: F.embedding(i, w), torch.randint(0, 37, (3, 7)))
    check(lambda i: F.embedding(i, w) * 2 + 1, torch.randint(0, 37, (5,)).to(torch.int32))
    check(lambda i: F.embedding(i, w), torch.randint(0, 37, (0, 4)))


def test_index_select_other_axis_and_views():
    x = torch.randn(4, 9, 5)
    idx = torch.tensor([8, 0, 3, 3])
    check(lambda a, i: torch.index_select(a, 1, i), x, idx)
    check(lambda a, i: torch.index_select(a.transpose(0, 2), 0, i[:2] % 5), x, idx)


def test_gather_out_of_range_raises():
    w = torch.randn(10, 4)
    c = compile_cpu(lambda i: F.embedding(i, w), torch.tensor([1, 2]))
    with pytest.raises(IndexError):
        c(torch.tensor([1, 10]))
    with pytest.raises(IndexError):
        c(torch.tensor([-1, 2]))


def test_index_on_adjacent_axes_is_one_gather():
    """x[i, j] (index tensors on adjacent axes: the padding mask transformers builds for every
    decode step) runs as one generated take over the merged axes (no torch step): broadcast index
    shapes, negative and int32 indices, a boolean x; an index out of its own axis's range raises
    even where the merged (flat) index would be in range."""
    x = torch.randn(5, 7, 3)
    i, j = torch.tensor([[0], [4], [-1]]), torch.tensor([1, -7, 6, 2], dtype=torch.int32)
    check(lambda a, p, q: a[p, q] * 2, x, i, j)
    check(lambda a, p, q: a[:, p, q], x.permute(2, 0, 1).contiguous(), i, j)
    mask = torch.rand(2, 9) > 0.3
    check(lambda m, b, k: m[b[:, None, None, None], k[None, None, None, :]], mask, torch.arange(2), torch.arange(9))
    c = compile_cpu(lambda a, p, q: a[p, q], x, i, j)
    assert all(st.kind != "torch" for st in program(c).steps)
    for bad_i, bad_j in ((i, torch.tensor([1, 7, 0, 2])), (i, torch.tensor([1, -8, 0, 2])),
                         (torch.tensor([[0], [5], [1]]), torch.tensor([0, 0, 0, 0]))):
        with pytest.raises(IndexError):
            x[bad_i, bad_j]
        with pytest.raises(IndexError):
            c(x, bad_i, bad_j)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat(dim):
    a, b = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    c = torch.randn(6, 4, 5)[::2]
    check(lambda x, y, z: torch.cat([x, y.permute(0, 1, 2) * 2, z], dim), a, b, c)


def test_cat_with_empty_and_bool():
    check(lambda x, y: torch.cat([x, y], 0), torch.randn(0, 3), torch.randn(2, 3))
    check(lambda x, y: torch.cat([x > 0, y > 0], 1), torch.randn(2, 3), torch.randn(2, 5))


def test_torch_gather():
    x = torch.randn(5, 7, 3)
    idx = torch.randint(0, 7, (4, 6, 2))
    check(lambda a, i: torch.gather(a, 1, i), x, idx)
    check(lambda a, i: torch.gather(a.transpose(0, 2), 2, i[:3, :, :2] % 5), x, idx)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_scatter_add(dim):
    x = torch.randn(5, 7, 3)
    idx = torch.randint(0, x.shape[dim], (4, 6, 2))
    src = torch.randn(4, 6, 2)
    check(lambda a, i, s: torch.scatter_add(a, dim, i, s) * 2, x, idx, src)
    check(lambda a, i, s: torch.scatter_add(a.transpose(0, 1).contiguous().transpose(0, 1), dim, i, s.exp()),
          x, idx, src)
    check(lambda i, s: torch.zeros(5, 7, 3, dtype=torch.int64).scatter_add(dim, i, (s * 8).long()), idx, src)
    check(lambda a, i, s: torch.scatter_add(a, dim, i[:0], s[:0]), x, idx, src, allow_torch=1)


@pytest.mark.parametrize("rows,dim", [(7, 5), (600, 96), (2000, 300)])
def test_scatter_add_of_rows_along_axis_0(rows, dim):
    """The embedding gradient's scatter (idx [tokens, dim] expanded along dim, duplicates) walks
    rows with each thread's run of columns inner; per-column indices, strided sources and a
    threaded size too, against torch."""
    out_rows = 50
    ids = torch.randint(0, out_rows, (rows,))
    ids[: rows // 3] = 7  # duplicates accumulate in index order
    g = torch.randn(rows, dim)
    check(lambda i, v: torch.zeros(out_rows, dim).scatter_add(0, i[:, None].expand(rows, dim), v), ids, g)
    per_column = torch.randint(0, out_rows, (rows, dim))
    check(lambda a, i, v: a.scatter_add(0, i, v.t().contiguous().t() * 2), torch.randn(out_rows, dim), per_column,
          g.t().contiguous().t())
    with pytest.raises(IndexError):
        c = compile_cpu(lambda i, v: torch.zeros(out_rows, dim).scatter_add(0, i[:, None].expand(rows, dim), v),
                        ids, g)
        c(ids.clone().fill_(out_rows), g)


def test_index_put_accumulate_rows_is_a_scatter():
    """The embedding gradient's form (rows of values added at token ids, duplicates and
    negative ids included), plain and masked, is generated; other index_puts stay ATen calls
    with eager's errors."""
    w, g = torch.randn(11, 6), torch.randn(3, 5, 6)
    ids = torch.randint(-11, 11, (3, 5))
    ids[0, :3] = 4  # duplicates accumulate
    check(lambda a, i, v: torch.zeros_like(a).index_put((i,), v, accumulate=True) + a, w, ids, g)
    check(lambda a, i, v: a.index_put((i,), v[0, 0], accumulate=True), w, ids, g)  # broadcast values
    masked = torch.ops.aten._unsafe_masked_index_put_accumulate
    check(lambda a, i, v: masked(torch.zeros_like(a), (i >= 2)[..., None], [i], v), w, ids, g)
    check(lambda a, i, v: a.index_put((i,), v, accumulate=False), w, ids[:1, :1], g[:1, :1], allow_torch=1)
    with pytest.raises(RuntimeError):
        compile_cpu(lambda a, i, v: a.index_put((i,), v.double(), accumulate=True), w, ids, g)

    def dead(a, i, v):  # eager raises even where the result is unused (fuzz seed 804148)
        a.double().index_put((i,), v, accumulate=True)
        return i * 2

    with pytest.raises(RuntimeError, match="dtypes match"):
        compile_cpu(dead, w, ids, g)


def test_scatter_out_of_range_raises():
    c = compile_cpu(lambda a, i, s: torch.scatter_add(a, 0, i, s), torch.randn(4, 3), torch.tensor([[1, 2, 3]]),
                    torch.randn(1, 3))
    with pytest.raises(IndexError):
        c(torch.randn(4, 3), torch.tensor([[1, 4, 0]]), torch.randn(1, 3))


def test_scatter_of_a_value_is_generated():
    """x.scatter(dim, index, value) (NLL's gradient, a one-hot): where an index hits, the value;
    duplicates included; out-of-range indices raise."""
    x = torch.randn(6, 9)
    t = torch.randint(0, 9, (6, 1))
    check(lambda a, i: torch.zeros_like(a).scatter(1, i, -1.0) * a, x, t)
    dup = torch.randint(0, 6, (3, 4)).repeat(2, 1)
    check(lambda a, i: a.scatter(0, i, 3.0), x, dup)
    c = compile_cpu(lambda a, i: a.scatter(1, i, 2.0), x, t)
    with pytest.raises(IndexError):
        c(x, t + 9)
    with pytest.raises(IndexError):
        c(x, t - 10)
    # one index per row: a pointwise one-hot (no scattered [6, 9] buffer); the indices are
    # checked by a take of n integers
    bodies = [n.attrs["kernel"].body for n in c.stats().graph.nodes if n.op == "kernel"]
    assert not any(m.op == "scatter_add" for b in bodies for m in b.nodes)


def test_take_of_a_range_is_a_view():
    """A take at start + step * arange(n) (a position embedding's rows) becomes a slice: no
    kernel, the same values."""
    w = torch.randn(16, 5)
    c = compile_cpu(lambda x: x + w[torch.arange(3, 11, 2)], torch.randn(4, 5))
    assert not any(n.op == "kernel" and n.attrs["kernel"].kind == "single" for n in c.stats().graph.nodes)
    check(lambda x: x + w[torch.arange(3, 11, 2)], torch.randn(4, 5))
    check(lambda x: x + w.t()[:, torch.arange(0, 16)].t(), torch.randn(16, 5))


@pytest.mark.parametrize("shape", [(1, 50257), (8, 1000), (3, 7, 5)])
def test_argmax_argmin_are_generated_with_torchs_ties_and_nans(shape):
    """argmax / argmin over one axis (any axis, through a transpose): torch's first index of the
    extreme, ties and infinities included, the first NaN where a row has one; no torch step."""
    torch.manual_seed(0)
    x = torch.randn(shape)
    x[0, 3] = x[0].max()  # a tie with the row's maximum
    x[-1, 1] = float("nan")
    if shape[0] > 2:
        x[1] = 0.0  # a row of ties (and -0.0 against 0.0)
        x[1, 0] = -0.0
        x[2, 2] = x[2, 5] = float("inf")
    check(lambda a: (torch.argmax(a, -1), torch.argmin(a, 1), torch.argmax(a.transpose(0, 1), 0, keepdim=True)), x)
    check(lambda a: torch.argmax(a * 2 - 1, dim=0), x)


def test_kv_cache_index_copy_in_place_is_generated():
    """A mutated input's index_copy_ (a static KV cache's new rows, the source a strided view):
    written into the caller's buffer by a generated kernel, no torch step, equal to eager; the
    rows not indexed are untouched; an index out of range raises before anything is written."""
    def step(cache, pos, qkv):
        k = qkv.view(1, 3, 4, 2).permute(0, 2, 1, 3)  # [B, H, S, D] from a fused projection's slice
        cache.index_copy_(2, pos, k)
        return cache.sum()

    cache = torch.randn(1, 4, 16, 2)
    pos = torch.tensor([5, 6, 9])
    qkv = torch.randn(3, 8)[:, :8]
    want_cache = cache.clone()
    want = step(want_cache, pos, qkv)
    c = compile_cpu(step, cache.clone(), pos, qkv)  # (compile_cpu's own call mutates its copy)
    got_cache = cache.clone()
    with torch.no_grad():
        got = c(got_cache, pos, qkv)
    torch.testing.assert_close(got, want)
    assert torch.equal(got_cache, want_cache)
    assert program(c).info["torch"] == 0, program(c).info["fallbacks"]
    with pytest.raises(IndexError), torch.no_grad():
        c(got_cache, torch.tensor([5, 16, 1]), qkv)
    assert torch.equal(got_cache, want_cache)

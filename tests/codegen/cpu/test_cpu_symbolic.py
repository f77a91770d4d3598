"""Programs for a range of sizes on the CPU backend: every kernel kind compiled once with a
symbolic size and run at several sizes against eager (issue 16).

Each case is compiled with `novaforge.compile(fn, dynamic=...)`: one symbolic capture, one
build (`compilations == 1`), then every size runs the same library through `CpuProgram.at`.
"""

from __future__ import annotations

import random
import threading

import pytest
import sympy
import torch
import torch.nn.functional as F

import novaforge
from nf_symbolic_cases import B48, CASES, W32x48, _rand, run_case
from novaforge.ir.symbolic import Sym, as_dim, c_expr, py_expr, symbol
from novaforge.runtime.symbolic_layout import bucket_size


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_one_program_serves_every_size(name):
    c = run_case(name, "cpu")
    prog = c.stats().program
    assert prog.symbolic is not None and prog.info["torch"] == 0, prog.info["fallbacks"]


def test_library_key_holds_the_ranges():
    """The same kernel under two ranges is two libraries: a row buffer sized for one range
    (softmax's cached row, at most 1000 here) is never run at the other's sizes."""
    torch.manual_seed(0)
    fn = torch.nn.Softmax(-1)
    small = novaforge.compile(fn, backend="cpu", dynamic={0: {1: (2, 1000)}}, tiered=False)
    large = novaforge.compile(fn, backend="cpu", dynamic={0: {1: (2, 20000)}}, tiered=False)
    with torch.no_grad():
        for n in (8, 900):
            x = _rand(3, n)
            torch.testing.assert_close(small(x), fn(x))
        x = _rand(3, 8)
        large(x)
        x = _rand(3, 9000)
        torch.testing.assert_close(large(x), fn(x))
    assert small.stats().program.info["library_key"] != large.stats().program.info["library_key"]


def test_two_threads_at_two_sizes():
    torch.manual_seed(0)
    fn = lambda x: torch.relu(x @ W32x48 + B48).sum(-1)  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={0: {0: (2, 4096)}}, tiered=False)
    errors = []

    def work(n: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(20):
                    x = _rand(n, 32)
                    torch.testing.assert_close(c(x), fn(x), atol=1e-4, rtol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in (7, 300, 301)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert c.compilations == 1


def test_size_expressions_print_and_evaluate_exactly():
    s0, s1 = Sym(symbol(0)), Sym(symbol(1))
    exprs = [s0 * 768, s0 + 1, s0 * s0 * 12, (s0 + 1) // 2, s0 % 16, -(-s0 // 16) * 16, s0 * s1 - 3, 2 - s0,
             (s0 * 3 + 5) // 7, s0 * s1 // (s1 + 1)]
    rng = random.Random(0)
    for _ in range(200):
        values = {symbol(0): rng.randint(1, 5000), symbol(1): rng.randint(1, 300)}
        for x in exprs:
            want = as_dim(x.expr.subs(values))
            assert x.subs(values) == want, (x, values)
            env = {str(k): v for k, v in values.items()}
            assert eval(py_expr(x.expr), {"max": max, "min": min}, env) == want
    assert c_expr(sympy.floor((symbol(0) + 1) / 2)) == "nf_floordiv_i((1 + s0), 2)"
    assert f"{s0 * s0 * 12}" == "(12*(s0*s0))" and f"{(s0 + 2) * 3}" == "(6 + (3*s0))"


@pytest.mark.parametrize("n,want", [(1, 16), (16, 16), (17, 20), (100, 112), (512, 512), (513, 640), (1000, 1024)])
def test_bucket_sizes(n, want):
    assert bucket_size(n) == want


def _sdpa_size_mask(q, k, v, band: int | None):
    """Attention under a mask built from the sizes alone (as transformers builds its masks)."""
    n = q.shape[-2]
    i = torch.arange(n)
    mask = i[None, :] <= i[:, None]
    if band is not None:
        mask = mask & (i[None, :] > i[:, None] - band)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])


@pytest.mark.parametrize("band", [None, 3])
def test_a_mask_of_the_sizes_is_computed_once_per_size_and_causal_where_it_is_the_triangle(band):
    """The mask depends on the sizes alone: hoisted out of the graph (a `size` input, evaluated
    once per size), and where it is the causal triangle the flash kernel gets a null mask and
    skips the upper half; a banded mask is passed as it is."""
    fn = lambda q, k, v: _sdpa_size_mask(q, k, v, band)  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={i: {2: (2, 2048)} for i in range(3)}, tiered=False)
    with torch.no_grad():
        for n in (5, 40, 5):
            args = [_rand(1, 2, n, 16) for _ in range(3)]
            torch.testing.assert_close(c(*args), fn(*args), atol=2e-5, rtol=2e-5)
    graph = c.stats().graph
    assert [gi.kind for gi in graph.inputs].count("size") == 1
    assert c.compilations == 1 and c.stats().program.info["torch"] == 0
    inst = next(iter(c._instances.values())).stats.program
    sized = [spec for spec in inst.slots if spec.kind == "sized"]
    assert len(sized) == 1 and sized[0].causal
    assert (sized[0].tensor is None) == (band is None)  # null: the kernels run causal


def test_positions_taken_from_an_arange_of_the_size_are_generated():
    """`table[arange(n)]` in a graph with symbolic sizes: the index is an iota computed in the
    kernel (the static graph folds it into a constant), not a torch step."""
    table = torch.nn.Embedding(64, 8)
    fn = lambda x: x + table(torch.arange(x.shape[1]))  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={0: {1: (2, 100)}}, tiered=False)
    with torch.no_grad():
        for n in (3, 30, 64):
            x = _rand(2, n, 8)
            torch.testing.assert_close(c(x), fn(x))
        assert c.compilations == 1 and c.stats().program.info["torch"] == 0, c.stats().program.info["fallbacks"]
        with pytest.raises(IndexError):  # position 64 is past the table's 64 rows: eager raises too
            c(_rand(2, 65, 8))


def test_sizes_of_one_bucket_share_its_placement_and_a_shrinking_buffer_gets_its_own():
    """Sizes 17..20 fall in one bucket (top 20): they share its placed slots (`_Bucket.slots`); the
    buffers of 200 - n rows are larger below the top, so 17..19 get placements of their own (a fresh
    bucket each). Every size matches eager, in any order."""
    torch.manual_seed(0)
    z, w = _rand(200, 32), _rand(32, 48)
    fn = lambda x, z: (z[: 200 - x.shape[0]].exp() @ w).sum(0) + (x @ w).sum(0)  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={0: {0: (2, 190)}}, tiered=False)
    sym = None
    with torch.no_grad():
        for n in (20, 19, 18, 17, 20, 5, 17, 64, 60):
            x = _rand(n, 32)
            torch.testing.assert_close(c(x, z), fn(x, z), atol=1e-3, rtol=1e-5)
            sym = c.stats().program.symbolic
            top = sym.buckets[(bucket_size(n),)]
            assert (sym.bucket_for({sym.symbols[0]: n}) is top) == (n == bucket_size(n)), n
            if n == bucket_size(n):  # (the bucket's own sizes ran on its placed slots)
                assert top.slots is not None and len(top.slots) == len(c.stats().program.slots)
    assert c.compilations == 1 and sym is not None


def test_a_bound_instance_is_copied_for_other_sizes_of_its_bucket():
    """Once an instance of a bucket has run, another size of that bucket is its copy with the
    varying slots retyped (`CpuProgram._resized`: bound at once, no new placement or binding);
    each copy computes its own size, also after the sizes interleave, and a size in another
    bucket is built in full."""
    torch.manual_seed(0)
    fn = lambda x: torch.relu(x @ W32x48 + B48).sum(-1)  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={0: {0: (2, 4096)}}, tiered=False)
    with torch.no_grad():
        c(_rand(20, 32))
        prog = c.stats().program
        s0 = prog.symbolic.symbols[0]
        first = prog.at({s0: 20})
        x20 = _rand(20, 32)
        torch.testing.assert_close(first.run([x20])[0], fn(x20), atol=1e-4, rtol=1e-5)
        copies = {n: prog.at({s0: n}) for n in (17, 18, 19)}
        for n, p in copies.items():
            assert p._ready and p._bucket is first._bucket and p.sizes == {s0: n}, n
        for n in (18, 17, 19, 18):
            x = _rand(n, 32)
            (got,) = copies[n].run([x])
            assert got.shape == (n,)
            torch.testing.assert_close(got, fn(x), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(first.run([x20])[0], fn(x20), atol=1e-4, rtol=1e-5)
        other = prog.at({s0: 100})  # (bucket 112: nothing bound there yet)
        assert not other._ready and other._bucket is not first._bucket

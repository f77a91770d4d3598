"""Strided view algebra against torch's own views on random view chains."""

from __future__ import annotations

import random

import torch

from novaforge.ir.graph import Attrs
from novaforge.ir.views import Strided, apply_view, reshape_strides


def _random_view(rng: random.Random, shape: tuple[int, ...]):
    op = rng.choice(["permute", "reshape", "expand", "slice"])
    if op == "permute":
        perm = list(range(len(shape)))
        rng.shuffle(perm)
        return op, Attrs(perm=tuple(perm))
    if op == "slice" and shape:
        ax = rng.randrange(len(shape))
        n = shape[ax]
        start = rng.randrange(n + 1) if n else 0
        stop = rng.randrange(start, n + 1) if n else 0
        return op, Attrs(axis=ax, start=start, stop=stop, step=rng.choice([1, 2]))
    if op == "expand":
        new = tuple(rng.choice([1, 3]) if s == 1 else s for s in shape)
        return op, Attrs(shape=((2,) + new) if rng.random() < 0.3 else new)
    numel = 1
    for s in shape:
        numel *= s
    cands = [(numel,), (1, numel)]
    for d in (2, 3, 4):
        if numel and numel % d == 0:
            cands.append((d, numel // d))
    return "reshape", Attrs(shape=rng.choice(cands))


def _torch_view(t, op, a):
    if op == "permute":
        return t.permute(a["perm"])
    if op == "reshape":
        return t.view(a["shape"])
    if op == "expand":
        return t.expand(a["shape"])
    idx = [slice(None)] * t.dim()
    idx[a["axis"]] = slice(a["start"], a["stop"], a["step"])
    return t[tuple(idx)]


def test_random_view_chains_match_torch():
    rng = random.Random(0)
    checked = 0
    for _ in range(400):
        shape = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.randrange(1, 4)))
        base = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)
        t = base
        lay = Strided.contiguous(shape)
        for _ in range(4):
            op, a = _random_view(rng, tuple(t.shape))
            new = apply_view(lay, op, a)
            try:
                tv = _torch_view(t, op, a)
            except RuntimeError:
                assert new is None or op != "reshape"
                break
            if new is None:
                assert op == "reshape"
                break
            assert new.shape == tuple(tv.shape)
            if tv.numel():
                expect = torch.as_strided(base, new.shape, new.strides, new.offset)
                assert torch.equal(expect, tv)
                checked += 1
            t, lay = tv, new
    assert checked > 300


def test_reshape_of_transpose_is_not_a_view():
    assert reshape_strides((3, 4), (1, 3), (12,)) is None
    assert reshape_strides((3, 4), (4, 1), (2, 6)) == (6, 1)
    lay = apply_view(Strided.contiguous((4,)), "expand", Attrs(shape=(3, 4)))
    assert lay.strides == (0, 1)
    assert apply_view(lay, "reshape", Attrs(shape=(12,))) is None

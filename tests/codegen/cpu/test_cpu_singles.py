"""Generated gathers (embedding / index_select) and cat against eager; out-of-range indices raise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cpu_check import check, compile_cpu


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

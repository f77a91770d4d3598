"""ir/serialize.py: a constant's bytes round-trip whatever its strides (the pipeline cache stores
folded constants this way: torchao's int8-dynamic GPT-2 under generate() folded a [1]-shaped scalar
expanded with stride 0, which the byte view refused)."""

import pytest
import torch

from novaforge.ir.serialize import tensor_from_data, tensor_to_data

CASES = {
    "expanded size-1 (stride 0)": torch.tensor(2.5).expand(1),
    "expanded 1 x 1": torch.tensor(-3.0, dtype=torch.float64).expand(1, 1),
    "transposed": torch.arange(6, dtype=torch.int32).reshape(2, 3).t(),
    "sliced": torch.arange(10, dtype=torch.int8)[::3],
    "broadcast rows": torch.tensor([1.0, 2.0]).expand(3, 2),
    "bfloat16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    "empty": torch.empty(0, 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_constants_round_trip(case):
    t = CASES[case]
    back = tensor_from_data(tensor_to_data(t))
    assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)

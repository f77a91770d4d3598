"""Results that are views of other results: rebuilt only from a base that spans them."""

import pytest
import torch

import novaforge


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_a_chunk_returned_before_its_base(backend):
    # the first chunk is contiguous at offset 0 of y's storage, but cannot be y's base (it is smaller)
    def f(x):
        y = x * 2
        return y.chunk(2)[0], y, y[1:].t()

    c = novaforge.compile(f, backend=backend)
    x = torch.randn(4, 3)
    for got, want in zip(c(x), f(x), strict=True):
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and got.stride() == want.stride()

"""Custom ops on the Triton backend (under TRITON_INTERPRET=1): the CPU tests' three kinds
(tests/frontend/test_custom_ops.py) -- a `torch.library.custom_op` with a fake implementation
and autograd formula, an op defined the way a C++ extension's TORCH_LIBRARY defines one, and a
custom op that mutates its input -- through `novaforge.compile(backend="triton")` and
`torch.compile(backend="novaforge", options={"backend": "triton"})`: one graph (no graph break,
no fallback), the op one call through torch between generated Triton kernels, results (and the
mutated input, and gradients) equal to eager's.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import novaforge
import novaforge.dynamo as nf_dynamo


@torch.library.custom_op("nftest_tri_co::shift", mutates_args=())
def shift(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s - 0.25


@shift.register_fake
def _shift_fake(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.empty_like(x)


def _shift_setup(ctx, inputs, output) -> None:
    ctx.s = inputs[1]


shift.register_autograd(lambda ctx, g: (g * ctx.s, None), setup_context=_shift_setup)

_LIB = torch.library.Library("nftest_tri_lib", "DEF")  # as TORCH_LIBRARY(nftest_tri_lib, m) defines it
_LIB.define("square(Tensor x) -> Tensor")
_LIB.impl("square", lambda x: x * x, "CPU")
torch.library.register_fake("nftest_tri_lib::square", lambda x: torch.empty_like(x))


@torch.library.custom_op("nftest_tri_mut::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(y)
    return y + 1


@scale_.register_fake
def _scale_fake(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(y)


class Model(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.lin(x)) * 2 - 1
        h = shift(h, 3.0) if self.kind == "custom_op" else torch.ops.nftest_tri_lib.square(h)
        return torch.tanh(h) * 0.5 + 1


def _compile(model, entry: str):
    torch._dynamo.reset()
    counters.clear()
    nf_dynamo.FALLBACKS.clear()
    if entry == "novaforge":
        return novaforge.compile(model, backend="triton")
    return torch.compile(model, backend="novaforge", options={"backend": "triton"})


def _one_graph(compiled) -> None:
    assert getattr(compiled, "_via_dynamo", None) is None
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not nf_dynamo.FALLBACKS, nf_dynamo.FALLBACKS


@pytest.mark.parametrize("entry", ["novaforge", "torch.compile"])
@pytest.mark.parametrize("kind", ["custom_op", "library"])
def test_custom_op_between_triton_kernels(kind, entry):
    torch.manual_seed(0)
    model, x = Model(kind), torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        c = _compile(model, entry)
        got = c(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    _one_graph(c)
    if entry == "novaforge":
        kinds = [s.kind for s in c.stats().program.steps]
        assert "triton" in kinds, kinds  # the pointwise work around the op is generated


@pytest.mark.parametrize("entry", ["novaforge", "torch.compile"])
def test_custom_op_training_gradients(entry):
    torch.manual_seed(0)
    ref_model, model = Model("custom_op"), Model("custom_op")
    model.load_state_dict(ref_model.state_dict())
    x = torch.randn(4, 16)
    ref_model(x).square().sum().backward()
    c = _compile(model, entry)
    c(x).square().sum().backward()
    _one_graph(c)
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("entry", ["novaforge", "torch.compile"])
def test_mutating_custom_op_mutates_as_eager(entry):
    def f(x, y):
        before = x * 2
        w = scale_(x, y.exp())
        return before + x.sin() + w

    torch.manual_seed(0)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    x_ref = x.clone()
    ref = f(x_ref, y)
    c = _compile(f, entry)
    got = c(x, y)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x, x_ref, atol=1e-6, rtol=1e-6)
    _one_graph(c)

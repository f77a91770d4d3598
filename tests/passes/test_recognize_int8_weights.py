"""recognize_int8_weights: `A @ views(cast(int8 W))` becomes a float-times-int8 matmul on the int8
value (the weight is never converted to a float32 copy), computing the same values (against the IR
interpreter on random inputs); other products are left alone."""

from __future__ import annotations

import pytest
import torch

from nf_testing import captured_graph, check_pass
from novaforge.passes.context import PassContext
from novaforge.passes.recognize_int8_weights import recognize_int8_weights


def _w(n=24, k=40, seed=0):
    return torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


FORMS = {  # (function of (x, w_int8 [N, K], scale [N]), x shape)
    "torchao Int8Tensor": (lambda x, w, s: torch.mm(x, w.t().to(torch.float32)) * s + 1.0, (5, 40)),
    "cast then permute": (lambda x, w, s: torch.mm(x, w.to(torch.float32).t()) * s, (3, 40)),
    "linear on the cast": (lambda x, w, s: torch.nn.functional.linear(x, w.float()) * s, (2, 7, 40)),
    "batched A": (lambda x, w, s: torch.matmul(x, w.float().t()) * s, (2, 3, 40)),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_the_cast_weight_becomes_an_int8_operand(form):
    fn, shape = FORMS[form]
    x, w, s = torch.randn(shape), _w(), torch.rand(24)
    ctx = PassContext()
    out = check_pass(recognize_int8_weights, captured_graph(fn, x, w, s), [x, w, s], ctx)
    mms = [n for n in out.nodes if n.op == "matmul"]
    assert len(mms) == 1 and mms[0].inputs[1].type.dtype == torch.int8
    assert mms[0].outputs[0].type.dtype == torch.float32
    assert ctx.counters["int8_weight_matmuls"] == 1


@pytest.mark.parametrize("case", ["float weight", "int16 weight", "bfloat16 activations", "cast to bfloat16"])
def test_other_products_are_left_alone(case):
    x, s = torch.randn(4, 40), torch.rand(24)
    w = {"float weight": torch.randn(24, 40), "int16 weight": _w().to(torch.int16)}.get(case, _w())
    fn = lambda x, w, s: torch.mm(x, w.t().float()) * s  # noqa: E731
    if case == "bfloat16 activations":
        x = x.bfloat16()
        fn = lambda x, w, s: torch.mm(x, w.t().bfloat16()) * s  # noqa: E731
    if case == "cast to bfloat16":
        fn = lambda x, w, s: torch.mm(x.bfloat16(), w.t().bfloat16()).float() * s  # noqa: E731
    ctx = PassContext()
    out = check_pass(recognize_int8_weights, captured_graph(fn, x, w, s), [x, w, s], ctx, atol=1e-2, rtol=1e-2)
    assert all(n.inputs[1].type.dtype != torch.int8 for n in out.nodes if n.op == "matmul")
    assert ctx.counters.get("int8_weight_matmuls", 0) == 0


def test_not_on_the_triton_backend():
    class Triton:
        name = "triton"

    x, w, s = torch.randn(4, 40), _w(), torch.rand(24)
    g = captured_graph(FORMS["torchao Int8Tensor"][0], x, w, s)
    assert recognize_int8_weights(g, PassContext(backend=Triton())) is g

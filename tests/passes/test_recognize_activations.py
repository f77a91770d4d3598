"""recognize_activations: the tanh-GELU formula written out (GPT-2's NewGELUActivation) becomes
one `gelu(approximate="tanh")` node, computing the same values (against the IR interpreter on
random inputs); near misses are left alone."""

from __future__ import annotations

import math

import pytest
import torch

from nf_testing import captured_graph, check_pass
from novaforge.passes.context import PassContext
from novaforge.passes.recognize_activations import recognize_activations
from novaforge.passes.simplify import simplify

C = math.sqrt(2.0 / math.pi)

FORMS = {
    "transformers NewGELU": lambda x: 0.5 * x * (1.0 + torch.tanh(C * (x + 0.044715 * torch.pow(x, 3.0)))),
    "operands swapped": lambda x: (torch.tanh((0.044715 * (x * x * x) + x) * C) + 1.0) * (x * 0.5),
    "x * x * x the other way": lambda x: x * 0.5 * (1 + torch.tanh(C * (x + (x * (x * x)) * 0.044715))),
}


def _ops(graph):
    return sorted(n.op for n in graph.nodes)


def _recognized(fn, x):
    g = simplify(captured_graph(fn, x))  # (pow(x, 3) -> x * x * x first, as in the pipeline)
    ctx = PassContext()
    out = check_pass(recognize_activations, g, [x], ctx, atol=2e-6, rtol=1e-5)
    return out, ctx


@pytest.mark.parametrize("form", list(FORMS))
def test_the_formula_becomes_one_gelu(form):
    x = torch.randn(7, 33) * 4
    out, ctx = _recognized(FORMS[form], x)
    gelus = [n for n in out.nodes if n.op == "gelu"]
    assert len(gelus) == 1 and gelus[0].attrs["approximate"] == "tanh"
    assert ctx.counters["rewrites"] == 1
    ref = torch.nn.functional.gelu(x, approximate="tanh")
    torch.testing.assert_close(FORMS[form](x), ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("case", ["constant off", "another x", "bfloat16", "no half"])
def test_near_misses_are_left_alone(case):
    x = torch.randn(5, 8)
    y = torch.randn(5, 8)
    fns = {
        "constant off": lambda x: 0.5 * x * (1.0 + torch.tanh(C * (x + 0.045 * x * x * x))),
        "another x": lambda x: 0.5 * x * (1.0 + torch.tanh(C * (y + 0.044715 * x * x * x))),
        "bfloat16": FORMS["transformers NewGELU"],
        "no half": lambda x: x * (1.0 + torch.tanh(C * (x + 0.044715 * x * x * x))),
    }
    if case == "bfloat16":
        x = x.to(torch.bfloat16)
    g = simplify(captured_graph(fns[case], x))
    out = recognize_activations(g, PassContext())
    assert "gelu" not in _ops(out)


def test_gpt2_mlp_compiles_its_activation_into_the_gemm_epilogue():
    transformers = pytest.importorskip("transformers")
    import novaforge

    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    m = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 50, (2, 9))
    c = novaforge.compile(m, backend="cpu")
    with torch.no_grad():
        torch.testing.assert_close(c(ids).last_hidden_state, m(ids).last_hidden_state, atol=1e-5, rtol=1e-5)
    names = [n.attrs["kernel"].name for n in c.stats().graph.nodes if n.op == "kernel"]
    assert "matmul_add_gelu" in names, names

"""torch.compile(model, backend="novaforge"): registration, graph breaks, dynamic shapes, training."""

from __future__ import annotations

import torch
import torch._dynamo


class WithBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.l1(x))
        if h.sum() > 0:  # data-dependent branch: a graph break
            h = h * 2
        return torch.softmax(self.l2(self.ln(h + 1.0)), -1)


def test_backend_is_registered_by_entry_point():
    torch._dynamo.reset()
    assert "novaforge" in torch._dynamo.list_backends()


def test_inference_with_graph_breaks_and_new_shapes():
    torch._dynamo.reset()
    m = WithBreak().eval()
    c = torch.compile(m, backend="novaforge")
    with torch.no_grad():
        for n in (4, 7, 9):
            x = torch.randn(n, 16)
            torch.testing.assert_close(c(x), m(x), atol=1e-6, rtol=1e-5)


def test_training_gradients_match_eager():
    torch._dynamo.reset()
    m = WithBreak()
    c = torch.compile(m, backend="novaforge")
    x = torch.randn(4, 16, requires_grad=True)
    c(x).pow(2).sum().backward()
    gx, gw = x.grad.clone(), m.l1.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    m(x).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gw, m.l1.weight.grad, atol=1e-6, rtol=1e-5)

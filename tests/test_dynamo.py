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
    c = torch.compile(m, backend="novaforge", options={"tiered": False})  # every shape compiled
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


def test_results_are_fresh_where_eager_is():
    torch._dynamo.reset()

    def fn(x):
        return x + 0, x * 1, torch.ones(3) + 0

    c = torch.compile(fn, backend="novaforge")
    x = torch.randn(3)
    a, b, k = c(x)
    assert a.data_ptr() != x.data_ptr() and b.data_ptr() != x.data_ptr() and a.data_ptr() != b.data_ptr()
    k.add_(100)
    assert torch.equal(c(x)[2], torch.ones(3))


def test_unsupported_graph_runs_eagerly_and_is_recorded():
    from novaforge import dynamo as nf_dynamo

    torch._dynamo.reset()
    nf_dynamo.FALLBACKS.clear()

    def fn(x):
        return torch.fft.rfft(x).abs() + 1

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(fn, backend="novaforge")(x), fn(x))
    assert len(nf_dynamo.FALLBACKS) == 1
    reason = nf_dynamo.FALLBACKS[0].reason
    assert "_fft_r2c" in reason and "complex64" in reason and "test_dynamo.py" in reason


def test_fallback_raise_option():
    import pytest

    from novaforge import UnsupportedError

    torch._dynamo.reset()
    c = torch.compile(lambda x: torch.fft.rfft(x).abs(), backend="novaforge", options={"fallback": "raise"})
    with pytest.raises(Exception) as info:
        c(torch.randn(8))
    assert isinstance(info.value, UnsupportedError) or "UnsupportedError" in str(info.value)


def test_graph_break_on_item_and_real_constants():
    torch._dynamo.reset()

    def fn(x):
        s = x.sum().item()
        return torch.tril(torch.ones(4, 4)) * s + torch.linspace(0, 1, 4) + x

    x = torch.randn(4, 4)
    torch.testing.assert_close(torch.compile(fn, backend="novaforge")(x), fn(x))


def test_optimizer_step_compiled():
    torch._dynamo.reset()
    torch.manual_seed(0)
    m1, m2 = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    m2.load_state_dict(m1.state_dict())
    o1, o2 = torch.optim.AdamW(m1.parameters(), lr=1e-2), torch.optim.AdamW(m2.parameters(), lr=1e-2)
    step = torch.compile(o1.step, backend="novaforge")
    x = torch.randn(5, 8)
    for _ in range(3):
        for m, o, st in ((m1, o1, step), (m2, o2, o2.step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            st()
    torch.testing.assert_close(m1.weight, m2.weight, atol=1e-6, rtol=1e-5)


def test_importing_novaforge_registers_the_backend_without_installed_metadata(monkeypatch):
    """A source tree on PYTHONPATH has no entry point: `torch.compile(backend="novaforge")` said
    "Invalid backend" there (seen on the GPU machine); importing novaforge now registers it."""
    import importlib.metadata

    from torch._dynamo.backends import registry

    import novaforge
    from novaforge.dynamo import novaforge_backend

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [])
    monkeypatch.delitem(registry._BACKENDS, "novaforge", raising=False)
    monkeypatch.delitem(registry._COMPILER_FNS, "novaforge", raising=False)
    assert "novaforge" not in registry._BACKENDS
    novaforge._register_dynamo_backend()
    assert registry.lookup_backend("novaforge") is novaforge_backend

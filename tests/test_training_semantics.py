"""Training semantics through both entry points (`novaforge.compile(model)` and
`torch.compile(model, backend="novaforge")`), compared with eager: double backward raises a clear
error, a parameter only an unused output depends on keeps `.grad` None, and `compile_step` runs
forward hooks at every step."""

import pytest
import torch

import novaforge
from novaforge.dynamo import DoubleBackwardError

ENTRIES = {"novaforge.compile": novaforge.compile,
           "torch.compile": lambda m: torch.compile(m, backend="novaforge")}


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("how", ["autograd.grad", "backward"])
def test_double_backward_raises_a_clear_error(entry, how):
    """A backward with create_graph=True through a compiled graph raises DoubleBackwardError
    naming the graph and what to do (not AOTAutograd's internal message)."""
    model = _mlp()
    compiled = ENTRIES[entry](model)
    x = torch.randn(5, 4)
    loss = compiled(x).pow(2).mean()
    with pytest.raises(DoubleBackwardError, match="create_graph=True.*uncompiled") as info:
        if how == "autograd.grad":
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            (loss + sum(g.pow(2).sum() for g in grads)).backward()
        else:
            loss.backward(create_graph=True)
    assert ("Sequential" if entry == "novaforge.compile" else "torch.compile") in str(info.value)
    for p in model.parameters():  # (a plain backward still works)
        p.grad = None
    compiled(x).pow(2).mean().backward()
    eager = _mlp()
    eager(x).pow(2).mean().backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


class _TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.p = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        return self.lin(x), self.p * 2


@pytest.mark.parametrize("entry", ENTRIES)
def test_parameter_of_an_unused_output_keeps_grad_none(entry):
    """b depends on p only and is left out of the loss: p.grad stays None as in eager (AdamW
    then leaves p undecayed), the other gradients equal eager's; when b is used, p gets its grad."""
    torch.manual_seed(0)
    eager = _TwoOutputs()
    torch.manual_seed(0)
    model = _TwoOutputs()
    compiled = ENTRIES[entry](model)
    x = torch.randn(2, 4)
    eager(x)[0].sum().backward()
    a, _ = compiled(x)
    a.sum().backward()
    assert eager.p.grad is None and model.p.grad is None
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad)
    before = model.p.detach().clone()
    torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5).step()
    assert torch.equal(model.p.detach(), before)
    model.zero_grad(set_to_none=True)
    a, b = compiled(x)
    (a.sum() + b.sum()).backward()
    torch.testing.assert_close(model.p.grad, torch.full((3,), 2.0))


def test_compile_step_runs_forward_hooks_every_step():
    """compile_step of a model with a forward hook and a forward pre-hook: the hooks see every
    step, and the losses and parameters equal eager's over a few AdamW steps."""
    torch.manual_seed(0)
    xs = [torch.randn(6, 4) for _ in range(4)]
    ys = [torch.randn(6, 1) for _ in range(4)]

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _mlp()

        def forward(self, x, y):
            return torch.nn.functional.mse_loss(self.body(x), y)

    def run(compiled: bool):
        model = Net()
        seen, pre = [], []
        model.body[0].register_forward_hook(lambda m, i, o: seen.append(float(o.detach().abs().sum())))
        model.register_forward_pre_hook(lambda m, i: pre.append(1))
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
        step = novaforge.compile_step(model, opt) if compiled else None
        losses = []
        for x, y in zip(xs, ys, strict=True):
            if step is not None:
                losses.append(float(step(x, y)))
            else:
                opt.zero_grad(set_to_none=True)
                loss = model(x, y)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        return losses, seen, pre, model

    ref_losses, ref_seen, ref_pre, ref_model = run(False)
    losses, seen, pre, model = run(True)
    assert len(pre) == len(ref_pre) == 4 and len(seen) == 4
    assert seen == pytest.approx(ref_seen, rel=1e-5)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)

"""Counter-based random numbers (ir/ops/random.py): the default lowering of dropout, bernoulli
and rand. Checked: the generator against an independent SplitMix64 in Python integers, the
compiled kernels against the interpreter bit for bit, the statistics of the draws, their
determinism per seed, and that a training step's backward uses its forward's mask through the
three entry points."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import novaforge
from novaforge.ir.ops.random import splitmix64

MASK64 = (1 << 64) - 1


def _splitmix_py(seed: int, n: int) -> int:
    """The n-th output of a SplitMix64 stream started at `seed` (Python integers)."""
    z = (seed + (n + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_splitmix64_matches_the_reference_stream():
    # the published first outputs of SplitMix64 seeded with 0
    assert _splitmix_py(0, 0) == 0xE220A8397B1DCDAF
    assert _splitmix_py(0, 1) == 0x6E789E6AA1B965F4
    g = torch.Generator().manual_seed(3)
    counters = torch.randint(-2**62, 2**62, (200,), generator=g)
    for seed in (0, 1, -7, 2**62 - 3, -2**62):
        got = splitmix64(counters, torch.tensor(seed))
        want = [_splitmix_py(seed & MASK64, c & MASK64) for c in counters.tolist()]
        assert [v & MASK64 for v in got.tolist()] == want


def _draws(x):
    return F.dropout(x, 0.3, training=True), torch.rand_like(x), torch.bernoulli(torch.sigmoid(x))


def test_compiled_kernels_draw_the_interpreters_numbers():
    x = torch.randn(37, 129)
    cpu = novaforge.compile(_draws, backend="cpu", graph_cache=False)
    ref = novaforge.compile(_draws, backend="interpret", graph_cache=False)
    torch.manual_seed(5)
    got = cpu(x)
    torch.manual_seed(5)
    want = ref(x)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert not any(n.op.startswith("extern") and n.attrs.get("target") != "aten.randint.low"
                   for k in cpu.stats().graph.nodes if k.op == "kernel"
                   for n in k.attrs["kernel"].body.nodes), "a random op stayed an ATen call"


def test_draws_are_uniform_independent_and_deterministic_per_seed():
    n = 1 << 20
    x = torch.randn(n)

    def f(x):
        return torch.rand_like(x), F.dropout(x, 0.3, training=True), F.dropout(x, 0.3, training=True)

    c = novaforge.compile(f, backend="cpu", graph_cache=False)
    torch.manual_seed(0)
    u, d1, d2 = c(x)
    # uniform: 64 equal bins, chi-square with 63 degrees of freedom far below 63 + 8 sd
    counts = torch.histc(u, bins=64, min=0.0, max=1.0)
    chi2 = ((counts - n / 64) ** 2 / (n / 64)).sum().item()
    assert chi2 < 63 + 8 * math.sqrt(2 * 63), chi2
    assert u.min().item() >= 0.0 and u.max().item() < 1.0
    # neighbours uncorrelated (lag 1 and lag 37), within 6 standard errors
    for lag in (1, 37):
        r = torch.corrcoef(torch.stack([u[:-lag], u[lag:]]))[0, 1].item()
        assert abs(r) < 6 / math.sqrt(n), (lag, r)
    # dropout keeps 70% (within 6 sd), kept elements scaled by 1 / 0.7 exactly as eager scales them
    for d in (d1, d2):
        kept = d != 0
        assert abs(kept.float().mean().item() - 0.7) < 6 * math.sqrt(0.21 / n)
        torch.testing.assert_close(d[kept], x[kept] * (1 / 0.7), rtol=0, atol=0)
    # two dropouts of one call are independent: they agree on p^2 + (1-p)^2 of the elements
    agree = ((d1 != 0) == (d2 != 0)).float().mean().item()
    assert abs(agree - 0.58) < 6 * math.sqrt(0.58 * 0.42 / n), agree
    # the next call draws anew; the same seed draws the same numbers again
    u2 = c(x)[0]
    assert (u2 == u).float().mean().item() < 1e-3
    torch.manual_seed(0)
    assert torch.equal(c(x)[0], u)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_rand_in_other_float_dtypes_stays_below_one(dtype):
    # 16-bit floats keep the draw's top bits: a float32 draw near 1 would round up to 1
    c = novaforge.compile(lambda x: torch.rand_like(x), backend="cpu", graph_cache=False)
    torch.manual_seed(1)
    u = c(torch.empty(1 << 16, dtype=dtype))
    assert u.dtype == dtype and u.min() >= 0 and u.max() < 1
    assert 0.49 < u.float().mean().item() < 0.51
    assert u.unique().numel() > {torch.bfloat16: 200, torch.float16: 1500, torch.float64: 60000}[dtype]


def test_eager_mode_keeps_atens_draws():
    x = torch.randn(8, 33)
    c = novaforge.compile(lambda x: F.dropout(x, 0.5, training=True), backend="cpu", random="eager",
                          graph_cache=False)
    torch.manual_seed(4)
    got = c(x)
    torch.manual_seed(4)
    assert torch.equal(got, F.dropout(x, 0.5, training=True))
    with pytest.raises(ValueError, match="random"):
        novaforge.compile(lambda x: x, random="philox")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(24, 48)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(self.lin(x))


@pytest.mark.parametrize("entry", ["novaforge", "torch.compile"])
def test_backward_uses_the_forwards_mask(entry):
    """The gradient of sum(dropout(x W^T + b) * c) is c * mask / (1 - p) back through the linear:
    rebuilt from the mask the forward's output shows, it must equal the compiled gradient."""
    torch.manual_seed(0)
    net = _Net().train()
    if entry == "novaforge":
        model = novaforge.compile(net)
    else:
        torch._dynamo.reset()
        model = torch.compile(net, backend="novaforge")
    x, c = torch.randn(16, 24), torch.randn(16, 48)
    for _ in range(2):
        net.zero_grad(set_to_none=True)
        out = model(x)
        (out * c).sum().backward()
        mask = (out != 0).float()
        assert 0.6 < mask.mean().item() < 0.9
        g = c * mask / 0.75
        torch.testing.assert_close(net.lin.weight.grad, g.t() @ x, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(net.lin.bias.grad, g.sum(0), rtol=1e-5, atol=1e-5)
        h = x @ net.lin.weight.detach().t() + net.lin.bias.detach()
        torch.testing.assert_close(out, h * mask / 0.75, rtol=1e-5, atol=1e-5)


def test_compile_step_with_dropout_is_deterministic_per_seed_and_trains():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    steps = [novaforge.compile_step(m, torch.optim.AdamW(m.parameters(), lr=3e-3),
                                    loss_fn=lambda out, *args, **kwargs: out.loss) for m in (a, b)]
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in steps:
        torch.manual_seed(7)
        losses.append([step(ids, labels=ids).item() for _ in range(12)])
    assert losses[0] == losses[1]
    assert losses[0][-1] < 0.8 * losses[0][0], losses[0]
    graph = next(iter(steps[0]._compiled.values())).stats().graph
    targets = {n.attrs.get("target") for k in graph.nodes if k.op == "kernel"
               for n in k.attrs["kernel"].body.nodes if n.op.startswith("extern")}
    assert targets <= {"aten.randint.low"}, targets


def test_attention_dropout_of_sdpas_math_path():
    """SDPA with dropout_p runs ATen's math path, whose dropout is in place (bernoulli_, div_)
    even in a functionalized trace; the capture functionalizes the traced graph again. The
    draws are counter-based; with v = 1 every output averages 1 over the masks."""
    q, k = torch.randn(2, 4, 64, 8), torch.randn(2, 4, 64, 8)
    v = torch.ones(2, 4, 64, 8)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)

    cpu = novaforge.compile(f, backend="cpu", graph_cache=False)
    ref = novaforge.compile(f, backend="interpret", graph_cache=False)
    torch.manual_seed(2)
    got = cpu(q, k, v)
    torch.manual_seed(2)
    torch.testing.assert_close(got, ref(q, k, v), rtol=1e-5, atol=1e-5)  # same masks (softmax sums may round apart)
    assert abs(got[:, :, 16:].mean().item() - 1.0) < 0.05  # rows with >= 17 keys
    assert (got[..., 0] == got[..., 7]).all()  # one mask per (row, key), shared by v's columns
    torch._dynamo.reset()
    qg = q.clone().requires_grad_()
    out = torch.compile(f, backend="novaforge")(qg, k, v)
    out.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()


class _Checkpointed(_Net):
    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)


def test_compile_step_replays_the_forwards_dropout_under_activation_checkpointing():
    """Activation checkpointing recomputes the forward in the backward after restoring the RNG
    state: the recompute's dropout must draw the forward's mask. With SGD at lr 1 and x = I the
    update is the gradient g^T = (c * mask / 0.75)^T, so the mask the backward used shows; the
    loss shows the forward's."""
    torch.manual_seed(0)
    net = _Checkpointed().train()
    w0, b0 = net.lin.weight.detach().clone(), net.lin.bias.detach().clone()
    x, c = torch.eye(24), torch.randn(24, 48)
    step = novaforge.compile_step(net, torch.optim.SGD(net.parameters(), lr=1.0),
                                  loss_fn=lambda out, x: (out * c).sum())
    loss = step(x).item()
    mask = ((w0 - net.lin.weight.detach()).t() != 0).float()
    assert 0.6 < mask.mean().item() < 0.9
    want = ((x @ w0.t() + b0) * mask * c / 0.75).sum().item()
    assert abs(loss - want) <= 1e-4 * abs(want), (loss, want)
    # ATen's own draws cannot be replayed: a clear refusal, not other masks
    net2 = _Checkpointed().train()
    with pytest.raises(Exception, match="activation checkpointing"):
        novaforge.compile_step(net2, torch.optim.SGD(net2.parameters(), lr=1.0),
                               loss_fn=lambda out, x: (out * c).sum(), random="eager")(x)

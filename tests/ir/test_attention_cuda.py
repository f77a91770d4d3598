"""CUDA's three SDPA forms and their backwards (ir/ops/attention_cuda.py), lowered on the CPU:
FX graphs holding the CUDA ops (with the shapes their meta functions declare) go through
novaforge's ATen-graph compiler with the interpreter backend, and must compute what eager's SDPA
and autograd compute: the output, the logsumexp in the op's own shape (flash [B, H, L], cuDNN
[B, H, L, 1], efficient zero padded to a multiple of 32), and dq, dk, dv from that logsumexp."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from novaforge.dynamo import FALLBACKS, _AtenGraphProgram

aten = torch.ops.aten
B, H, L, E = 2, 3, 37, 16


class P:
    """A placeholder reference in a hand-built graph's arguments."""

    def __init__(self, i: int) -> None:
        self.i = i


def _lse_shape(form: str) -> tuple:
    return {"flash": (B, H, L), "cudnn": (B, H, L, 1), "efficient": (B, H, -(-L // 32) * 32)}[form]


def _graph(target, args: list, kwargs: dict, vals: tuple, outputs: list[int], n_in: int, examples: list):
    g = torch.fx.Graph()
    phs = []
    for i in range(n_in):
        p = g.placeholder(f"x{i}")
        p.meta["val"] = examples[i]
        phs.append(p)
    call = g.call_function(target, tuple(phs[a.i] if isinstance(a, P) else a for a in args), kwargs)
    call.meta["val"] = vals
    outs = []
    for i in outputs:
        o = g.call_function(operator.getitem, (call, i))
        o.meta["val"] = vals[i]
        outs.append(o)
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _run(gm, inputs):
    n = len(FALLBACKS)
    prog = _AtenGraphProgram(gm, inputs, {"backend": "interpret", "fallback": "raise"})
    out = prog(*inputs)
    assert len(FALLBACKS) == n
    return out


def _reference(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) / E ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


@pytest.mark.parametrize("form", ["flash", "cudnn", "efficient"])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_sdpa_forward_and_backward_lower_to_the_attention_records(form, causal):
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(B, H, L, E) for _ in range(4))
    seed = torch.zeros((), dtype=torch.int64)
    lse_shape = _lse_shape(form)
    out_val, lse_val = torch.empty(B, H, L, E), torch.empty(lse_shape)
    if form == "flash":
        fwd = (aten._scaled_dot_product_flash_attention.default, [P(0), P(1), P(2), 0.0, causal, False], {})
        vals = (out_val, lse_val, None, None, L, L, seed, seed, None)
    elif form == "cudnn":
        fwd = (aten._scaled_dot_product_cudnn_attention.default, [P(0), P(1), P(2), None, True, 0.0, causal, False], {})
        vals = (out_val, lse_val, None, None, L, L, seed, seed, None)
    else:
        fwd = (aten._scaled_dot_product_efficient_attention.default, [P(0), P(1), P(2), None, True, 0.0, causal], {})
        vals = (out_val, lse_val, seed, seed)
    # the training forward (output and logsumexp read), then inference (output only)
    out, lse = _run(_graph(*fwd, vals, [0, 1], 3, [q, k, v]), [q, k, v])
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-5)
    assert tuple(lse.shape) == lse_shape
    torch.testing.assert_close(lse.reshape(B, H, -1)[..., :L], _reference(q, k, v, causal), atol=2e-5, rtol=1e-5)
    assert not lse.reshape(B, H, -1)[..., L:].any()  # the efficient form's padding is zero
    (only,) = _run(_graph(*fwd, vals, [0], 3, [q, k, v]), [q, k, v])
    torch.testing.assert_close(only, want, atol=2e-5, rtol=1e-5)

    # the backward, from that logsumexp
    grads = (torch.empty(B, H, L, E),) * 3
    if form == "flash":
        bwd = (aten._scaled_dot_product_flash_attention_backward.default,
               [P(0), P(1), P(2), P(3), P(4), P(5), None, None, L, L, 0.0, causal, P(6), P(6)], {})
    elif form == "cudnn":
        bwd = (aten._scaled_dot_product_cudnn_attention_backward.default,
               [P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(6), None, None, None, L, L, 0.0, causal], {})
    else:
        bwd = (aten._scaled_dot_product_efficient_attention_backward.default,
               [P(0), P(1), P(2), P(3), None, P(4), P(5), P(6), P(6), 0.0, [True, True, True, False], causal], {})
        grads = grads + (None,)
    ins = [g, q, k, v, out, lse, seed]
    got = _run(_graph(*bwd, grads, [0, 1, 2], 7, ins), ins)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal).backward(g)
    for a, b in zip(got, (qr.grad, kr.grad, vr.grad), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_cpu_scalar_constant_read_on_another_device_becomes_a_scalar_there():
    """Decompositions write `where(c, x, 0)` with a 0-d CPU constant; on a CUDA graph that made a
    host copy per call, which CUDA-graph capture refused (cross-entropy on the H200). Lowered, the
    constant is a scalar on the device of the op that reads it ('meta' stands in for 'cuda')."""
    from novaforge.frontend.lower import InputSpec, lower_fx

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(3, device="meta")
    c = g.get_attr("c0")
    pos = g.call_function(aten.gt.Scalar, (x, 0.0))
    pos.meta["val"] = torch.empty(3, dtype=torch.bool, device="meta")
    w = g.call_function(aten.where.self, (pos, x, c))
    w.meta["val"] = torch.empty(3, device="meta")
    g.output((w,))
    root = torch.nn.Module()
    root.c0 = torch.tensor(0.0)
    graph, _ = lower_fx(torch.fx.GraphModule(root, g), [InputSpec("user", "x")])
    (where,) = [n for n in graph.nodes if n.op == "where"]
    assert [v.type.device for v in where.inputs] == ["meta", "meta", "meta"]


@pytest.mark.parametrize("s", [37, 48])
def test_the_efficient_kernels_bias_has_aligned_rows(s):
    """ATen's memory-efficient attention refuses a bias whose rows are not 16-element aligned
    (BERT's padding mask at a length like 37): the bias is built in 16-aligned rows."""
    from novaforge.ir.ops.attention_cuda_impl import _bias

    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, s, 8)
    keep = torch.rand(2, 1, 1, s) > 0.3
    b = _bias(q, k, keep)
    assert b.shape == (2, 3, 5, s) and b.stride(-1) == 1 and b.stride(-2) % 16 == 0
    want = torch.zeros(2, 3, 5, s).masked_fill(~keep, float("-inf"))
    assert torch.equal(b, want)
    additive = torch.randn(5, s)
    assert torch.equal(_bias(q, k, additive), additive.expand(2, 3, 5, s))

"""passes/autodiff.py: reverse mode on the IR, one VJP rule per op record, checked against
torch.autograd on every differentiable op (generated over the records, float32 and bfloat16),
then on composed graphs (broadcasting, fan-out, a captured MLP with a loss)."""

from __future__ import annotations

import pytest
import torch

from nf_op_samples import sample
from nf_testing import captured_graph
from novaforge.ir import OPS, Graph, GraphInput, Value, make_node, verify
from novaforge.ir.types import TensorType, is_float
from novaforge.passes.autodiff import autodiff
from novaforge.passes.pipeline import run_pipeline
from novaforge.report.ops_table import matrix_ops
from novaforge.runtime.interpret import interpret

f32, bf16 = torch.float32, torch.bfloat16
# ops without a VJP rule, and why (everything else with float inputs and outputs has one)
NO_VJP = {"index": "advanced indexing with several index tensors: not yet",
          "extern": "an ATen call", "extern_effect": "an ATen call",
          "attention_backward": "a gradient itself (lowered from autograd's SDPA backward); no double backward",
          "attention_lse": "lowered from autograd's traced SDPA forward, whose backward is attention_backward"}
TOL = {f32: 2e-5, bf16: 3e-2}  # relative to the gradient's norm


def _floats(ts):
    return [i for i, t in enumerate(ts) if t.is_floating_point()]


def _one_op_graph(op, ts, attrs):
    vals = [Value(TensorType.of(t)) for t in ts]
    node = make_node(op, vals, attrs)
    return Graph([GraphInput(v, "user", f"x{i}") for i, v in enumerate(vals)], [node], list(node.outputs))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


def differentiable_ops() -> list[str]:
    return [op for op in matrix_ops() if OPS[op].vjp is not None]


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("op", differentiable_ops())
def test_vjp_matches_autograd(op: str, dtype: torch.dtype) -> None:
    ts, attrs = sample(op, dtype, seed=7)
    wrt = _floats(ts)
    graph = _one_op_graph(op, ts, attrs)
    float_outs = [i for i, o in enumerate(graph.outputs) if is_float(o.type.dtype)]
    if not wrt or not float_outs:
        pytest.skip(f"{op} on {dtype}: no float input or output in this sample")
    g = autodiff(graph, wrt=wrt, seed="inputs")
    gen = torch.Generator().manual_seed(3)
    cts = [torch.randn(graph.outputs[i].type.shape, generator=gen).to(graph.outputs[i].type.dtype) for i in float_outs]
    got = interpret(g, ts + cts)[len(graph.outputs):]
    leaves = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(ts)]
    out = OPS[op].impl(leaves, graph.nodes[0].attrs)
    outs = out if isinstance(out, tuple) else (out,)
    try:
        want = torch.autograd.grad([outs[i] for i in float_outs], [leaves[i] for i in wrt], cts, allow_unused=True)
    except RuntimeError as e:  # not differentiable in torch either (floor_divide): our gradient is zero
        assert all(torch.count_nonzero(x) == 0 for x in got), f"{op}: torch says {e}"
        return
    for i, gx, wx in zip(wrt, got, want, strict=True):
        assert gx.shape == ts[i].shape and gx.dtype == ts[i].dtype
        wx = torch.zeros_like(gx) if wx is None else wx
        if wx.abs().max() == 0:
            assert gx.abs().max() == 0, f"{op}: input {i}: expected a zero gradient"
            continue
        assert _rel(gx, wx) < TOL[dtype], f"{op} {dtype} input {i}: relative error {_rel(gx, wx):.2e}"


def test_every_differentiable_op_has_a_vjp_rule() -> None:
    lacking = []
    for op in matrix_ops():
        d = OPS[op]
        ts, attrs = sample(op, f32, 0)
        if d.vjp is None and op not in NO_VJP and _floats(ts):
            outs = _one_op_graph(op, ts, attrs).outputs
            if any(is_float(o.type.dtype) for o in outs):
                lacking.append(op)
    assert not lacking, f"ops with float inputs and outputs but no VJP rule: {lacking}"


def test_composed_graph_broadcast_and_fan_out() -> None:
    def f(x, w, b):
        h = torch.tanh(x @ w + b)  # b broadcast over rows
        return (h * h + h).sum(), h.mean(dim=0)

    x, w, b = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
    graph = captured_graph(f, x, w, b)
    g = autodiff(graph, seed="ones")  # the first output is the loss
    verify(g)
    got = interpret(g, [x, w, b])
    xs = [t.clone().requires_grad_() for t in (x, w, b)]
    loss, _ = f(*xs)
    want = torch.autograd.grad(loss, xs)
    assert len(got) == 2 + 3
    for gx, wx in zip(got[2:], want, strict=True):
        torch.testing.assert_close(gx, wx, rtol=1e-5, atol=1e-6)


def test_forward_and_backward_go_through_the_pipeline_together() -> None:
    """The result is one graph: the passes and the CPU backend optimize forward and backward
    together (a LayerNorm MLP with a cross-entropy loss)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 10))
    x, y = torch.randn(8, 16), torch.randint(0, 10, (8,))

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.m(x), y)

    loss_fn = WithLoss()
    graph = captured_graph(loss_fn, x, y)
    params = [i for i, gi in enumerate(graph.inputs) if gi.kind == "param"]
    assert len(params) == 6
    g = autodiff(graph, wrt=params, seed="ones")
    from novaforge.codegen.registry import get_backend

    be = get_backend("cpu")
    opt, _ = run_pipeline(g, target=be.target(), backend=be)
    program = be.build(opt, {})
    names = [gi.name for gi in graph.inputs if gi.kind == "param"]
    byname = dict(loss_fn.named_parameters())
    bound = [x if gi.kind == "user" and gi.value.type.dtype.is_floating_point else
             y if gi.kind == "user" else byname[gi.name] for gi in g.inputs if gi.kind != "const"]
    got = program.run(bound)
    loss = loss_fn(x, y)
    want = torch.autograd.grad(loss, [byname[n] for n in names])
    torch.testing.assert_close(got[0], loss, rtol=1e-5, atol=1e-6)
    for gx, wx, n in zip(got[1:], want, names, strict=True):
        torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-5, msg=n)


def test_errors_name_the_op_and_the_input() -> None:
    x = torch.randn(3, 4)
    idx = torch.tensor([0, 2])
    vals = [Value(TensorType.of(x)), Value(TensorType.of(idx)), Value(TensorType.of(idx))]
    node = make_node("index", vals, {"axes": (0, 1)})
    graph = Graph([GraphInput(v, "user", f"x{i}") for i, v in enumerate(vals)], [node], list(node.outputs))
    with pytest.raises(NotImplementedError, match="index has no VJP rule"):
        autodiff(graph, wrt=[0])
    with pytest.raises(TypeError, match="only float inputs"):
        autodiff(graph, wrt=[1])

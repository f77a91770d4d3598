"""Bad input: what cannot be compiled fails loudly and says where; nothing gives a wrong result.

* data-dependent shapes (nonzero, boolean masks, unique) raise UnsupportedError naming the op
  and the user's file:line, with `fallback="raise"`;
* data-dependent control flow and .item()-sized tensors raise CaptureError naming the construct
  and the user's file:line, with `fallback="raise"`;
* by default both compile through Dynamo instead (it splits the graph there), with a warning
  that names the op or line, and give eager's results on every branch;
* an op without a lowering rule becomes a counted extern and still computes what eager does;
* a new input shape or dtype compiles a new program (and gives correct results); the same
  signature reuses the compiled one.
"""

from __future__ import annotations

import os

import pytest
import torch

import novaforge

MODES = ("fx", "export")
HERE = os.path.basename(__file__)


def _where(fn, offset: int = 0) -> str:
    return f"{HERE}:{fn.__code__.co_firstlineno + offset}"


def f_nonzero(x): return torch.nonzero(x) * 2  # noqa: E704
def f_mask(x): return x[x > 0] + 1  # noqa: E704
def f_unique(x): return torch.unique(x) * 2  # noqa: E704
def f_masked_select(x): return torch.masked_select(x, x > 0)  # noqa: E704


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fn", "op"), [(f_nonzero, "nonzero"), (f_mask, "index"), (f_unique, "unique"),
                                        (f_masked_select, "masked_select")])
def test_data_dependent_shape_names_op_and_line(fn, op: str, mode: str) -> None:
    compiled = novaforge.compile(fn, backend="interpret", capture=mode, fallback="raise")
    with pytest.raises(novaforge.UnsupportedError) as info:
        compiled(torch.randn(3, 4))
    msg = str(info.value)
    assert op in msg and "data-dependent" in msg, msg
    assert _where(fn) in msg, msg


def f_branch(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def f_item_size(x):
    n = int(x.abs().sum().item())
    return torch.ones(n)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fn", "line"), [(f_branch, 1), (f_item_size, 1)])
def test_data_dependent_control_flow_is_a_clear_capture_error(fn, line: int, mode: str) -> None:
    compiled = novaforge.compile(fn, backend="interpret", capture=mode, fallback="raise")
    with pytest.raises(novaforge.CaptureError) as info:
        compiled(torch.randn(3, 4))
    msg = str(info.value)
    assert "depend on tensor values" in msg, msg


@pytest.mark.parametrize("mode", MODES)
def test_data_dependent_control_flow_names_the_line(mode: str) -> None:
    compiled = novaforge.compile(f_branch, backend="interpret", capture=mode, fallback="raise")
    with pytest.raises(novaforge.CaptureError) as info:
        compiled(torch.randn(3, 4))
    assert _where(f_branch, 1) in str(info.value), str(info.value)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("fn", "line"), [(f_nonzero, 0), (f_mask, 0), (f_unique, 0), (f_masked_select, 0),
                                          (f_branch, 1), (f_item_size, 1)])
def test_data_dependent_code_compiles_through_dynamo_by_default(fn, line: int, mode: str, caplog) -> None:
    from novaforge import dynamo

    compiled = novaforge.compile(fn, backend="cpu", capture=mode)
    built = dynamo.PROGRAMS_BUILT[0]
    with caplog.at_level("WARNING", logger="novaforge"):
        for x in (torch.randn(3, 4), -torch.rand(3, 4), torch.rand(3, 4) + 0.5, torch.randn(5, 2)):
            torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)  # both branches, a new shape
    warned = [r.getMessage() for r in caplog.records if "cannot be captured as one graph" in r.getMessage()]
    assert len(warned) == 1 and _where(fn, line) in warned[0] and "torch.compile" in warned[0], warned
    assert compiled.compilations == 1 and compiled._via_dynamo is not None
    if line:  # the graph before the branch (x.sum() > 0, x.abs().sum()) is a novaforge program
        assert dynamo.PROGRAMS_BUILT[0] > built


def test_data_dependent_branch_trains_through_dynamo() -> None:
    """A module whose forward branches on tensor values: `loss.backward()` through
    `novaforge.compile` fills the same gradients as eager on both branches."""

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            if h.sum() > 0:
                return (h.relu() * 2).sum()
            return (h.tanh() - 1).sum()

    torch.manual_seed(0)
    eager = Branchy()
    model = Branchy()
    model.load_state_dict(eager.state_dict())
    compiled = novaforge.compile(model, backend="cpu")
    for x in (torch.randn(3, 4) + 3, torch.randn(3, 4) - 3, torch.randn(6, 4) + 3):
        for m in (eager, model):
            m.zero_grad()
        want = eager(x)
        want.backward()
        got = compiled(x)
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad, rtol=1e-5, atol=1e-5)
    assert compiled._via_dynamo is not None


def test_a_user_error_on_the_first_training_call_raises_and_does_not_stick() -> None:
    """A training call that fails to trace because eager fails too raises (as eager does), and
    the module is not left going through Dynamo: the next good call compiles as usual."""
    model = torch.nn.Linear(4, 3)
    compiled = novaforge.compile(model, backend="cpu")
    with pytest.raises(RuntimeError):
        compiled(torch.randn(2, 5))  # wrong feature size: eager raises
    assert compiled._via_dynamo is None
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert compiled._via_dynamo is None


def f_topk(x): return torch.topk(x, 2, dim=-1).values * 2 + x[..., :2]  # noqa: E704


@pytest.mark.parametrize("mode", MODES)
def test_op_without_rule_is_a_counted_extern_with_correct_result(mode: str) -> None:
    x = torch.randn(3, 5)
    compiled = novaforge.compile(f_topk, backend="interpret", capture=mode)
    torch.testing.assert_close(compiled(x), f_topk(x), rtol=0, atol=0)
    externs = compiled.stats().captured.externs
    assert [t for t, _ in externs] == ["aten.topk.default"], externs
    nodes = [n for n in compiled.stats().captured.graph.nodes if n.op == "extern"]
    assert len(nodes) == 1 and nodes[0].attrs["target"] == "aten.topk.default"


def test_extern_keeps_its_source_line() -> None:
    compiled = novaforge.compile(f_topk, backend="interpret")
    compiled(torch.randn(3, 5))
    (node,) = [n for n in compiled.stats().captured.graph.nodes if n.op == "extern"]
    assert _where(f_topk) in node.meta["source"], node.meta


def _inner_topk(x): return torch.topk(x, 2).values  # noqa: E704
def f_outer(x): return _inner_topk(x * 2) + 1  # noqa: E704


def test_a_function_node_names_its_innermost_user_line() -> None:
    """Plain functions are captured without whole stack traces: a node records the innermost
    frame outside torch and novaforge, here the helper the function calls."""
    compiled = novaforge.compile(f_outer, backend="interpret")
    compiled(torch.randn(3, 5))
    (node,) = [n for n in compiled.stats().captured.graph.nodes if n.op == "extern"]
    assert _where(_inner_topk) in node.meta["source"], node.meta


def f_mix(x, y): return torch.softmax(x @ y, -1) * 2 + 1  # noqa: E704


@pytest.mark.parametrize("mode", MODES)
def test_new_shape_recompiles_and_is_correct(mode: str) -> None:
    compiled = novaforge.compile(f_mix, backend="interpret", capture=mode)
    shapes = [((3, 4), (4, 5)), ((7, 4), (4, 2)), ((3, 4), (4, 5)), ((1, 9), (9, 1)), ((0, 4), (4, 5))]
    expect_compilations = [1, 2, 2, 3, 4]
    for (sa, sb), n in zip(shapes, expect_compilations, strict=True):
        x, y = torch.randn(sa), torch.randn(sb)
        torch.testing.assert_close(compiled(x, y), f_mix(x, y), rtol=1e-5, atol=1e-5)
        assert compiled.compilations == n, (sa, sb, compiled.compilations)


@pytest.mark.parametrize("mode", MODES)
def test_new_dtype_recompiles_and_is_correct(mode: str) -> None:
    compiled = novaforge.compile(f_mix, backend="interpret", capture=mode)
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(compiled(x, y), f_mix(x, y), rtol=1e-5, atol=1e-5)
    xb, yb = x.bfloat16(), y.bfloat16()
    out = compiled(xb, yb)
    assert compiled.compilations == 2 and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, f_mix(xb, yb), rtol=2e-2, atol=2e-2)
    xd, yd = x.double(), y.double()
    torch.testing.assert_close(compiled(xd, yd), f_mix(xd, yd), rtol=1e-12, atol=1e-12)
    assert compiled.compilations == 3
    compiled(x, y)
    assert compiled.compilations == 3


def test_non_contiguous_input_is_a_new_signature_with_correct_result() -> None:
    compiled = novaforge.compile(f_mix, backend="interpret")
    x, y = torch.randn(4, 3).t(), torch.randn(4, 5)
    torch.testing.assert_close(compiled(x, y), f_mix(x, y), rtol=1e-5, atol=1e-5)
    xc = x.contiguous()
    torch.testing.assert_close(compiled(xc, y), f_mix(xc, y), rtol=1e-5, atol=1e-5)
    assert compiled.compilations == 2


def test_unsupported_mutation_of_a_view_is_an_error_or_correct() -> None:
    def f(x):
        y = x.clone()
        v = y[:, :2]
        v.mul_(3)
        return y + 1

    x = torch.randn(3, 4)
    for mode in MODES:
        compiled = novaforge.compile(f, backend="interpret", capture=mode)
        try:
            out = compiled(x)
        except (novaforge.UnsupportedError, novaforge.CaptureError):
            continue
        torch.testing.assert_close(out, f(x), rtol=0, atol=0)


def test_data_dependent_shapes_are_a_clear_refusal() -> None:
    # a boolean mask: an UnsupportedError naming the op; a size read from data: a CaptureError
    # that is also an UnsupportedError (a clear refusal, not a crash of the tracer)
    compiled = novaforge.compile(lambda x: x[x > 0].sum() * 2, backend="interpret", fallback="raise")
    with pytest.raises(novaforge.UnsupportedError, match="aten.index.Tensor"):
        compiled(torch.randn(8))
    with pytest.raises(novaforge.UnsupportedError) as info:
        novaforge.compile(f_item_size, backend="interpret", fallback="raise")(torch.randn(3, 4))
    assert isinstance(info.value, novaforge.CaptureError)


class _Running(torch.nn.Module):
    """Keeps a state between calls in a plain tensor attribute (as RecurrentGemma's recurrent
    and convolution states)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.state = torch.zeros(4)

    def forward(self, x):
        h = self.lin(x) + self.state
        self.state = h.detach().mean(0)
        return h.tanh()


def test_state_in_tensor_attributes_is_carried_between_calls(caplog) -> None:
    """A forward that assigns a tensor to a module attribute would lose that assignment in a
    compiled program (the next call reading the state of the first): novaforge.compile goes
    through Dynamo for it, whose calls carry the state as eager's do; with fallback="raise" it
    refuses, naming the attribute, and leaves the module's attribute as it was."""
    torch.manual_seed(0)
    eager = _Running()
    model = _Running()
    model.load_state_dict(eager.state_dict())
    refused = novaforge.compile(model, backend="cpu", fallback="raise")
    before = model.state
    with pytest.raises(novaforge.CaptureError, match="state"), torch.no_grad():
        refused(torch.randn(3, 4))
    assert model.state is before  # the traced value assigned during the capture was taken back
    compiled = novaforge.compile(model, backend="cpu")
    with caplog.at_level("WARNING", logger="novaforge"):
        for _ in range(4):
            x = torch.randn(3, 4)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.state, eager.state, rtol=1e-5, atol=1e-5)
    assert any("assigns tensors to module attributes (state)" in r.getMessage() for r in caplog.records)

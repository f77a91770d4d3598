"""Custom ops pass through as `extern` nodes and never break the graph (issue 48, item 1, CPU).

Three kinds of op, each through `novaforge.compile(model)` and `torch.compile(model,
backend="novaforge")`, compared with eager:

* a `torch.library.custom_op` (fake implementation and `register_autograd`);
* an op defined as a C++ extension's `TORCH_LIBRARY` defines it, through the same dispatcher
  path: `torch.library.Library(..., "DEF")`, a CPU kernel, `register_fake`, `register_autograd`;
* a custom op that mutates its input (`mutates_args`): the caller's tensor is mutated exactly as
  eager mutates it, and the output is eager's.

Each compiles as one graph: no Dynamo graph break (`counters["graph_break"]`), no novaforge
fallback (`novaforge.dynamo.FALLBACKS`), the op is the program's only call through torch and
the pointwise ops before and after it are generated kernels. Training: the op's registered
autograd formula gives eager's gradients. An op without a fake implementation raises an error
that names it and says to register one with `torch.library.register_fake`.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import novaforge
import novaforge.dynamo as nf_dynamo


@torch.library.custom_op("nftest_co::scale", mutates_args=())
def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + 1


@scale.register_fake
def _scale_fake(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.empty_like(x)


def _scale_setup(ctx, inputs, output) -> None:
    ctx.s = inputs[1]


scale.register_autograd(lambda ctx, g: (g * ctx.s, None), setup_context=_scale_setup)

# as a C++ extension's TORCH_LIBRARY(nftest_lib, m) { m.def(...); } and its CPU kernel define it
_LIB = torch.library.Library("nftest_lib", "DEF")
_LIB.define("cube(Tensor x) -> Tensor")
_LIB.impl("cube", lambda x: x * x * x, "CPU")
torch.library.register_fake("nftest_lib::cube", lambda x: torch.empty_like(x))
torch.library.register_autograd("nftest_lib::cube", lambda ctx, g: g * 3 * ctx.x * ctx.x,
                                setup_context=lambda ctx, inputs, output: setattr(ctx, "x", inputs[0]))


@torch.library.custom_op("nftest_mut::add_into_", mutates_args=("x",))
def add_into_(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    return y * 2


@add_into_.register_fake
def _add_into_fake(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(y)


_NOFAKE_LIB = torch.library.Library("nftest_nofake", "DEF")
_NOFAKE_LIB.define("foo(Tensor x) -> Tensor")
_NOFAKE_LIB.impl("foo", lambda x: x * 3, "CPU")


@torch.library.custom_op("nftest_nofake2::bar", mutates_args=())
def bar(x: torch.Tensor) -> torch.Tensor:
    return x * 3


class CustomOpModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(scale(torch.sigmoid(self.lin(x)) * 2 - 1, 3.0)) * 0.5 + 1


class LibraryOpModel(CustomOpModel):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.ops.nftest_lib.cube(torch.sigmoid(self.lin(x)) * 2 - 1)) * 0.5 + 1


class MutatingOpModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        before = x * 2
        w = add_into_(x, y.exp())
        return before + x.sin() + w


class NoFakeModel(torch.nn.Module):
    def __init__(self, op) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x.sin()).cos()


MODELS = {"custom_op": (CustomOpModel, "nftest_co.scale.default"),
          "library": (LibraryOpModel, "nftest_lib.cube.default")}
ENTRIES = ("novaforge", "torch.compile")


def _compile(model: torch.nn.Module, entry: str):
    torch._dynamo.reset()
    counters.clear()
    nf_dynamo.FALLBACKS.clear()
    if entry == "novaforge":
        return novaforge.compile(model)
    return torch.compile(model, backend="novaforge")


def _assert_one_graph(compiled, entry: str, built_before: int) -> None:
    assert getattr(compiled, "_via_dynamo", None) is None  # novaforge.compile captured one graph
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not nf_dynamo.FALLBACKS, nf_dynamo.FALLBACKS
    if entry == "torch.compile":
        assert nf_dynamo.PROGRAMS_BUILT[0] > built_before  # novaforge compiled it, not eager


def _assert_extern_fused_around(compiled, target: str) -> None:
    stats = compiled.stats()
    assert [t for t, _ in stats.captured.externs] == [target], stats.captured.externs
    info = stats.program.info
    assert info["torch"] == 1, info  # the custom op only: the pointwise ops are generated kernels
    assert info["generated"] >= 2, info  # one kernel before the op, one after


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_custom_op_inference_is_one_graph_equal_to_eager(kind: str, entry: str) -> None:
    torch.manual_seed(0)
    cls, target = MODELS[kind]
    model = cls().eval()
    x = torch.randn(8, 16)
    built = nf_dynamo.PROGRAMS_BUILT[0]
    compiled = _compile(model, entry)
    with torch.no_grad():
        for _ in range(2):  # the second call runs the compiled program
            torch.testing.assert_close(compiled(x), model(x))
    _assert_one_graph(compiled, entry, built)
    if entry == "novaforge":
        _assert_extern_fused_around(compiled, target)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_custom_op_training_gradients_equal_eager(kind: str, entry: str) -> None:
    torch.manual_seed(0)
    cls, _ = MODELS[kind]
    model = cls()
    ref = cls()
    ref.load_state_dict(model.state_dict())
    built = nf_dynamo.PROGRAMS_BUILT[0]
    compiled = _compile(model, entry)
    for step in range(2):
        x = torch.randn(8, 16, requires_grad=True)
        xr = x.detach().clone().requires_grad_(True)
        out, want = compiled(x), ref(xr)
        torch.testing.assert_close(out, want)
        (out * out).sum().backward()
        (want * want).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=f"step {step}: {name}")
    _assert_one_graph(compiled, entry, built)


@pytest.mark.parametrize("entry", ENTRIES)
def test_mutating_custom_op_mutates_the_callers_tensor_as_eager(entry: str) -> None:
    model = MutatingOpModel()
    built = nf_dynamo.PROGRAMS_BUILT[0]
    compiled = _compile(model, entry)
    for _ in range(2):
        x, y = torch.randn(6, 5), torch.randn(6, 5)
        xe = x.clone()
        want = model(xe, y)
        out = compiled(x, y)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(x, xe)  # written back as eager writes it
    _assert_one_graph(compiled, entry, built)
    if entry == "novaforge":
        stats = compiled.stats()
        assert [t for t, _ in stats.captured.externs] == ["auto_functionalized_v2(nftest_mut.add_into_.default)"]
        assert stats.program.info["torch"] == 1, stats.program.info


@pytest.mark.parametrize(("op", "name"), [(torch.ops.nftest_nofake.foo, "nftest_nofake::foo"),
                                          (bar, "nftest_nofake2::bar")])
def test_op_without_fake_implementation_names_it_and_what_to_register(op, name: str) -> None:
    model = NoFakeModel(op)
    compiled = _compile(model, "novaforge")
    x = torch.randn(4, 5)
    torch.testing.assert_close(model(x), torch.cos(torch.sin(x) * 3))  # eager runs it
    with pytest.raises(novaforge.UnsupportedError) as info:
        compiled(x)
    msg = str(info.value)
    assert name in msg and "torch.library.register_fake" in msg, msg
    assert not nf_dynamo.FALLBACKS and not counters["graph_break"]  # refused, not split through Dynamo

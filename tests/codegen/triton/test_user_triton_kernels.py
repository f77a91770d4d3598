"""User Triton kernels inside novaforge programs (issue 48, item 2), in Triton's interpreter.

Two kinds of user kernel, each compared with eager:

* a `torch.library.triton_op` whose function launches a `@triton.jit` kernel through
  `wrap_triton` with a grid `lambda meta: ...` (and `register_autograd` for training), through
  `novaforge.compile` and `torch.compile(backend="novaforge")`;
* a bare `@triton.jit` kernel launched in `forward` (`kernel[grid](...)`), which Dynamo captures
  as `triton_kernel_wrapper_mutation` / `_functional`.

Both kinds also in a form that writes an intermediate and the caller's input in place
(`mutates_args`), mutated as eager mutates them.

On the Triton backend the program launches the user's kernel itself (a `user` step: its grid,
arguments and meta-parameters as written, its outputs arena views, the generated kernels before
and after it fused as usual), also inside a CUDA graph (the graph runner with a stand-in for
torch.cuda). On the CPU backend a `triton_op` with a CPU kernel (`register_kernel("cpu")`) runs
that kernel, as eager does; one without runs its Triton kernel in the interpreter. A launch
novaforge cannot reproduce exactly (here: a strided view argument) raises UnsupportedError
naming the kernel.

How this runs on a machine without a GPU: `@triton.jit` under TRITON_INTERPRET=1 returns an
`InterpretedFunction`, which neither Dynamo nor `wrap_triton` trace (torch recognises only
`JITFunction`), and Dynamo recognises kernels only where `torch.utils._triton.has_triton()`.
So the kernels here are `JITFunction`s whose eager launches on CPU tensors run in the
interpreter (`InterpretableJIT`), and the Dynamo tests patch `has_triton` to say what it says on
a GPU machine. novaforge launches a `JITFunction` on CPU tensors in the interpreter itself.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from nf_triton_testing import compiled
from torch._dynamo.utils import counters
from torch.library import triton_op, wrap_triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import novaforge
import novaforge.codegen.triton.user_launch as user_launch
import novaforge.dynamo as nf_dynamo
from novaforge.codegen.triton.program import _CudaGraphRunner


class InterpretableJIT(JITFunction):
    """A `@triton.jit` kernel as on a GPU machine (a JITFunction, what Dynamo and `wrap_triton`
    trace) whose eager launches run in Triton's interpreter (the eager reference)."""

    def run(self, *args, grid, warmup, **kwargs):
        return InterpretedFunction(self.fn)[grid](*args, **kwargs)


@InterpretableJIT
def add_scaled_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


@InterpretableJIT
def affine_inplace_kernel(x_ptr, n, scale, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale + shift, mask=mask)


def _launch_add_scaled(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, alpha: float) -> None:
    n = out.numel()
    wrap_triton(add_scaled_kernel)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n, alpha, BLOCK=32)


@triton_op("nftest_uk::add_scaled", mutates_args=())
def add_scaled(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _launch_add_scaled(x, y, out, alpha)
    return out


def _add_scaled_setup(ctx, inputs, output) -> None:
    ctx.alpha = inputs[2]


# d/dx = 1, d/dy = alpha; the y gradient through the op itself (g + (alpha - 1) g)
add_scaled.register_autograd(lambda ctx, g: (g, add_scaled(g, g, ctx.alpha - 1.0), None),
                             setup_context=_add_scaled_setup)


@triton_op("nftest_uk::add_scaled_cpu", mutates_args=())
def add_scaled_cpu(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _launch_add_scaled(x, y, out, alpha)
    return out


CPU_KERNEL_CALLS = [0]


@add_scaled_cpu.register_kernel("cpu")
def _add_scaled_on_cpu(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    CPU_KERNEL_CALLS[0] += 1
    return x + alpha * y


@triton_op("nftest_uk::add_transposed", mutates_args=())
def add_transposed(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _launch_add_scaled(x.t(), x, out, 1.0)  # (a strided view: the kernel reads it by eager's strides)
    return out


@triton_op("nftest_uk::add_rows_below", mutates_args=())
def add_rows_below(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x[1:])
    _launch_add_scaled(x[1:], x[1:], out, 1.0)  # (a view into x: the kernel could address x around it)
    return out


@triton_op("nftest_uk::affine_", mutates_args=("x",))
def affine_(x: torch.Tensor, scale: float) -> None:
    n = x.numel()
    wrap_triton(affine_inplace_kernel)[(triton.cdiv(n, 32),)](x, n, scale, 1.0, BLOCK=32)


class OpModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.lin(x))
        return torch.tanh(add_scaled(h, h * h, 0.5)) * 2


class BareKernelModel(OpModel):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.lin(x))
        out = torch.empty_like(h)
        n = h.numel()
        add_scaled_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](h, h * h, out, n, 0.5, BLOCK=32)
        return torch.tanh(out) * 2


class InPlaceOpModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.sin()
        affine_(h, 3.0)  # an intermediate
        affine_(x, 2.0)  # the caller's tensor
        return h.cos() * x


class InPlaceKernelModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.sin() * 2  # an intermediate the kernel writes in place
        affine_inplace_kernel[(triton.cdiv(h.numel(), 32),)](h, h.numel(), 3.0, 1.0, BLOCK=32)
        affine_inplace_kernel[(triton.cdiv(x.numel(), 64),)](x, x.numel(), -1.0, 0.5, BLOCK=64)  # the caller's
        return h.cos() + x


ENTRIES = ("novaforge", "torch.compile")


@pytest.fixture
def launches(monkeypatch):
    """Counts the user kernel launches the Triton program performs itself (its `user` steps)."""
    count = [0]
    run = user_launch.run_user_triton

    def counted(*args, **kwargs):
        count[0] += 1
        return run(*args, **kwargs)

    monkeypatch.setattr(user_launch, "run_user_triton", counted)
    return count


@pytest.fixture
def dynamo_sees_triton(monkeypatch):
    """Dynamo traces `kernel[grid](...)` as a kernel only where torch finds a Triton device."""
    import torch.utils._triton

    monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)


def _compile(model: torch.nn.Module, entry: str, backend: str = "triton"):
    torch._dynamo.reset()
    counters.clear()
    nf_dynamo.FALLBACKS.clear()
    if entry == "novaforge":
        return compiled(model) if backend == "triton" else novaforge.compile(model, backend=backend)
    return torch.compile(model, backend="novaforge", options={"backend": backend})


def _assert_one_graph(built_before: int, entry: str) -> None:
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not nf_dynamo.FALLBACKS, nf_dynamo.FALLBACKS
    if entry == "torch.compile":
        assert nf_dynamo.PROGRAMS_BUILT[0] > built_before  # novaforge compiled it, not eager


def _assert_user_step_between_generated_kernels(c) -> None:
    prog = c.stats().program
    kinds = [st.kind for st in prog.steps]
    assert kinds.count("user") == 1 and "torch" not in kinds, prog.describe()
    (user,) = [st for st in prog.steps if st.kind == "user"]
    assert user.title == "add_scaled_kernel" and prog.info()["user_kernels"] == [{"title": user.title,
                                                                                   "grid": [4, 1, 1]}]
    assert any(o in prog.arena_slots for o in user.outs), prog.describe()  # its output is an arena view
    i = kinds.index("user")
    assert "triton" in kinds[:i] and "triton" in kinds[i + 1:], prog.describe()  # generated around it


@pytest.mark.parametrize("entry", ENTRIES)
def test_triton_op_launches_inside_the_triton_program(entry: str, launches) -> None:
    torch.manual_seed(0)
    model = OpModel().eval()
    built = nf_dynamo.PROGRAMS_BUILT[0]
    c = _compile(model, entry)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, 16)
            torch.testing.assert_close(c(x), model(x), atol=1e-5, rtol=1e-5)
    assert launches[0] == 2  # each call: the program's own launch, not a torch step
    _assert_one_graph(built, entry)
    if entry == "novaforge":
        _assert_user_step_between_generated_kernels(c)


@pytest.mark.parametrize("entry", ENTRIES)
def test_triton_op_training_gradients_equal_eager(entry: str, launches) -> None:
    torch.manual_seed(0)
    model, ref = OpModel(), OpModel()
    ref.load_state_dict(model.state_dict())
    built = nf_dynamo.PROGRAMS_BUILT[0]
    c = _compile(model, entry)
    for step in range(2):
        x = torch.randn(8, 16, requires_grad=True)
        xr = x.detach().clone().requires_grad_(True)
        out, want = c(x), ref(xr)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        (out * out).sum().backward()
        (want * want).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-5)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=f"step {step}: {name}")
    assert launches[0] >= 4  # forward and backward (the y gradient is the op again), both calls
    _assert_one_graph(built, entry)


@pytest.mark.parametrize("entry", ENTRIES)
def test_dynamo_captured_jit_kernel_with_grid_lambda(entry: str, launches, dynamo_sees_triton) -> None:
    torch.manual_seed(0)
    model = BareKernelModel().eval()
    built = nf_dynamo.PROGRAMS_BUILT[0]
    c = _compile(model, entry)  # (novaforge.compile cannot trace a bare launch: it compiles through Dynamo)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, 16)
            torch.testing.assert_close(c(x), model(x), atol=1e-5, rtol=1e-5)
    assert launches[0] == 2
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not nf_dynamo.FALLBACKS, nf_dynamo.FALLBACKS
    assert nf_dynamo.PROGRAMS_BUILT[0] > built


def test_dynamo_captured_kernel_writing_in_place_mutates_as_eager(launches, dynamo_sees_triton) -> None:
    model = InPlaceKernelModel()
    built = nf_dynamo.PROGRAMS_BUILT[0]
    c = _compile(model, "torch.compile")
    for _ in range(2):
        x = torch.randn(6, 20)
        xe = x.clone()
        want = model(xe)
        torch.testing.assert_close(c(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x, xe, atol=1e-6, rtol=1e-6)  # the caller's tensor, written as eager writes it
    assert launches[0] == 4
    _assert_one_graph(built, "torch.compile")


@pytest.mark.parametrize("entry", ENTRIES)
def test_triton_op_writing_in_place_mutates_as_eager(entry: str, launches) -> None:
    model = InPlaceOpModel()
    built = nf_dynamo.PROGRAMS_BUILT[0]
    c = _compile(model, entry)
    for _ in range(2):
        x = torch.randn(5, 7)
        xe = x.clone()
        want = model(xe)
        torch.testing.assert_close(c(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x, xe, atol=1e-6, rtol=1e-6)
    assert launches[0] == 4  # both launches, both calls, by the program
    _assert_one_graph(built, entry)


def test_user_launch_is_captured_and_replayed_by_the_cuda_graph_runner(launches) -> None:
    from test_runtime_paths import FakeCuda

    torch.manual_seed(0)
    model = OpModel().eval()
    c = compiled(model, freeze=True)
    with torch.no_grad():
        c(torch.randn(8, 16))
        prog = c.stats().program
        runner = _CudaGraphRunner(prog, cuda=FakeCuda())
        launches[0] = 0
        xs = [torch.randn(8, 16) for _ in range(4)]
        outs = [runner.run([xi])[0].clone() for xi in xs]
        assert (runner.captures, runner.replays) == (1, 3)
        # warm-up, side-stream warm-up, capture, and the two replays that re-run the graph
        assert launches[0] == 5
        for o, xi in zip(outs, xs, strict=True):
            torch.testing.assert_close(o, model(xi), atol=1e-5, rtol=1e-5)


def test_cpu_backend_runs_the_ops_cpu_kernel_or_the_triton_kernel() -> None:
    torch.manual_seed(0)

    class CpuModel(OpModel):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.sigmoid(self.lin(x))
            return torch.tanh(add_scaled_cpu(h, h * h, 0.5) + add_scaled(h, h, -1.5))

    model = CpuModel().eval()
    c = _compile(model, "novaforge", backend="cpu")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(8, 16)
            before = CPU_KERNEL_CALLS[0]
            want = model(x)
            assert CPU_KERNEL_CALLS[0] == before + 1  # eager runs the CPU kernel
            torch.testing.assert_close(c(x), want, atol=1e-5, rtol=1e-5)
            assert CPU_KERNEL_CALLS[0] == before + 2  # and so does the compiled program
    externs = sorted(t for t, _ in c.stats().captured.externs)
    assert externs[0] == "nftest_uk.add_scaled_cpu.default", externs  # the op, called as such
    assert externs[1].startswith(f"user_triton({__name__}.add_scaled_kernel:"), externs


@pytest.mark.parametrize(("op", "why"), [(add_transposed, "strided view"), (add_rows_below, "view into a larger")])
def test_launch_that_cannot_be_reproduced_names_the_kernel(op, why: str) -> None:
    class Model(torch.nn.Module):
        def forward(self, x):
            return op(x.exp())

    c = _compile(Model(), "novaforge")
    with pytest.raises(novaforge.UnsupportedError) as info:
        c(torch.randn(4, 4))
    msg = str(info.value)
    assert "add_scaled_kernel" in msg and why in msg, msg


def test_dynamo_graph_with_such_a_launch_runs_eagerly_and_says_why(dynamo_sees_triton) -> None:
    class StridedBare(torch.nn.Module):
        def forward(self, x):
            h = x.exp()
            out = torch.empty_like(h)
            add_scaled_kernel[(1,)](h.t(), h, out, h.numel(), 1.0, BLOCK=32)  # (reads h.t() by its pointer)
            return out.sin()

    model = StridedBare()
    c = _compile(model, "torch.compile")
    x = torch.randn(4, 4)
    torch.testing.assert_close(c(x), model(x))  # eager's answer, never a rewritten launch's
    (fallback,) = nf_dynamo.FALLBACKS
    assert "add_scaled_kernel" in str(fallback) and "strided" in str(fallback), fallback

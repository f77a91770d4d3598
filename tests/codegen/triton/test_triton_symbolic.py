"""Programs for a range of sizes on the Triton backend (issue 16), in Triton's interpreter:
every kernel kind rendered and compiled once with symbolic sizes (size arguments, masks,
run-time loop bounds) and run at several sizes against eager, through both entry points.
"""

from __future__ import annotations

import re

import pytest
import sympy
import torch

import novaforge
from nf_symbolic_cases import CASES, _rand, run_case
from novaforge import dynamo as nf_dynamo
from novaforge.codegen.triton.sized import SizedTritonProgram
from novaforge.ir.symbolic import py_expr, symbol, tl_expr


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_one_program_serves_every_size(name):
    c = run_case(name, "triton")
    prog = c.stats().program
    assert isinstance(prog, SizedTritonProgram)
    info = prog.info()
    assert info["kernels"] and not info["fallbacks"], info["fallbacks"]
    for k in prog.kernels:  # every generated kernel takes the sizes it names as arguments
        sig = re.search(r"def nf_\w+\((.*)\):", k.source).group(1)
        assert [a.strip() for a in sig.split(",") if re.fullmatch(r"\s*s\d+\s*", a)] == list(k.symbols)


@pytest.mark.parametrize("kind", ["matmul", "attention"])
def test_a_batch_the_grid_axis_may_not_hold_runs_on_one_flat_axis(kind):
    """A symbolic batch up to 10^6 may exceed the grid's second axis (65535): the kernel walks
    (batch, tile) on one axis instead."""
    if kind == "matmul":
        fn = lambda a, b: (a @ b).relu()  # noqa: E731
        make = lambda n: (_rand(n, 5, 8), _rand(n, 8, 6))  # noqa: E731
    else:
        fn = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        make = lambda n: tuple(_rand(n, 2, 9, 16) for _ in range(3))  # noqa: E731
    spec = {i: {0: (2, 1_000_000)} for i in range(len(make(2)))}
    c = novaforge.compile(fn, backend="triton", dynamic=spec, tiered=False)
    with torch.no_grad():
        for n in (2, 7):
            args = make(n)
            torch.testing.assert_close(c(*args), fn(*args), atol=1e-5, rtol=1e-5)
    assert c.compilations == 1
    (k,) = [k for k in c.stats().program.kernels if k.kind == kind]
    assert len(k.grid) == 1 or k.grid[1] == 1, k.grid


def test_rows_longer_than_any_block_loop_over_columns():
    """An unbounded symbolic row is reduced in a loop to a run-time bound (a single pass would
    read only the first block of a long row)."""
    fn = lambda x: torch.softmax(x, -1)  # noqa: E731
    c = novaforge.compile(fn, backend="triton", dynamic={0: {1: (2, 1 << 20)}}, tiered=False)
    with torch.no_grad():
        for n in (5, 3000):
            x = _rand(2, n)
            torch.testing.assert_close(c(x), fn(x), atol=1e-6, rtol=1e-5)
    (k,) = c.stats().program.kernels
    assert k.schedule.looped and "for c0 in range(0, s0," in k.source.replace("(1*s0)", "s0")


def test_torch_compile_dynamic_builds_one_triton_program():
    def fn(x, w):
        return torch.nn.functional.layer_norm(x @ w, (w.shape[1],)).relu()

    torch._dynamo.reset()
    before = nf_dynamo.SHARED_PROGRAMS[0]
    w = torch.randn(16, 24)
    c = torch.compile(fn, backend="novaforge", dynamic=True, options={"backend": "triton", "tiered": False})
    with torch.no_grad():
        for n in (3, 17, 40, 3):
            x = _rand(n, 16)
            torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
    assert nf_dynamo.SHARED_PROGRAMS[0] - before == 1


@pytest.mark.parametrize("text", ["-floor(-s0/16)", "floor((s0 - 40)/7)", "Mod(3 - s0, 5)", "ceiling(s0/3)*s1",
                                  "Max(s0, 2*s1) + Min(s0, 4)"])
def test_triton_size_expressions_match_python_floor_semantics(text):
    """Triton's `//` and `%` truncate like C's: the printed form is exact for every size."""
    expr = sympy.sympify(text, locals={"s0": symbol(0), "s1": symbol(1)})

    def c_div(a, b):  # C's truncating division and remainder, as Triton computes them
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return q

    def c_mod(a, b):
        return a - c_div(a, b) * b

    code = tl_expr(expr)
    code = re.sub(r"tl\.(maximum|minimum)", lambda m: "max" if m.group(1) == "maximum" else "min", code)
    # (operators of the same precedence, rebound to C's semantics below)
    code = code.replace("//", "@").replace("%", "/")

    class C(int):
        def __matmul__(self, o): return C(c_div(int(self), int(o)))  # noqa: E704
        def __truediv__(self, o): return C(c_mod(int(self), int(o)))  # noqa: E704
        def __add__(self, o): return C(int(self) + int(o))  # noqa: E704
        def __radd__(self, o): return C(int(o) + int(self))  # noqa: E704
        def __sub__(self, o): return C(int(self) - int(o))  # noqa: E704
        def __rsub__(self, o): return C(int(o) - int(self))  # noqa: E704
        def __mul__(self, o): return C(int(self) * int(o))  # noqa: E704
        def __rmul__(self, o): return C(int(o) * int(self))  # noqa: E704
        def __neg__(self): return C(-int(self))  # noqa: E704

    code = re.sub(r"\b(\d+)\b", r"C(\1)", code)
    for s0 in (1, 2, 5, 16, 17, 39, 40, 41, 100):
        for s1 in (1, 3, 8):
            want = eval(py_expr(expr), {"max": max, "min": min}, {"s0": s0, "s1": s1})  # noqa: S307
            got = eval(code, {"C": C, "max": max, "min": min}, {"s0": C(s0), "s1": C(s1)})  # noqa: S307
            assert int(got) == want, (text, s0, s1, code)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_models_one_triton_program_for_every_length(name):
    from novaforge.bench.workloads import build_inference_model, input_ids

    model, vocab = build_inference_model(f"{name}-tiny")
    c = novaforge.compile(model, backend="triton", dynamic={"input_ids": {1: (2, 128)}}, tiered=False)
    with torch.no_grad():
        for seq in (7, 16, 23):
            ids = input_ids(vocab, 2, seq)
            torch.testing.assert_close(c(ids).last_hidden_state, model(ids).last_hidden_state, atol=2e-5, rtol=1e-4)
    assert c.compilations == 1 and c.dynamic.traces == 1
    prog = c.stats().program
    assert isinstance(prog, SizedTritonProgram)
    # (GPT-2's position lookup takes an arange of the length: the index is computed in the kernel)
    assert not prog.info()["fallbacks"], prog.info()["fallbacks"]


def test_torch_compile_dynamic_llama_one_triton_program():
    from novaforge.bench.workloads import build_inference_model, input_ids

    torch._dynamo.reset()
    model, vocab = build_inference_model("llama-tiny")
    c = torch.compile(model, backend="novaforge", dynamic=True,
                      options={"backend": "triton", "fallback": "raise", "tiered": False})
    built, shared = nf_dynamo.PROGRAMS_BUILT[0], nf_dynamo.SHARED_PROGRAMS[0]
    with torch.no_grad():
        for seq in (7, 16, 23):
            ids = input_ids(vocab, 2, seq)
            torch.testing.assert_close(c(ids).last_hidden_state, model(ids).last_hidden_state, atol=2e-5, rtol=1e-4)
    assert nf_dynamo.PROGRAMS_BUILT[0] - built == 1 and nf_dynamo.SHARED_PROGRAMS[0] - shared == 1

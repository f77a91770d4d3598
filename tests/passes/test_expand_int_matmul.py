"""expand_int_matmul: off the CPU, `matmul(x_i8, w_i8, out_dtype=int32)` (aten._int_mm) becomes exact float32
products over chunks of K added in int32, equal bit for bit to the int8 product (against the IR interpreter,
and ATen); the CPU backend and the interpreter keep the int8 node (nf_gemm_s8s8 runs it)."""

from __future__ import annotations

import pytest
import torch

from nf_testing import captured_graph, check_pass
from novaforge.ir.ops.matmul import INT_MM_EXACT_K
from novaforge.passes.context import PassContext
from novaforge.passes.expand_int_matmul import expand_int_matmul


class _Backend:
    def __init__(self, name: str) -> None:
        self.name = name


def _int8(*shape, seed=0, fill=None):
    if fill is not None:
        return torch.full(shape, fill, dtype=torch.int8)
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def _fn(a, b, s):
    return torch._int_mm(a, b.t()).to(torch.float32) * s


@pytest.mark.parametrize("K,fill", [(40, None), (INT_MM_EXACT_K + 16, None), (2 * INT_MM_EXACT_K + 8, -128)])
def test_expanded_off_the_cpu_and_exact(K, fill):
    a, b, s = _int8(17, K, seed=1, fill=fill), _int8(24, K, seed=2, fill=fill), torch.rand(24)
    ctx = PassContext(backend=_Backend("triton"))
    out = check_pass(expand_int_matmul, captured_graph(_fn, a, b, s), [a, b, s], ctx, atol=0, rtol=0)
    mms = [n for n in out.nodes if n.op == "matmul"]
    assert len(mms) == -(-K // INT_MM_EXACT_K)
    assert all(n.inputs[0].type.dtype == torch.float32 and n.attrs.get("out_dtype") is None for n in mms)
    assert ctx.counters["int_matmuls_expanded"] == 1


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_kept_on_the_cpu(backend):
    a, b, s = _int8(5, 40), _int8(24, 40, seed=3), torch.rand(24)
    ctx = PassContext(backend=_Backend(backend))
    out = check_pass(expand_int_matmul, captured_graph(_fn, a, b, s), [a, b, s], ctx, atol=0, rtol=0)
    mms = [n for n in out.nodes if n.op == "matmul"]
    assert len(mms) == 1 and mms[0].attrs["out_dtype"] == torch.int32 and mms[0].inputs[0].type.dtype == torch.int8
    assert ctx.counters.get("int_matmuls_expanded", 0) == 0

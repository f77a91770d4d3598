"""bf16 models through novaforge.compile reach nf_gemm's native bf16 path (AMX or AVX512-BF16 where
the CPU has them) by every route: model.to(torch.bfloat16) and torch.autocast('cpu', bfloat16),
weights read in place (nn.Linear W [N, K]: nf_gemm_nt_mixed; a row-major [K, N] weight: nf_gemm_mixed)
or packed at compile time (VNNI panels: nf_gemm_bf16_vnni_packed), inference and training.

The oracle is eager PyTorch on the same bf16 module; tolerances are bf16's (outputs are rounded
to bf16 where the graph asks). Each test also checks which nf_gemm path ran (its call counts).
"""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.codegen.cpu import gemm

NATIVE = gemm.bf16_hw_path() != "convert"


class Block(torch.nn.Module):
    """LayerNorm -> Linear + bias -> GELU -> row-major [K, N] weight (a Conv1D) -> + residual."""

    def __init__(self, d: int = 64, h: int = 160):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, h)
        self.proj_w = torch.nn.Parameter(torch.randn(h, d) / h**0.5)
        self.proj_b = torch.nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.fc(self.ln(x)))
        return x + torch.addmm(self.proj_b, y.reshape(-1, y.shape[-1]), self.proj_w).reshape(x.shape)


def _native_calls() -> int:
    c = gemm.bf16_counts()
    return c["amx"] + c["avx512_bf16"]


def _expect_native(before: int) -> None:
    if NATIVE:
        assert _native_calls() > before, f"no native bf16 call (path {gemm.bf16_path()})"


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), ref.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("pack_weights", [False, True])
def test_bf16_model_inference(pack_weights):
    torch.manual_seed(0)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(2, 40, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        f = novaforge.compile(model, freeze=True, pack_weights=pack_weights)
        before = _native_calls()
        got = f(x)
    assert got.dtype == torch.bfloat16
    _close(got, ref)
    _expect_native(before)


def test_bf16_model_on_the_conversion_path_too():
    """The same compiled program gives the same values with the native path forced off."""
    torch.manual_seed(1)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(1, 48, 64).to(torch.bfloat16)
    with torch.no_grad():
        f = novaforge.compile(model, freeze=True, pack_weights=True)
        native = f(x)
        with gemm.forced_bf16_path("convert"):
            converted = f(x)
    _close(native, converted)


def test_autocast_inference():
    torch.manual_seed(2)
    model = Block().eval()
    x = torch.randn(2, 32, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
        f = novaforge.compile(model, freeze=True)
        before = _native_calls()
        got = f(x)
    assert got.dtype == ref.dtype
    _close(got, ref)
    _expect_native(before)


def test_bf16_training_step():
    """Forward and backward of a bf16 model: the weight gradients (dW = dY^T X, a column-major A)
    go through the native path too."""
    torch.manual_seed(3)
    model = Block().to(torch.bfloat16)
    ref_model = Block().to(torch.bfloat16)
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 40, 64).to(torch.bfloat16)
    f = novaforge.compile(model)
    before = _native_calls()
    f(x).float().square().mean().backward()
    ref_model(x).float().square().mean().backward()
    _expect_native(before)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad.float(), q.grad.float(), atol=3e-2, rtol=5e-2, msg=name)


@pytest.mark.skipif(not NATIVE, reason=f"this CPU has no bf16 dot instructions (path {gemm.bf16_hw_path()!r})")
def test_packed_weights_take_the_vnni_entry():
    """With pack_weights=True the weights are VNNI panels: even 8 rows (below the in-place entries'
    16-row threshold) run natively; without packing they take the conversion path's dot kernel."""
    torch.manual_seed(4)
    model = Block().to(torch.bfloat16).eval()
    x = torch.randn(1, 8, 64).to(torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        for pack, native in ((True, True), (False, False)):
            f = novaforge.compile(model, freeze=True, pack_weights=pack)
            f(x)
            before = _native_calls()
            _close(f(x), ref)
            assert (_native_calls() > before) == native, pack

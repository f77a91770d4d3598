"""Weight-only int8 models through novaforge.compile and torch.compile(backend="novaforge"): the int8
weight stays int8 (passes/recognize_int8_weights.py) and nf_gemm_i8w runs (its call counts: the
streaming GEMV at decode sizes, the packed path above them), results equal eager's.

Two ways a user gets such a model: a hand-written dequantize (`x @ W_int8.t().float() * scale`),
and torchao's `quantize_(model, Int8WeightOnlyConfig())` (its `Int8Tensor` weights decompose to the
same ATen ops; capture binds their inner tensors, frontend/subclass_state.py). Also checked: the
model's weights reassigned or changed in place after the compile are seen, frozen or not, and
torchao's dynamic-activation config gives eager's results, its `aten._int_mm` computed by nf_gemm's
int8 x int8 kernel (exact int32 sums; tests/codegen/test_gemm_s8.py tests the kernel itself), not by
ATen's scalar loop.
"""

from __future__ import annotations

import pytest
import torch

import novaforge
from novaforge.codegen.cpu import gemm
from novaforge.codegen.cpu.gemm.build import S8_PATHS


class Dequant(torch.nn.Module):
    """A linear with int8 weights and per-channel scales, then GELU: the torchao decomposition."""

    def __init__(self, k: int = 96, n: int = 72, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("q", torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g))
        self.register_buffer("scale", torch.rand(n, 1, generator=g) * 0.02)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=g))

    def forward(self, x):
        y = torch.mm(x.reshape(-1, x.shape[-1]), self.q.t().to(torch.float32)) * self.scale.view(-1) + self.bias
        return torch.nn.functional.gelu(y).reshape(*x.shape[:-1], -1)


def _entries(model, freeze=False):
    return {"novaforge.compile": novaforge.compile(model, freeze=freeze),
            "torch.compile": torch.compile(model, backend="novaforge", dynamic=False)}


@pytest.mark.parametrize("rows,path", [(1, "gemv"), (5, "gemv"), (40, "packed")])
@pytest.mark.parametrize("freeze", [False, True])
def test_dequant_pattern_runs_on_the_int8_kernel(rows, path, freeze):
    torch._dynamo.reset()
    model = Dequant().eval()
    x = torch.randn(1, rows, 96)
    with torch.no_grad():
        ref = model(x)
        for name, f in _entries(model, freeze).items():
            before = gemm.i8_counts()[path]
            got = f(x)
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=name)
            assert gemm.i8_counts()[path] > before, f"{name}: nf_gemm_i8w ({path}) did not run"


def test_frozen_weight_stays_int8():
    model = Dequant().eval()
    x = torch.randn(2, 96)
    report = novaforge.explain(model, x, freeze=True)
    assert "int8_weight_matmuls 1" in str(report)
    assert "nf_gemm_i8w" in str(report)  # the report names the path that runs
    f = novaforge.compile(model, freeze=True)
    with torch.no_grad():
        f(x)
    consts = [gi.tensor for gi in f.stats().graph.inputs if gi.kind == "const"]
    assert any(t.dtype == torch.int8 and t.shape == (72, 96) for t in consts)
    assert not any(t.dtype == torch.float32 and t.numel() >= 96 * 72 for t in consts), "a float32 copy of W"


torchao = pytest.importorskip("torchao", reason="torchao (the `quant` extra) is not installed")


def _quantized(config_name: str, seed: int = 0) -> torch.nn.Module:
    from torchao.quantization import quant_api, quantize_

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.GELU(), torch.nn.Linear(160, 48)).eval()
    quantize_(model, getattr(quant_api, config_name)())
    return model


@pytest.mark.parametrize("rows", [1, 4, 33])
def test_torchao_int8_weight_only_both_entries(rows):
    torch._dynamo.reset()
    model = _quantized("Int8WeightOnlyConfig")
    x = torch.randn(2, rows, 64)
    with torch.no_grad():
        ref = model(x)
        for name, f in _entries(model).items():
            before = sum(gemm.i8_counts().values())
            torch.testing.assert_close(f(x), ref, atol=1e-5, rtol=1e-5, msg=name)
            assert sum(gemm.i8_counts().values()) >= before + 2, f"{name}: the int8 kernel did not run"


@pytest.mark.parametrize("freeze", [False, True])
def test_torchao_grouped_scales_both_entries(freeze):
    """Int8WeightOnlyConfig(granularity=PerGroup(32)): one scale per 32 inputs of a row. Not the int8
    kernel (recognize_int8_weights matches per-channel scales only): dequantized by generated pointwise
    kernels every call, or folded into a float32 weight when frozen; eager's results either way."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    torch._dynamo.reset()
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(64, 160), torch.nn.GELU(), torch.nn.Linear(160, 48)).eval()
    quantize_(model, Int8WeightOnlyConfig(granularity=PerGroup(32)))
    assert model[0].weight.scale.shape == (160, 2)
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        ref = model(x)
        for name, f in _entries(model, freeze).items():
            torch.testing.assert_close(f(x), ref, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("freeze", [False, True])
def test_torchao_weights_reassigned_or_changed_are_seen(freeze):
    model = _quantized("Int8WeightOnlyConfig")
    x = torch.randn(3, 64)
    with torch.no_grad():
        f = novaforge.compile(model, freeze=freeze)
        torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
        model[0].weight = _quantized("Int8WeightOnlyConfig", seed=1)[0].weight
        torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
        model[2].weight.qdata.neg_()
        torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)


def test_torchao_dynamic_int8_both_entries():
    torch._dynamo.reset()
    model = _quantized("Int8DynamicActivationInt8WeightConfig")
    x = torch.randn(1, 16, 64)
    with torch.no_grad():
        ref = model(x)
        for name, f in _entries(model).items():
            before = sum(gemm.s8_counts().values())
            torch.testing.assert_close(f(x), ref, atol=1e-4, rtol=1e-4, msg=name)
            assert sum(gemm.s8_counts().values()) > before, name  # int8 x int8 went to nf_gemm_s8s8
        stats = _entries(model)["novaforge.compile"]
        stats(x)
        assert not [t for t, _ in stats.stats().captured.externs if "_int_mm" in t]


@pytest.mark.parametrize("K", [64, 2504])
def test_int_mm_is_exact_with_extreme_operands(K):
    """int8 x int8 -> int32 equals ATen's bit for bit, also where every partial sum reaches 2^24."""
    f = novaforge.compile(lambda a, b: torch._int_mm(a, b.t()))
    g = torch.Generator().manual_seed(K)
    for fill in (None, -128, 127):
        if fill is None:
            a = torch.randint(-128, 128, (32, K), dtype=torch.int8, generator=g)
            b = torch.randint(-128, 128, (48, K), dtype=torch.int8, generator=g)
        else:
            a, b = torch.full((32, K), fill, dtype=torch.int8), torch.full((48, K), -128, dtype=torch.int8)
        assert torch.equal(f(a, b), torch._int_mm(a, b.t()))


def test_quantize_gpt2_conv1d_and_generate():
    """novaforge.quantize on transformers' GPT-2 (Conv1D projections become int8 Linears too), then
    generate() through both entry points gives eager's tokens on the same quantized model."""
    from novaforge.bench.workloads import build_generation_model

    torch._dynamo.reset()
    model, vocab = build_generation_model("gpt2-tiny")
    ref_logits = model(torch.arange(1, 9)[None]).logits
    novaforge.quantize(model, "int8-weight")
    assert not any(type(m).__name__ == "Conv1D" for m in model.modules())
    assert type(model.transformer.h[0].mlp.c_fc.weight).__name__ == "Int8Tensor"
    ids = torch.randint(1, vocab, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(torch.arange(1, 9)[None]).logits - ref_logits).abs().max() < 0.05 * ref_logits.abs().max()
        want = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        before = sum(gemm.i8_counts().values())
        got = novaforge.compile(model, freeze=True).generate(ids, max_new_tokens=6, min_new_tokens=6,
                                                             do_sample=False, pad_token_id=0)
        assert torch.equal(got, want)
        assert sum(gemm.i8_counts().values()) > before
        model.forward = torch.compile(model.forward, backend="novaforge")
        got = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(got, want)


def test_quantize_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="int8-weight"):
        novaforge.quantize(torch.nn.Linear(4, 4), "int4")


def test_dequant_pattern_symbolic_rows():
    """One program for every row count (a symbolic dimension): the int8 kernel takes M at run time."""
    model = Dequant().eval()
    f = novaforge.compile(model, dynamic={"x": {1: (2, 64)}})
    with torch.no_grad():
        for rows in (2, 3, 8, 17):
            x = torch.randn(1, rows, 96)
            before = sum(gemm.i8_counts().values())
            torch.testing.assert_close(f(x), model(x), atol=1e-5, rtol=1e-5)
            assert sum(gemm.i8_counts().values()) > before
    assert f.compilations == 1


class Int8PackMM(torch.nn.Module):
    """torchao's older CPU route: aten._weight_int8pack_mm(x, W_int8 [N, K], scales [N])."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randint(-128, 128, (40, 64), dtype=torch.int8, generator=g))
        self.register_buffer("s", torch.rand(40, generator=g) * 0.05)

    def forward(self, x):
        return torch.ops.aten._weight_int8pack_mm(x, self.w, self.s)


@pytest.mark.parametrize("rows", [1, 24])
def test_weight_int8pack_mm_is_lowered_to_the_int8_kernel(rows):
    torch._dynamo.reset()
    model = Int8PackMM()
    x = torch.randn(rows, 64)
    with torch.no_grad():
        ref = model(x)
        for name, f in _entries(model).items():
            before = sum(gemm.i8_counts().values())
            torch.testing.assert_close(f(x), ref, atol=1e-3, rtol=1e-4, msg=name)
            assert sum(gemm.i8_counts().values()) > before, name
    report = str(novaforge.explain(model, x))
    externs = report.split("-- extern ops (ATen calls kept as is) --\n", 1)[1].split("\n\n", 1)[0]
    assert externs.strip() == "none", externs


INT_MM_FORMS = {  # (a, b, s) -> ...; how the product runs
    "cast and scales (float C, fused epilogue)": lambda a, b, s: torch._int_mm(a, b.t()).to(torch.float32) * s + 1,
    "the int32 result itself": lambda a, b, s: torch._int_mm(a, b.t()),
    "int32 arithmetic after it (library step)": lambda a, b, s: torch._int_mm(a, b.t()) * 3 - 7,
    "both the int32 and a float use": lambda a, b, s: (torch._int_mm(a, b.t()), torch._int_mm(a, b.t()).float() * s),
}


@pytest.mark.parametrize("form", list(INT_MM_FORMS))
@pytest.mark.parametrize("path", ["vnni", "avx2", "portable"])
def test_int_mm_forms_on_both_entries(form, path):
    if list(S8_PATHS.values()).index(path) > list(S8_PATHS.values()).index(gemm.s8_path()):
        pytest.skip(f"this CPU or build of nf_gemm has no {path} int8 kernel")
    fn = INT_MM_FORMS[form]
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (21, 200), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (40, 200), dtype=torch.int8, generator=g)
    s = torch.rand(40, generator=g)
    ref = fn(a, b, s)
    torch._dynamo.reset()
    with gemm.forced_s8_path(path):
        for name, f in {"novaforge.compile": novaforge.compile(fn),
                        "torch.compile": torch.compile(fn, backend="novaforge", dynamic=False)}.items():
            before = gemm.s8_counts()[path]
            got = f(a, b, s)
            # the first two on nf_gemm_s8s8; the others on the exact library step (runtime/cpu_program.py)
            assert (gemm.s8_counts()[path] > before) == (form in list(INT_MM_FORMS)[:2]), (name, form)
            for x, y in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,),
                            strict=True):
                assert x.dtype == y.dtype and torch.equal(x, y), (name, form)


def _matrix_section(report: str) -> str:
    return report.split("-- matrix products: precision and nf_gemm path on this CPU --\n", 1)[1].split("\n\n", 1)[0]


def test_report_names_the_path_each_precision_ran():
    """novaforge.explain lists the program's products per precision with the nf_gemm path this CPU
    (or a forced one) runs them on."""
    x = torch.randn(4, 64)
    dynamic = _matrix_section(str(novaforge.explain(_quantized("Int8DynamicActivationInt8WeightConfig"), x)))
    assert dynamic.strip() == f"2 x int8 x int8: {gemm.s8_path()} (of vnni, avx2, portable), exact int32 sums"
    with gemm.forced_s8_path("portable"):
        forced = str(novaforge.explain(_quantized("Int8DynamicActivationInt8WeightConfig"), x))
    assert "int8 x int8: portable (of" in _matrix_section(forced)
    weight = _matrix_section(str(novaforge.explain(_quantized("Int8WeightOnlyConfig"), x)))
    assert weight.strip().startswith("2 x int8 weight: int8 weight converted to float32 in registers"), weight
    plain = torch.nn.Sequential(torch.nn.Linear(64, 16)).eval()
    assert _matrix_section(str(novaforge.explain(plain, x))).strip() == f"1 x float32: {gemm.isa()} FMA micro-kernels"
    bf16 = _matrix_section(str(novaforge.explain(plain.to(torch.bfloat16), x.bfloat16())))
    assert bf16.strip() == f"1 x bf16: {gemm.bf16_path()} (of amx, avx512_bf16, convert)"

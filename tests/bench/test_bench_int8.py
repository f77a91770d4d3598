"""`novaforge bench --dtype int8-weight | int8-dynamic` (issue 44): the command line takes the
modes, planning skips every runner that does not run them with its reason, the worker quantizes
the model (torchao for the torch runners, ORT's quantize_dynamic for onnxruntime) and compares
it with float32 eager (max / mean abs diff; top-1 agreement for logits), and the table says
which quantization ran."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from novaforge.bench import harness, worker
from novaforge.bench import runners as reg
from novaforge.bench.cli import build_parser
from novaforge.bench.harness import Options, plan
from novaforge.bench.runners.base import RunContext, output_is_logits
from novaforge.bench.table import render

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
HAS_ORT = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnxscript", "onnx"))


def test_cli_accepts_the_int8_dtypes_and_they_are_quantize_modes():
    from novaforge.quantize import MODES

    parser = build_parser()
    for dtype in ("float32", "bfloat16", "int8-weight", "int8-dynamic"):
        assert parser.parse_args(["--dtype", dtype]).dtype == dtype
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int4-weight"])
    assert set(MODES) == reg.INT8_MODES  # the registry names exactly what novaforge.quantize takes
    assert "int8-dynamic" in parser.format_help()


def _plan(dtype: str, runners: list[str], workloads=("gpt2-tiny", "gpt-tiny"), device="cpu"):
    cases, skipped = plan(harness.resolve(Options(workloads=list(workloads), runners=runners, dtype=dtype,
                                                  device=device)))
    started = {c.workload: names for c, names in cases}
    reasons = {(s["workload"], s["runner"]): s["reason"] for s in skipped}
    return started, reasons


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao (the quant extra) is not installed")
def test_plan_runs_the_quantized_runners_and_skips_the_rest_with_reasons():
    runners = ["novaforge", "novaforge-packed", "eager", "torch-compile", "torch-compile-freeze", "onnxruntime",
               "openvino", "torch-compile-novaforge"]
    started, reasons = _plan("int8-weight", runners)
    assert started["gpt2-tiny"][:5] == ["novaforge", "novaforge-packed", "eager", "torch-compile",
                                        "torch-compile-freeze"]
    assert "onnxruntime" not in started["gpt2-tiny"] and "MatMulNBits" in reasons[("gpt2-tiny", "onnxruntime")]
    assert "NNCF" in reasons[("gpt2-tiny", "openvino")]
    assert started["gpt2-tiny"][5:] == ["torch-compile-novaforge"]  # torchao's subclasses through Dynamo
    # training workloads are not quantized: every runner is skipped, saying why
    assert started["gpt-tiny"] == []
    assert "CPU inference and generate workloads only" in reasons[("gpt-tiny", "novaforge")]
    # int8-dynamic: ONNX Runtime quantizes its export (when installed)
    started, reasons = _plan("int8-dynamic", ["eager", "onnxruntime", "openvino"], workloads=["gpt2-tiny"])
    assert started["gpt2-tiny"] == ["eager"] + ["onnxruntime"] * HAS_ORT
    assert "NNCF" in reasons[("gpt2-tiny", "openvino")]
    # not on the GPU
    started, reasons = _plan("int8-dynamic", ["eager"], workloads=["gpt2-tiny"], device="cuda")
    assert started["gpt2-tiny"] == [] and "CPU inference" in reasons[("gpt2-tiny", "eager")]


def test_plan_skips_int8_without_torchao_but_float32_needs_no_torchao(monkeypatch):
    real = reg.importlib.util.find_spec
    monkeypatch.setattr(reg.importlib.util, "find_spec", lambda n, *a: None if n == "torchao" else real(n, *a))
    started, reasons = _plan("int8-dynamic", ["novaforge", "eager", "onnxruntime"], workloads=["gpt2-tiny"])
    assert started["gpt2-tiny"] == ["onnxruntime"] * HAS_ORT  # ORT quantizes without torchao
    assert "'torchao' is not installed" in reasons[("gpt2-tiny", "novaforge")]
    assert "[quant]" in reasons[("gpt2-tiny", "eager")]
    started, _ = _plan("float32", ["novaforge", "eager"], workloads=["gpt2-tiny"])
    assert started["gpt2-tiny"] == ["novaforge", "eager"]


def test_run_context_keeps_float32_activations_under_int8(tmp_path):
    ctx = RunContext(device="cpu", dtype="int8-dynamic", threads=1, workdir=tmp_path)
    assert ctx.quantization == "int8-dynamic" and ctx.torch_dtype is torch.float32
    bf16 = RunContext(device="cpu", dtype="bfloat16", threads=1, workdir=tmp_path)
    assert bf16.quantization is None and bf16.torch_dtype is torch.bfloat16


def test_comparison_reports_mean_diff_and_top1_for_logits_only():
    from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

    ref = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]]])
    got = ref.clone()
    got[0, 3] = torch.tensor([0.0, 2.0, 0.0])  # one of 4 positions predicts another token
    c = worker.compare_with_reference(got, ref, logits=True)
    assert c["top1_agreement"] == pytest.approx(0.75)
    assert c["max_abs_diff"] == pytest.approx(2.0) and c["mean_abs_diff"] == pytest.approx(3.0 / 12)
    assert "top1_agreement" not in worker.compare_with_reference(got, ref, logits=False)
    assert worker.compare_with_reference(got[:, :2], ref, logits=True)["max_abs_diff"] is None  # shape mismatch
    assert output_is_logits(CausalLMOutput(logits=ref))
    assert not output_is_logits(BaseModelOutput(last_hidden_state=ref)) and not output_is_logits(ref)


def _spec(tmp_path, runner: str, dtype: str) -> dict:
    return {"runner": runner, "workload": "gpt2-tiny", "batch": 1, "seq": 16, "device": "cpu", "dtype": dtype,
            "threads": 2, "runs": 2, "warmup": 1, "budget_s": 30.0, "nf_backend": "interpret",
            "workdir": str(tmp_path / runner)}


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao (the quant extra) is not installed")
def test_worker_runs_novaforge_and_eager_on_the_int8_dynamic_model(tmp_path):
    rows = {}
    for runner in ("eager", "novaforge"):
        result = worker.measure(_spec(tmp_path, runner, "int8-dynamic"))
        assert result["status"] == "ok"
        (rows[runner],) = result["rows"]
    for r in rows.values():
        assert r["quantize_s"] > 0 and len(r["times_ms"]) == 2
        # quantized: visibly off float32 eager (float32 runners differ by ~1e-6), yet close
        assert 1e-3 < r["max_abs_diff"] < 0.5 and 0 < r["mean_abs_diff"] <= r["max_abs_diff"]
        assert "top1_agreement" not in r  # GPT2Model's last_hidden_state is no logits
    # novaforge compiles the same quantized model as eager runs: their errors agree
    assert rows["novaforge"]["max_abs_diff"] == pytest.approx(rows["eager"]["max_abs_diff"], rel=0.05, abs=1e-3)
    assert rows["novaforge"]["metrics"]["kernels"] > 0


@pytest.mark.skipif(not HAS_ORT, reason="onnxruntime / onnxscript / onnx (the bench extra) not installed")
def test_worker_runs_onnxruntime_on_its_quantize_dynamic_export(tmp_path):
    import onnx

    result = worker.measure(_spec(tmp_path, "onnxruntime", "int8-dynamic"))
    assert result["status"] == "ok"
    (row,) = result["rows"]
    assert "quantize_s" not in row  # the torch model stays float32: ORT quantizes the export
    assert row["setup_info"]["ort_quantize_s"] > 0
    assert 1e-3 < row["max_abs_diff"] < 0.5
    ops = {n.op_type for n in onnx.load(str(tmp_path / "onnxruntime" / "model_int8.onnx")).graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops


def test_table_names_the_quantization_and_the_accuracy_columns():
    base = {"kind": "inference", "status": "ok", "median_ms": 10.0, "min_ms": 9.0, "max_ms": 12.0,
            "proc_medians_ms": [10.0], "calls": 4, "setup_s": [1.0], "peak_mem_mb": 100.0, "capped": False}
    rows = [dict(base, case="gpt2 b1 s128", runner="eager", max_abs_diff=0.03, mean_abs_diff=0.004),
            dict(base, case="lm b1 s128", runner="novaforge", max_abs_diff=0.5, mean_abs_diff=0.02,
                 top1_agreement=0.984),
            {"case": "gpt2 b1 s128", "runner": "openvino", "kind": "inference", "status": "skipped",
             "reason": reg.RUNNERS["openvino"].not_applicable("inference", "cpu", "int8-dynamic")}]
    payload = {"date": "2026-12-07T00:00:00+00:00", "rows": rows, "machine": {"cpu": "Test CPU"},
               "options": {"device": "cpu", "dtype": "int8-dynamic", "threads": 2, "procs": 2, "nf_backend": "auto"}}
    text = render(payload)
    assert "dtype int8-dynamic" in text and "quantization int8-dynamic: torchao" in text
    assert "quantize_dynamic" in text and "quant_accuracy.py" in text
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert "mean abs diff" in table[0] and "top-1 = fp32 eager" in table[0]
    assert len({ln.count("|") for ln in table}) == 1
    assert "98.4%" in text and "skipped: OpenVINO's int8 needs NNCF" in text
    assert "top-1" not in render(dict(payload, options=dict(payload["options"], dtype="float32")))


@pytest.mark.parametrize("dtype", ["bfloat16", "int8-weight"])
def test_generate_workloads_run_the_dtype(tmp_path, dtype):
    """`--dtype` reaches the generate workloads: the model is cast / quantized before eager's reference
    tokens at that precision are taken, the roof counts its own (smaller) weight bytes, and the
    share of new tokens equal to float32 eager's is reported and shown."""
    if dtype.startswith("int8") and not HAS_TORCHAO:
        pytest.skip("torchao (the quant extra) is not installed")
    rows = {}
    for dt in ("float32", dtype):
        spec = {"runner": "novaforge", "device": "cpu", "dtype": dt, "threads": 2, "runs": 1, "warmup": 0,
                "budget_s": 30.0, "nf_backend": "auto", "max_size": 64, "workdir": str(tmp_path / dt),
                "workload": "gpt2-generate-tiny", "batch": 1, "seq": 8, "new_tokens": 6}
        (rows[dt],) = worker.measure(spec)["rows"]
    low, full = rows[dtype], rows["float32"]
    assert low["tokens_equal"] and 0.0 <= low["tokens_agree_fp32"] <= 1.0
    assert "tokens_agree_fp32" not in full
    assert low["weight_bytes"] < 0.6 * full["weight_bytes"]  # bf16: half, int8: about a quarter (+ scales)
    if dtype.startswith("int8"):
        assert "quantize_s" in low
    job = {"status": "ok", "runner": "novaforge", "case": low["case"], "spec": {**spec, "dtype": dtype}, "rows": [low]}
    s = harness.aggregate([job], [(harness.Case("gpt2-generate-tiny", "generate", 1, 8), ["novaforge"])])[0]
    assert s["tokens_agree_fp32"] == low["tokens_agree_fp32"]
    assert "% of fp32's" in render({"rows": [s], "options": {"dtype": dtype}})

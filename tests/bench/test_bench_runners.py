"""Runners in-process against eager: novaforge inference/training/matmul, the registry's
applicability and missing-package rules; ONNX Runtime, OpenVINO and JAX where installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from novaforge.bench import runners as reg
from novaforge.bench import workloads as wl
from novaforge.bench.runners.base import RunContext, main_tensor
from novaforge.bench.runners.novaforge_runner import NovaforgeRunner
from novaforge.bench.runners.torch_runners import EagerRunner


@pytest.fixture
def ctx(tmp_path):
    return RunContext(device="cpu", dtype="float32", threads=2, workdir=tmp_path, nf_backend="interpret")


def test_all_expands_to_the_applicable_runners():
    assert reg.expand(["all"], "inference", "cpu") == ["novaforge", "novaforge-packed", "eager", "torch-compile",
                                                       "torch-compile-freeze", "onnxruntime", "openvino"]
    assert reg.expand(["all"], "training", "cpu") == ["novaforge", "novaforge-step", "eager", "torch-compile"]
    assert reg.expand(["all"], "training", "cuda") == ["novaforge", "novaforge-step", "eager", "torch-compile", "jax"]
    assert "onnxruntime" not in reg.expand(["all"], "inference", "cuda")
    assert reg.expand(["eager", "all"], "matmul", "cpu") == ["eager", "novaforge"]
    with pytest.raises(ValueError, match="unknown runner"):
        reg.expand(["tvm"], "inference", "cpu")


def test_not_applicable_and_missing_package(monkeypatch):
    ort = reg.RUNNERS["onnxruntime"]
    assert ort.not_applicable("inference", "cpu", "float32") is None
    assert "no training" in ort.not_applicable("training", "cpu", "float32")
    assert "cpu only" in ort.not_applicable("inference", "cuda", "float32")
    assert "bfloat16" in ort.not_applicable("inference", "cpu", "bfloat16")
    real = importlib.util.find_spec
    monkeypatch.setattr(reg.importlib.util, "find_spec", lambda n, *a: None if n == "onnxruntime" else real(n, *a))
    assert "onnxruntime" in ort.missing_package() and "[bench]" in ort.missing_package()
    assert reg.RUNNERS["eager"].missing_package() is None


def test_main_tensor_finds_the_hidden_state():
    t = torch.ones(2)
    assert main_tensor(t) is t
    assert main_tensor((t, torch.zeros(1))) is t
    assert main_tensor({"a": t}) is t
    with pytest.raises(TypeError):
        main_tensor("nope")


def test_novaforge_inference_matches_eager(ctx):
    model, vocab = wl.build_inference_model("gpt2-tiny")
    ids = wl.input_ids(vocab, 2, 24)
    with torch.inference_mode():
        ref = model(ids).last_hidden_state
    prepared = NovaforgeRunner().inference(model, (ids,), ctx)
    out = prepared.call()
    torch.testing.assert_close(prepared.to_tensor(out), ref, atol=1e-5, rtol=1e-5)
    m = prepared.after_first()["metrics"]
    for key in ("fusion_gain_ratio", "kernels", "launches", "library_calls", "externs", "arena_bytes",
                "sum_intermediate_bytes", "transitions", "pass_ms", "compile_s"):
        assert key in m
    assert m["kernels"] > 0 and m["aten_ops"] > m["kernels"]


def test_novaforge_training_losses_follow_eager(ctx):
    def losses(runner, steps=3):
        model = wl.build_training_model("gpt-tiny")
        batches = wl.training_batches(model.config.vocab_size, 2, 16)
        prepared = runner.training(model, batches, ctx)
        return [float(prepared.to_tensor(prepared.call())) for _ in range(steps)]

    ref = losses(EagerRunner())
    got = losses(NovaforgeRunner())
    assert ref[0] != ref[2]  # the optimizer really steps
    assert got == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize(("m", "k", "n"), [(33, 17, 9), (1, 64, 5), (64, 0, 8)])
def test_matmul_runners(ctx, m, k, n):
    a, b = torch.randn(m, k), torch.randn(k, n)
    for runner in (EagerRunner(), NovaforgeRunner()):
        prepared = runner.matmul(a, b, ctx)
        torch.testing.assert_close(prepared.to_tensor(prepared.call()), a @ b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["onnxruntime", "openvino"])
def test_peer_runners_match_eager(ctx, runner):
    spec = reg.RUNNERS[runner]
    if spec.missing_package():
        pytest.skip(spec.missing_package())
    model, vocab = wl.build_inference_model("llama-tiny")
    ids = wl.input_ids(vocab, 1, 16)
    with torch.inference_mode():
        ref = model(ids).last_hidden_state
    prepared = reg.load_runner(runner).inference(model, (ids,), ctx)
    torch.testing.assert_close(prepared.to_tensor(prepared.call()), ref, atol=1e-4, rtol=1e-4)


def test_jax_training_losses_follow_eager(ctx):
    pytest.importorskip("jax")
    from novaforge.bench.runners.jax_runner import JaxRunner

    def losses(runner, steps=3):
        model = wl.build_training_model("gpt-tiny")
        batches = wl.training_batches(model.config.vocab_size, 2, 16)
        prepared = runner.training(model, batches, ctx)
        return [float(prepared.to_tensor(prepared.call())) for _ in range(steps)]

    assert losses(JaxRunner()) == pytest.approx(losses(EagerRunner()), abs=1e-4)

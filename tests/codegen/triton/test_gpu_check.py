"""benchmarks/gpu_check.py in its CPU dry-run mode (Triton interpreter, tiny shapes): every group
runs in its own worker process and completes, results are correct, the JSON, the markdown and the
per-part files exist; and a crash or a hang in one group's worker leaves the other groups'
results (fault injection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _run(out: Path, *extra: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), *extra], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    pytest.importorskip("transformers")
    proc, res = _run(tmp_path)
    parts = res["parts"]
    assert {k for k, v in parts.items() if v["status"] == "error"} == set(), {k: v.get("error") for k, v in
                                                                                parts.items()}
    train = next(iter(parts["training"]["result"].values()))  # the training part: both novaforge runners
    for runner in ("novaforge", "novaforge-step"):
        assert train[runner]["max_rel_loss_diff"] < 1e-2, train[runner]  # bf16 autocast, like eager's
        assert len(train[runner]["losses"]) == len(train["eager"]["losses"]) == 3
    assert "| training |" in proc.stdout
    probe = parts["probe"]["result"]
    assert probe["ok"] and probe["program"]["launcher"] == "interpreter"
    corr = parts["correctness"]["result"]
    assert corr["ok"], [c for c in corr["cases"] + corr["training_kernels"] if not c.get("ok")]
    kinds = {k for c in corr["cases"] for k in c["kinds"]}
    assert kinds == {"pointwise", "reduction", "matmul", "attention", "gather"}
    assert len(corr["training_kernels"]) == 4
    for part, n_rows in (("matmul", 6), ("matmul tma", 2)):
        rows = parts[part]["result"]["rows"]
        assert len(rows) == n_rows and all(r["nf_finite"] for r in rows), rows
        for r in rows:  # TF32 with an operand that is not K-major runs on cuBLAS, with the reason
            assert "nf_fallback" not in r or (r["dtype"] == "tf32" and r["layout"] != "a@b.T"
                                              and "not K-major" in r["nf_fallback"]), r
            assert r["nf_rel_err"] < (1e-6 if r["dtype"] == "tf32" else 1e-2), r
            assert r["nf_s"] > 0 and r["torch_s"] > 0
            assert "nf_fallback" in r or r["nf_schedule"].startswith("mm")
    assert any("tma" in r.get("nf_schedule", "") for r in parts["matmul tma"]["result"]["rows"])
    for name in ("model gpt2", "model llama"):
        nf = parts[name]["result"]["novaforge"]
        assert nf["rel_diff"] < 2e-2 and nf["rel_diff_replay"] == nf["rel_diff"], nf
        assert nf["steps"]["torch"] == 0 and nf["fallbacks"] == []
    assert parts["model gpt2 tf32"]["result"]["novaforge"]["rel_diff"] < 1e-5
    lib = parts["model gpt2 cublas matmuls"]["result"]["novaforge"]  # matmuls through torch.matmul
    assert lib["steps"]["torch"] >= 1 and lib["rel_diff"] < 2e-2
    assert all(f["reason"] == "matmul_executor='torch'" for f in lib["fallbacks"])
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| matmul | layout | dtype |" in md and "| matmul tma |" in md and "correctness: 18 kernel cases" in md
    assert "| matmul |" in proc.stdout and len(list((tmp_path / "parts").glob("*.json"))) == 10


@pytest.mark.slow
def test_gpu_check_survives_a_crashed_and_a_hung_worker(tmp_path):
    _, res = _run(tmp_path, "--parts", "device,probe,model gpt2 tf32", "--skip-models", "--group-timeout", "15",
                  "--inject-fault", "probe:hang,model gpt2 tf32:crash", timeout=120)
    parts = res["parts"]
    assert parts["device"]["status"] == "ok" and parts["device"]["result"]["torch"]  # saved before the hang
    assert parts["probe"]["status"] == "error" and "timeout" in parts["probe"]["error"]
    assert parts["model gpt2 tf32"]["status"] == "error" and "code 134" in parts["model gpt2 tf32"]["error"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "errors: probe: worker killed" in md


def test_gpu_check_times_the_other_form_where_the_model_is_close():
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("nf_gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._other_form(None, 16384, 2048, 512, torch.float32, {"nf_persistent": True}) == "off"
    assert mod._other_form(None, 4096, 4096, 4096, torch.bfloat16, {"nf_persistent": False}) == "on"
    assert mod._other_form(None, 1024, 1024, 1024, torch.bfloat16, {"nf_persistent": False}) == ""  # far slower
    assert mod._other_form(None, 37, 45, 29, torch.float32, {"nf_persistent": False}) == ""  # no persistent form
    assert mod._other_form(None, 37, 45, 29, torch.float32, {"nf_fallback": "x"}) == ""
    md = mod.markdown({"parts": {"matmul": {"status": "ok", "result": {"rows": [
        {"shape": "s", "layout": "a@b", "dtype": "tf32", "nf_fallback": "mm: OutOfResources: shared memory",
         "torch_tflops": 400.0, "nf_rel_err": 1e-4, "torch_rel_err": 1e-4, "nf_schedule": "mm128x256"}],
        "summary": mod.mm_summary([{"dtype": "tf32", "nf_fallback": "x", "speedup": 1.0}])}}}, "total_s": 1})
    assert "FALLBACK to torch" in md and "fallback: mm: OutOfResources" in md and "(0 generated, 1 fallbacks" in md


@pytest.mark.slow
def test_gpu_check_ab_options_add_a_second_step_runner(tmp_path):
    """`--ab-options`: compile_step a second time in the same process with those options (here the
    split reductions off), reported as "novaforge-step B" with its losses, ratios and profile."""
    proc, res = _run(tmp_path, "--parts", "training", "--ab-options", '{"split_reductions": false}')
    (case,) = res["parts"]["training"]["result"].values()
    assert case["ab_options"] == {"split_reductions": False}
    a, b = case["novaforge-step"], case["novaforge-step B"]
    assert len(a["losses"]) == len(b["losses"]) == len(case["eager"]["losses"])
    assert b["max_rel_loss_diff"] < 1e-2 and "novaforge-step B tokens/s vs eager" in case["ratios"]
    assert "| novaforge-step B |" in proc.stdout and '"split_reductions": false' in proc.stdout

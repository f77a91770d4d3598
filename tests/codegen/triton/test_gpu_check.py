"""benchmarks/gpu_check.py runs end to end in its CPU dry-run mode (Triton interpreter, tiny
shapes): every part completes, results are correct, the JSON and the markdown table exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    pytest.importorskip("transformers")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["errors"] == {} and res["skipped"] == []
    rows = res["parts"]["matmul"]["rows"]
    assert len(rows) == 4 and all(r["nf_finite"] for r in rows)
    for r in rows:
        assert r["nf_rel_err"] < (1e-6 if r["dtype"] == "tf32" else 1e-2), r
        assert r["nf_s"] > 0 and r["torch_s"] > 0
    for name in ("model gpt2", "model llama"):
        nf = res["parts"][name]["novaforge"]
        assert nf["rel_diff"] < 2e-2 and nf["rel_diff_replay"] == nf["rel_diff"], nf
        assert nf["steps"].get("torch", 0) == 0
    assert res["parts"]["model gpt2 tf32"]["novaforge"]["rel_diff"] < 1e-5
    lib = res["parts"]["model gpt2 cublas matmuls"]["novaforge"]  # matmuls through torch.matmul
    assert lib["steps"]["torch"] >= 1 and lib["rel_diff"] < 2e-2
    assert "| matmul | dtype |" in proc.stdout and (tmp_path / "gpu_check.md").exists()

"""Rendering: every row appears (skipped and failed with their reasons), the markdown is
well-formed, numbers are formatted readably, the novaforge metrics block is printed."""

from __future__ import annotations

from novaforge.bench.table import fmt_num, render


def _ok(case, runner, kind, median, **extra):
    row = {"case": case, "runner": runner, "kind": kind, "status": "ok", "median_ms": median, "min_ms": median * 0.9,
           "max_ms": median * 1.2, "proc_medians_ms": [median * 0.95, median * 1.05], "calls": 60,
           "setup_s": [1.0, 1.5], "peak_mem_mb": 812.4, "max_abs_diff": 3.1e-6, "capped": False}
    row.update(extra)
    return row


METRICS = {"aten_ops": 491, "launches": 98, "kernels": 98, "kernels_by_kind": {"matmul": 48, "reduction": 25},
           "distinct_kernels": 9, "library_calls": 98, "externs": [["aten.diff.default", "no lowering rule"]],
           "fusion_gain_ratio": 5.01, "arena_bytes": 2752512, "sum_intermediate_bytes": 62128128, "transitions": 0,
           "pass_ms": [["fuse", 32.96], ["cse", 6.87]], "compile_s": {"export_s": 0.9, "total_s": 4.6},
           "backend": "interpret"}


def payload():
    rows = [
        _ok("gpt2 b1 s128", "eager", "inference", 148.0, speedup_vs_eager=1.0),
        _ok("gpt2 b1 s128", "novaforge", "inference", 3300.0, speedup_vs_eager=148 / 3300, setup_cold_s=4.6,
            setup_warm_s=4.5, metrics=METRICS, capped=True, calls=12, backends=["interpret", "cpu"]),
        {"case": "gpt2 b1 s128", "runner": "openvino", "kind": "inference", "status": "skipped",
         "reason": "package 'openvino' is not installed (pip install -e .[bench])"},
        {"case": "gpt2 b1 s128", "runner": "onnxruntime", "kind": "inference", "status": "failed",
         "reason": "RuntimeError: export | broke"},
        _ok("gpt-42m b4 s256", "eager", "training", 1700.0, tokens_per_s=602.4, speedup_vs_eager=1.0,
            loss_diff_first_step=0.0, loss_diff_max=0.0),
        _ok("gpt-42m b4 s256", "torch-compile", "training", 1600.0, tokens_per_s=640.0, speedup_vs_eager=1.06,
            loss_diff_first_step=4e-7, loss_diff_max=9e-7),
        _ok("square 1024 1024x1024x1024", "eager", "matmul", 25.0, gflops=85.9, speedup_vs_eager=1.0,
            max_rel_diff=0.0),
        _ok("square 1024 1024x1024x1024", "novaforge", "matmul", 26.0, gflops=82.6, speedup_vs_eager=0.96,
            max_rel_diff=1e-7, metrics=dict(METRICS, launches=1, compile_s={"total_s": 0.07})),
    ]
    return {"date": "2026-11-30T00:00:00+00:00", "rows": rows, "machine": {"cpu": "Test CPU", "cores_available": 2},
            "load_avg_1min": [0.5, 9.0],
            "options": {"device": "cpu", "dtype": "float32", "threads": 2, "procs": 2, "nf_backend": "auto"}}


def test_tables_are_well_formed_and_complete():
    text = render(payload())
    assert "### inference" in text and "### training" in text and "### matmul" in text
    for block in text.split("###")[1:4]:
        table = [ln for ln in block.splitlines() if ln.startswith("|")]
        widths = {ln.count("|") for ln in table}
        assert len(widths) == 1, block  # every row has as many cells as the header
        assert table[1].startswith("| ---")
    assert "skipped: package 'openvino' is not installed" in text
    assert "failed: RuntimeError: export / broke" in text  # a '|' in a reason must not break the table
    assert "time budget: 12 of ? calls" in text
    assert "cold 4.60 / warm 4.50" in text
    assert "processes ran different backends: interpret / cpu" in text
    assert "0.04x" in text and "1.06x" in text
    assert "4.0e-07 / 9.0e-07" in text
    assert "load average during the run 0.5–9.0" in text
    assert "WARNING: the 1-min load average reached 9.0 (> 1.2" in text


def test_metrics_block():
    text = render(payload())
    assert "### novaforge compiler metrics" in text
    assert "fusion gain ratio 5.01 (491 ATen ops / 98 launches)" in text
    assert "aten.diff.default" in text
    assert "arena 2.6 MiB vs 59.2 MiB sum of intermediates (4.4%)" in text
    assert "matmul sweep" in text


def test_fmt_num():
    assert fmt_num(148.04) == "148"
    assert fmt_num(1111.2) == "1,111"
    assert fmt_num(14.83) == "14.8"
    assert fmt_num(0.4327) == "0.433"
    assert fmt_num(3.3e-6, 2) == "3.3e-06"
    assert fmt_num(None) == "–" and fmt_num(0) == "0"


def test_metrics_block_names_the_low_precision_paths():
    p = payload()
    row = next(r for r in p["rows"] if r["runner"] == "novaforge" and r.get("metrics") and r.get("kind") != "matmul")
    row["gemm_paths"] = {"int8 x int8 avx2": 48, "int8-weight gemv": 2}
    text = render(p)
    want = "nf_gemm low-precision calls in the first call (path: calls): int8 x int8 avx2 48, int8-weight gemv 2"
    assert want in text

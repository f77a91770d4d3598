"""The harness: planning (skips), aggregation (medians, ratios, loss agreement, cold/warm
setup, failures), the worker's failure reporting, and real runs in subprocesses that write
valid JSON through the command line."""

from __future__ import annotations

import json
import math

import pytest

from novaforge.bench import harness, worker
from novaforge.bench import runners as reg
from novaforge.bench.cli import main as bench_main
from novaforge.bench.harness import Case, Options, aggregate, plan


def _hide(monkeypatch, module: str) -> None:
    real = reg.importlib.util.find_spec
    monkeypatch.setattr(reg.importlib.util, "find_spec", lambda n, *a: None if n == module else real(n, *a))


def test_plan_skips_missing_packages_and_inapplicable_runners(monkeypatch):
    _hide(monkeypatch, "openvino")
    cases, skipped = plan(harness.resolve(Options(workloads=["gpt2-tiny", "gpt-tiny"],
                                                  runners=["eager", "openvino", "onnxruntime"])))
    ort = reg.importlib.util.find_spec("onnxruntime") is not None  # an optional extra ([bench])
    assert [(c.label, names) for c, names in cases] == [("gpt2-tiny b1 s32", ["eager"] + ["onnxruntime"] * ort),
                                                        ("gpt-tiny b2 s64", ["eager"])]
    reasons = {(s["case"], s["runner"]): s["reason"] for s in skipped}
    if not ort:
        assert "not installed" in reasons[("gpt2-tiny b1 s32", "onnxruntime")]
    assert "not installed" in reasons[("gpt2-tiny b1 s32", "openvino")]
    assert "no training runner" in reasons[("gpt-tiny b2 s64", "onnxruntime")]
    assert all(s["status"] == "skipped" for s in skipped)


def test_missing_package_is_reported_skipped_without_starting_a_process(monkeypatch, tmp_path, capsys):
    _hide(monkeypatch, "openvino")
    monkeypatch.setattr(harness, "run_process", lambda *a, **k: pytest.fail("no process should start"))
    out = tmp_path / "r.json"
    assert bench_main(["--workload", "gpt2-tiny", "--runner", "openvino", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(r["runner"], r["status"]) for r in data["rows"]] == [("openvino", "skipped")]
    assert "skipped: package 'openvino' is not installed" in capsys.readouterr().out


def _proc(case, runner, index, times, **row):
    r = {"case": case, "times_ms": times, "setup_s": row.pop("setup_s", 1.0), "memory": {"peak_mb": 100.0 + index,
                                                                                        "kind": "peak RSS"}}
    r.update(row)
    return {"status": "ok", "case": case, "runner": runner, "process": index, "rows": [r], "spec": {"runs": len(times)}}


def test_aggregate_medians_ratios_losses_and_setups():
    case = Case("gpt-tiny", "training", 2, 64)
    label = case.label
    procs = [
        _proc(label, "eager", 0, [10.0, 12.0, 11.0], losses=[6.0, 5.9, 5.8], tokens_per_call=128),
        _proc(label, "novaforge", 0, [20.0, 22.0], losses=[6.0, 5.9001], tokens_per_call=128, cache="cold",
              setup_s=5.0, metrics={"kernels": 3}),
        _proc(label, "eager", 1, [14.0, 13.0, 15.0], losses=[6.0, 5.9, 5.8], tokens_per_call=128),
        _proc(label, "novaforge", 1, [24.0, 21.0], losses=[6.00002, 5.9], tokens_per_call=128, cache="warm",
              setup_s=1.0),
        {"status": "failed", "case": label, "runner": "torch-compile", "process": 0, "reason": "boom"},
        {"status": "failed", "case": label, "runner": "torch-compile", "process": 1, "reason": "boom again"},
    ]
    rows = {r["runner"]: r for r in aggregate(procs, [(case, ["eager", "novaforge", "torch-compile"])])}
    eager, nf, tc = rows["eager"], rows["novaforge"], rows["torch-compile"]
    assert eager["planned_calls"] == 6
    assert eager["median_ms"] == 12.5 and eager["proc_medians_ms"] == [11.0, 14.0] and eager["calls"] == 6
    assert (eager["min_ms"], eager["max_ms"]) == (10.0, 15.0)
    assert nf["median_ms"] == 21.5 and nf["speedup_vs_eager"] == pytest.approx(12.5 / 21.5)
    assert nf["tokens_per_s"] == pytest.approx(128 / 0.0215)
    assert nf["setup_cold_s"] == 5.0 and nf["setup_warm_s"] == 1.0
    assert nf["loss_diff_first_step"] == pytest.approx(2e-5, rel=1e-3)
    assert nf["loss_diff_max"] == pytest.approx(1e-4, rel=1e-3)
    assert nf["peak_mem_mb"] == 101.0 and nf["metrics"] == {"kernels": 3} and nf["backends"] == [None, None]
    assert tc["status"] == "failed" and tc["reason"] == "boom" and tc["failed_processes"] == 2


def test_aggregate_keeps_partial_failures_visible():
    case = Case("gpt2-tiny", "inference", 1, 32)
    procs = [_proc(case.label, "eager", 0, [1.0, 2.0, 3.0]),
             {"status": "failed", "case": case.label, "runner": "eager", "process": 1, "reason": "worker died"}]
    (row,) = aggregate(procs, [(case, ["eager"])])
    assert row["status"] == "ok" and row["failed_processes"] == 1 and row["reason"] == "worker died"


def test_worker_reports_failure_and_missing_package(tmp_path, monkeypatch):
    spec = {"workload": "no-such-workload", "runner": "eager", "batch": 1, "seq": 8, "device": "cpu",
            "dtype": "float32", "threads": 1, "runs": 1, "warmup": 0, "budget_s": 1.0, "nf_backend": "auto",
            "max_size": 64, "workdir": str(tmp_path / "w")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert worker.main([str(tmp_path / "spec.json"), str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["status"] == "failed" and "unknown workload" in out["reason"] and "Traceback" in out["traceback"]

    def missing(name):
        raise ModuleNotFoundError("No module named 'openvino'", name="openvino")

    monkeypatch.setattr(worker, "load_runner", missing)
    (tmp_path / "spec.json").write_text(json.dumps(dict(spec, workload="gpt2-tiny", runner="openvino")))
    worker.main([str(tmp_path / "spec.json"), str(tmp_path / "out.json")])
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["status"] == "skipped" and "openvino" in out["reason"]


def test_worker_measures_training_and_matmul_in_process(tmp_path):
    base = {"runner": "novaforge", "device": "cpu", "dtype": "float32", "threads": 2, "runs": 2, "warmup": 1,
            "budget_s": 30.0, "nf_backend": "interpret", "max_size": 64, "workdir": str(tmp_path / "w")}
    train = worker.measure(dict(base, workload="gpt-tiny", batch=2, seq=16))
    (row,) = train["rows"]
    assert len(row["losses"]) == 4 and len(row["times_ms"]) == 2 and row["tokens_per_call"] == 32
    assert all(math.isfinite(x) for x in row["losses"]) and row["metrics"]["kernels"] > 0
    # the whole step as one program: the same model, batches and AdamW, so the same losses
    (whole,) = worker.measure(dict(base, runner="novaforge-step", workload="gpt-tiny", batch=2, seq=16))["rows"]
    assert whole["programs"] == 1 and len(whole["losses"]) == 4
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(whole["losses"], row["losses"], strict=True))
    mm = worker.measure(dict(base, workload="matmul-tiny", batch=2, seq=8))
    assert [r["case"].split(" ")[-1] for r in mm["rows"]][:2] == ["64x64x64", "96x96x96"]
    assert all(r["max_rel_diff"] < 1e-5 and r["flops"] > 0 for r in mm["rows"])


def test_a_hung_worker_is_killed_and_reported(tmp_path):
    opts = harness.resolve(Options(workloads=["gpt2-tiny"], runners=["eager"], timeout_s=0.5))
    case = Case("gpt2-tiny", "inference", 1, 8)
    result = harness.run_process(case, "eager", 0, opts, tmp_path, log=lambda s: None)
    assert result["status"] == "failed" and "timed out" in result["reason"]


def test_cli_runs_eager_and_novaforge_in_subprocesses_and_writes_json(tmp_path, capsys):
    out = tmp_path / "results.json"
    rc = bench_main(["--workload", "gpt2-tiny", "--runner", "eager,novaforge", "--procs", "2", "--runs", "3",
                     "--warmup", "1", "--seq", "16", "--nf-backend", "interpret", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| gpt2-tiny b1 s16 | eager |" in text and "| gpt2-tiny b1 s16 | novaforge |" in text
    assert "### novaforge compiler metrics" in text
    data = json.loads(out.read_text())  # strict JSON, written where asked
    assert {"date", "machine", "versions", "options", "rows", "processes"} <= set(data)
    assert data["options"]["threads"] >= 1 and data["versions"]["torch"]
    rows = {r["runner"]: r for r in data["rows"]}
    assert rows["eager"]["status"] == rows["novaforge"]["status"] == "ok"
    assert rows["eager"]["calls"] == 6 and len(rows["novaforge"]["proc_medians_ms"]) == 2
    assert rows["novaforge"]["max_abs_diff"] < 1e-4 and rows["eager"]["max_abs_diff"] == 0
    assert rows["novaforge"]["metrics"]["fusion_gain_ratio"] > 1
    procs = data["processes"]
    assert [(p["runner"], p["process"]) for p in procs] == [("eager", 0), ("novaforge", 0), ("novaforge", 1),
                                                            ("eager", 1)]  # interleaved, order reversed in pass 2
    assert len({p["env"]["pid"] for p in procs}) == 4  # a fresh process each
    assert all(len(p["load_avg_1min"]) == 2 for p in procs) and len(data["load_avg_1min"]) == 2
    assert [p["rows"][0]["cache"] for p in procs if p["runner"] == "novaforge"][0] == "cold"


def test_cli_usage_errors_and_list(capsys):
    assert bench_main(["--workload", "gpt5"]) == 2
    assert bench_main(["--runner", "tvm"]) == 2
    assert bench_main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert "gpt-42m" in listing and "torch-compile-freeze" in listing and "openvino" in listing


def test_worker_measures_generation_in_process(tmp_path):
    spec = {"runner": "novaforge", "device": "cpu", "dtype": "float32", "threads": 2, "runs": 2, "warmup": 1,
            "budget_s": 30.0, "nf_backend": "auto", "max_size": 64, "workdir": str(tmp_path / "w"),
            "workload": "gpt2-generate-tiny", "batch": 1, "seq": 8, "new_tokens": 6}
    (row,) = worker.measure(spec)["rows"]
    assert row["tokens_equal"] and row["new_tokens"] == 6
    assert len(row["times_ms"]) == len(row["ttft_ms"]) == 2 and row["programs_after"] == 2
    assert row["weight_bytes"] > 0 and row["read_bw_bytes_s"] > 1e8
    lo, hi = row["read_bw_range"]  # (one sample per timed generate; the roof is their median)
    assert lo <= row["read_bw_bytes_s"] <= hi
    # the aggregate's arithmetic on fixed times (a 6-token generate of ~1 ms: measured times are noise)
    fixed = {**row, "times_ms": [10.0, 12.0], "ttft_ms": [2.0, 2.0]}
    s = harness.aggregate([{"status": "ok", "runner": "novaforge", "case": row["case"], "spec": spec,
                            "rows": [fixed]}], [(Case("gpt2-generate-tiny", "generate", 1, 8), ["novaforge"])])[0]
    assert s["median_ms"] == 11.0 and s["ttft_ms"] == 2.0
    assert s["decode_tokens_per_s"] == pytest.approx(5 / 9e-3) and s["tokens_equal"] and s["programs"] == 2
    assert s["roof_fraction"] == pytest.approx(s["decode_tokens_per_s"] / s["roof_tokens_per_s"])
    assert s["read_bw_range_gb_s"] == pytest.approx([lo / 1e9, hi / 1e9])


def test_worker_generates_with_a_dynamic_cache_on_two_programs(tmp_path):
    spec = {"runner": "novaforge-dynamic-cache", "device": "cpu", "dtype": "float32", "threads": 2, "runs": 2,
            "warmup": 1, "budget_s": 30.0, "nf_backend": "auto", "max_size": 64, "workdir": str(tmp_path / "w"),
            "workload": "gpt2-generate-tiny", "batch": 1, "seq": 8, "new_tokens": 6}
    (row,) = worker.measure(spec)["rows"]
    assert row["tokens_equal"] and row["new_tokens"] == 6 and row["setup_info"]["cache"] == "dynamic"
    assert row["programs_after"] == 2  # the prefill and one decode program for every cache length

"""The benchmark harness: plan cases, run every (case, runner) in fresh processes, interleaved
over repeated passes, and aggregate the measurements into rows.

Method (benchmarks/README.md says why): each measurement is a new Python process running one
runner on one case (`worker.py`); pass 1 runs every runner on every case, pass 2 runs them
again in reverse order, and so on, so slow drift of the machine (10-20% between minutes) falls
on all runners alike instead of on whichever ran last. All runners get the same thread count
(OMP/MKL env, `torch.set_num_threads`, ORT and OpenVINO settings). torch.compile gets an empty
inductor cache in every process (cold compile); novaforge gets one cache folder per case shared
by its processes, so the first process compiles cold and later ones find what it cached (the
GEMM library comes from the install-time build when there is one: benchmarks/README.md).

Invariant: a runner whose package is missing is `skipped` (no process started), a runner that
raises or dies is `failed` with its reason, and neither stops the other runners; every timed
call of every process is kept in the raw results.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import results as res
from .measure import energy_counter, median
from .runners import BASELINE, RUNNERS, expand
from .workloads import default_dtype, default_shapes, get


@dataclass
class Options:
    workloads: list[str]
    runners: list[str] = field(default_factory=lambda: ["all"])
    batches: list[int] | None = None
    seq: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    runs: int | None = None
    warmup: int | None = None
    procs: int = 2
    threads: int | None = None
    budget_s: float = 30.0
    timeout_s: float = 1800.0
    nf_backend: str = "auto"
    tf32: bool = False
    max_size: int | None = None
    new_tokens: int | None = None  # generate workloads (default 128; 16 for -tiny)
    keep_logs: bool = False


@dataclass(frozen=True)
class Case:
    workload: str
    kind: str
    batch: int
    seq: int

    @property
    def label(self) -> str:
        if self.kind == "matmul":
            return f"{self.workload} (tokens {self.batch * self.seq})"
        return f"{self.workload} b{self.batch} s{self.seq}"


def available_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve(opts: Options) -> Options:
    """Fill the defaults that depend on the device and the workload."""
    o = Options(**asdict(opts))
    o.dtype = o.dtype or default_dtype(o.device)
    o.threads = o.threads or available_threads()
    o.max_size = o.max_size or (8192 if o.device == "cuda" else 2048)
    return o


def plan(opts: Options) -> tuple[list[tuple[Case, list[str]]], list[dict[str, Any]]]:
    """The cases with the runners to start for each, and the rows of runners skipped up front."""
    cases: list[tuple[Case, list[str]]] = []
    skipped: list[dict[str, Any]] = []
    for wname in opts.workloads:
        w = get(wname)
        batches, seq = default_shapes(w, opts.device)
        batches = opts.batches or batches
        seq = opts.seq or seq
        names = expand(opts.runners, w.kind, opts.device)
        for b in batches:
            case = Case(w.name, w.kind, b, seq)
            start = []
            for n in names:
                spec = RUNNERS[n]
                reason = spec.not_applicable(w.kind, opts.device, opts.dtype)
                reason = reason or spec.missing_package(opts.dtype)
                if reason:
                    skipped.append({"case": case.label, "workload": w.name, "kind": w.kind, "batch": b, "seq": seq,
                                    "runner": n, "status": "skipped", "reason": reason})
                else:
                    start.append(n)
            cases.append((case, start))
    return cases, skipped


def _defaults(case: Case, opts: Options) -> tuple[int, int]:
    if opts.runs is not None:
        runs = opts.runs
    elif case.kind == "inference":
        runs = 30 if case.batch <= 1 else 20
    elif case.kind == "generate":
        runs = 3
    else:
        runs = 10
    warmup = opts.warmup if opts.warmup is not None else (2 if case.kind == "training" else 3)
    return runs, warmup


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def run_process(case: Case, runner: str, index: int, opts: Options, root: Path,
                log: Callable[[str], None]) -> dict[str, Any]:
    """Start one worker and return its result (a `failed` result if it died or timed out)."""
    runs, warmup = _defaults(case, opts)
    name = f"{_slug(case.label)}-{runner}"
    pdir = root / f"p{index}-{name}"
    pdir.mkdir(parents=True)
    spec = {"workload": case.workload, "runner": runner, "batch": case.batch, "seq": case.seq,
            "device": opts.device, "dtype": opts.dtype, "threads": opts.threads, "runs": runs, "warmup": warmup,
            "budget_s": opts.budget_s, "nf_backend": opts.nf_backend, "tf32": opts.tf32, "max_size": opts.max_size,
            "new_tokens": opts.new_tokens,
            "process": index, "workdir": str(pdir / "work")}
    (pdir / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    threads = str(opts.threads)
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               TORCHINDUCTOR_CACHE_DIR=str(pdir / "inductor"), TRITON_CACHE_DIR=str(pdir / "triton"),
               NOVAFORGE_CACHE_DIR=str(root / "novaforge-cache" / name), XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out_path, log_path = pdir / "result.json", pdir / "log.txt"
    load_before = _load()
    t0 = time.perf_counter()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "novaforge.bench.worker", str(pdir / "spec.json"),
                                 str(out_path)], env=env, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=opts.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
    wall = time.perf_counter() - t0
    if out_path.is_file():
        result = json.loads(out_path.read_text())
    else:
        tail = log_path.read_bytes()[-1500:].decode(errors="replace")
        why = f"timed out after {opts.timeout_s:.0f} s" if timed_out else f"worker died (exit code {proc.returncode})"
        result = {"status": "failed", "reason": why, "log_tail": tail}
    if result["status"] == "failed" and "log_tail" not in result:
        result["log_tail"] = log_path.read_bytes()[-1500:].decode(errors="replace")
    result.update(case=case.label, runner=runner, process=index, spec=spec, process_wall_s=wall,
                  load_avg_1min=[load_before, _load()])
    log(_progress_line(result, index, opts.procs))
    return result


def _load() -> float | None:
    """The 1-minute load average: other work on the machine, recorded with every process."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _progress_line(r: dict[str, Any], index: int, procs: int) -> str:
    head = f"[pass {index + 1}/{procs}] {r['case']:<24} {r['runner']:<21}"
    if r["status"] != "ok":
        return f"{head} {r['status']}: {r.get('reason', '')}  ({r['process_wall_s']:.0f} s)"
    rows = r["rows"]
    meds = ", ".join(f"{median(x['times_ms']):.4g}" for x in rows[:4]) + (", ..." if len(rows) > 4 else "")
    setup = sum(x["setup_s"] for x in rows)
    return f"{head} ok  median ms {meds}  setup {setup:.1f} s  ({r['process_wall_s']:.0f} s)"


def run(opts: Options, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, Any]:
    """Run the whole benchmark and return the results payload (see results.py for the file)."""
    opts = resolve(opts)
    started = res.now_utc()
    cases, skipped = plan(opts)
    for s in skipped:
        log(f"[skip] {s['case']:<24} {s['runner']:<21} {s['reason']}")
    root = Path(tempfile.mkdtemp(prefix="novaforge-bench-"))
    processes: list[dict[str, Any]] = []
    try:
        for p in range(opts.procs):
            for case, names in cases:
                order = names if p % 2 == 0 else list(reversed(names))
                for n in order:
                    processes.append(run_process(case, n, p, opts, root, log))
    finally:
        if opts.keep_logs:
            log(f"worker folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    rows = aggregate(processes, cases) + skipped
    loads = [x for p in processes for x in p.get("load_avg_1min", []) if x is not None]
    envs = [p["env"] for p in processes if p.get("env")]
    repo = res.repo_root()
    return {
        "date": started.isoformat(timespec="seconds"), "finished": res.now_utc().isoformat(timespec="seconds"),
        "options": asdict(opts), "machine": res.machine(),
        "energy_counter": energy_counter(opts.device)[1],
        "gpu": next((e.get("gpu") for e in envs if e.get("gpu")), None),
        "load_avg_1min": [min(loads), max(loads)] if loads else None,
        "versions": res.versions(), "git_commit": res.git_commit(repo) if repo else None,
        "rows": rows, "processes": processes,
    }


# ---------------------------------------------------------------- aggregation


def aggregate(processes: list[dict[str, Any]], cases: list[tuple[Case, list[str]]]) -> list[dict[str, Any]]:
    """One row per (row case, runner) over all its processes; a runner none of whose processes
    succeeded on a case gets one `failed` row carrying the first reason."""
    by_case = {c.label: c for c, _ in cases}
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = {}  # (row case, runner) -> [(process, row)]
    parent: dict[str, str] = {}  # row case -> case label (a matmul process yields one row per shape)
    failures: dict[tuple[str, str], list[dict]] = {}
    for p in processes:
        if p["status"] == "ok":
            for row in p["rows"]:
                groups.setdefault((row["case"], p["runner"]), []).append((p, row))
                parent[row["case"]] = p["case"]
        else:
            failures.setdefault((p["case"], p["runner"]), []).append(p)
    out = [_summarize(by_case[parent[rc]], rc, runner, got, failures.get((parent[rc], runner), []))
           for (rc, runner), got in groups.items()]
    succeeded = {(parent[rc], runner) for rc, runner in groups}
    for (label, runner), failed in failures.items():
        if (label, runner) not in succeeded:
            out.append({**_case_fields(by_case[label]), "case": label, "runner": runner, "status": "failed",
                        "reason": failed[0].get("reason", ""), "failed_processes": len(failed)})
    _add_comparisons(out)
    return out


def _case_fields(case: Case) -> dict[str, Any]:
    return {"workload": case.workload, "kind": case.kind, "batch": case.batch, "seq": case.seq}


def _summarize(case: Case, row_case: str, runner: str, got: list[tuple[dict, dict]],
               failed: list[dict]) -> dict[str, Any]:
    times = [t for _, r in got for t in r["times_ms"]]
    first = got[0][1]
    s: dict[str, Any] = {
        **_case_fields(case), "case": row_case, "runner": runner, "status": "ok", "processes": len(got),
        "calls": len(times), "planned_calls": sum(p["spec"]["runs"] for p, _ in got),
        "median_ms": median(times), "min_ms": min(times), "max_ms": max(times),
        "proc_medians_ms": [median(r["times_ms"]) for _, r in got],
        "capped": any(r.get("capped") for _, r in got),
        "setup_s": [r["setup_s"] for _, r in got],
        "peak_mem_mb": max(r["memory"]["peak_mb"] for _, r in got),
        "mem_kind": first["memory"]["kind"],
    }
    diffs = [r.get("max_abs_diff") for _, r in got if r.get("max_abs_diff") is not None]
    s["max_abs_diff"] = max(diffs) if diffs else None
    means = [r["mean_abs_diff"] for _, r in got if r.get("mean_abs_diff") is not None]
    if means:
        s["mean_abs_diff"] = max(means)
    top1 = [r["top1_agreement"] for _, r in got if r.get("top1_agreement") is not None]
    if top1:  # logits outputs only: the worst process
        s["top1_agreement"] = min(top1)
    if first.get("max_rel_diff") is not None:
        s["max_rel_diff"] = max(r["max_rel_diff"] for _, r in got)
    energies = [r["energy_j_per_call"][0] for _, r in got if r.get("energy_j_per_call")]
    s["energy_j_per_call"] = median(energies) if energies else None
    caches = {r.get("cache") for _, r in got}
    if caches - {None}:
        for state in ("cold", "warm"):
            vals = [r["setup_s"] for _, r in got if r.get("cache") == state]
            s[f"setup_{state}_s"] = median(vals) if vals else None
    if "gemm_paths" in first:
        s["gemm_paths"] = first["gemm_paths"]  # (nf_gemm's low-precision paths in the first call)
    if "metrics" in first:
        s["metrics"] = first["metrics"]
        # the backend `auto` resolved to, per process: a tree that changed between passes shows here
        s["backends"] = [(r.get("metrics") or {}).get("backend") for _, r in got]
    if first.get("tokens_per_call"):
        s["tokens_per_s"] = first["tokens_per_call"] / (s["median_ms"] / 1e3)
    if first.get("flops"):
        s["flops"] = first["flops"]
        s["gflops"] = first["flops"] / (s["median_ms"] / 1e3) / 1e9
    if "losses" in first:
        s["losses"] = [r["losses"] for _, r in got]
    if "ttft_ms" in first:  # generation: time to the first token, decode rate, bandwidth roof
        ttft = [t for _, r in got for t in r["ttft_ms"]]
        s["ttft_ms"] = median(ttft)
        s["new_tokens"] = first["new_tokens"]
        per_token = (s["median_ms"] - s["ttft_ms"]) / 1e3 / max(first["new_tokens"] - 1, 1)
        s["decode_tokens_per_s"] = 1.0 / per_token if per_token > 0 else None
        s["tokens_equal"] = all(r["tokens_equal"] for _, r in got)
        agree = [r["tokens_agree_fp32"] for _, r in got if r.get("tokens_agree_fp32") is not None]
        if agree:
            s["tokens_agree_fp32"] = min(agree)
        s["weight_bytes"] = first["weight_bytes"]
        bw = median([r["read_bw_bytes_s"] for _, r in got])
        s["read_bw_gb_s"] = bw / 1e9
        ranges = [r["read_bw_range"] for _, r in got if r.get("read_bw_range")]
        if ranges:
            s["read_bw_range_gb_s"] = [min(a for a, _ in ranges) / 1e9, max(b for _, b in ranges) / 1e9]
        s["roof_tokens_per_s"] = bw / first["weight_bytes"]
        if s["decode_tokens_per_s"]:
            s["roof_fraction"] = s["decode_tokens_per_s"] / s["roof_tokens_per_s"]
        progs = [r.get("programs_after") for _, r in got if r.get("programs_after") is not None]
        if progs:
            s["programs"] = max(progs)
    if failed:
        s["failed_processes"] = len(failed)
        s["reason"] = failed[0].get("reason", "")
    return s


def _add_comparisons(rows: list[dict[str, Any]]) -> None:
    """speedup vs the baseline runner of the same case; for training, loss agreement with it."""
    base = {r["case"]: r for r in rows if r["runner"] == BASELINE and r["status"] == "ok"}
    for r in rows:
        b = base.get(r["case"])
        if r["status"] != "ok" or b is None:
            continue
        r["speedup_vs_eager"] = b["median_ms"] / r["median_ms"]
        if r.get("decode_tokens_per_s") and b.get("decode_tokens_per_s"):
            r["decode_vs_eager"] = r["decode_tokens_per_s"] / b["decode_tokens_per_s"]
        if "losses" in r and "losses" in b:
            first, common = [], []
            for mine, theirs in zip(r["losses"], b["losses"], strict=False):
                n = min(len(mine), len(theirs))
                if n:
                    first.append(abs(mine[0] - theirs[0]))
                    common.extend(abs(x - y) for x, y in zip(mine[:n], theirs[:n], strict=True))
            r["loss_diff_first_step"] = max(first) if first else None
            r["loss_diff_max"] = max(common) if common else None

"""Sequence-length sweep (issue 16): compile counts and total time of one model called once at
every length of a range, per runner, each runner in a fresh process with empty compile caches.

    PYTHONPATH=src python benchmarks/dynamic_sweep.py --model gpt2 --lengths 8:40 [--runners ...] [--full]
        [--points 32,128]

(the -tiny model by default: 128 positions, so lengths up to 128; --full for GPT-2 124M and the
other benchmark-size models)

Runners:
  nf-static       novaforge.compile(model, tiered=False): a program per length, each traced on
                  its own (tiered, the default, would make the length dynamic at its third value)
  nf-static-points  the same without the sweep: only the timed lengths (--points), each compiled
                  statically: the reference the dynamic runners' latency is compared with
  nf-dynamic      novaforge.compile(model, dynamic={"input_ids": {1: (2, 4096)}}): one trace and
                  one program for every length (the CPU backend's shared program)
  nf-dynamo       torch.compile(model, backend="novaforge", dynamic=True): one symbolic
                  lowering, one program for every length
  nf-dynamic-tiered, nf-dynamo-tiered   the same with symbolic_programs=False: a program per
                  length, tiered (a length runs eagerly until its calls cost one build)
  inductor        torch.compile(model, dynamic=True)
  eager           the model itself (no compile)
The sweep time counts the runner's own calls (compiles included), not the eager reference
calls made to check them. After the sweep each runner times 20 calls at each of --points (median ms), after
warm-up calls (one; a tiered runner calls until that length has paid for its program, at most 10 s). Outputs
are checked against eager at every length, or every k-th (--check-every), and at every timed
length (max abs difference printed). Prints one JSON line per runner, and
a table with each runner's latency over nf-static-points' (when it ran).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TIERED = ("nf-dynamic-tiered", "nf-dynamo-tiered")
FULL = [False]  # --full: the benchmark-size model (GPT-2 124M, ...) instead of its -tiny version
CHECK_EVERY = [1]  # --check-every: compare with eager at every k-th length of the sweep (and every timed one)
RUNNERS = ("eager", "nf-static-points", "nf-dynamic", "nf-dynamo", "nf-dynamic-tiered", "nf-dynamo-tiered",
           "inductor")


def _model(name: str):
    import torch

    from novaforge.bench.workloads import build_inference_model

    model, vocab = build_inference_model(name if FULL[0] else f"{name}-tiny")
    torch.manual_seed(0)
    return model.eval(), vocab


def _compiled(runner: str, model):
    import torch

    import novaforge

    if runner == "eager":
        return model, lambda: (0, 0)
    if runner.startswith("nf-static"):
        c = novaforge.compile(model, backend="cpu", tiered=False)  # not made dynamic at its third length
        return c, lambda: (c.compilations, 0)
    shared = not runner.endswith("-tiered")
    if runner.startswith("nf-dynamic"):
        c = novaforge.compile(model, backend="cpu", dynamic={"input_ids": {1: (2, 4096)}}, symbolic_programs=shared)
        return c, lambda: (c.compilations, c.tiering.eager_calls)
    from novaforge import dynamo

    if runner.startswith("nf-dynamo"):
        c = torch.compile(model, backend="novaforge", dynamic=True, options={"symbolic_programs": shared})
        return c, lambda: (dynamo.PROGRAMS_BUILT[0], dynamo.TIERED_EAGER_CALLS[0])
    if runner == "inductor":
        from torch._dynamo.utils import counters

        c = torch.compile(model, dynamic=True)
        return c, lambda: (counters["inductor"].get("fxgraph_cache_miss", 0) + counters["inductor"].get(
            "fxgraph_cache_bypass", 0) or counters["stats"].get("unique_graphs", 0), 0)
    raise ValueError(runner)


def worker(runner: str, model_name: str, lengths: list[int], points: list[int]) -> dict:
    import torch

    torch.set_num_threads(2)
    model, vocab = _model(model_name)
    fn, count = _compiled(runner, model)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    sweep_s = 0.0  # the runner's own calls only (the eager reference calls are not counted)
    with torch.no_grad():
        for k, n in enumerate([] if runner == "nf-static-points" else lengths):
            ids = torch.randint(0, vocab, (1, n), generator=g)
            t0 = time.perf_counter()
            out = fn(input_ids=ids).last_hidden_state
            sweep_s += time.perf_counter() - t0
            if runner != "eager" and k % CHECK_EVERY[0] == 0:
                worst = max(worst, (out - model(input_ids=ids).last_hidden_state).abs().max().item())
    programs, eager_calls = count()
    lat, warm = {}, {}
    with torch.no_grad():
        for n in points:
            ids = torch.randint(0, vocab, (1, n), generator=g)
            built, w0 = count()[0], time.perf_counter()
            fn(input_ids=ids)
            warm[n] = 1
            while runner in TIERED and count()[0] == built and time.perf_counter() - w0 < 10:
                fn(input_ids=ids)  # a tiered runner: until this length has paid for its program
                warm[n] += 1
            ts = []
            for _ in range(20):
                a = time.perf_counter()
                fn(input_ids=ids)
                ts.append(time.perf_counter() - a)
            lat[n] = statistics.median(ts) * 1e3
            out = fn(input_ids=ids).last_hidden_state
            worst = max(worst, (out - model(input_ids=ids).last_hidden_state).abs().max().item())
    return {"runner": runner, "model": model_name, "lengths": f"{lengths[0]}..{lengths[-1]}", "sweep_s": sweep_s,
            "programs": programs, "eager_tier_calls": eager_calls, "max_abs_diff": worst,
            "ms_at": {str(n): lat[n] for n in points}, "programs_after_latency": count()[0], "warm_calls": warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--lengths", default="8:40", help="first:last (inclusive)")
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--points", default="32,128", help="lengths whose latency is timed after the sweep")
    ap.add_argument("--check-every", type=int, default=1, help="compare with eager at every k-th sweep length")
    ap.add_argument("--full", action="store_true", help="the full-size model (gpt2: 124M) instead of the tiny one")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    FULL[0] = a.full
    CHECK_EVERY[0] = a.check_every
    lo, hi = (int(x) for x in a.lengths.split(":"))
    lengths = list(range(lo, hi + 1))
    points = [int(x) for x in a.points.split(",")]
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, lengths, points)))
        return
    rows = []
    for r in a.runners.split(","):
        with tempfile.TemporaryDirectory() as nf_cache, tempfile.TemporaryDirectory() as ind_cache:
            env = {**os.environ, "NOVAFORGE_CACHE_DIR": nf_cache, "TORCHINDUCTOR_CACHE_DIR": ind_cache,
                   "NOVAFORGE_GRAPH_CACHE": "0"}
            load0 = os.getloadavg()[0]
            p = subprocess.run([sys.executable, __file__, "--worker", r, "--model", a.model, "--lengths", a.lengths,
                                "--points", a.points, "--check-every", str(a.check_every)]
                               + (["--full"] if a.full else []),
                               env=env, capture_output=True, text=True, timeout=3600)
            load1 = os.getloadavg()[0]
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
        if line is None:
            print(f"{r}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
            continue
        row = json.loads(line)
        row["load"] = [round(load0, 2), round(load1, 2)]
        print(json.dumps(row), flush=True)
        rows.append(row)
    ref = next((row["ms_at"] for row in rows if row["runner"] == "nf-static-points"), None)

    def at(row: dict, n: int) -> str:
        ms = row["ms_at"][str(n)]
        return f"{ms:.2f}" + (f" ({ms / ref[str(n)]:.2f}x)" if ref else "")

    print(f"\n| runner | programs built | eager-tier calls | sweep {a.lengths} (s) | "
          + " | ".join(f"ms @{n}" + (" (/ static)" if ref else "") for n in points)
          + " | programs after timing | max abs diff | load before/after |")
    print("|---" * (7 + len(points)) + "|")
    for row in rows:
        sweep = "-" if row["runner"] == "nf-static-points" else f"{row['sweep_s']:.1f}"
        print(f"| {row['runner']} | {row['programs']} | {row['eager_tier_calls']} | {sweep} | "
              + " | ".join(at(row, n) for n in points)
              + f" | {row['programs_after_latency']} | {row['max_abs_diff']:.1e} | {row['load'][0]} / "
              f"{row['load'][1]} |")


if __name__ == "__main__":
    main()

"""`novaforge demo`: compile a real model, compare it with eager PyTorch, print the report.

The model is a transformers model built from its config with random weights (never from a
hub), as in the benchmark workloads. The demo times eager and novaforge in the same process,
interleaved, and prints medians, the speedup, the largest difference of the outputs, and the
compile report (passes, kernels with their schedules, memory plan, metrics, and where the time
went: each kernel's measured time and roofline efficiency), then writes the same as an HTML
page (`novaforge report`, report/html_report.py) from the same measurements and prints its
path. Benchmarks against the other peers are `novaforge bench`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def _median_ms(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="novaforge demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2", help="gpt2, bert, llama (or their -tiny variants)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--runs", type=int, default=20, help="timed calls per runner")
    p.add_argument("--backend", default="auto", help="auto, cpu, triton or interpret")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--max-kernels", type=int, default=25, help="distinct kernels listed in the report")
    p.add_argument("--no-profile", action="store_true", help="skip the per-kernel timing (roofline) section")
    p.add_argument("--report", default=None, metavar="PATH",
                   help="the HTML report (default novaforge-report-<model>.html; 'none' skips it)")
    args = p.parse_args(argv)

    import novaforge
    from novaforge.bench.workloads import build_inference_model, input_ids
    from novaforge.report.explain import Report
    from novaforge.report.metrics import metrics

    torch.set_num_threads(args.threads)
    model, vocab = build_inference_model(args.model)
    dtype = getattr(torch, args.dtype)
    model = model.to(dtype)
    ids = input_ids(vocab, args.batch, args.seq)
    print(f"novaforge {novaforge.__version__} demo: {args.model}, batch {args.batch} x seq {args.seq}, {args.dtype}, "
          f"{args.threads} threads, torch {torch.__version__}")

    with torch.inference_mode():
        ref = model(ids).last_hidden_state
        compiled = novaforge.compile(model, freeze=True, backend=args.backend, profile=not args.no_profile,
                                     keep_graphs=True)
        t0 = time.perf_counter()
        out = compiled(ids).last_hidden_state
        compile_s = time.perf_counter() - t0
        eager_fn = lambda: model(ids)  # noqa: E731
        nf_fn = lambda: compiled(ids)  # noqa: E731
        for _ in range(2):
            eager_fn()
            nf_fn()
        eager, nf = [], []
        for _ in range(3):  # interleave: the machine drifts between minutes
            eager += _median_ms(eager_fn, max(args.runs // 3, 1))
            nf += _median_ms(nf_fn, max(args.runs // 3, 1))

    stats = compiled.stats()
    diff = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    e_ms, n_ms = statistics.median(eager), statistics.median(nf)
    print(f"compile (first call): {compile_s:.2f} s   backend: {stats.backend}")
    print(f"eager     {e_ms:8.2f} ms  (median of {len(eager)})")
    print(f"novaforge {n_ms:8.2f} ms  (median of {len(nf)})   speedup x{e_ms / n_ms:.2f}")
    print(f"max |novaforge - eager| = {diff:.3g} (output scale {scale:.3g})")
    print()
    profile, prof = "", None
    if not args.no_profile:
        from novaforge.report.roofline import format_profile, profile_program

        with torch.inference_mode():
            prof = profile_program(compiled, (ids,), {}, runs=max(args.runs // 4, 3))
        profile = format_profile(prof)
    print(Report(stats, metrics(stats), args.max_kernels, profile=profile))
    if args.report != "none":
        from pathlib import Path

        from novaforge.report.eager import eager_peak_bytes
        from novaforge.report.html_report import render

        with torch.inference_mode():
            peak = eager_peak_bytes(model, (ids,))
        data = {"stats": stats, "metrics": metrics(stats), "profile": prof, "first_call_s": compile_s,
                "wall_ms": prof.wall_s * 1e3 if prof is not None else n_ms, "eager_ms": e_ms, "eager_peak": peak,
                "max_diff": diff}
        path = Path(args.report or f"novaforge-report-{args.model}.html")
        path.write_text(render(data, f"{args.model}, batch {args.batch} x seq {args.seq}, {args.dtype}"),
                        encoding="utf-8")
        print(f"\nHTML report: {path.resolve()}")
    return 0

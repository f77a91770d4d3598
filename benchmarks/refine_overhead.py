"""What refinement's sampling costs a call (`refine=True`, codegen/cpu/refine.py).

    .venv/bin/python benchmarks/refine_overhead.py --model gpt2 --batch 1 --rounds 7

Two compiled copies of the same model in one process (bit-identical weights, the same input):
`refine=False`, and `refine=True` held in its measuring phase for the whole run (the refiner
never decides, so every call pays what sampling costs: the refiner's per-call bookkeeping, and
on every `refine_sample_every`-th call the launch timers and reading them). The programs are
otherwise the same kernels. Calls are interleaved A/B in rounds; the table gives each side's
median and the ratio of medians per round, then the median ratio. Also reported: what a sampled
call adds in Python (switching the timers on and off, reading the counters twice), timed alone.

Run it on a quiet machine; the load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import novaforge
from novaforge.bench.workloads import build_inference_model, input_ids
from novaforge.codegen.cpu import refine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=40, help="calls per side per round")
    ap.add_argument("--every", type=int, default=8, help="refine_sample_every")
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    refine.SAMPLES = 10**9  # never decide: sampling all along
    model, vocab = build_inference_model(a.model)
    ids = input_ids(vocab, a.batch, a.seq)
    plain = novaforge.compile(model, freeze=True)
    sampled = novaforge.compile(model, freeze=True, refine=True, refine_sample_every=a.every)
    with torch.no_grad():
        ref = plain(ids).last_hidden_state
        got = sampled(ids).last_hidden_state
        assert torch.equal(ref, got), "the two programs differ"
    assert sampled.stats().program.refiner is not None, "refine=True did not attach a refiner"

    def burst(fn) -> list[float]:
        ts = []
        with torch.no_grad():
            for _ in range(a.calls):
                t0 = time.perf_counter()
                fn(ids)
                ts.append((time.perf_counter() - t0) * 1e3)
        return ts

    ratios, med_a, med_b = [], [], []
    for r in range(a.rounds):
        order = [("plain", plain), ("sampled", sampled)] if r % 2 == 0 else [("sampled", sampled), ("plain", plain)]
        got = {name: statistics.median(burst(fn)) for name, fn in order}
        med_a.append(got["plain"])
        med_b.append(got["sampled"])
        ratios.append(got["sampled"] / got["plain"])
    program = sampled.stats().program
    bound = program.refiner.current  # (a frozen model's program takes the input ids alone)
    t0 = time.perf_counter()
    for _ in range(2000):  # what a sampled call adds besides the timers themselves
        bound.lib.nf_prof_set(1)
        bound._launch_totals()
        bound.lib.nf_prof_set(0)
        bound._launch_totals()
    readout_us = (time.perf_counter() - t0) / 2000 * 1e6
    launches = len(program.info.get("launch_keys") or [])
    print(f"\n{a.model} b{a.batch} x {a.seq}, {torch.get_num_threads()} threads, refine_sample_every={a.every}, "
          f"{launches} timed launches per sampled call, {a.rounds} rounds x {a.calls} calls per side")
    print("| round | refine=False ms | refine=True (sampling) ms | ratio |")
    print("| --- | --- | --- | --- |")
    for i, (x, y, q) in enumerate(zip(med_a, med_b, ratios, strict=True)):
        print(f"| {i + 1} | {x:.3f} | {y:.3f} | {q:.4f} |")
    print(f"\nmedian ratio sampling / plain: {statistics.median(ratios):.4f} "
          f"(overhead {100 * (statistics.median(ratios) - 1):+.2f}%)")
    print(f"one sampled call's switch and two counter readouts: {readout_us:.1f} us (the timers' own cost, "
          f"two omp_get_wtime per launch, is inside the calls above)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

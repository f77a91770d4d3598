"""Latency of one program for every length against a static compile of that length (issue 16),
both entry points, interleaved in one process (host noise moves per-process figures by 10-20%).

    PYTHONPATH=src python benchmarks/dynamic_latency.py --model gpt2 --points 32,128,512 --rounds 15

Runners, each called once per round in turn, medians printed (ms):
  nf-static   novaforge.compile(model, tiered=False): a program for this length
  nf-shared   novaforge.compile(model, dynamic={"input_ids": {1: (2, 4096)}}): one program, all lengths
  tc-static   torch.compile(model, backend="novaforge", dynamic=False)
  tc-shared   torch.compile(model, backend="novaforge", dynamic=True)
Every runner's output is checked against eager (max abs difference < 1e-4) before timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", help="gpt2, bert or llama (benchmark size; -tiny for tests)")
    ap.add_argument("--points", default="32,128,512")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    import novaforge
    from novaforge.bench.workloads import build_inference_model

    torch.set_num_threads(2)
    model, vocab = build_inference_model(a.model)
    g = torch.Generator().manual_seed(0)
    nf_shared = novaforge.compile(model, backend="cpu", dynamic={"input_ids": {1: (2, 4096)}})
    load0 = os.getloadavg()[0]
    print("| length | nf static | nf shared | shared / static | tc static | tc shared | shared / static |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.points.split(",")):
        ids = torch.randint(0, vocab, (1, n), generator=g)
        torch._dynamo.reset()
        runners = {"nf-static": novaforge.compile(model, backend="cpu", tiered=False), "nf-shared": nf_shared,
                   "tc-static": torch.compile(model, backend="novaforge", dynamic=False),
                   "tc-shared": torch.compile(model, backend="novaforge", dynamic=True)}
        ts: dict[str, list[float]] = {k: [] for k in runners}
        with torch.no_grad():
            ref = model(input_ids=ids).last_hidden_state
            for k, f in runners.items():
                f(input_ids=ids)
                diff = (f(input_ids=ids).last_hidden_state - ref).abs().max().item()
                assert diff < 1e-4, (k, diff)
            for _ in range(a.rounds):
                for k, f in runners.items():
                    t0 = time.perf_counter()
                    f(input_ids=ids)
                    ts[k].append(time.perf_counter() - t0)
        m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        print(f"| {n} | {m['nf-static']:.1f} | {m['nf-shared']:.1f} | {m['nf-shared'] / m['nf-static']:.3f} | "
              f"{m['tc-static']:.1f} | {m['tc-shared']:.1f} | {m['tc-shared'] / m['tc-static']:.3f} |", flush=True)
    print(f"\nload average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()

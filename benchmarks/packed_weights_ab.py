"""Unpacked against packed weights, in one process, interleaved calls (issue 15).

    PYTHONPATH=src python benchmarks/packed_weights_ab.py --models bert,llama,gpt2 --calls 20

For each model (float32, batch 1 x 128, 2 threads) it compiles `novaforge.compile(model,
freeze=True)` twice, with `pack_weights=False` (the default: weights read where they are, packed
block by block during each GEMM) and `pack_weights=True` (a packed copy made at compile time), checks
both against eager, and times their calls alternately. The ratio of the two medians is what packing
on the fly costs; measured in one process it is far steadier than two processes' walls on a shared
machine. The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import novaforge
from novaforge.bench.workloads import build_inference_model, input_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert,llama,gpt2")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before {os.getloadavg()[0]:.2f}")
    for name in args.models.split(","):
        model = build_inference_model(name)[0]
        ids = input_ids(model.config.vocab_size, 1, 128)
        with torch.no_grad():
            ref = model(ids)[0]
            fns = {p: novaforge.compile(model, freeze=True, pack_weights=p) for p in (False, True)}
            for p, f in fns.items():
                err = (f(ids)[0] - ref).abs().max().item()
                if err > 1e-3:
                    raise SystemExit(f"{name} pack_weights={p}: max error {err:.2e} against eager")
            times: dict[bool, list[float]] = {p: [] for p in fns}
            for _ in range(args.calls):
                for p, f in fns.items():
                    t0 = time.perf_counter()
                    f(ids)
                    times[p].append(time.perf_counter() - t0)
        u, k = (statistics.median(times[p]) * 1e3 for p in (False, True))
        print(f"{name}: unpacked {u:.1f} ms, packed {k:.1f} ms, unpacked / packed {u / k:.3f}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

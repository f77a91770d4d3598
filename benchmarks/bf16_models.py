"""bf16 against float32 novaforge, whole models in one process, interleaved calls (issue 44).

    PYTHONPATH=src python benchmarks/bf16_models.py --models gpt2,bert,llama --calls 20

For each model (batch 1 x 128, 2 threads) it compiles `novaforge.compile(model, freeze=True)` for the
float32 model and for a bf16 copy (`model.to(torch.bfloat16)`), checks both against float32 eager,
times their calls alternately (median of each), and prints the ratio bf16 / float32 with the bf16
path nf_gemm took (its per-path call counts during the bf16 calls: 'amx', 'avx512_bf16' or
'convert'). `--paths amx,convert` compiles once more per forced path (the same bf16 program
family, timed in the same rounds). Load average before and after.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

import novaforge
from novaforge.bench.workloads import build_inference_model, input_ids
from novaforge.codegen.cpu import gemm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="", help="bf16 paths to force as well, e.g. convert,avx512_bf16")
    ap.add_argument("--pack-weights", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before {os.getloadavg()[0]:.2f}; bf16 path {gemm.bf16_path()} "
          f"(hardware {gemm.bf16_hw_path()})")
    forced = [p for p in args.paths.split(",") if p]
    for name in args.models.split(","):
        model = build_inference_model(name)[0].eval()
        model16 = copy.deepcopy(model).to(torch.bfloat16)
        ids = input_ids(model.config.vocab_size, 1, 128)
        with torch.no_grad():
            ref = model(ids)[0]
            fns = {
                "f32": novaforge.compile(model, freeze=True, pack_weights=args.pack_weights),
                "bf16": novaforge.compile(model16, freeze=True, pack_weights=args.pack_weights),
            }
            for p in forced:
                fns[f"bf16-{p}"] = novaforge.compile(model16, freeze=True, pack_weights=args.pack_weights)
            scale = ref.abs().max().item()
            for key, f in fns.items():
                ctx = gemm.forced_bf16_path(key[5:]) if key.startswith("bf16-") else _null()
                with ctx:
                    err = (f(ids)[0].float() - ref).abs().max().item()
                print(f"  {name} {key}: max abs error {err:.3g} ({err / scale:.2%} of max|ref|)")
            times: dict[str, list[float]] = {k: [] for k in fns}
            counts = {k: dict.fromkeys(("convert", "avx512_bf16", "amx"), 0) for k in fns}
            for _ in range(args.calls):
                for key, f in fns.items():
                    ctx = gemm.forced_bf16_path(key[5:]) if key.startswith("bf16-") else _null()
                    with ctx:
                        before = gemm.bf16_counts()
                        t0 = time.perf_counter()
                        f(ids)
                        times[key].append(time.perf_counter() - t0)
                        after = gemm.bf16_counts()
                    for p in after:
                        counts[key][p] += after[p] - before[p]
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        parts = [f"{k} {v:.1f} ms" + (f" ({v / med['f32']:.3f}x f32)" if k != "f32" else "") for k, v in med.items()]
        print(f"{name}: " + ", ".join(parts))
        for k in fns:
            if k != "f32":
                per_call = {p: n // args.calls for p, n in counts[k].items() if n}
                print(f"  {k} nf_gemm bf16 calls per forward by path: {per_call}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()

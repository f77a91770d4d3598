"""Weight-gradient GEMMs (dW = dY^T X, column-major A) of GPT-42M's training step: nf_gemm
against torch.mm (MKL), both into a preallocated output, same process, interleaved.

    PYTHONPATH=src python benchmarks/gemm_weight_grad.py [--threads 2] [--rounds 11]

Prints GFLOP/s and nf_gemm's time over MKL's (median of the rounds, each 0.1 s of calls
cycling over 3 dY matrices). Checks the results against each other first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from novaforge.codegen.cpu.gemm import build

SHAPES = [(1536, 512, 1024), (512, 512, 1024), (2048, 512, 1024), (512, 2048, 1024), (32000, 512, 1024)]
NAMES = ["qkv", "proj", "fc1", "fc2", "LM head"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11)
    a = ap.parse_args()
    lib = build.load(None, ())
    th = a.threads
    torch.set_num_threads(th)
    print(f"dW = dY^T X, {th} thread(s), {a.rounds} rounds; M x K x N: nf GFLOP/s, MKL GFLOP/s, nf time / MKL time")
    for name, (M, N, K) in zip(NAMES, SHAPES, strict=True):
        dy = [torch.randn(K, M) for _ in range(3)]
        x, c, c2 = torch.randn(K, N), torch.empty(M, N), torch.empty(M, N)

        def nf(d):
            lib.nf_sgemm(M, N, K, d.data_ptr(), 1, M, x.data_ptr(), N, 1, c.data_ptr(), N, 0, None, th)

        def mkl(d):
            torch.mm(d.t(), x, out=c2)

        nf(dy[0])
        mkl(dy[0])
        torch.testing.assert_close(c, c2, rtol=1e-4, atol=1e-3)
        times: dict[str, list[float]] = {"nf": [], "mkl": []}
        for _ in range(a.rounds):
            for key, fn in (("nf", nf), ("mkl", mkl)):
                t0, n = time.perf_counter(), 0
                while time.perf_counter() - t0 < 0.1:
                    fn(dy[n % 3])
                    n += 1
                times[key].append((time.perf_counter() - t0) / n)
        tn, tm = statistics.median(times["nf"]), statistics.median(times["mkl"])
        gf = 2 * M * N * K / 1e9
        print(f"{name:8s} {M} x {K} x {N}: {gf / tn:6.0f} {gf / tm:6.0f}  {tn / tm:.3f}")


if __name__ == "__main__":
    main()

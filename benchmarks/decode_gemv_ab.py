"""A/B of nf_gemm's decode-sized streaming path (nf_gemv.cpp) inside one compiled model: the same
novaforge program generates with the path on and off (`ops.gemv_path`), interleaved, tokens checked
against eager's.

    .venv/bin/python benchmarks/decode_gemv_ab.py --model gpt2 --batch 1

Decode rate = batch * 64 / (time of a 66-token generate - time of a 2-token one), median of
`--rounds` interleaved rounds (the prefill and the call's fixed cost cancel)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))

from decode_bench import build_model, prompt_batch  # noqa: E402

import novaforge  # noqa: E402
from novaforge.codegen.cpu.gemm import ops  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, vocab = build_model(args.model)
    ids, mask = prompt_batch(vocab, args.batch, 32)
    compiled = novaforge.compile(model)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    print(f"# {args.model} batch {args.batch} prompt 32, threads {args.threads}, load {os.getloadavg()}")
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=64, min_new_tokens=64, **kw)
        assert torch.equal(compiled.generate(ids, max_new_tokens=64, min_new_tokens=64, **kw), ref)
        rates: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                with ops.gemv_path(on):
                    t = time.perf_counter()
                    compiled.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
                    short = time.perf_counter() - t
                    t = time.perf_counter()
                    out = compiled.generate(ids, max_new_tokens=66, min_new_tokens=66, **kw)
                    full = time.perf_counter() - t
                assert torch.equal(out[:, :ref.shape[1]], ref), "tokens differ from eager's"
                rates[on].append(args.batch * 64 / (full - short))
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print("| path | decode tok/s | rounds |\n|---|---|---|")
    print(f"| streaming (nf_gemv) | {on:.1f} | {', '.join(f'{r:.1f}' for r in rates[True])} |")
    print(f"| dot / row kernels | {off:.1f} | {', '.join(f'{r:.1f}' for r in rates[False])} |")
    print(f"# streaming / other: {on / off:.3f}; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""Accuracy of the low-precision paths against the float32 eager model, on one fixed 512-token text.

    .venv/bin/python benchmarks/quant_accuracy.py --model gpt2
    .venv/bin/python benchmarks/quant_accuracy.py --model llama --precisions int8-weight,bf16

Per precision (each compiled with novaforge.compile, freeze=True, and run once over the text):
max and mean absolute error of the logits, top-1 agreement of the next-token predictions over the
512 positions, and the perplexity of the text against float32 eager's. Precisions: `int8-weight`
and `int8-dynamic` (novaforge.quantize, torchao), `bf16` (model.to(torch.bfloat16)); `fp32` is
novaforge's float32 program (a check of the compiler itself).

The models are the benchmark's GPT-2 124M and Llama-style configs with *random* weights from seed 0
(GPT-2's own weights are not available here), and the text is 512 token ids drawn from seed 0 (no
tokenizer is available either): the same for every precision. A random model's logits are close
together, so its top-1 margins are small and the agreement is a stricter test than a trained
model's; its perplexity is about the vocabulary size, so the *change* is what to read.

Two things are measured apart: what the precision itself costs (eager PyTorch on the same
quantized / bf16 model against float32 eager: the `eager` rows) and what the compiler adds (the
novaforge rows, and their top-1 agreement with eager at the same precision). Bounds (BOUNDS;
docs/cpu-backend.md, "int8"): the precision against float32 (top-1 agreement and perplexity ratio,
set for these random models), and the compiler against eager at the same precision: its mean error
against float32 at most 1.1x eager's and its top-1 agreement with float32 at most 1 point below
eager's. (Top-1 agreement *with* eager at the same precision is shown too, but it is no bound: eager
bf16 rounds after every op and the compiled program rounds once per kernel, so either differs from
the other by as much as from float32 on a random model's near-tied logits.)
A row beyond a bound is printed with "BEYOND BOUND", never hidden.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys

import torch

# (min top-1 agreement with float32, max |perplexity ratio - 1|) per precision, for these random models
BOUNDS = {"fp32": (0.999, 1e-4), "int8-weight": (0.90, 0.01), "int8-dynamic": (0.85, 0.02), "bf16": (0.85, 0.02)}
SAME_PRECISION = (1.1, 0.01)  # novaforge vs eager at its precision: mean-error ratio, top-1 points below


def text_ids(vocab: int, length: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))


def variant(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    import novaforge

    m = copy.deepcopy(model)
    if precision in ("int8-weight", "int8-dynamic"):
        novaforge.quantize(m, precision)
    elif precision == "bf16":
        m = m.to(torch.bfloat16)
    return m


def logits_of(f, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return f(input_ids=ids, use_cache=False).logits.float()[0]


def measure(ref: torch.Tensor, got: torch.Tensor, ids: torch.Tensor) -> dict[str, float]:
    err = (got - ref).abs()
    nll = lambda lg: torch.nn.functional.cross_entropy(lg[:-1], ids[0, 1:]).item()  # noqa: E731
    return {"max_abs": err.max().item(), "mean_abs": err.mean().item(), "ref_absmax": ref.abs().max().item(),
            "top1": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
            "ppl_ratio": math.exp(nll(got) - nll(ref))}


def main(argv: list[str] | None = None) -> int:
    import novaforge
    from novaforge.bench.workloads import build_generation_model
    from novaforge.codegen.cpu import gemm

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--precisions", default="fp32,int8-weight,int8-dynamic,bf16")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, vocab = build_generation_model(f"{args.model}-generate")
    ids = text_ids(vocab)
    ref = logits_of(model, ids)
    ppl = math.exp(torch.nn.functional.cross_entropy(ref[:-1], ids[0, 1:]).item())
    print(f"# {args.model} (random weights, seed 0), 512 seeded token ids, threads {args.threads}, "
          f"torch {torch.__version__}, float32 eager perplexity {ppl:.1f} (vocab {vocab}); "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| precision | runner | max abs err | mean abs err | top-1 agreement | perplexity ratio "
          "| top-1 = eager same precision | nf_gemm path | bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision in [s.strip() for s in args.precisions.split(",") if s.strip()]:
        m = variant(model, precision)
        same = logits_of(m, ids)  # eager at this precision
        i8_before, bf_before = gemm.i8_counts(), gemm.bf16_counts()
        got = logits_of(novaforge.compile(m, freeze=True), ids)
        i8 = {k: v - i8_before[k] for k, v in gemm.i8_counts().items() if v > i8_before[k]}
        bf = {k: v - bf_before[k] for k, v in gemm.bf16_counts().items() if v > bf_before[k]}
        path = ", ".join([f"int8 {k} x{v}" for k, v in i8.items()] + [f"bf16 {k} x{v}" for k, v in bf.items()]) or "f32"
        lo, hi = BOUNDS[precision]
        base = measure(ref, same, ids)
        for runner, logits in (("eager", same), ("novaforge", got)):
            r = measure(ref, logits, ids)
            agree = (logits.argmax(-1) == same.argmax(-1)).float().mean().item()
            ok = r["top1"] >= lo and abs(r["ppl_ratio"] - 1) <= hi
            if runner == "novaforge":
                ok = ok and r["mean_abs"] <= SAME_PRECISION[0] * max(base["mean_abs"], 1e-6) \
                    and r["top1"] >= base["top1"] - SAME_PRECISION[1]
            bound = (f"top-1 >= {lo:.0%}, ppl within {hi:.0%}"
                     + (", error <= 1.1x eager's" if runner == "novaforge" else "")
                     + ("" if ok else " BEYOND BOUND"))
            print(f"| {precision} | {runner} | {r['max_abs']:.2e} (of {r['ref_absmax']:.2f}) | {r['mean_abs']:.2e} | "
                  f"{r['top1']:.2%} | {r['ppl_ratio']:.5f} | {'' if runner == 'eager' else f'{agree:.2%}'} | "
                  f"{path if runner == 'novaforge' else ''} | {bound} |")
    print(f"# load after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

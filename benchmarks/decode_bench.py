"""Decoding benchmark: eager, Inductor and novaforge `generate()` in one process, against the
memory-bandwidth roof measured in the same process.

    .venv/bin/python benchmarks/decode_bench.py --model gpt2 --batch 1 --new-tokens 128
    .venv/bin/python benchmarks/decode_bench.py --model llama --batch 8 --sampling top-p

Every runner gets its own copy of the model, built from the same seed (bit-identical weights),
and the same prompt (batch > 1: left-padded rows of different lengths with an attention mask).
Per runner: the first call (which compiles) generates all tokens and is compared with eager's
per row; then `--repeats` rounds of a one-token generate (time to the first token: the prefill
and one step) and a full generate, interleaved. Decode rate = batch * (new - 1) / (median full -
median one-token), so the first token and the fixed cost of a call are excluded. `min_new_tokens
= new` keeps an end-of-sequence token from stopping a row early (a standard processor, on every
runner alike). Sampling is seeded (`torch.manual_seed(SAMPLE_SEED)` before every call), so its
tokens are comparable with eager's too.

The roof: one decode step reads every weight once (an embedding table no other module uses only a
row of it: not counted; tied weights once; a torchao int8 weight as its int8 data and scales), so
tokens/s <= batch * read bandwidth / weight bytes, per runner (`-int8` runners: the model quantized
with `novaforge.quantize(model, "int8-weight")`, torchao int8 weight-only; `-bf16` runners: the model
cast to bfloat16; their tokens are compared with eager's on the same quantized or cast model, run
automatically, and the share of new tokens equal to float32 eager's is reported). The read bandwidth is the
best of a torch sum and a GEMV over 1 GiB buffers (larger than the last-level cache) with the
same thread count. KV-cache reads are not in the roof (they are < 3% of the weights at batch 1,
prompt 32 + 128 new; more at batch 8).

`--forward-share` also reports the share of a decode step spent inside the forward call (the
rest is `generate()`'s own Python: logits processors, stopping criteria, cache bookkeeping).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from novaforge.bench.measure import decode_weight_bytes

SAMPLE_SEED = 1234
SAMPLING = {"greedy": {"do_sample": False},
            "top-p": {"do_sample": True, "temperature": 0.8, "top_k": 0, "top_p": 0.9}}
BASE_RUNNERS = ("eager", "inductor", "inductor-static", "novaforge", "novaforge-dynamo")
# a runner name's precision suffix: -int8 = novaforge.quantize(m, "int8-weight"), -bf16 = m.to(torch.bfloat16)
PRECISIONS = ("-int8", "-bf16")
RUNNERS = BASE_RUNNERS + tuple(f"{r}{p}" for p in PRECISIONS for r in BASE_RUNNERS)


def precision(name: str) -> str:
    """The runner's precision suffix ('' for float32)."""
    return next((p for p in PRECISIONS if name.endswith(p)), "")


def build_model(name: str) -> tuple[torch.nn.Module, int]:
    """GPT2LMHeadModel (default config) or the Llama-style LlamaForCausalLM (hidden 768, 12
    layers, 12 heads, 4 KV heads, FFN 2048, vocab 32000): random weights from seed 0, fp32, eval."""
    from novaforge.bench.workloads import build_generation_model

    return build_generation_model(f"{name}-generate")


def prompt_batch(vocab: int, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded prompt ids and attention mask. Batch > 1: row i keeps `length - i * length // (2 *
    batch)` tokens, left-padded (pad id 0, mask 0)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch):
        pad = i * length // (2 * batch)
        ids[i, :pad] = 0
        mask[i, :pad] = 0
    return ids, mask


def read_bandwidth() -> float:
    """Bytes/s of a streaming read over 1 GiB: the best of a sum and a GEMV, 5 tries each."""
    best = 0.0
    x = torch.ones(2**28)
    w, v = x.view(2**15, 2**13), torch.ones(2**13)
    for f in (x.sum, lambda: torch.mv(w, v)):
        f()
        for _ in range(5):
            t0 = time.perf_counter()
            f()
            best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best


@contextlib.contextmanager
def forward_timer(model: torch.nn.Module, compiled: Any, spent: list[float]) -> Iterator[None]:
    """Adds the seconds spent in each forward call to spent[0]: novaforge's compiled call (the
    forward that its generate() installs calls it) or the model's (possibly compiled) forward."""
    if compiled is not None:
        inner = compiled._call

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        compiled._call = timed
        try:
            yield
        finally:
            del compiled._call
        return
    inner = model.forward

    @functools.wraps(inner)
    def forward(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    model.forward = forward
    try:
        yield
    finally:
        model.forward = inner


def make_runner(name: str, model: torch.nn.Module) -> tuple[Callable[..., torch.Tensor], Any, dict]:
    """(generate, the novaforge CompiledModule or None, extra generate kwargs) for a runner; a
    name ending in -int8 runs on the model quantized by novaforge.quantize (torchao int8 weights),
    one ending in -bf16 on the model cast to bfloat16."""
    if name.endswith("-int8"):
        import novaforge

        novaforge.quantize(model, "int8-weight")
    elif name.endswith("-bf16"):
        model.to(torch.bfloat16)
    name = name.removesuffix(precision(name))
    if name == "eager":
        return model.generate, None, {}
    if name in ("inductor", "inductor-static"):
        model.forward = torch.compile(model.forward)
        return model.generate, None, ({"cache_implementation": "static"} if name == "inductor-static" else {})
    if name == "novaforge":
        import novaforge

        compiled = novaforge.compile(model, freeze=True)
        return compiled.generate, compiled, {}
    if name == "novaforge-dynamo":
        import novaforge  # noqa: F401 - registers the backend

        model.forward = torch.compile(model.forward, backend="novaforge")
        return model.generate, None, {"cache_implementation": "static"}
    raise ValueError(f"unknown runner {name!r} (one of {', '.join(RUNNERS)})")


def run_one(name: str, args: argparse.Namespace, ids: torch.Tensor, mask: torch.Tensor,
            want: torch.Tensor | None, want_fp32: torch.Tensor | None) -> dict[str, Any]:
    model, _ = build_model(args.model)
    generate, compiled, extra = make_runner(name, model)
    wbytes = decode_weight_bytes(model)
    kw = {**SAMPLING[args.sampling], **extra, "attention_mask": mask, "pad_token_id": 0}

    def call(n: int) -> torch.Tensor:
        if kw["do_sample"]:
            torch.manual_seed(SAMPLE_SEED)
        with torch.no_grad():
            return generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

    t0 = time.perf_counter()
    out = call(args.new_tokens)
    first_s = time.perf_counter() - t0
    rows_equal = None if want is None else [bool(torch.equal(out[i], want[i])) for i in range(out.shape[0])]
    same = None if want_fp32 is None else out[:, ids.shape[1]:] == want_fp32[:, ids.shape[1]:]
    agree = None if same is None else same.float().mean().item()
    # (greedy: after the first differing token, the rest follow another prefix)
    first_diff = None if same is None or bool(same.all()) else int((~same).any(0).nonzero()[0, 0]) + 1
    call(1)
    full, one = [], []
    for _ in range(args.repeats):
        for n, times in ((1, one), (args.new_tokens, full)):
            t0 = time.perf_counter()
            call(n)
            times.append(time.perf_counter() - t0)
    decode_s = statistics.median(full) - statistics.median(one)
    row = {"runner": name, "first_call_s": first_s, "ttft_ms": 1e3 * statistics.median(one),
           "decode_tok_s": args.batch * (args.new_tokens - 1) / decode_s, "rows_equal": rows_equal,
           "agree_fp32": agree, "first_diff": first_diff,
           "full_ms": [round(1e3 * t) for t in full], "out": out, "weight_bytes": wbytes}
    if args.forward_share:
        spent = [0.0]
        with forward_timer(model, compiled, spent):
            t0 = time.perf_counter()
            call(args.new_tokens)
            total = time.perf_counter() - t0
        row["forward_share"] = spent[0] / total
    if compiled is not None:
        row["programs"] = compiled.compilations
    model = compiled = None
    gc.collect()
    return row


def _cells(r: dict[str, Any], eager: dict[str, Any], ind: dict[str, Any] | None, bw: float, batch: int) -> list[str]:
    rate, eq = r["decode_tok_s"], r["rows_equal"]
    roof = batch * bw / r["weight_bytes"]
    return [r["runner"], f"{r['weight_bytes'] / 1e6:.0f}", f"{rate:.1f}", f"{rate / eager['decode_tok_s']:.2f}",
            "" if ind is None else f"{rate / ind['decode_tok_s']:.2f}", f"{100 * rate / roof:.0f}%",
            f"{r['ttft_ms']:.0f}", "" if ind is None else f"{r['ttft_ms'] / ind['ttft_ms']:.2f}",
            f"{r['first_call_s']:.1f}", "–" if eq is None else f"{sum(eq)}/{len(eq)}",
            "–" if r.get("agree_fp32") is None else f"{100 * r['agree_fp32']:.1f}%"
            + ("" if r.get("first_diff") is None else f" (from token {r['first_diff']})"),
            f"{100 * r['forward_share']:.0f}%" if "forward_share" in r else "", str(r.get("programs", ""))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--sampling", choices=tuple(SAMPLING), default="greedy")
    p.add_argument("--runners", default="eager,inductor,novaforge",
                   help=f"comma-separated, of {', '.join(RUNNERS)} (eager always runs first: the reference)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-share", action="store_true",
                   help="also time the forward calls inside one generate (the rest is generate()'s Python)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    model, vocab = build_model(args.model)
    wbytes = decode_weight_bytes(model)
    del model
    ids, mask = prompt_batch(vocab, args.batch, args.prompt)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    bw = read_bandwidth()
    roof = args.batch * bw / wbytes
    print(f"# {args.model} batch {args.batch} prompt {args.prompt} new {args.new_tokens} {args.sampling} "
          f"{SAMPLING[args.sampling]}, threads {args.threads}, torch {torch.__version__}, load before {load}")
    print(f"# read bandwidth {bw / 1e9:.2f} GB/s, fp32 weights {wbytes / 1e6:.1f} MB/step -> roof {roof:.1f} tok/s "
          "(an int8 or bf16 runner's roof: the same bandwidth over its own weight bytes)")
    rows, want = [], {}
    order = ["eager", *(r for r in runners if r != "eager")]  # eager first: the reference, always shown
    for p in PRECISIONS:  # a precision's runners are compared with eager at that precision
        if any(precision(r) == p for r in order) and f"eager{p}" not in order:
            order.append(f"eager{p}")
    order.sort(key=lambda r: (("", *PRECISIONS).index(precision(r)), not r.startswith("eager")))
    for name in order:
        suffix = precision(name)
        row = run_one(name, args, ids, mask, want.get(suffix), want.get("") if suffix else None)
        if name == f"eager{suffix}":
            want[suffix] = row["out"]
        rows.append(row)
        print(f"#   {name}: done ({row['first_call_s']:.1f} s first call)", file=sys.stderr)
    eager = rows[0]
    print("| runner | weights MB/step | decode tok/s | x eager fp32 | x inductor (same precision) | of roof | TTFT ms "
          "| TTFT / inductor | first call s | rows = eager (same precision) | new tokens = eager fp32's "
          "| forward share | programs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        suffix = precision(r["runner"])
        ind = next((x for x in rows if x["runner"] == "inductor" + suffix), None)
        print("| " + " | ".join(_cells(r, eager, ind, bw, args.batch)) + " |")
    print(f"# load after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

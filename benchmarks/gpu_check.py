"""One-call GPU check of the Triton backend (issue 5): correctness and timings of novaforge and
its peers in one process, sized to finish in under 8 minutes on one H200.

    PYTHONPATH=src python benchmarks/gpu_check.py --out $OUT              # the GPU machine
    PYTHONPATH=src python benchmarks/gpu_check.py --dry-run --out /tmp/x  # CPU, Triton interpreter, tiny shapes

Parts, in order; each is guarded (a failure is recorded with its error and the script goes on)
and skipped once the time budget (--budget, seconds) is spent:
 1. the device, and the configurator's target description;
 2. matmul: square 1024..8192 and the GPT-42M training shapes, TF32 (float32 inputs) and
    bfloat16: novaforge (the configurator's choice) against torch.matmul (cuBLAS, TF32 allowed),
    both timed as CUDA-graph replays of back-to-back calls, with ||C - C64|| / ||C64|| against a
    float64 product of the same inputs and the geometric mean of the speedups per dtype;
 3. inference of GPT2Model and the Llama-style model of ANCHORS.md (random weights, eval),
    batch 16 x seq 1024, bfloat16: eager, torch.compile and novaforge -- compile time (first
    call, empty caches), latency (median of timed calls), peak memory
    (torch.cuda.max_memory_allocated over the timed calls) and ||y - y_eager|| / ||y_eager||;
 4. GPT2Model in float32 with TF32 math: novaforge against eager at full float32 precision;
 5. diagnostics: the matmul table with the other operand loader (pointer vs TMA descriptors), and
    GPT2Model with novaforge's matmul kernels replaced by torch.matmul (cuBLAS) and unfused epilogues.
It prints a markdown table last and writes everything to --out/gpu_check.json (and .md).
Environment: fresh TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR / NOVAFORGE_CACHE_DIR under a
temporary directory, so compile times are cold for every runner.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any

T0 = time.perf_counter()

MATMULS = [("square1024", 1024, 1024, 1024), ("square2048", 2048, 2048, 2048), ("square4096", 4096, 4096, 4096),
           ("square8192", 8192, 8192, 8192), ("gpt42m_qkv", 16384, 1536, 512), ("gpt42m_fc", 16384, 2048, 512),
           ("gpt42m_proj", 16384, 512, 2048), ("gpt42m_head", 16384, 32000, 512)]
DRY_MATMULS = [("odd", 37, 45, 29), ("square64", 64, 64, 64)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for gpu_check.json / gpu_check.md")
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes (a test of the script)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which remaining parts are skipped")
    p.add_argument("--skip-models", action="store_true")
    p.add_argument("--skip-compile", action="store_true", help="do not run torch.compile")
    return p.parse_args(argv)


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.dry = args.dry_run
        self.torch = torch
        self.dev = "cpu" if self.dry else "cuda"
        self.results: dict[str, Any] = {"dry_run": self.dry, "parts": {}, "errors": {}, "skipped": []}

    # -- bookkeeping --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - T0

    def part(self, name: str, fn, *a) -> Any:
        if self.elapsed() > self.args.budget:
            print(f"## {name}: skipped (time budget spent at {self.elapsed():.0f} s)", flush=True)
            self.results["skipped"].append(name)
            return None
        print(f"## {name} (t={self.elapsed():.0f} s)", flush=True)
        try:
            out = fn(*a)
            self.results["parts"][name] = out
            return out
        except Exception as e:  # record and continue: one broken part must not hide the others
            traceback.print_exc()
            self.results["errors"][name] = f"{type(e).__name__}: {e}"[:2000]
            return None
        finally:
            self.free()

    def free(self) -> None:
        gc.collect()
        if not self.dry:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    # -- timing -------------------------------------------------------------------------------
    def time_call(self, fn, iters: int) -> list[float]:
        """Wall times of `iters` calls, each synchronized (latency as a user sees it)."""
        out = []
        for _ in range(iters):
            self.sync()
            t = time.perf_counter()
            fn()
            self.sync()
            out.append(time.perf_counter() - t)
        return out

    def time_replay(self, fn) -> float:
        """Seconds per call of `fn` (GPU work only): back-to-back calls captured in one CUDA
        graph, replayed; the median of 5 replays. On the CPU: the median of direct calls."""
        torch = self.torch
        if self.dry:
            return statistics.median(self.time_call(fn, 2))
        fn()
        one = statistics.median(self.time_call(fn, 3))
        reps = max(1, min(50, int(0.03 / max(one, 1e-6))))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / reps)
        del g
        return statistics.median(times)

    # -- parts --------------------------------------------------------------------------------
    def device(self) -> dict[str, Any]:
        torch = self.torch
        import triton

        from novaforge.codegen.registry import get_backend

        be = get_backend("triton")
        info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
                "target": str(be.target()), "backend": be.hash()}
        if not self.dry:
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        try:
            import transformers

            info["transformers"] = transformers.__version__
        except ImportError:
            info["transformers"] = None
        print(json.dumps(info, indent=1), flush=True)
        return info

    def matmul_table(self, loader: str = "auto") -> dict[str, Any]:
        torch = self.torch
        import novaforge

        rows = []
        shapes = DRY_MATMULS if self.dry else MATMULS
        for dtype, kind in ((torch.float32, "tf32"), (torch.bfloat16, "bf16")):
            for name, m, n, k in shapes:
                if self.elapsed() > self.args.budget:
                    self.results["skipped"].append(f"matmul {loader} {kind} {name}")
                    continue
                row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k, "dtype": kind, "loader": loader}
                try:
                    g = torch.Generator(device=self.dev).manual_seed(1000 + m + n + k)
                    a = torch.randn(m, k, device=self.dev, generator=g).to(dtype)
                    b = torch.randn(k, n, device=self.dev, generator=g).to(dtype)
                    ref = a.double() @ b.double()
                    ref_norm = ref.norm().item()
                    torch.set_float32_matmul_precision("high")  # cuBLAS TF32 for the float32 peer
                    t = time.perf_counter()
                    c = novaforge.compile(_mm, backend="triton", cuda_graphs=False, matmul_loader=loader)
                    out = c(a, b)
                    self.sync()
                    row["nf_compile_s"] = time.perf_counter() - t
                    prog = c.stats().program
                    step = prog.steps[0] if len(prog.steps) == 1 and prog.steps[0].kind == "triton" else None
                    if step is not None:  # poison the output: every element must be written
                        out = torch.full((m, n), float("nan"), dtype=dtype, device=self.dev)
                        step.launch(a, b, out)
                        self.sync()
                        row["schedule"] = prog.kernels[0].schedule.key()
                    row["nf_rel_err"] = ((out.double() - ref).norm().item() / ref_norm)
                    row["nf_finite"] = bool(torch.isfinite(out).all().item())
                    del out
                    ct = torch.matmul(a, b)
                    row["torch_rel_err"] = ((ct.double() - ref).norm().item() / ref_norm)
                    del ref
                    row["nf_s"] = self.time_replay(lambda p=prog, a=a, b=b: p.run_eager([a, b]))
                    row["torch_s"] = self.time_replay(lambda a=a, b=b, ct=ct: torch.matmul(a, b, out=ct))
                    flops = 2.0 * m * n * k
                    row["nf_tflops"] = flops / row["nf_s"] / 1e12
                    row["torch_tflops"] = flops / row["torch_s"] / 1e12
                    row["speedup"] = row["torch_s"] / row["nf_s"]
                    del a, b, ct, c, prog, step
                except Exception as e:
                    traceback.print_exc()
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                finally:
                    torch.set_float32_matmul_precision("highest")
                    self.free()
                print(json.dumps(row), flush=True)
                rows.append(row)
        summary = {}
        for kind in ("tf32", "bf16"):
            sp = [r["speedup"] for r in rows if r["dtype"] == kind and "speedup" in r]
            errs = [r["nf_rel_err"] for r in rows if r["dtype"] == kind and "nf_rel_err" in r]
            summary[kind] = {"geomean_speedup": math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None,
                             "max_rel_err": max(errs) if errs else None, "measured": len(sp)}
        print(json.dumps(summary), flush=True)
        return {"rows": rows, "summary": summary}

    def make_model(self, name: str, dtype):
        torch = self.torch
        import transformers

        if self.dry:
            cfgs = {"gpt2": transformers.GPT2Config(use_cache=False, n_layer=1, n_embd=32, n_head=2, vocab_size=97,
                                                    n_positions=32),
                    "llama": transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                      num_key_value_heads=2, intermediate_size=48, vocab_size=97,
                                                      use_cache=False)}
            batch, seq = 1, 8
        else:
            cfgs = {"gpt2": transformers.GPT2Config(use_cache=False),
                    "llama": transformers.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                      num_key_value_heads=4, intermediate_size=2048, vocab_size=32000,
                                                      use_cache=False)}
            batch, seq = 16, 1024
        cfg = cfgs[name]
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(cfg).eval().to(device=self.dev, dtype=dtype)
        g = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(self.dev)
        return model, ids

    def peak_reset(self) -> None:
        if not self.dry:
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float | None:
        return None if self.dry else self.torch.cuda.max_memory_allocated() / 2**30

    def run_model(self, name: str, dtype_name: str = "bf16", runners=("eager", "torch.compile", "novaforge"),
                  tf32: bool = False, nf_options: dict[str, Any] | None = None) -> dict[str, Any]:
        torch = self.torch
        import novaforge

        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        model, ids = self.make_model(name, dtype)
        iters = 1 if self.dry else 10
        res: dict[str, Any] = {"model": name, "dtype": dtype_name, "batch_x_seq": list(ids.shape),
                               "nf_options": nf_options or {}}

        def last(out):
            return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

        with torch.no_grad():
            torch.set_float32_matmul_precision("highest")
            self.peak_reset()
            ref = last(model(ids)).float()
            res["eager"] = {"latency_s": statistics.median(self.time_call(lambda m=model, x=ids: m(x), iters)),
                            "peak_gib": self.peak()}
            print(name, "eager", json.dumps(res["eager"]), flush=True)
            for runner in runners:
                if runner == "eager":
                    continue
                if self.elapsed() > self.args.budget:
                    res[runner] = {"skipped": "time budget"}
                    continue
                if runner == "torch.compile" and (self.dry or self.args.skip_compile):
                    res[runner] = {"skipped": "dry run" if self.dry else "--skip-compile"}
                    continue
                r: dict[str, Any] = {}
                try:
                    if tf32:
                        torch.set_float32_matmul_precision("high")
                    self.free()
                    self.peak_reset()
                    t = time.perf_counter()
                    if runner == "torch.compile":
                        fn = torch.compile(model)
                        out = last(fn(ids))
                    else:
                        fn, out = _nf_compile(novaforge, model, ids, tf32, nf_options or {})
                        out = last(out)
                        r["times"] = {k: round(v, 3) for k, v in fn.stats().times.items()}
                        prog = fn.stats().program
                        r["steps"] = dict(_count(s.kind for s in prog.steps))
                    self.sync()
                    r["compile_s"] = time.perf_counter() - t
                    r["peak_first_call_gib"] = self.peak()
                    out = out.float()
                    r["rel_diff"] = ((out - ref).norm() / ref.norm()).item()
                    r["max_abs_diff"] = (out - ref).abs().max().item()
                    del out
                    t = time.perf_counter()
                    fn(ids)  # novaforge: the CUDA graph is captured here
                    self.sync()
                    r["second_call_s"] = time.perf_counter() - t
                    self.peak_reset()
                    r["latency_s"] = statistics.median(self.time_call(lambda fn=fn, x=ids: fn(x), iters))
                    r["peak_gib"] = self.peak()
                    again = last(fn(ids)).float()
                    r["rel_diff_replay"] = ((again - ref).norm() / ref.norm()).item()
                    del again, fn
                except Exception as e:
                    traceback.print_exc()
                    r["error"] = f"{type(e).__name__}: {e}"[:1000]
                finally:
                    torch.set_float32_matmul_precision("highest")
                    if runner == "torch.compile":
                        torch._dynamo.reset()
                    self.free()
                res[runner] = r
                print(name, runner, json.dumps(r), flush=True)
        e, n, c = res["eager"], res.get("novaforge", {}), res.get("torch.compile", {})
        if "latency_s" in n and "latency_s" in c:
            res["ratios"] = {"latency_vs_compile": n["latency_s"] / c["latency_s"],
                             "compile_time_vs_compile": n["compile_s"] / c["compile_s"],
                             "peak_vs_compile": (n["peak_gib"] / c["peak_gib"]) if c.get("peak_gib") else None}
        if "latency_s" in n:
            res.setdefault("ratios", {})["latency_vs_eager"] = n["latency_s"] / e["latency_s"]
        del model, ids, ref
        return res


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _mm(a, b):
    return a @ b


def _nf_compile(novaforge, model, ids, tf32: bool, options: dict[str, Any]):
    """novaforge.compile and its first call (which compiles), with the default capture, or
    torch.export's if that fails. Returns the compiled callable and the first call's output."""
    fn = novaforge.compile(model, backend="triton", freeze=True, tf32=tf32, **options)
    try:
        return fn, fn(ids)
    except novaforge.CaptureError as e:
        print(f"default capture failed ({str(e)[:200]}); retrying with capture='export'", flush=True)
        fn = novaforge.compile(model, backend="triton", freeze=True, tf32=tf32, capture="export", **options)
        return fn, fn(ids)


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict[str, Any]) -> str:
    lines = []
    mm = results["parts"].get("matmul")
    if mm:
        lines += ["| matmul | dtype | novaforge TFLOP/s | cuBLAS TFLOP/s | speedup | rel err nf | rel err cuBLAS |"
                  " schedule |", "|---|---|---|---|---|---|---|---|"]
        for r in mm["rows"]:
            lines.append(f"| {r['shape']} | {r['dtype']} | {_fmt(r.get('nf_tflops'), '.1f')} | "
                         f"{_fmt(r.get('torch_tflops'), '.1f')} | {_fmt(r.get('speedup'), '.3f')} | "
                         f"{_fmt(r.get('nf_rel_err'), '.2e')} | {_fmt(r.get('torch_rel_err'), '.2e')} | "
                         f"{r.get('schedule', r.get('error', '-'))} |")
        for kind, s in mm["summary"].items():
            lines.append(f"| geomean {kind} | | | | {_fmt(s['geomean_speedup'], '.3f')} (target "
                         f"{'1.0' if kind == 'tf32' else '0.95'}) | max {_fmt(s['max_rel_err'], '.2e')} | | |")
        alt = results["parts"].get("matmul tma loader")
        if alt:
            for kind, s in alt["summary"].items():
                lines.append(f"| geomean {kind}, TMA loader | | | | {_fmt(s['geomean_speedup'], '.3f')} | "
                             f"max {_fmt(s['max_rel_err'], '.2e')} | | |")
        lines.append("")
    models = [v for k, v in results["parts"].items() if k.startswith("model") and v]
    if models:
        lines += ["| model | runner | compile s | latency ms | peak GiB | rel diff vs eager |",
                  "|---|---|---|---|---|---|"]
        for m in models:
            for runner in ("eager", "torch.compile", "novaforge"):
                r = m.get(runner)
                if not r:
                    continue
                if "skipped" in r or "error" in r:
                    lines.append(f"| {m['model']} {m['dtype']} | {runner} | {r.get('skipped', r.get('error', ''))[:60]}"
                                 " | | | |")
                    continue
                lat = r.get("latency_s")
                label = runner + (" " + ",".join(f"{k}={v}" for k, v in m["nf_options"].items())
                                  if runner == "novaforge" and m.get("nf_options") else "")
                lines.append(f"| {m['model']} {m['dtype']} | {label} | {_fmt(r.get('compile_s'), '.1f')} | "
                             f"{_fmt(lat * 1e3 if lat else None, '.2f')} | {_fmt(r.get('peak_gib'), '.2f')} | "
                             f"{_fmt(r.get('rel_diff'), '.2e')} |")
            if m.get("ratios"):
                lines.append(f"| {m['model']} ratios | " + ", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in
                                                                   m["ratios"].items()) + " | | | | |")
        lines.append("")
    if results["errors"]:
        lines.append("errors: " + "; ".join(f"{k}: {v[:120]}" for k, v in results["errors"].items()))
    if results["skipped"]:
        lines.append("skipped: " + ", ".join(results["skipped"]))
    lines.append(f"total {results.get('total_s', 0):.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    scratch = tempfile.mkdtemp(prefix="nf-gpu-check-")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor")
    os.environ["NOVAFORGE_CACHE_DIR"] = os.path.join(scratch, "novaforge")
    os.makedirs(args.out, exist_ok=True)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    chk = Check(args)
    chk.part("device", chk.device)
    chk.part("matmul", chk.matmul_table)
    have_transformers = chk.results["parts"].get("device", {}).get("transformers") is not None
    if args.skip_models:
        chk.results["skipped"].append("models (--skip-models)")
    elif not have_transformers:
        chk.results["skipped"].append("models (transformers is not importable here)")
    else:
        chk.part("model gpt2", chk.run_model, "gpt2")
        chk.part("model llama", chk.run_model, "llama")
        chk.part("model gpt2 tf32", chk.run_model, "gpt2", "fp32", ("eager", "novaforge"), True)
    if not args.dry_run and torch.cuda.get_device_capability() >= (9, 0):
        chk.part("matmul tma loader", chk.matmul_table, "tma")
    if have_transformers and not args.skip_models:
        chk.part("model gpt2 cublas matmuls", chk.run_model, "gpt2", "bf16", ("eager", "novaforge"), False,
                 {"matmul_executor": "torch"})
    chk.results["total_s"] = chk.elapsed()
    md = markdown(chk.results)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(chk.results, f, indent=1, default=str)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(md + "\n")
    print("\n" + md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One-call GPU check of the Triton backend (issue 14): correctness and timings of novaforge and
its peers, sized to finish in under 8 minutes on one H200, saving results as it goes.

    PYTHONPATH=src python benchmarks/gpu_check.py --out $OUT              # the GPU machine
    PYTHONPATH=src python benchmarks/gpu_check.py --dry-run --out /tmp/x  # CPU, Triton interpreter, tiny shapes

Parts, in order (groups of parts run in their own worker process, so that a device fault --
an illegal address poisons a CUDA context for good -- or a hang costs only its group):
 [device]  device: versions, device properties, the target `target_from_device` reads;
           probe: the first GPU call -- a small model compiled on the device, called three times,
             so target_from_device, the build-time compile-and-load check (_precompile), the GPU
             launcher and the CUDA-graph runner (eager, capture, replay) all run; prints which ran;
           correctness: every kernel kind on small odd shapes on the device against eager
             (pointwise, cat loads, single-pass and looped reductions, matmul IEEE/TF32/bf16,
             persistent, TMA, batched, a pre-transposed TF32 weight, attention causal/GQA/mask,
             gathers), and the training kernels against torch autograd;
 [matmul]  the matmul table, pointer loader (what models use): square 1024..8192 and the GPT-42M
           training GEMMs (projections, LM head and its dX / dW), TF32 (float32 inputs) and bf16,
           with `b.T` rows (B given as [N, K]: K-major, what TF32 wgmma reads); novaforge (the
           configurator's choice, and the other one-tile/persistent form where the model chose
           persistent) against torch.matmul (cuBLAS), CUDA-graph-timed, ||C - C64|| / ||C64||;
 [model *] GPT2Model and the Llama-style model (ANCHORS.md), batch 16 x 1024, bf16: eager,
           torch.compile, novaforge, in that order in one process per model -- compile time, latency,
           peak memory, difference vs eager, novaforge's fallbacks; then GPT2Model in float32/TF32
           (accuracy) and with cuBLAS matmuls (matmul_executor="torch", a comparison point);
 [tma]     the matmul table with the TMA loader (Hopper), in a fresh process (fresh kernels);
 [training] (second, after the device group) GPT-42M (bf16 autocast, TF32) and GPT-124M (bf16)
           training steps, batch 16 x 1024, AdamW: eager, torch.compile, novaforge through
           torch.compile and novaforge.compile_step (benchmarks/gpu_training.py).
Every row and part is written to --out/parts/*.json when it completes; --out/gpu_check.json and
gpu_check.md (the tables, gpu_report.py; fallbacks to torch are shown as such, never as timings)
are rewritten after each group. Caches (Triton, Inductor, novaforge) are fresh per group, so compile times are
cold for every runner. --budget: no new group or row after it; --limit: workers are killed so
the whole call ends by then.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

T0 = time.time()

# (name, M, N, K, layout): a@b (both row-major), a@b.T (B given as [N, K]), a.T@b (A given as [K, M])
MATMULS = [("square1024", 1024, 1024, 1024, "a@b"), ("square2048", 2048, 2048, 2048, "a@b"),
           ("square4096", 4096, 4096, 4096, "a@b"), ("square4096", 4096, 4096, 4096, "a@b.T"),
           ("square8192", 8192, 8192, 8192, "a@b"), ("square8192", 8192, 8192, 8192, "a@b.T"),
           ("gpt42m_qkv", 16384, 1536, 512, "a@b.T"), ("gpt42m_fc", 16384, 2048, 512, "a@b.T"),
           ("gpt42m_proj", 16384, 512, 2048, "a@b.T"), ("gpt42m_head", 16384, 32000, 512, "a@b.T"),
           ("gpt42m_head_dX", 16384, 512, 32000, "a@b"), ("gpt42m_head_dW", 32000, 512, 16384, "a.T@b")]
DRY_MATMULS = [("odd", 37, 45, 29, "a@b"), ("odd", 37, 45, 29, "a@b.T"), ("square64", 64, 64, 64, "a.T@b")]
DRY_TMA = DRY_MATMULS[2:]  # 16-byte aligned: the TMA loader applies

GROUPS = [("device", ["device", "probe", "correctness"], 150), ("training", ["training"], 300),
          ("model gpt2", ["model gpt2"], 150), ("matmul", ["matmul"], 170), ("model llama", ["model llama"], 150),
          ("model gpt2 variants", ["model gpt2 tf32", "model gpt2 cublas matmuls"], 120),
          ("tma", ["matmul tma"], 110)]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_training  # noqa: E402  (the training part: issue 11's H200 targets)
from gpu_report import markdown  # noqa: E402,F401  (the tables; tests read gpu_check.markdown)

TRAINING = gpu_training.part_training


def groups(dry: bool) -> list[tuple[str, list[str], float]]:
    """The worker groups; a dry run (tiny models) runs the three model groups in one worker."""
    if not dry:
        return GROUPS
    models = [p for g, ps, _ in GROUPS if g.startswith("model") for p in ps]
    out = [g for g in GROUPS if not g[0].startswith("model")]
    out.insert(2, ("models", models, 300))
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for gpu_check.json / gpu_check.md / parts/")
    p.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes (a test of the script)")
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which no new group or row starts")
    p.add_argument("--limit", type=float, default=470.0, help="seconds after which running workers are killed")
    p.add_argument("--group-timeout", type=float, default=0.0, help="cap on every group's seconds (0: per group)")
    p.add_argument("--parts", default="", help="comma-separated part names to run (default: all)")
    p.add_argument("--training", default="", help="training cases MODEL:PRECISION,... (default: "
                   + ",".join(f"{m}:{q}" for m, q in gpu_training.CASES) + ")")
    p.add_argument("--nf-options", default="", help="JSON object of novaforge options for the training runners "
                   "(A/B experiments, e.g. '{\"reduction_outer_tile\": 64}')")
    p.add_argument("--ab-options", default="", help="JSON object of novaforge options for a second compile_step "
                   "runner ('novaforge-step B', options over --nf-options) in the same process: an A/B in one run, "
                   "e.g. '{\"split_reductions\": false}'")
    p.add_argument("--skip-models", action="store_true")
    p.add_argument("--skip-compile", action="store_true", help="do not run torch.compile")
    p.add_argument("--inject-fault", default="", help="tests: comma-separated PART:crash / PART:hang faults")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def slug(name: str) -> str:
    return name.replace(" ", "_").replace(".", "")


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# ===================================================================================== worker


class Check:
    """One worker: runs the parts of one group, writing each part's JSON as it goes."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args, self.torch, self.dry = args, torch, args.dry_run
        self.dev = "cpu" if self.dry else "cuda"
        self.t0 = args.t0 or T0
        self.parts_dir = Path(args.out) / "parts"
        self.broken = ""  # set when the device context is lost: later parts of this worker are skipped

    def elapsed(self) -> float:
        return time.time() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.args.budget

    def save(self, name: str, result: dict[str, Any]) -> None:
        write_json(self.parts_dir / f"{slug(name)}.json", {"name": name, **result})

    def run_part(self, name: str) -> None:
        faults = set(self.args.inject_fault.split(","))
        if self.broken:
            self.save(name, {"status": "error", "error": f"skipped: device context lost ({self.broken[:300]})"})
            return
        print(f"## {name} (t={self.elapsed():.0f} s)", flush=True)
        if f"{name}:crash" in faults:
            os._exit(134)  # a device fault that kills the process
        if f"{name}:hang" in faults:
            time.sleep(3600)
        t = time.perf_counter()
        try:
            out = PARTS[name](self)
            self.save(name, {"status": "ok", "seconds": time.perf_counter() - t, "result": out})
        except Exception as e:  # record and continue: one broken part must not hide the others
            traceback.print_exc()
            f = self.parts_dir / f"{slug(name)}.json"
            partial = json.loads(f.read_text()).get("result") if f.exists() else None  # rows saved so far
            self.save(name, {"status": "error", "seconds": time.perf_counter() - t,
                             "error": f"{type(e).__name__}: {e}"[:2000],
                             **({"result": partial} if partial is not None else {})})
        self.free()

    def free(self) -> None:
        """Release memory; a synchronize that fails means the context is lost (never raises)."""
        gc.collect()
        if self.dry or self.broken:
            return
        try:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        except Exception as e:
            self.broken = f"{type(e).__name__}: {e}"

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

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


def rel(got, want) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


# ----------------------------------------------------------------------------- device parts


def part_device(chk: Check) -> dict[str, Any]:
    torch = chk.torch
    import triton

    from novaforge.codegen.registry import get_backend
    from novaforge.schedule import gpu as sched_gpu

    info: dict[str, Any] = {"torch": torch.__version__, "triton": triton.__version__,
                            "python": sys.version.split()[0], "backend": get_backend("triton").hash()}
    if not chk.dry:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                    capability=list(torch.cuda.get_device_capability()),
                    smem_per_block_optin=getattr(p, "shared_memory_per_block_optin", None))
    t = sched_gpu.default_target()
    info["target"], info["target_source"] = str(t), t.source
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    print(json.dumps(info, indent=1), flush=True)
    return info


def part_probe(chk: Check) -> dict[str, Any]:
    """The first GPU call: compile a small model on the device, call it three times (eager run,
    CUDA-graph capture, replay) and say which of the GPU-only runtime paths ran."""
    torch = chk.torch
    import novaforge
    from novaforge.schedule import gpu as sched_gpu

    torch.manual_seed(0)
    d = 16 if chk.dry else 48
    m = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d),
                            torch.nn.LayerNorm(d), torch.nn.Softmax(-1)).to(chk.dev).eval()
    c = novaforge.compile(m, backend="triton", freeze=True)
    errs = []
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 5, d, device=chk.dev) if chk.dry else torch.randn(5, 33, d, device=chk.dev)
            errs.append(rel(c(x), m(x)))
            chk.sync()
    info = c.stats().program.info()
    target = sched_gpu.target_from_device() if not chk.dry else None
    graphs = info["cuda_graphs"]
    ran = {"target_from_device": target is not None, "precompile": bool(info.get("precompile", {}).get("ran")),
           "gpu_launcher": info["launcher"] == "gpu", "cuda_graph_capture": graphs["captures"] > 0,
           "cuda_graph_replay": graphs["replays"] > 1}
    print("probe ran: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in ran.items())
          + f"; max rel err vs eager {max(errs):.2e}; target {target}", flush=True)
    return {"ran": ran, "rel_err": errs, "ok": max(errs) < 1e-2, "program": info,
            "target": str(target) if target else None}


def part_correctness(chk: Check) -> dict[str, Any]:
    torch = chk.torch
    import novaforge
    from novaforge.codegen.triton import selfcheck

    rows = []
    hopper = chk.dry or torch.cuda.get_device_capability() >= (9, 0)
    for name, fn, inputs, opts, tol in selfcheck.kernel_cases(chk.dev):
        if "tma" in name and not hopper:
            continue
        row: dict[str, Any] = {"name": name}
        try:
            opts = dict(opts)
            ref64, expect = opts.pop("ref64", fn), opts.pop("expect", "")
            c = novaforge.compile(fn, backend="triton", freeze=opts.pop("freeze", False), **opts)
            with torch.no_grad():
                got, want = c(*inputs), fn(*inputs)
                want64 = ref64(*[x.double() if x.is_floating_point() else x for x in inputs])
            chk.sync()
            info = c.stats().program.info()
            row.update(rel_err=rel(got, want), rel_err_fp64=rel(got, want64),
                       kinds=sorted({k["kind"] for k in info["kernels"]}), fallbacks=info["fallbacks"])
            scheds = " ".join(k["schedule"] for k in info["kernels"])
            row["expected"] = (expect[5:] in info) if expect.startswith("info:") else expect in scheds
            row["ok"] = (row["rel_err_fp64"] <= max(tol, 2 * rel(want, want64)) + 1e-7 and not info["fallbacks"]
                         and row["expected"])
        except Exception as e:
            traceback.print_exc()
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:500])
        print(json.dumps(row, default=str)[:400], flush=True)
        rows.append(row)
        chk.free()
    train = selfcheck.training_kernel_checks(chk.dev)
    for r in train:
        print(json.dumps(r)[:300], flush=True)
    return {"cases": rows, "training_kernels": train, "ok": all(r.get("ok") for r in rows + train)}


# ----------------------------------------------------------------------------- matmul table


def _operands(torch, dev, m, n, k, layout, dtype, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(k, m, device=dev, generator=g).to(dtype) if layout == "a.T@b" else \
        torch.randn(m, k, device=dev, generator=g).to(dtype)
    b = torch.randn(n, k, device=dev, generator=g).to(dtype) if layout == "a@b.T" else \
        torch.randn(k, n, device=dev, generator=g).to(dtype)
    return a, b


MM_FNS = {"a@b": lambda a, b: a @ b, "a@b.T": lambda a, b: a @ b.t(), "a.T@b": lambda a, b: a.t() @ b}
MM_ARGS = {"a@b": lambda a, b: (a, b), "a@b.T": lambda a, b: (a, b.t()), "a.T@b": lambda a, b: (a.t(), b)}


def _time_novaforge(chk: Check, a, b, layout: str, flops: float, options: dict[str, Any]) -> dict[str, Any]:
    torch = chk.torch
    import novaforge

    row: dict[str, Any] = {}
    t = time.perf_counter()
    c = novaforge.compile(MM_FNS[layout], backend="triton", cuda_graphs=False, **options)
    out = c(a, b)
    chk.sync()
    row["compile_s"] = time.perf_counter() - t
    prog = c.stats().program
    info = prog.info()
    if info["fallbacks"]:
        row["fallback"] = "; ".join(f"{f['title']}: {f['reason']}" for f in info["fallbacks"])[:400]
    if info["kernels"]:
        k = info["kernels"][0]
        sched = prog.kernels[0].schedule
        row.update(schedule=k["schedule"], persistent=sched.persistent, shared=k.get("shared"),
                   n_regs=k.get("n_regs"), n_spills=k.get("n_spills"),
                   predicted_tflops=flops / sched.predicted_s / 1e12 if sched.predicted_s else None)
        st = prog.steps[0]
        if len(prog.steps) == 1 and st.kind == "triton" and st.args == prog.input_slots:
            # poison the output: every element must be written
            out = torch.full(out.shape, float("nan"), dtype=out.dtype, device=out.device)
            st.launch(a, b, out)
            chk.sync()
    row["out"] = out
    row["s"] = chk.time_replay(lambda: prog.run_eager([a, b]))
    return row


def _other_form(chk: Check, m: int, n: int, k: int, dtype, row: dict[str, Any]) -> str:
    """'on'/'off': the persistent / one-tile form the configurator did not choose, when it exists
    and is predicted within 10% of the choice (worth measuring); '' otherwise."""
    from novaforge.schedule import gpu as sched_gpu

    if "nf_persistent" not in row:
        return ""
    target = sched_gpu.default_target()
    chose = row["nf_persistent"]
    alt = sched_gpu.matmul_schedule(1, m, n, k, dtype, target, persistent=not chose)
    best = sched_gpu.matmul_schedule(1, m, n, k, dtype, target)
    if alt.persistent == chose or alt.predicted_s > 1.1 * best.predicted_s:
        return ""
    return "on" if alt.persistent else "off"


def matmul_table(chk: Check, loader: str) -> dict[str, Any]:
    torch = chk.torch
    rows: list[dict[str, Any]] = []
    shapes = (DRY_MATMULS if loader == "pointer" else DRY_TMA) if chk.dry else MATMULS
    part = "matmul" if loader == "pointer" else "matmul tma"
    for dtype, kind in ((torch.float32, "tf32"), (torch.bfloat16, "bf16")):
        for name, m, n, k, layout in shapes:
            row: dict[str, Any] = {"shape": name, "m": m, "n": n, "k": k, "layout": layout, "dtype": kind,
                                   "loader": loader}
            if chk.over_budget():
                row["skipped"] = "time budget"
                rows.append(row)
                continue
            try:
                a, b = _operands(torch, chk.dev, m, n, k, layout, dtype, 1000 + m + n + k)
                ref = MM_FNS[layout](a.double(), b.double())
                torch.set_float32_matmul_precision("high")  # cuBLAS TF32 for the float32 peer
                flops = 2.0 * m * n * k
                nf = _time_novaforge(chk, a, b, layout, flops, {"matmul_loader": loader})
                out = nf.pop("out")
                row.update({f"nf_{key}": v for key, v in nf.items()})
                row["nf_rel_err"] = rel(out, ref)
                row["nf_finite"] = bool(torch.isfinite(out).all().item())
                del out
                ct = MM_FNS[layout](a, b)
                row["torch_rel_err"] = rel(ct, ref)
                row["torch_s"] = chk.time_replay(lambda a=a, b=b, ct=ct, lay=layout:
                                                 torch.matmul(*MM_ARGS[lay](a, b), out=ct))
                row["nf_tflops"], row["torch_tflops"] = flops / row["nf_s"] / 1e12, flops / row["torch_s"] / 1e12
                row["speedup"] = row["torch_s"] / row["nf_s"]
                if kind == "tf32" and "nf_fallback" not in row and not chk.over_budget():  # rounded to nearest
                    rnd = _time_novaforge(chk, a, b, layout, flops, {"matmul_loader": loader,
                                                                     "matmul_tf32_round": True})
                    row["rounded"] = {"tflops": flops / rnd["s"] / 1e12, "rel_err": rel(rnd.pop("out"), ref),
                                      "fallback": rnd.get("fallback")}
                other = _other_form(chk, m, n, k, dtype, row)
                if loader == "pointer" and other and not chk.over_budget():  # test the model's form choice
                    alt = _time_novaforge(chk, a, b, layout, flops, {"matmul_loader": loader,
                                                                     "matmul_persistent": other})
                    alt.pop("out")
                    row["other_form"] = {"schedule": alt.get("schedule"), "tflops": flops / alt["s"] / 1e12,
                                         "predicted_tflops": alt.get("predicted_tflops"),
                                         "fallback": alt.get("fallback")}
                del a, b, ct, ref
            except Exception as e:
                traceback.print_exc()
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            finally:
                torch.set_float32_matmul_precision("highest")
                chk.free()
            print(json.dumps(row, default=str), flush=True)
            rows.append(row)
            chk.save(part, {"status": "running", "result": {"rows": rows, "summary": mm_summary(rows)}})
            if chk.broken:
                raise RuntimeError(f"device context lost: {chk.broken}")
    return {"rows": rows, "summary": mm_summary(rows)}


def mm_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary = {}
    for kind in ("tf32", "bf16"):
        mine = [r for r in rows if r["dtype"] == kind]
        gen = [r for r in mine if "speedup" in r and "nf_fallback" not in r]
        errs = [r["nf_rel_err"] for r in gen]
        summary[kind] = {"geomean_speedup": math.exp(sum(math.log(r["speedup"]) for r in gen) / len(gen))
                         if gen else None, "max_rel_err": max(errs) if errs else None, "generated": len(gen),
                         "fallbacks": sum("nf_fallback" in r for r in mine),
                         "errors": sum("error" in r for r in mine)}
    return summary


# ------------------------------------------------------------------------------------ models


def make_model(chk: Check, name: str, dtype):
    torch = chk.torch
    import transformers

    if chk.dry:
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
    model = transformers.AutoModel.from_config(cfg).eval().to(device=chk.dev, dtype=dtype)
    g = torch.Generator(device="cpu").manual_seed(0)
    return model, torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(chk.dev)


def run_model(chk: Check, name: str, dtype_name: str = "bf16", runners=("eager", "torch.compile", "novaforge"),
              tf32: bool = False, nf_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runners in this order, one process: eager, torch.compile, novaforge."""
    torch = chk.torch
    import novaforge

    if chk.args.skip_models:
        return {"skipped": "--skip-models"}
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    model, ids = make_model(chk, name, dtype)
    iters = 1 if chk.dry else 10
    res: dict[str, Any] = {"model": name, "dtype": dtype_name, "batch_x_seq": list(ids.shape),
                           "nf_options": nf_options or {}}

    def last(out):
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def peak_reset():
        if not chk.dry:
            torch.cuda.reset_peak_memory_stats()
        return None if chk.dry else torch.cuda.memory_allocated() / 2**30

    def peak():
        return None if chk.dry else torch.cuda.max_memory_allocated() / 2**30

    with torch.no_grad():
        torch.set_float32_matmul_precision("highest")
        base = peak_reset()
        ref = last(model(ids)).float()
        res["eager"] = {"latency_s": statistics.median(chk.time_call(lambda: model(ids), iters)), "peak_gib": peak(),
                        "base_gib": base}
        print(name, "eager", json.dumps(res["eager"]), flush=True)
        for runner in runners[1:]:
            if chk.over_budget():
                res[runner] = {"skipped": "time budget"}
                continue
            if runner == "torch.compile" and (chk.dry or chk.args.skip_compile):
                res[runner] = {"skipped": "dry run" if chk.dry else "--skip-compile"}
                continue
            r: dict[str, Any] = {}
            try:
                if tf32:
                    torch.set_float32_matmul_precision("high")
                chk.free()
                r["base_gib"] = peak_reset()
                t = time.perf_counter()
                if runner == "torch.compile":
                    fn = torch.compile(model)
                    out = last(fn(ids))
                else:
                    fn = novaforge.compile(model, backend="triton", freeze=True, tf32=tf32, **(nf_options or {}))
                    out = last(fn(ids))
                    r["times"] = {k: round(v, 3) for k, v in fn.stats().times.items()}
                    info = fn.stats().program.info()
                    r["steps"] = {"triton": len(info["kernels"]), "torch": len(info["fallbacks"])}
                    r["fallbacks"] = info["fallbacks"][:20]
                    r["precompile"] = info.get("precompile")
                    r["spilling_kernels"] = [k["title"] for k in info["kernels"] if k.get("n_spills")][:20]
                    r["kernels"] = [{key: k.get(key) for key in ("title", "kind", "schedule", "shared", "n_regs",
                                                                 "n_spills")} for k in info["kernels"]]
                chk.sync()
                r["compile_s"] = time.perf_counter() - t
                r["peak_first_call_gib"] = peak()
                out = out.float()
                r["rel_diff"] = ((out - ref).norm() / ref.norm()).item()
                r["max_abs_diff"] = (out - ref).abs().max().item()
                del out
                r["allocated_after_first_gib"] = None if chk.dry else torch.cuda.memory_allocated() / 2**30
                t = time.perf_counter()
                fn(ids)  # novaforge: the CUDA graph is captured here
                chk.sync()
                r["second_call_s"] = time.perf_counter() - t
                # (run 2: novaforge's steady peak was 0.28 GiB above its first call's; this says where)
                r["allocated_after_second_gib"] = None if chk.dry else torch.cuda.memory_allocated() / 2**30
                peak_reset()
                r["latency_s"] = statistics.median(chk.time_call(lambda fn=fn: fn(ids), iters))
                r["peak_gib"] = peak()
                again = last(fn(ids)).float()
                r["rel_diff_replay"] = ((again - ref).norm() / ref.norm()).item()
                if runner == "novaforge":
                    r["cuda_graphs"] = fn.stats().program.info()["cuda_graphs"]
                del again, fn
            except Exception as e:
                traceback.print_exc()
                r["error"] = f"{type(e).__name__}: {e}"[:1000]
            finally:
                torch.set_float32_matmul_precision("highest")
                if runner == "torch.compile":
                    torch._dynamo.reset()
                chk.free()
            res[runner] = r
            print(name, runner, json.dumps(r, default=str)[:2000], flush=True)
            if chk.broken:
                raise RuntimeError(f"device context lost: {chk.broken}")
    e, n, c = res["eager"], res.get("novaforge", {}), res.get("torch.compile", {})
    ratios: dict[str, Any] = {}
    if "latency_s" in n:
        ratios["latency_vs_eager"] = n["latency_s"] / e["latency_s"]
    if "latency_s" in n and "latency_s" in c:
        ratios.update(latency_vs_compile=n["latency_s"] / c["latency_s"],
                      compile_time_vs_compile=n["compile_s"] / c["compile_s"],
                      peak_vs_compile=(n["peak_gib"] / c["peak_gib"]) if c.get("peak_gib") else None)
    res["ratios"] = ratios
    return res


PARTS = {
    "device": part_device, "probe": part_probe, "correctness": part_correctness,
    "matmul": lambda chk: matmul_table(chk, "pointer"),
    "matmul tma": lambda chk: matmul_table(chk, "tma") if chk.dry or chk.torch.cuda.get_device_capability() >= (9, 0)
    else {"skipped": "TMA needs Hopper"},
    "model gpt2": lambda chk: run_model(chk, "gpt2"), "model llama": lambda chk: run_model(chk, "llama"),
    "model gpt2 tf32": lambda chk: run_model(chk, "gpt2", "fp32", ("eager", "novaforge"), True),
    "model gpt2 cublas matmuls": lambda chk: run_model(chk, "gpt2", "bf16", ("eager", "novaforge"), False,
                                                       {"matmul_executor": "torch"}),
    "training": TRAINING,
}


def worker(args: argparse.Namespace) -> int:
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    chk = Check(args)
    parts = [p for g, ps, _ in groups(args.dry_run) if g == args.worker for p in ps]
    wanted = {p.strip() for p in args.parts.split(",") if p.strip()}
    for name in parts:
        if not wanted or name in wanted:
            chk.run_part(name)
    return 3 if chk.broken else 0


# ================================================================================ orchestrator


def collect(out: Path, started: float, plan: list[str]) -> dict[str, Any]:
    parts = {}
    for name in plan:
        f = out / "parts" / f"{slug(name)}.json"
        if f.exists():
            try:
                parts[name] = json.loads(f.read_text())
            except json.JSONDecodeError as e:
                parts[name] = {"status": "error", "error": f"unreadable part file: {e}"}
    return {"parts": parts, "total_s": time.time() - started}


def publish(out: Path, results: dict[str, Any]) -> str:
    md = markdown(results)
    write_json(out / "gpu_check.json", results)
    (out / "gpu_check.md").write_text(md + "\n")
    return md


def _device_result(out: Path) -> dict[str, Any]:
    f = out / "parts" / "device.json"
    try:
        return json.loads(f.read_text()).get("result") or {}
    except (OSError, json.JSONDecodeError):
        return {}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args)
    out = Path(args.out)
    (out / "parts").mkdir(parents=True, exist_ok=True)
    for f in (out / "parts").glob("*.json"):
        f.unlink()
    scratch = Path(tempfile.mkdtemp(prefix="nf-gpu-check-"))
    wanted = {p.strip() for p in args.parts.split(",") if p.strip()}
    plan = [p for _, ps, _ in GROUPS for p in ps if not wanted or p in wanted]
    for gname, gparts, cap in groups(args.dry_run):
        todo = [p for p in gparts if p in plan]
        if not todo:
            continue
        left = args.limit - (time.time() - T0)
        if gname.startswith("model") and _device_result(out).get("transformers", "") is None:
            for p in todo:
                write_json(out / "parts" / f"{slug(p)}.json", {"name": p, "status": "skipped",
                                                               "reason": "transformers is not importable here"})
            continue
        if time.time() - T0 > args.budget or left < 5:
            for p in todo:
                write_json(out / "parts" / f"{slug(p)}.json", {"name": p, "status": "skipped", "reason": "time budget"})
            continue
        timeout = min(cap if not args.group_timeout else args.group_timeout, left)
        env = dict(os.environ)
        for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                         ("NOVAFORGE_CACHE_DIR", "novaforge")):
            env[var] = str(scratch / slug(gname) / sub)
        if args.dry_run:
            env["TRITON_INTERPRET"] = "1"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", gname, "--t0", str(T0), "--out", str(out),
               "--budget", str(args.budget), "--parts", ",".join(todo), "--inject-fault", args.inject_fault,
               "--training", args.training, "--nf-options", args.nf_options, "--ab-options", args.ab_options]
        cmd += [flag for flag, on in (("--dry-run", args.dry_run), ("--skip-models", args.skip_models),
                                      ("--skip-compile", args.skip_compile)) if on]
        print(f"# group {gname}: {', '.join(todo)} (timeout {timeout:.0f} s, t={time.time() - T0:.0f} s)", flush=True)
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc, why = proc.wait(timeout=timeout), ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, why = None, f"worker killed after {timeout:.0f} s (timeout)"
        if rc not in (0, None):
            why = f"worker exited with code {rc}" + (f" (signal {-rc})" if rc < 0 else "")
        for p in todo:  # parts the worker did not finish
            f = out / "parts" / f"{slug(p)}.json"
            prev = json.loads(f.read_text()) if f.exists() else None
            if prev is None or prev.get("status") == "running":
                write_json(f, {**(prev or {}), "name": p, "status": "error",
                               "error": (why or "worker ended without a result") + (
                                   "; partial result kept" if prev else "")})
        publish(out, collect(out, T0, plan))
    md = publish(out, collect(out, T0, plan))
    print("\n" + md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`novaforge bench`: measure novaforge against its peers, in the same run, on this machine.

    novaforge bench --workload gpt2 --runner all            # every CPU runner, batch 1 x 128
    novaforge bench --workload gpt2,bert,llama --batch 1,8
    novaforge bench --workload gpt-42m --runner eager,torch-compile,novaforge
    novaforge bench --workload matmul --runner eager,novaforge
    novaforge bench --device cuda --workload gpt-42m        # bf16, 16 x 1024; JAX too if importable
    novaforge bench --workload gpt2,bert,llama --dtype int8-dynamic   # torchao int8 / ORT quantize_dynamic
    novaforge bench --list                                  # workloads and runners

Each (case, runner) runs in a fresh process, runners interleaved over --procs passes; the
table at the end gives medians over all timed calls with each process's median, setup
(compile/convert) time, peak memory and agreement with eager. Results go to
benchmarks/results/ as JSON (see benchmarks/README.md for the method).

Invariant: the exit status is 0 when the benchmark ran (even if some runners were skipped or
failed: the table says so) and 2 on a usage error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from . import results as res
from .harness import Options, run
from .runners import DTYPES, RUNNERS
from .table import render
from .workloads import WORKLOADS


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    return [int(t) for t in _csv(text)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="novaforge bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="gpt2", help="comma list of workloads (see --list); default gpt2")
    p.add_argument("--runner", default="all", help="comma list of runners or 'all' (applicable ones); default all")
    p.add_argument("--batch", type=_ints, default=None,
                   help="comma list of batch sizes (default: 1 on CPU / 16 on GPU for inference, 4 / 16 for training)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 128 CPU / 1024 GPU inference; "
                                                         "256 / 1024 training; matmul: tokens = batch x seq)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="float32 (CPU default) or bfloat16 (GPU default): bf16 weights for inference and "
                        "generate, autocast for training, OpenVINO's precision hint. int8-weight / int8-dynamic "
                        "(CPU inference and generate only): the model quantized by novaforge.quantize (torchao: "
                        "int8 weights; -dynamic also int8 activations) for novaforge, eager and torch.compile, "
                        "ORT's quantize_dynamic on the export for onnxruntime (int8-dynamic only); correctness vs "
                        "float32 eager (top-1 for logits; generate: tokens equal eager's at the same precision, "
                        "and the share equal to float32 eager's). Runners without the dtype are skipped with the "
                        "reason")
    p.add_argument("--runs", type=int, default=None,
                   help="timed calls per process (default 30 at batch 1, 20 above; 10 for training and matmul)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per process (default 3; 2 for training)")
    p.add_argument("--procs", type=int, default=2, help="processes (interleaved passes) per case and runner; default 2")
    p.add_argument("--threads", type=int, default=None, help="threads for every runner (default: all available cores)")
    p.add_argument("--budget-s", type=float, default=30.0,
                   help="time budget for the timed calls of one process: past it a process stops after 3 calls "
                        "(reported as capped); default 30")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="kill a process running longer; default 1800")
    p.add_argument("--nf-backend", choices=["auto", "cpu", "interpret", "triton"], default="auto",
                   help="novaforge backend (default auto)")
    p.add_argument("--tf32", action="store_true", help="allow TF32 for float32 matmuls on the GPU (all torch runners)")
    p.add_argument("--max-size", type=int, default=None,
                   help="largest square size in the matmul sweep (default 2048 CPU, 8192 GPU)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens each generate workload produces (default 128; 16 for -tiny workloads)")
    p.add_argument("--json", type=Path, default=None, help="results file (default benchmarks/results/<date>-...json)")
    p.add_argument("--no-json", action="store_true", help="do not write a results file")
    p.add_argument("--keep-logs", action="store_true", help="keep the workers' folders (specs, logs) and say where")
    p.add_argument("--list", action="store_true", help="list workloads and runners and exit")
    p.add_argument("--nproc", type=int, default=1,
                   help="processes per training job, launched through torchrun (with --parallel; bench/distributed.py)")
    p.add_argument("--parallel", choices=["fsdp", "tp", "ddp"], default=None,
                   help="distributed training style for --nproc > 1: FSDP2, tensor parallel or DDP (runners: eager, "
                        "torch-compile, novaforge, novaforge-no-overlap)")
    return p


def list_text() -> str:
    lines = ["workloads:"]
    lines += [f"  {w.name:<12} {w.kind:<10} {w.description}" for w in WORKLOADS.values()]
    lines.append("runners:")
    for s in RUNNERS.values():
        missing = s.missing_package()
        lines.append(f"  {s.name:<21} {'/'.join(sorted(s.kinds)):<26} {s.description}"
                     + (f"  [{missing}]" if missing else ""))
    return "\n".join(lines)


def _distributed(args: argparse.Namespace, workloads: list[str]) -> int:
    """`--nproc N --parallel STYLE`: one torchrun job per (training workload, runner)."""
    from . import distributed

    runners = distributed.RUNNERS if args.runner == "all" else _csv(args.runner)
    bad = [r for r in runners if r not in distributed.RUNNERS]
    not_training = [w for w in workloads if WORKLOADS[w].kind != "training"]
    if args.parallel is None or args.nproc < 2 or bad or not_training:
        print(f"novaforge bench: distributed runs need --nproc >= 2, --parallel, training workloads (not "
              f"{not_training}) and runners among {', '.join(distributed.RUNNERS)} (not {bad})", file=sys.stderr)
        return 2
    results = distributed.launch(workloads, runners, args.parallel, args.nproc, batch=(args.batch or [None])[0],
                                 seq=args.seq, warmup=args.warmup, runs=args.runs, threads=args.threads,
                                 nf_backend=args.nf_backend, timeout_s=args.timeout_s)
    print(distributed.render(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list:
        print(list_text())
        return 0
    workloads = _csv(args.workload)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if not unknown and workloads and (args.parallel is not None or args.nproc > 1):
        return _distributed(args, workloads)  # (its own runners: bench/distributed.py RUNNERS)
    bad_runners = [r for r in _csv(args.runner) if r != "all" and r not in RUNNERS]
    if unknown or bad_runners or not workloads:
        parser.print_usage(sys.stderr)
        print(f"novaforge bench: unknown workload(s) {unknown} or runner(s) {bad_runners}; see --list", file=sys.stderr)
        return 2
    if args.procs < 1:
        print("novaforge bench: --procs must be at least 1", file=sys.stderr)
        return 2
    opts = Options(workloads=workloads, runners=_csv(args.runner), batches=args.batch, seq=args.seq,
                   device=args.device, dtype=args.dtype, runs=args.runs, warmup=args.warmup, procs=args.procs,
                   threads=args.threads, budget_s=args.budget_s, timeout_s=args.timeout_s, nf_backend=args.nf_backend,
                   tf32=args.tf32, max_size=args.max_size, keep_logs=args.keep_logs,
                   new_tokens=args.new_tokens)
    payload = run(opts)
    print(render(payload))
    if not args.no_json:
        started = datetime.datetime.fromisoformat(payload["date"])
        path = args.json or res.default_results_path(workloads, args.device, started)
        res.write(path, payload)
        print(f"\nresults: {path}")
    return 0

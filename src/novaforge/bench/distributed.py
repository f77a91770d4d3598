"""`novaforge bench --nproc N --parallel fsdp|tp|ddp`: distributed training steps through torchrun.

    novaforge bench --workload gpt-tiny --runner eager,novaforge --nproc 2 --parallel fsdp --runs 3
    torchrun --nproc-per-node 2 -m novaforge.bench.distributed --workload gpt-42m --runner novaforge \
        --parallel fsdp     # what the command above launches, once per runner

Each runner is launched as one `torchrun` job (`--standalone`, gloo on the CPU, nccl on CUDA):
every rank builds the same nanoGPT workload (`nanogpt.py`, seed 0), shards it in the `--parallel`
style (`fsdp`: fully_shard per block and on the root; `tp`: the MLPs tensor parallel, c_fc
colwise and c_proj rowwise, since nanoGPT's attention fuses q/k/v in one Linear; `ddp`),
compiles it with the runner (`eager`: none; `torch-compile`: Inductor; `novaforge`:
`novaforge.compile`, which goes through Dynamo for distributed models), and runs `--warmup` then
`--runs` AdamW steps on its own batches (tensor parallel: the same batch on every rank). Rank 0
gathers every rank's tokens/s (the rank's tokens over its timed steps' wall time) and peak
resident memory (`ru_maxrss`) and prints one JSON line, which the launcher collects into a table.

Invariant: every rank runs the same steps in the same order (the collectives match); the
report's tokens/s is the sum over ranks (data parallel) or rank 0's (tensor parallel, where the
ranks share each batch).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

PARALLEL = ("fsdp", "tp", "ddp")
# novaforge-no-overlap: novaforge with each collective waited on at once (option overlap_collectives=False)
RUNNERS = ("eager", "torch-compile", "novaforge", "novaforge-no-overlap")
MARK = "NOVAFORGE_DIST_RESULT "


def _shard(model, style: str):
    import torch

    if style == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.h:
            fully_shard(block)
        fully_shard(model)
        return model
    if style == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (torch.distributed.get_world_size(),))
        for block in model.h:
            parallelize_module(block.mlp, mesh, {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
        return model
    return torch.nn.parallel.DistributedDataParallel(model)


def _compiled(model, runner: str, nf_backend: str):
    import torch

    if runner == "torch-compile":
        return torch.compile(model)
    if runner in ("novaforge", "novaforge-no-overlap"):
        import novaforge

        return novaforge.compile(model, backend=nf_backend, overlap_collectives=runner == "novaforge")
    return model


def rank_main(argv: list[str] | None = None) -> int:
    """One rank of one runner (run under torchrun)."""
    import torch
    import torch.distributed as dist

    from .nanogpt import CONFIGS
    from .workloads import build_training_model, training_batches

    p = argparse.ArgumentParser(prog="python -m novaforge.bench.distributed")
    p.add_argument("--workload", default="gpt-tiny")
    p.add_argument("--runner", choices=RUNNERS, default="novaforge")
    p.add_argument("--parallel", choices=PARALLEL, default="fsdp")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--nf-backend", default="auto")
    a = p.parse_args(argv)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // world))
    model = _shard(build_training_model(a.workload), a.parallel)
    step_model = _compiled(model, a.runner, a.nf_backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = CONFIGS[a.workload].vocab_size
    data = training_batches(vocab, a.batch, a.seq, count=2, seed=0 if a.parallel == "tp" else rank)
    from ..runtime.collectives import process_stats

    t_setup = time.perf_counter()
    times, losses = [], []
    comm0 = process_stats()
    for i in range(a.warmup + a.runs):
        idx, targets = data[i % len(data)]
        t0 = time.perf_counter()
        loss = step_model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        if i == a.warmup - 1:
            t_setup = time.perf_counter() - t_setup
            comm0 = process_stats()
    mine = {"rank": rank, "tokens_per_s": a.batch * a.seq * len(times) / max(sum(times), 1e-9),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "first_steps_s": t_setup, "last_loss": losses[-1]}
    comm1 = process_stats()  # collectives in novaforge's graphs: how long their waits blocked (exposed)
    mine["collectives_per_step"] = (comm1["collectives_async"] - comm0["collectives_async"]) / max(a.runs, 1)
    mine["wait_ms_per_step"] = 1e3 * (comm1["wait_blocked_s"] - comm0["wait_blocked_s"]) / max(a.runs, 1)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        total = gathered[0]["tokens_per_s"] if a.parallel == "tp" else sum(g["tokens_per_s"] for g in gathered)
        print(MARK + json.dumps({"workload": a.workload, "runner": a.runner, "parallel": a.parallel, "nproc": world,
                                 "batch": a.batch, "seq": a.seq, "tokens_per_s": total, "ranks": gathered}),
              flush=True)
    dist.destroy_process_group()
    return 0


def launch(workloads: list[str], runners: list[str], parallel: str, nproc: int, *, batch: int | None,
           seq: int | None, warmup: int | None, runs: int | None, threads: int | None, nf_backend: str,
           timeout_s: float) -> list[dict]:
    """One torchrun job per (workload, runner); each job's result (or its error)."""
    out = []
    for workload in workloads:
        for runner in runners:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   "-m", "novaforge.bench.distributed", "--workload", workload, "--runner", runner,
                   "--parallel", parallel, "--nf-backend", nf_backend]
            for flag, value in (("--batch", batch), ("--seq", seq), ("--warmup", warmup), ("--runs", runs),
                                ("--threads", threads)):
                if value is not None:
                    cmd += [flag, str(value)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
                lines = [ln[len(MARK):] for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
                if proc.returncode == 0 and lines:
                    out.append(json.loads(lines[-1]))
                    continue
                error = [_error_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"]
            except subprocess.TimeoutExpired:
                error = [f"timed out after {timeout_s:.0f} s"]
            out.append({"workload": workload, "runner": runner, "parallel": parallel, "nproc": nproc,
                        "error": error[0]})
    return out


def _error_line(text: str) -> str:
    """The line of a failed job's output that says what failed: the last naming an error, else the last
    that is not one of torchrun's banner rules."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and set(ln.strip()) - set("=-")]
    named = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (named or lines or [""])[-1][:300]


def render(results: list[dict]) -> str:
    lines = [f"{'workload':<10} {'parallel':<8} {'runner':<20} {'nproc':>5} {'tokens/s':>10} {'first steps s':>13}"
             "  peak RSS per rank (MiB)  graph collectives / step, their waits' blocked ms / step (rank 0)"]
    for r in results:
        head = f"{r['workload']:<10} {r['parallel']:<8} {r['runner']:<20} {r['nproc']:>5}"
        if "error" in r:
            lines.append(f"{head} {'failed':>10}  {r['error']}")
        else:
            rss = ", ".join(f"{g['peak_rss_mib']:.0f}" for g in r["ranks"])
            g0 = r["ranks"][0]
            comm = f"{g0.get('collectives_per_step', 0):.0f}, {g0.get('wait_ms_per_step', 0):.2f} ms"
            first = max(g.get("first_steps_s", 0.0) for g in r["ranks"])  # (the warm-up steps, compiles included)
            lines.append(f"{head} {r['tokens_per_s']:>10.0f} {first:>13.1f}  {rss:<24}  {comm}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(rank_main())

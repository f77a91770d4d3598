"""The training part of `gpu_check.py` (issue 11's H200 targets): nanoGPT-style GPT training steps
(AdamW, batch 16 x 1024) on the device, runners in this order in one process: eager,
torch.compile (Inductor), novaforge through `torch.compile(backend="novaforge")`, and
`novaforge.compile_step` (forward, backward and AdamW in one program); with `--ab-options`, a fifth
runner "novaforge-step B" compiles the step again with those options over `--nf-options` (an A/B
in the same process, without a second eager and torch.compile).

Per runner: the first step's seconds (compile included, cold caches), the median step time of the
timed steps (synchronized: a step as a training loop sees it), tokens/s, peak allocated memory
(`torch.cuda.max_memory_allocated` over the timed steps, parameters and optimizer state
included), the losses of the first steps against eager's (same weights, same batches), and one
more step under torch.profiler (device time per kernel: the top 25 and the total).
Precisions: "bf16" = bf16 autocast over float32 parameters (nanoGPT's recipe), "tf32" = float32
with TF32 matmuls. A dry run (CPU, Triton interpreter) trains a one-layer, 32-wide GPT at 2 x 16 for 3 steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
import traceback
from typing import Any

CASES = [("gpt-42m", "bf16"), ("gpt-42m", "tf32"), ("gpt-124m", "bf16"), ("gpt-124m", "tf32")]
RUNNERS = ("eager", "torch.compile", "novaforge", "novaforge-step")
STEP_B = "novaforge-step B"  # compile_step again with --ab-options over --nf-options (an A/B in one run)


def _batches(torch, cfg, batch: int, seq: int, n: int, dev: str):
    g = torch.Generator(device="cpu").manual_seed(1234)
    return [(torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev),
             torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)) for _ in range(n)]


def run_case(chk, name: str, prec: str, runners=RUNNERS) -> dict[str, Any]:
    torch = chk.torch
    import novaforge
    from novaforge.bench.nanogpt import CONFIGS, GPT, GPTConfig

    dry = chk.dry
    if dry:  # the interpreter runs every kernel in Python: one small layer, one timed step
        cfg, batch, seq, steps = GPTConfig(n_layer=1, n_embd=32, n_head=2, vocab_size=64, block_size=16), 2, 16, 1
    else:
        cfg, batch, seq, steps = CONFIGS[name], 16, 1024, 8
    warm = 2  # the first call compiles; the second captures CUDA graphs where a runner does
    data = _batches(torch, cfg, batch, seq, warm + steps, chk.dev)
    extra = json.loads(getattr(chk.args, "nf_options", "") or "{}")  # (--nf-options: an A/B experiment)
    ab = json.loads(getattr(chk.args, "ab_options", "") or "{}")
    if ab:
        runners = tuple(runners) + (STEP_B,)
    res: dict[str, Any] = {"model": name, "precision": prec, "batch_x_seq": [batch, seq], "steps": steps,
                           "nf_options": extra, "ab_options": ab}
    eager_losses: list[float] = []

    def autocast():
        if prec == "bf16":
            return torch.autocast(device_type="cpu" if dry else "cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    for runner in runners:
        if chk.over_budget():
            res[runner] = {"skipped": "time budget"}
            continue
        if runner == "torch.compile" and dry:
            res[runner] = {"skipped": "dry run"}
            continue
        r: dict[str, Any] = {}
        try:
            torch.set_float32_matmul_precision("high" if prec == "tf32" else "highest")
            torch.manual_seed(0)
            model = GPT(cfg).to(chk.dev)
            fused = {} if dry else {"fused": True}
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **fused)
            if runner in ("novaforge-step", STEP_B):
                def loss_fn(out, x, y):
                    return out

                nf_opts = {"backend": "triton"} if dry else {}
                step_fn = novaforge.compile_step(model, opt, loss_fn, **nf_opts,
                                                 **({**extra, **ab} if runner == STEP_B else extra))

                def step(x, y):
                    with autocast():
                        return step_fn(x, y)
            else:
                if runner == "torch.compile":
                    fm = torch.compile(model)
                elif runner == "novaforge":
                    fm = torch.compile(model, backend="novaforge",
                                       options={**({"backend": "triton"} if dry else {}), **extra})
                else:
                    fm = model

                def step(x, y):
                    opt.zero_grad(set_to_none=True)
                    with autocast():
                        loss = fm(x, y)
                    loss.backward()
                    opt.step()
                    return loss

            chk.free()
            if not dry:
                torch.cuda.reset_peak_memory_stats()
            losses, times = [], []
            for i, (x, y) in enumerate(data):
                chk.sync()
                t = time.perf_counter()
                loss = step(x, y)
                chk.sync()
                times.append(time.perf_counter() - t)
                losses.append(float(loss.detach().float()))
                if i == 0:
                    r["first_step_s"] = times[0]
                if i == warm - 1 and not dry:
                    torch.cuda.reset_peak_memory_stats()
            if runner.startswith("novaforge"):
                r["programs"] = _program_memory(torch)
                r["allocated_after_gib"] = None if dry else torch.cuda.memory_allocated() / 2**30
            r["profile"] = _profile_step(torch, step, data[-1], dry)
            timed = times[warm:]
            r["step_s"] = statistics.median(timed)
            r["step_s_all"] = [round(t, 5) for t in times]
            r["tokens_per_s"] = batch * seq / r["step_s"]
            r["peak_gib"] = None if dry else torch.cuda.max_memory_allocated() / 2**30
            r["losses"] = losses
            if runner == "eager":
                eager_losses = losses
            elif eager_losses:
                r["max_rel_loss_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, eager_losses, strict=True))
            if runner == "novaforge":
                from novaforge import dynamo as nf_dynamo

                r["fallbacks"] = [str(f)[:200] for f in nf_dynamo.FALLBACKS[-10:]]
            model = opt = step = None  # (free before the next runner)
        except Exception as e:
            traceback.print_exc()
            r["error"] = f"{type(e).__name__}: {e}"[:1500]
        finally:
            torch.set_float32_matmul_precision("highest")
            if runner in ("torch.compile", "novaforge"):
                torch._dynamo.reset()
            chk.free()
        res[runner] = r
        print(name, prec, runner, {k: v for k, v in r.items() if k not in ("step_s_all",)}, flush=True)
        if chk.broken:
            raise RuntimeError(f"device context lost: {chk.broken}")
    e, c = res.get("eager", {}), res.get("torch.compile", {})
    ratios: dict[str, Any] = {}
    for runner in ("novaforge", "novaforge-step", STEP_B):
        n = res.get(runner, {})
        if "step_s" not in n:
            continue
        if "step_s" in e:
            ratios[f"{runner} tokens/s vs eager"] = e["step_s"] / n["step_s"]
        if "step_s" in c:
            ratios[f"{runner} tokens/s vs torch.compile"] = c["step_s"] / n["step_s"]
            ratios[f"{runner} first step vs torch.compile"] = n["first_step_s"] / c["first_step_s"]
            if c.get("peak_gib"):
                ratios[f"{runner} peak vs torch.compile"] = n["peak_gib"] / c["peak_gib"]
    res["ratios"] = ratios
    return res


def _profile_step(torch, step, batch, dry: bool, top: int = 25) -> dict[str, Any]:
    """One more step under torch.profiler: device time per kernel name (the top `top` and the
    total), so a slow runner's time can be placed (attention, GEMMs, pointwise, copies)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([] if dry else [ProfilerActivity.CUDA])
    try:
        with profile(activities=acts) as prof:
            step(*batch)
            if not dry:
                torch.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            t = (getattr(e, "self_device_time_total", 0) or 0) if not dry else e.self_cpu_time_total
            if t > 0 and (dry or str(getattr(e, "device_type", "")).endswith("CUDA")):  # (kernels, not ops)
                rows.append((t, e.key, e.count))
        rows.sort(reverse=True)
        total = sum(t for t, _, _ in rows)
        return {"total_ms": total / 1e3, "kernels": len(rows),
                "top": [{"name": k[:120], "ms": t / 1e3, "calls": c} for t, k, c in rows[:top]]}
    except Exception as e:  # noqa: BLE001 - the profile is a diagnostic; never fail the runner for it
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def _program_memory(torch) -> list[dict[str, Any]]:
    """Where a novaforge runner's memory goes: each live Triton program's arena (held, or taken
    shared), its per-call fresh outputs, its user inputs, and its CUDA graph's static copies."""
    import gc

    from novaforge.codegen.triton.program import TritonProgram, hinted_bytes

    mib = 2**20
    rows = []
    for p in [o for o in gc.get_objects() if type(o) is TritonProgram and o.calls]:
        info = p.info()
        runner = p._graph_runner
        rows.append({
            "arena_mib": round(p.arena_bytes / mib, 1), "arena_shared": p.arena_shared,
            "fresh_mib": round(sum(math.prod(s) * d.itemsize for _, s, d in p.fresh) / mib, 1),
            "user_inputs_mib": round(sum(hinted_bytes(gi.value) for gi in p.graph.inputs
                                         if gi.kind == "user") / mib, 1),
            "static_mib": round(sum(t.numel() * t.element_size() for t in runner.static.values()) / mib, 1)
            if runner else 0.0,
            "graphs": info["cuda_graphs"], "graphs_off": info.get("cuda_graphs_off", ""),
            "steps": len(p.steps), "torch_steps": len(info["fallbacks"]),
            "calls": p.calls})
    return rows


def part_training(chk) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cases = [tuple(c.split(":")) for c in chk.args.training.split(",") if c] or CASES
    for name, prec in cases[:1] if chk.dry else cases:
        key = f"{name} {prec}"
        if chk.over_budget():
            out[key] = {"skipped": "time budget"}
            continue
        out[key] = run_case(chk, name, prec)
        chk.save("training", {"status": "running", "result": out})
    return out


def markdown(result: dict[str, Any]) -> list[str]:
    lines = ["| training | runner | first step s | step ms | tokens/s | peak GiB | max rel loss diff vs eager |",
             "|---|---|---|---|---|---|---|"]
    for key, case in result.items():
        if "skipped" in case:
            lines.append(f"| {key} | skipped: {case['skipped']} | | | | | |")
            continue
        if case.get("nf_options"):
            lines.append(f"| {key} | novaforge options {json.dumps(case['nf_options'])} | | | | | |")
        if case.get("ab_options"):
            lines.append(f"| {key} | {STEP_B}: options {json.dumps(case['ab_options'])} over those | | | | | |")
        for runner in (*RUNNERS, STEP_B):
            r = case.get(runner)
            if r is None:
                continue
            if "skipped" in r or "error" in r:
                lines.append(f"| {key} | {runner} | {(r.get('skipped') or 'ERROR ' + r['error'])[:160]} | | | | |")
                continue
            peak = r.get("peak_gib")
            lines.append(f"| {key} | {runner} | {r['first_step_s']:.1f} | {r['step_s'] * 1e3:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | {'-' if peak is None else f'{peak:.2f}'} | "
                         f"{r.get('max_rel_loss_diff', 0):.1e} |")
        for runner in (*RUNNERS, STEP_B):
            prof = (case.get(runner) or {}).get("profile") or {}
            if prof.get("top"):
                tops = "; ".join(f"{t['name'][:50]} {t['ms']:.2f} ms x{t['calls']}" for t in prof["top"][:6])
                lines.append(f"| {key} profile | {runner} | {prof['total_ms']:.1f} ms in {prof['kernels']} kernels: "
                             f"{tops} | | | | |")
        if case.get("ratios"):
            lines.append(f"| {key} ratios | " + ", ".join(f"{k} {v:.3f}" for k, v in case["ratios"].items())
                         + " | | | | | |")
    return lines + [""]

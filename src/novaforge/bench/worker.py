"""One benchmark process: one runner on one case, measured, written as JSON.

    python -m novaforge.bench.worker SPEC.json OUT.json

The harness starts this in a fresh interpreter for every (case, runner, pass), so no runner
inherits another's compiled code, caches in memory, allocator state or thread pools. The
worker builds the workload (seeded: identical in every process), computes the eager float32
reference where one is compared, prepares the runner, times its first call as setup, checks
the first result against the reference, then times warm-up and measured calls. Under an int8
`dtype` the inference model is quantized with `novaforge.quantize` (torchao) after the float32
reference is taken and inside the timed setup, unless the runner quantizes its own export
(`quantizes_model = False`: ONNX Runtime); the comparison then also reports the mean abs
difference and, for logits, the top-1 agreement with float32 eager.

Invariant: OUT.json is always written (atomically) unless the process itself dies; it says
`ok`, `skipped` (a package the runner needs is missing) or `failed` (with the error).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .. import settings
from .measure import current_rss_mb, decode_weight_bytes, energy_counter, peak_rss_mb, sync_for, time_calls
from .results import dumps
from .runners import INT8_MODES, RUNNERS, load_runner
from .workloads import (
    build_generation_model,
    build_inference_model,
    build_training_model,
    default_new_tokens,
    get,
    input_ids,
    matmul_operands,
    matmul_shapes,
    training_batches,
)


def case_label(workload: str, batch: int, seq: int) -> str:
    return f"{workload} b{batch} s{seq}"


def _environment(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "pid": os.getpid(),
    }
    if spec["device"] == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def _memory(spec: dict[str, Any], base_rss: float | None, prepared) -> dict[str, Any]:
    import torch

    mem: dict[str, Any] = {"peak_rss_mb": peak_rss_mb(), "base_rss_mb": base_rss}
    own = prepared.peak_memory_mb() if prepared is not None and prepared.peak_memory_mb else None
    if own is not None:
        mem.update(peak_mb=own, kind="runner allocator peak")
    elif spec["device"] == "cuda":
        mem.update(peak_mb=torch.cuda.max_memory_allocated() / 2**20, kind="torch.cuda.max_memory_allocated")
    else:
        mem.update(peak_mb=mem["peak_rss_mb"], kind="peak RSS (ru_maxrss)")
    return mem


def _setup(prepared_fn, sync) -> tuple[Any, Any, float, float]:
    t0 = time.perf_counter()
    prepared = prepared_fn()
    t1 = time.perf_counter()
    out = prepared.call()
    sync()
    t2 = time.perf_counter()
    return prepared, out, t1 - t0, t2 - t0


def _reset_cuda_peak(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def compare_with_reference(got, ref, logits: bool) -> dict[str, Any]:
    """Max and mean abs difference to the float32 eager reference; for logits also the share of
    positions whose argmax over the last dimension equals the reference's (top-1 agreement)."""
    if got.shape != ref.shape:
        return {"max_abs_diff": None, "shape_mismatch": [list(got.shape), list(ref.shape)]}
    diff = (got - ref).abs()
    out: dict[str, Any] = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
                           "shape_mismatch": None}
    if logits:
        out["top1_agreement"] = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return out


def _quantized(model, spec: dict[str, Any], runner, row: dict[str, Any]):
    """`model` quantized in place for an int8 dtype (unless the runner quantizes its own export)."""
    if spec["dtype"] in INT8_MODES and getattr(runner, "quantizes_model", True):
        from ..quantize import quantize

        t0 = time.perf_counter()
        quantize(model, spec["dtype"])
        row["quantize_s"] = time.perf_counter() - t0
    return model


def run_inference(spec: dict[str, Any], runner, ctx) -> list[dict[str, Any]]:
    import torch

    from .runners.base import main_tensor, output_is_logits

    on = getattr(runner, "model_device", spec["device"])
    model, vocab = build_inference_model(spec["workload"])
    model.to(on)
    ids = input_ids(vocab, spec["batch"], spec["seq"], on)
    with torch.inference_mode():
        ref_out = model(ids)
        logits, ref = output_is_logits(ref_out), main_tensor(ref_out).float().cpu()
    del ref_out
    if spec["dtype"] not in ("float32", *INT8_MODES) and getattr(runner, "casts_model", True):
        model.to(ctx.torch_dtype)
    gc.collect()
    _reset_cuda_peak(spec["device"])
    base_rss = current_rss_mb()
    sync = sync_for(spec["device"])
    row: dict[str, Any] = {"case": case_label(spec["workload"], spec["batch"], spec["seq"])}
    prepared, out, prepare_s, setup_s = _setup(
        lambda: runner.inference(_quantized(model, spec, runner, row), (ids,), ctx), sync)
    got = prepared.to_tensor(out).float().cpu()
    row.update(prepare_s=prepare_s, setup_s=setup_s, setup_info=prepared.info,
               **compare_with_reference(got, ref, logits))
    if prepared.after_first is not None:
        row.update(prepared.after_first())
    timing = time_calls(prepared.call, sync=sync, warmup=spec["warmup"], runs=spec["runs"], budget_s=spec["budget_s"],
                        energy=_energy(spec))
    row.update(times_ms=timing.times_ms, warmup=timing.warmup, capped=timing.capped, energy_j_per_call=timing.energy_j,
               tokens_per_call=spec["batch"] * spec["seq"], memory=_memory(spec, base_rss, prepared))
    return [row]


def run_training(spec: dict[str, Any], runner, ctx) -> list[dict[str, Any]]:
    on = getattr(runner, "model_device", spec["device"])
    model = build_training_model(spec["workload"], on)
    batches = training_batches(model.config.vocab_size, spec["batch"], spec["seq"], on)
    gc.collect()
    _reset_cuda_peak(spec["device"])
    base_rss = current_rss_mb()
    sync = sync_for(spec["device"])
    prepared, out, prepare_s, setup_s = _setup(lambda: runner.training(model, batches, ctx), sync)
    losses = [float(prepared.to_tensor(out))]
    row: dict[str, Any] = {
        "case": case_label(spec["workload"], spec["batch"], spec["seq"]),
        "prepare_s": prepare_s, "setup_s": setup_s, "setup_info": prepared.info,
    }
    if prepared.after_first is not None:
        row.update(prepared.after_first())
    timing = time_calls(prepared.call, sync=sync, warmup=spec["warmup"], runs=spec["runs"], budget_s=spec["budget_s"],
                        on_result=lambda loss: losses.append(float(prepared.to_tensor(loss))), energy=_energy(spec))
    row.update(times_ms=timing.times_ms, warmup=timing.warmup, capped=timing.capped, energy_j_per_call=timing.energy_j,
               losses=losses, tokens_per_call=spec["batch"] * spec["seq"], memory=_memory(spec, base_rss, prepared))
    return [row]


def run_matmul(spec: dict[str, Any], runner, ctx) -> list[dict[str, Any]]:
    import torch

    shapes = matmul_shapes(spec["workload"], spec["batch"] * spec["seq"], spec["max_size"])
    sync = sync_for(spec["device"])
    rows = []
    budget = max(spec["budget_s"] / max(len(shapes), 1), 2.0)
    for shape in shapes:
        a, b = matmul_operands(shape, ctx.torch_dtype, spec["device"])
        ref = (a.float() @ b.float()).cpu()
        _reset_cuda_peak(spec["device"])
        prepared, out, prepare_s, setup_s = _setup(lambda a=a, b=b: runner.matmul(a, b, ctx), sync)
        got = prepared.to_tensor(out).float().cpu()
        diff = (got - ref).abs().max().item()
        row: dict[str, Any] = {
            "case": f"{shape.label} {shape.m}x{shape.k}x{shape.n}", "shape": [shape.m, shape.k, shape.n],
            "flops": shape.flops, "prepare_s": prepare_s, "setup_s": setup_s, "setup_info": prepared.info,
            "max_abs_diff": diff, "max_rel_diff": diff / max(ref.abs().max().item(), 1e-30),
        }
        if prepared.after_first is not None:
            row.update(prepared.after_first())
        timing = time_calls(prepared.call, sync=sync, warmup=spec["warmup"], runs=spec["runs"], budget_s=budget,
                            energy=_energy(spec))
        row.update(times_ms=timing.times_ms, warmup=timing.warmup, capped=timing.capped,
                   energy_j_per_call=timing.energy_j, memory=_memory(spec, None, prepared))
        rows.append(row)
        del a, b, ref, prepared, out, got
        gc.collect()
        if spec["device"] == "cuda":
            torch.cuda.empty_cache()
    return rows


class _ReadProbe:
    """Bytes/s that a streaming read (a sum over 256 MiB, all threads) reaches here: the roof of
    decoding, which reads every weight once per token. This VM's bandwidth moves by a third from one
    process or minute to the next, so the probe runs beside every timed generate (best of 3 each)
    and the roof is the median of those samples."""

    def __init__(self) -> None:
        import torch

        self.x = torch.ones(64 * 2**20)
        self.x.sum()
        self.samples: list[float] = []

    def sample(self, repeats: int = 3) -> None:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.x.sum()
            best = min(best, time.perf_counter() - t0)
        self.samples.append(self.x.numel() * 4 / best)

    def summary(self) -> dict[str, Any]:
        return {"read_bw_bytes_s": statistics.median(self.samples),
                "read_bw_range": [min(self.samples), max(self.samples)]}


def run_generate(spec: dict[str, Any], runner, ctx) -> list[dict[str, Any]]:
    """Greedy generation: the first call (setup: compiles) generates `new_tokens` and is checked
    token for token against eager's on the same model (quantized or cast for `dtype`; then also
    the share of new tokens equal to float32 eager's); then `runs` times a one-token generate
    (time to the first token: prompt + one step) and `runs` times the full generate, interleaved.
    Decode rate = (new_tokens - 1) / (median full - median one-token)."""
    import torch

    new = int(spec.get("new_tokens") or default_new_tokens(spec["workload"]))
    model, vocab = build_generation_model(spec["workload"])
    ids = input_ids(vocab, spec["batch"], spec["seq"])
    row: dict[str, Any] = {}

    def eager_tokens():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    want32 = None
    if spec["dtype"] != "float32":
        want32 = eager_tokens()
        if spec["dtype"] in INT8_MODES:
            _quantized(model, spec, runner, row)
        else:
            model.to(ctx.torch_dtype)
    want = eager_tokens()
    gc.collect()
    base_rss = current_rss_mb()
    sync = sync_for(spec["device"])
    prepared, out, prepare_s, setup_s = _setup(lambda: runner.generate(model, ids, new, ctx), sync)
    got = prepared.to_tensor(out)
    row.update({
        "case": case_label(spec["workload"], spec["batch"], spec["seq"]),
        "prepare_s": prepare_s, "setup_s": setup_s, "setup_info": prepared.info,
        "tokens_equal": bool(got.shape == want.shape and torch.equal(got, want)),
        "new_tokens": new, "weight_bytes": decode_weight_bytes(model),
    })
    probe = _ReadProbe()
    if want32 is not None and got.shape == want32.shape:  # (greedy: tokens after a first difference follow it)
        row["tokens_agree_fp32"] = (got[:, ids.shape[1]:] == want32[:, ids.shape[1]:]).float().mean().item()
    if prepared.after_first is not None:
        row.update(prepared.after_first())
    full, first = [], []
    t_end = time.perf_counter() + spec["budget_s"]
    for _ in range(spec["warmup"]):
        prepared.call(1)
    for i in range(spec["runs"]):
        for n, times in ((1, first), (new, full)):
            t0 = time.perf_counter()
            prepared.call(n)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        probe.sample()
        if time.perf_counter() > t_end and i >= 1:
            break
    if not probe.samples:  # (no timed run)
        probe.sample(5)
    del probe.x
    row.update(times_ms=full, ttft_ms=first, capped=len(full) < spec["runs"], energy_j_per_call=None,
               memory=_memory(spec, base_rss, prepared), **probe.summary())
    if "programs" in row:
        row["programs_after"] = prepared.after_first()["programs"] if prepared.after_first else None
    return [row]


def _energy(spec: dict[str, Any]):
    return energy_counter(spec["device"])[0]


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from .runners.base import RunContext

    torch.set_num_threads(spec["threads"])
    if spec.get("tf32"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    cache_dir = settings.cache_dir_override()
    cache_state = None
    if spec["runner"].startswith("novaforge") and cache_dir:
        cache_state = "warm" if Path(cache_dir).is_dir() and any(Path(cache_dir).iterdir()) else "cold"
    runner = load_runner(spec["runner"])
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(device=spec["device"], dtype=spec["dtype"], threads=spec["threads"], workdir=workdir,
                     nf_backend=spec["nf_backend"], tf32=bool(spec.get("tf32")))
    kind = get(spec["workload"]).kind
    run = {"inference": run_inference, "training": run_training, "matmul": run_matmul, "generate": run_generate}[kind]
    rows = run(spec, runner, ctx)
    for r in rows:
        r["cache"] = cache_state
    return {"status": "ok", "rows": rows, "env": _environment(spec)}


def _missing_module(e: BaseException, runner: str) -> str | None:
    name = getattr(e, "name", None) or ""
    top = name.split(".")[0]
    spec = RUNNERS.get(runner)
    if isinstance(e, ModuleNotFoundError) and top and spec is not None and top in spec.requires:
        return f"package '{top}' is not installed ({spec.install})"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    t0 = time.perf_counter()
    try:
        result = measure(spec)
    except Exception as e:  # reported, never raised: the harness goes on with the other runners
        missing = _missing_module(e, spec["runner"])
        if missing:
            result = {"status": "skipped", "reason": missing}
        else:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            result = {"status": "failed", "reason": f"{type(e).__name__}: {first}",
                      "traceback": traceback.format_exc()[-4000:]}
    result["wall_s"] = time.perf_counter() - t0
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(dumps(result))
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Refinement from measured run times (`Options.refine`, CPU backend).

Compile time stays zero search: a program is built with the configurator's schedules. With
`refine`, its glue has launch timers that stay off except on sampled calls, and a `Refiner`
decides which program serves each call:

1. measure: after WARMUP calls, every `refine_sample_every`-th call is timed (the timers are on
   for that call alone); after SAMPLES of them, each kernel's measured time per call (all its
   launches) is compared with the model's prediction (`schedule.cpu.predicted_ns` of its
   configure calls).
2. build: the kernels measured more than SLOW x their prediction, taking at least MIN_SHARE of
   the call, with schedule candidates, and not decided before (the store) -- at most
   MAX_KERNELS, largest excess first -- get up to 3 alternative programs, one per variant k
   (each chosen kernel at the configurator's k-th candidate), built in a background thread.
3. try: an alternative's first call is its check: the current program serves the call, the
   alternative then runs on the same inputs and its outputs must match within `close` (another
   summation order at most), else it is dropped. Then sampled calls rotate over the current
   program and the alternatives, ROUNDS times each.
4. keep: per kernel, the variant with the least median time wins where it beats the current
   schedule by more than KEEP_MARGIN. The program with every winner is built (a cache hit when
   it is one of the trials), checked once like a trial, and swapped in between calls; the
   choices go to the store (refine_store.py), so the next process starts with them. Choices
   measured while the machine was busy (1-min load average above BUSY_LOAD_PER_CORE per core)
   serve this process but are not stored.

A failure anywhere (a build error, a mismatch, slower alternatives) leaves the current program
serving and is logged on `novaforge.refine`; `rows()` gives, per kernel, predicted and measured
time, what was tried and what was kept (the report's refinement table).

Invariant: every call is served by the original program or by one whose outputs matched the
program it replaces on a real call's inputs. Programs that write their inputs (mutations, KV
caches), programs for a range of sizes and programs under the numerics check are not refined.
"""

from __future__ import annotations

import contextvars
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ... import logs
from ...ir import Graph
from ...options import Options

WARMUP = 3  # calls before the first sample
SAMPLES = 4  # sampled calls before the decision
SLOW = 1.25  # measured / predicted above which a kernel is refined
MIN_SHARE = 0.005  # of the sampled call's launch time: smaller kernels are not worth a build
MAX_KERNELS = 8
ROUNDS = 4  # sampled calls per program while trying
KEEP_MARGIN = 0.97  # an alternative must take less than this share of the current time

BUSY_LOAD_PER_CORE = 1.0  # above: other work distorted the times (OpenMP loses whole time slices)

_log = logs.get_logger("refine")


def load_per_core() -> float:
    try:
        return os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    except OSError:
        return 0.0


@dataclass
class KernelRefinement:
    """One kernel's row of the refinement report (times: ns per call, all its launches)."""

    key: str
    label: str
    predicted_ns: float
    measured_ns: float = 0.0
    variant: int = 0  # the variant serving now
    tried: dict[int, float] = field(default_factory=dict)  # variant -> median measured ns
    kept: int | None = None  # the variant kept after trying (None: not decided)
    note: str = ""


@dataclass
class _Trial:
    variant: int
    variants: dict[str, int]  # kernel key -> variant of this program
    program: Any
    checked: bool = False
    samples: list[list[float]] = field(default_factory=list)  # per sampled call: seconds per launch


class Refiner:
    def __init__(self, backend: Any, graph: Graph, options: Options, program: Any, target: Any) -> None:
        self.backend, self.graph, self.options, self.target = backend, graph, options, target
        self.every = max(1, options.refine_sample_every)
        self.original = program
        self.current = program
        self.current_variants: dict[str, int] = {k: v for k, (_, _, v) in program.info["kernel_plans"].items()}
        self.calls = 0
        self.sampled = 0
        self.phase = "measure"  # measure | build | try | keep | done
        self.samples: list[list[float]] = []  # the current program's sampled calls
        self.trials: list[_Trial] = []
        self.pending: _Trial | None = None  # the final program, checked on its first call
        self.kernels: dict[str, KernelRefinement] = {}
        self.events: list[str] = []
        self._rotation = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------------------- calls
    def run(self, original: Any, inputs: Any) -> list[torch.Tensor]:
        with self._lock:
            self.calls += 1
            prog, trial, timed = self._pick()
        if trial is not None and not trial.checked:
            return self._check(trial, inputs)
        if not timed:
            return prog.call_timed(inputs)
        launch_s: list[float] = []
        out = prog.call_timed(inputs, launch_s)
        with self._lock:
            (trial.samples if trial is not None else self.samples).append(launch_s)
            self._after_sample()
        return out

    def _pick(self) -> tuple[Any, _Trial | None, bool]:
        """Which program serves this call, as which trial, and whether it is timed (lock held)."""
        if self.phase == "keep" and self.pending is not None:
            return self.pending.program, self.pending, False
        if self.phase in ("done", "build", "keep") or self.calls <= WARMUP or self.calls % self.every:
            return self.current, None, False
        if self.phase == "try":
            unchecked = next((t for t in self.trials if not t.checked), None)
            if unchecked is not None:
                return unchecked.program, unchecked, False
            self._rotation += 1
            k = self._rotation % (len(self.trials) + 1)
            return (self.current, None, True) if k == 0 else (self.trials[k - 1].program, self.trials[k - 1], True)
        return self.current, None, True

    def _check(self, trial: _Trial, inputs: Any) -> list[torch.Tensor]:
        """The current program serves the call; `trial` runs on the same inputs and is kept for
        timing (or swapped in, for the final program) only if its outputs match."""
        ref = self.current.call_timed(inputs)
        with self._lock:
            if trial.checked:  # another thread's call checked it meanwhile
                return ref
        try:
            got = trial.program.call_timed(inputs)
            problem = close(got, ref)
        except Exception as e:  # noqa: BLE001 - a failing alternative changes nothing
            problem = f"{type(e).__name__}: {e}"
        with self._lock:
            if trial.checked:
                return ref
            trial.checked = True
            if trial is self.pending:
                self._finish_keep(problem)
            elif problem:
                self._event(f"variant {trial.variant} dropped: outputs differ ({problem})")
                self.trials.remove(trial)
                for k in trial.variants:
                    self.kernels[k].note = f"variant {trial.variant} differed"
                if not self.trials:
                    self._done("no alternative passed the check")
        return ref

    # ------------------------------------------------------------------------ decisions
    def _after_sample(self) -> None:
        self.sampled += 1
        if self.phase == "measure" and len(self.samples) >= SAMPLES:
            self._decide_what_to_try()
        elif self.phase == "try" and all(len(t.samples) >= ROUNDS for t in self.trials) \
                and len(self.samples) >= ROUNDS:
            self._decide_what_to_keep()

    def _per_kernel(self, program: Any, samples: list[list[float]]) -> dict[str, float]:
        """Median over the sampled calls of each kernel's ns per call (its launches summed)."""
        keys = program.info["launch_keys"]
        per_call: dict[str, list[float]] = {}
        for launch_s in samples:
            sums: dict[str, float] = {}
            for k, s in zip(keys, launch_s, strict=True):
                sums[k] = sums.get(k, 0.0) + s * 1e9
            for k, v in sums.items():
                per_call.setdefault(k, []).append(v)
        return {k: statistics.median(v) for k, v in per_call.items()}

    def _decide_what_to_try(self) -> None:
        plans = self.current.info["kernel_plans"]
        measured = self._per_kernel(self.current, self.samples)
        launches: dict[str, int] = {}  # (identical layers: one kernel, one prediction, several launches)
        for k in self.current.info["launch_keys"]:
            launches[k] = launches.get(k, 0) + 1
        total = sum(measured.values()) or 1.0
        labels = dict(zip(self.current.info["launch_keys"], self.current.info["launch_labels"], strict=True))
        from .refine_store import stored_variants

        decided = stored_variants(self.target)
        slow = []
        for key, (pred, n_variants, variant) in plans.items():
            row = self.kernels[key] = KernelRefinement(key, labels.get(key, "?"), pred * launches.get(key, 1),
                                                       measured.get(key, 0.0), variant)
            pred = row.predicted_ns
            if n_variants <= 1:
                row.note = "no alternative schedule"
            elif key in decided:
                row.note = "decided before (stored)"
            elif row.measured_ns < SLOW * pred:
                row.note = "as predicted"
            elif row.measured_ns < MIN_SHARE * total:
                row.note = "too small to refine"
            else:
                slow.append((row.measured_ns - pred, key, n_variants))
        slow.sort(reverse=True)
        chosen = slow[:MAX_KERNELS]
        if not chosen:
            self._done("every kernel within 1.25x of its prediction, small, or decided")
            return
        self.phase = "build"
        self._event(f"refining {len(chosen)} kernel(s): " + ", ".join(self.kernels[k].label for _, k, _ in chosen))
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._build_trials, chosen), daemon=True,
                                        name="novaforge-refine")
        self._thread.start()

    def _build(self, variants: dict[str, int]) -> Any | None:
        try:
            return self.backend.build(self.graph, self.options, variants={**self.current_variants, **variants})
        except Exception as e:  # noqa: BLE001 - a failed refinement changes nothing
            self._event(f"build failed ({type(e).__name__}: {e}); nothing changes")
            return None

    def _build_trials(self, chosen: list[tuple[float, str, int]]) -> None:
        trials = []
        for k in (1, 2, 3):
            variants = {key: k for _, key, n in chosen if k < n}
            if not variants:
                break
            prog = self._build(variants)
            if prog is not None:
                trials.append(_Trial(k, variants, prog))
        with self._lock:
            self.trials = trials
            self.samples = []  # the current program is measured again, interleaved with the trials
            if trials:
                self.phase = "try"
            else:
                self._done("no alternative could be built")

    def _decide_what_to_keep(self) -> None:
        current = self._per_kernel(self.current, self.samples)
        winners: dict[str, int] = {}
        for key, row in self.kernels.items():
            best_v, best_t = row.variant, current.get(key, float("inf"))
            row.measured_ns = best_t
            for t in self.trials:
                if key in t.variants:
                    row.tried[t.variant] = self._per_kernel(t.program, t.samples).get(key, float("inf"))
            if not row.tried:
                continue
            for v, ns in sorted(row.tried.items()):
                if ns < KEEP_MARGIN * best_t:
                    best_v, best_t = v, ns
            row.kept = best_v
            if best_v != row.variant:
                winners[key] = best_v
        self.trials = []
        self.samples = []
        if not winners:
            self._store()
            self._done("no alternative was faster; the model's schedules stay")
            return
        self.phase = "keep"
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._build_final, winners), daemon=True,
                                        name="novaforge-refine")
        self._thread.start()

    def _build_final(self, winners: dict[str, int]) -> None:
        prog = self._build(winners)
        with self._lock:
            if prog is None:
                self._done("the refined program could not be built")
            else:
                self.pending = _Trial(-1, winners, prog)

    def _finish_keep(self, problem: str) -> None:
        pending, self.pending = self.pending, None
        assert pending is not None
        if problem:
            for k in pending.variants:
                self.kernels[k].kept, self.kernels[k].note = self.kernels[k].variant, "refined program differed"
            self._done(f"the refined program's outputs differ ({problem}); the model's schedules stay")
            return
        self.current = pending.program
        self.current_variants.update(pending.variants)
        for k, v in pending.variants.items():
            self.kernels[k].variant = v
        self._store()
        self._done("swapped in: " + ", ".join(f"{self.kernels[k].label} -> variant {v}"
                                             for k, v in pending.variants.items()))

    def _store(self) -> None:
        from .refine_store import store_choices

        load = load_per_core()
        if load > BUSY_LOAD_PER_CORE:
            self._event(f"choices kept in this process only: the 1-min load average was {load:.2f} per core "
                        f"(> {BUSY_LOAD_PER_CORE}); times measured on a busy machine are not stored")
            return
        records = {k: {"variant": r.kept, "label": r.label, "predicted_ns": r.predicted_ns,
                       "tried_ns": {str(v): ns for v, ns in r.tried.items()}, "measured_ns": r.measured_ns}
                   for k, r in self.kernels.items() if r.kept is not None}
        if records:
            store_choices(self.target, records)

    def _done(self, why: str) -> None:
        self.phase = "done"
        self.trials = []
        self.graph = None  # (nothing is built any more: the graph's constants are not kept alive)
        self._event(why)

    def _event(self, text: str) -> None:
        self.events.append(f"call {self.calls}: {text}")
        _log.info("%s", text)

    # --------------------------------------------------------------------------- report
    def wait(self, timeout: float | None = None) -> None:
        """Wait for a background build (tests, benchmarks)."""
        t = self._thread
        if t is not None:
            t.join(timeout)

    def rows(self) -> list[KernelRefinement]:
        with self._lock:
            return sorted(self.kernels.values(), key=lambda r: -r.measured_ns)


def close(got: list[torch.Tensor], ref: list[torch.Tensor]) -> str:
    """'' when `got` matches `ref` up to another summation order, else what differs. Integer and
    bool outputs must be equal; floating ones within 1e-3 relative plus 1e-4 of the output's
    scale (bf16/fp16: 3e-2 and 1e-2)."""
    if len(got) != len(ref):
        return f"{len(got)} outputs instead of {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if g.shape != r.shape or g.dtype != r.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)} instead of {r.dtype}{list(r.shape)}"
        if not r.is_floating_point():
            if not torch.equal(g, r):
                return f"output {i} differs"
            continue
        low = r.dtype in (torch.bfloat16, torch.float16)
        rtol, stol = (3e-2, 1e-2) if low else (1e-3, 1e-4)
        g64, r64 = g.double(), r.double()
        if not torch.equal(torch.isnan(g64), torch.isnan(r64)):
            return f"output {i}: NaN in other places"
        fin = torch.isfinite(r64)
        scale = r64[fin].abs().max().item() if fin.any() else 0.0
        err = (g64 - r64).abs()
        bad = fin & (err > rtol * r64.abs() + stol * scale)
        if bad.any() or not torch.equal(g64[~fin & ~torch.isnan(r64)], r64[~fin & ~torch.isnan(r64)]):
            return f"output {i}: max abs difference {err[fin].max().item():.3g} (scale {scale:.3g})"
    return ""


def attach(backend: Any, graph: Graph, options: Options, program: Any) -> None:
    """Give `program` a Refiner where refinement applies (else log why not)."""
    why = ""
    if program.symbolic is not None:
        why = "a program for a range of sizes"
    elif graph.mutations or any(s.kind == "input" and s.written for s in program.slots):
        why = "it writes its inputs"
    elif program.observer is not None:
        why = "the numerics check observes it"
    elif not any(n > 1 for _, n, _ in program.info.get("kernel_plans", {}).values()):
        why = "no kernel has an alternative schedule"
    if why:
        _log.info("refine: program not refined: %s", why)
        return
    program.refiner = Refiner(backend, graph, options, program, backend.target())
    program.info["refine"] = True


def wait_idle(program: Any, timeout: float = 120.0) -> None:
    """Block until `program`'s refiner has no background build (tests, benchmarks)."""
    r = getattr(program, "refiner", None)
    end = time.monotonic() + timeout
    while r is not None and r._thread is not None and r._thread.is_alive() and time.monotonic() < end:
        r.wait(0.05)

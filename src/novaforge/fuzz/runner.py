"""Running the fuzzer: seeds in subprocess batches, findings grouped, the first of each shrunk.

    novaforge fuzz --seeds 1000 [--start 0] [--backend cpu|triton] [--jobs 2] [--batch 50] [--numerics]
                   [--timeout 120] [--shrink 1] [--out results.jsonl] [--repro DIR]

Each batch of seeds runs in a worker process (`python -m novaforge.fuzz.runner --worker`),
which announces every seed before running it and reports its result as one JSON line. A
worker that dies (a segfault in generated code, an abort) or exceeds the per-seed timeout is
killed; its current seed is recorded as a crash (or hang) and a new worker continues with the
next seed, so a crash is a finding, not the end of the run. Triton workers run with
TRITON_INTERPRET=1 (the CPU interpreter).

Results are grouped by finding signature; the first `--shrink` programs of each signature are
shrunk (in a worker too) and printed as runnable snippets. `KNOWN` lists failures already
reported to the owners of the code at fault: they are counted apart, and `RunSummary.unknown`
excludes them. Delete an entry when its fix lands.
Everything is deterministic per (seed, backend): rerun one seed with `--start S --seeds 1`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TAG = "@@nf-fuzz "

# (kind, regex on the finding's detail or signature, backends, what it is): failures found by this
# fuzzer and reported to the owners of the code at fault (docs/debugging.md lists reproducers).
# They are counted apart so CI fails only on new ones; delete an entry when its fix lands.
KNOWN: list[tuple[str, str, tuple[str, ...], str]] = [
    ("layout", r"is not contiguous", ("interpret",),
     "backend='interpret': results computed from a transposed copy (x.t().contiguous() ** 2) keep its strides"),
]


def known(kind: str, text: str, backend: str = "") -> str:
    for k, pat, backends, what in KNOWN:
        if k == kind and (not backend or backend in backends) and re.search(pat, text):
            return what
    return ""


# ------------------------------------------------------------------------------- worker side
def _emit(obj: dict) -> None:
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


def worker(backend: str, seeds: Iterable[int], abort_at: int | None = None, numerics: bool = False) -> None:
    import warnings

    from .generator import generate
    from .oracle import check

    warnings.filterwarnings("ignore")
    for seed in seeds:
        _emit({"start": seed})
        if seed == abort_at:  # the runner's self-test: a worker dying inside a seed
            os.abort()
        t0 = time.perf_counter()
        try:
            prog = generate(seed, backend)
        except Exception as e:  # noqa: BLE001 - a generator bug: reported, never hidden
            _emit({"seed": seed, "status": "generator_error", "detail": f"{type(e).__name__}: {e}"})
            continue
        try:
            f = check(prog, backend, {"check": "numerics"} if numerics else None)
        except Exception as e:  # noqa: BLE001 - an oracle bug or an eager failure
            _emit({"seed": seed, "status": "oracle_error", "detail": f"{type(e).__name__}: {e}"})
            continue
        res = {"seed": seed, "secs": round(time.perf_counter() - t0, 3), "steps": len(prog.steps)}
        if f is None:
            res["status"] = "ok"
        else:
            res.update(status="refusal" if f.kind == "refusal" else "finding", kind=f.kind, signature=f.signature,
                       detail=f.detail if f.kind in ("refusal", "crash") else f"call {f.call}: {f.detail}")
        _emit(res)


def worker_shrink(backend: str, seed: int, budget: int, numerics: bool = False) -> None:
    import warnings

    from .generator import generate
    from .oracle import check
    from .shrink import shrink

    warnings.filterwarnings("ignore")
    options = {"check": "numerics"} if numerics else None
    prog = generate(seed, backend)
    f = check(prog, backend, options)
    if f is None or not f.is_failure():
        _emit({"seed": seed, "status": "not_reproduced"})
        return

    def checker(p):
        try:
            return check(p, backend, options)
        except ValueError:
            return None

    small, sf, n = shrink(prog, f, backend, budget=budget, checker=checker)
    _emit({"seed": seed, "status": "shrunk", "checks": n, "steps": len(small.steps), "kind": sf.kind,
           "detail": sf.detail, "snippet": small.snippet(backend, sf.detail)})


# ------------------------------------------------------------------------------- parent side
@dataclass
class RunSummary:
    backend: str
    results: list[dict] = field(default_factory=list)
    shrunk: dict[str, dict] = field(default_factory=dict)  # signature -> shrink result

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.get("status") == status)

    def failures(self) -> list[dict]:
        return [r for r in self.results if r.get("status") in ("finding", "died", "hang", "generator_error",
                                                                 "oracle_error")]

    @property
    def unknown(self) -> list[dict]:
        return [r for r in self.failures() if not r.get("known")]

    def by_signature(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for r in self.failures():
            out.setdefault(r.get("signature") or r["status"], []).append(r)
        return out

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.failures():
            k = r.get("kind") or r["status"]
            out[k] = out.get(k, 0) + 1
        return out

    def text(self) -> str:
        n = len(self.results)
        lines = [f"novaforge fuzz, {self.backend} backend: {n} seeds, {self.count('ok')} passed, "
                 f"{self.count('refusal')} refused (clear UnsupportedError), {len(self.failures())} failed "
                 f"({len(self.unknown)} not known)"]
        if self.failures():
            lines.append("failures by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(self.kinds().items())))
        for sig, rs in sorted(self.by_signature().items(), key=lambda kv: -len(kv[1])):
            k = rs[0].get("known", "")
            seeds = ", ".join(str(r["seed"]) for r in rs[:8]) + (" ..." if len(rs) > 8 else "")
            lines.append(f"\n== {sig}: {len(rs)} seeds ({seeds})" + (f"  [known: {k}]" if k else ""))
            lines.append("   " + rs[0].get("detail", "").replace("\n", "\n   ")[:600])
            sh = self.shrunk.get(sig)
            if sh and sh.get("snippet"):
                lines.append(f"   shrunk to {sh['steps']} steps in {sh['checks']} checks:")
                lines.append("   " + sh["snippet"].replace("\n", "\n   "))
        refusals: dict[str, int] = {}
        for r in self.results:
            if r.get("status") == "refusal":
                refusals[r.get("signature", "")] = refusals.get(r.get("signature", ""), 0) + 1
        if refusals:
            lines.append("\nrefusals: " + ", ".join(f"{k} x{v}" for k, v in sorted(refusals.items())))
        return "\n".join(lines)


def _worker_env(backend: str) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("NOVAFORGE_PROGRESS", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    return env


class _Worker:
    def __init__(self, args: list[str], env: dict[str, str], out: queue.Queue, wid: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "novaforge.fuzz.runner", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
        self.current: int | None = None
        self.started = time.monotonic()
        self.wid = wid
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._read, args=(out,), daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self, out: queue.Queue) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(TAG):
                out.put((self.wid, json.loads(line[len(TAG):])))
        out.put((self.wid, {"eof": True}))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-6:]

    def kill(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def run(seeds: list[int], backend: str = "cpu", jobs: int = 1, batch: int = 50, timeout: float = 120.0,
        shrink: int = 1, shrink_budget: int = 60, out: Path | None = None, progress: bool = False,
        worker_args: list[str] | None = None) -> RunSummary:
    """Run `seeds` in worker processes; `worker_args` are extra worker flags (self-tests)."""
    summary = RunSummary(backend)
    env = _worker_env(backend)
    todo = [seeds[i:i + batch] for i in range(0, len(seeds), batch)]
    q: queue.Queue = queue.Queue()
    workers: dict[int, tuple[_Worker, list[int]]] = {}
    next_id = 0
    sink = out.open("a") if out is not None else None
    t0 = time.monotonic()

    def start(chunk: list[int]) -> None:
        nonlocal next_id
        if not chunk:
            return
        w = _Worker(["--worker", "--backend", backend, "--list", ",".join(map(str, chunk)), *(worker_args or [])], env,
                    q, next_id)
        workers[next_id] = (w, list(chunk))
        next_id += 1

    def record(res: dict) -> None:
        if res.get("status") in ("finding", "died", "hang"):
            res["known"] = known(res.get("kind", res["status"]), res.get("detail", "") + " " + res.get("signature", ""),
                                 backend)
        summary.results.append(res)
        if sink is not None:
            sink.write(json.dumps({"backend": backend, **res}) + "\n")
            sink.flush()
        if progress and len(summary.results) % 50 == 0:
            print(f"  {len(summary.results)}/{len(seeds)} seeds, {len(summary.failures())} failed "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)

    while todo or workers:
        while todo and len(workers) < jobs:
            start(todo.pop(0))
        try:
            wid, msg = q.get(timeout=1.0)
        except queue.Empty:
            wid, msg = None, None
        if wid is not None and wid in workers:
            w, left = workers[wid]
            if "start" in msg:
                w.current, w.started = msg["start"], time.monotonic()
            elif "eof" in msg:
                w.proc.wait()
                del workers[wid]
                if w.current is not None and w.current in left:  # died inside a seed
                    record({"seed": w.current, "status": "died", "kind": "crash",
                            "signature": f"died:rc={w.proc.returncode}",
                            "detail": f"worker died (exit {w.proc.returncode}) running seed {w.current}: "
                                      + " | ".join(w.stderr_tail[-3:])})
                    left.remove(w.current)
                    start(left)
            elif "seed" in msg:
                record(msg)
                if msg["seed"] in left:
                    left.remove(msg["seed"])
                w.current = None
        for wid2, (w, left) in list(workers.items()):
            if w.current is not None and time.monotonic() - w.started > timeout:
                w.kill()
                w.proc.wait()
                del workers[wid2]
                record({"seed": w.current, "status": "hang", "kind": "hang", "signature": "hang",
                        "detail": f"seed {w.current} ran longer than {timeout:.0f} s"})
                left.remove(w.current)
                start(left)
    summary.results.sort(key=lambda r: r["seed"])
    if shrink:
        for sig, rs in summary.by_signature().items():
            if rs[0].get("status") != "finding":
                continue
            for r in rs[:shrink]:
                summary.shrunk.setdefault(sig, _shrink_one(backend, r["seed"], shrink_budget, env, timeout * 30,
                                                           worker_args or []))
    if sink is not None:
        sink.close()
    return summary


def _shrink_one(backend: str, seed: int, budget: int, env: dict[str, str], timeout: float,
                extra: list[str]) -> dict:
    try:
        p = subprocess.run([sys.executable, "-m", "novaforge.fuzz.runner", "--worker-shrink", str(seed), "--backend",
                            backend, "--budget", str(budget), *[a for a in extra if a == "--numerics"]],
                           capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "shrink_timeout"}
    for line in p.stdout.splitlines():
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    return {"status": "shrink_failed", "detail": p.stderr[-500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="novaforge fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--backend", choices=["cpu", "triton", "interpret"], default="cpu")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    ap.add_argument("--batch", type=int, default=50, help="seeds per worker process")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per seed (default 120, triton 600)")
    ap.add_argument("--shrink", type=int, default=1, help="programs shrunk per distinct failure (0: none)")
    ap.add_argument("--budget", type=int, default=60, help="checks per shrink")
    ap.add_argument("--out", type=Path, help="append one JSON line per seed to this file")
    ap.add_argument("--repro", type=Path, help="write each shrunk reproducer to DIR/<backend>-<seed>.py")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-shrink", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--list", help=argparse.SUPPRESS)
    ap.add_argument("--abort-at", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--numerics", action="store_true",
                    help="compile with check='numerics' (every kernel against the interpreter, slower)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.backend, [int(s) for s in args.list.split(",") if s], args.abort_at, args.numerics)
        return 0
    if args.worker_shrink is not None:
        worker_shrink(args.backend, args.worker_shrink, args.budget, args.numerics)
        return 0
    timeout = args.timeout or (600.0 if args.backend == "triton" else 120.0)
    seeds = list(range(args.start, args.start + args.seeds))
    summary = run(seeds, args.backend, jobs=args.jobs, batch=args.batch, timeout=timeout, shrink=args.shrink,
                  shrink_budget=args.budget, out=args.out, progress=True,
                  worker_args=["--numerics"] if args.numerics else None)
    print(summary.text())
    if args.repro is not None:
        args.repro.mkdir(parents=True, exist_ok=True)
        for _sig, sh in summary.shrunk.items():
            if sh.get("snippet"):
                (args.repro / f"{args.backend}-{sh['seed']}.py").write_text(sh["snippet"])
    return 1 if summary.unknown else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The OpInfo sweep: PyTorch's own op samples through `torch.compile(backend="novaforge")`.

For every entry of `torch.testing._internal.common_methods_invocations.op_db` (float32, CPU,
the first `samples` sample inputs), a function calling the op on the sample's tensors (other
arguments baked in) is run three ways: eagerly, through Dynamo's `eager` backend (the
reference: an op that backend cannot handle is out of scope) and through novaforge. Each op
gets one verdict:

* `compiled`: every sample matches eager and novaforge built programs with no fallback;
* `fallback`: every sample matches, but some graph ran uncompiled (a clear refusal, logged
  with the op and reason: `dynamo.FALLBACKS`);
* `wrong`: a result differs from eager (values beyond tolerance, dtype or shape);
* `crash`: novaforge raised where the eager backend did not;
* `skipped`: the eager backend itself fails on the op (out of scope).

Random ops (two eager runs with different seeds differ) and ops returning uninitialized memory
(`empty*`) are compared on dtype and shape only.
Ops run in subprocess batches (`run_sweep`), so a crash in generated code is a finding for
that batch's op, not the end of the sweep.

Invariant: a verdict of `compiled` or `fallback` means every sample's outputs matched eager's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

VERDICTS = ("compiled", "fallback", "wrong", "crash", "skipped")
UNINITIALIZED = ("empty", "new_empty")  # ops whose values are whatever the allocator held


@dataclass
class OpResult:
    name: str
    variant: str
    verdict: str
    detail: str = ""
    samples: int = 0


def _op_db() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def _leaves(x: Any) -> list[Any]:
    import torch.utils._pytree as pytree

    return pytree.tree_leaves(x)


def _compare(got: Any, want: Any, random: bool) -> str:
    """'' when `got` matches `want`, else what differs."""
    import torch

    g, w = _leaves(got), _leaves(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, eager has {len(w)}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"output {i}: {type(a).__name__}, eager gives a tensor"
            if a.dtype != b.dtype or a.shape != b.shape:
                return f"output {i}: {a.dtype}{list(a.shape)}, eager {b.dtype}{list(b.shape)}"
            if random:
                continue
            try:
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, equal_nan=True, check_device=True,
                                           check_stride=False)
            except AssertionError as e:
                return f"output {i}: {str(e).strip().splitlines()[0]}"
        elif a != b and not (a != a and b != b):  # NaN == NaN here
            return f"output {i}: {a!r}, eager {b!r}"
    return ""


def _sample_fn(op: Any, sample: Any):
    """(fn, tensors): fn(*tensors) calls the op on the sample, other arguments baked in."""
    import torch
    import torch.utils._pytree as pytree

    flat, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
    tensors = [flat[i] for i in where]

    def fn(*ts):
        leaves = list(flat)
        for i, t in zip(where, ts, strict=True):
            leaves[i] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def _clone(ts: list[Any]) -> list[Any]:
    return [t.clone() for t in ts]


def check_op(op: Any, samples: int = 3) -> OpResult:
    """The verdict for one OpInfo entry (see the module docstring)."""
    import torch
    import torch._dynamo

    from .. import dynamo as nf_dynamo

    res = OpResult(op.name, op.variant_test_name, "compiled")
    try:
        sample_list = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:samples]
    except Exception as e:
        return OpResult(op.name, op.variant_test_name, "skipped", f"no samples: {type(e).__name__}")
    if not sample_list:
        return OpResult(op.name, op.variant_test_name, "skipped", "no float32 samples")
    fell_back = False
    for sample in sample_list:
        fn, tensors = _sample_fn(op, sample)
        try:
            torch.manual_seed(0)
            want = fn(*_clone(tensors))
            torch.manual_seed(1)
            again = fn(*_clone(tensors))
            # random ops, and ops returning uninitialized memory (empty*): dtype and shape only
            random = _compare(again, want, False) != "" or op.name.startswith(UNINITIALIZED)
            torch._dynamo.reset()
            torch.manual_seed(0)
            ref = torch.compile(fn, backend="eager")(*_clone(tensors))
            if _compare(ref, want, random):
                return OpResult(op.name, op.variant_test_name, "skipped", "the eager backend differs from eager")
        except Exception as e:
            return OpResult(op.name, op.variant_test_name, "skipped", f"eager/eager backend: {type(e).__name__}")
        torch._dynamo.reset()
        nf_dynamo.FALLBACKS.clear()
        try:
            torch.manual_seed(0)
            got = torch.compile(fn, backend="novaforge")(*_clone(tensors))
        except Exception as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return OpResult(op.name, op.variant_test_name, "crash", f"{type(e).__name__}: {msg}"[:300], res.samples)
        diff = _compare(got, want, random)
        if diff:
            return OpResult(op.name, op.variant_test_name, "wrong", diff[:300], res.samples)
        if nf_dynamo.FALLBACKS:
            fell_back = True
            res.detail = nf_dynamo.FALLBACKS[0].reason[:300]
        res.samples += 1
    if fell_back:
        res.verdict = "fallback"
    return res


def _run_batch(indices: list[int], samples: int) -> list[OpResult]:
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    logging.getLogger("novaforge").setLevel(logging.ERROR)
    db = _op_db()
    return [check_op(db[i], samples) for i in indices]


def run_sweep(indices: list[int] | None = None, samples: int = 3, batch: int = 40, timeout_s: float = 900,
              log: Any = None) -> list[OpResult]:
    """Every op (or those of `indices`), in subprocess batches; an op whose batch dies or times
    out is a `crash` (ops of the batch are then re-run one by one to find which)."""
    total = len(_op_db()) if indices is None else None
    todo = list(range(total)) if indices is None else list(indices)
    out: list[OpResult] = []
    for start in range(0, len(todo), batch):
        chunk = todo[start:start + batch]
        out.extend(_run_in_subprocess(chunk, samples, timeout_s))
        if log is not None:
            print(f"  {min(start + batch, len(todo))}/{len(todo)} ops: {dict(Counter(r.verdict for r in out))}",
                  file=log, flush=True)
    return out


def _run_in_subprocess(chunk: list[int], samples: int, timeout_s: float) -> list[OpResult]:
    cmd = [sys.executable, "-m", "novaforge.bench.opinfo", "--worker", ",".join(map(str, chunk)),
           "--samples", str(samples)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
        line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("RESULTS ")), None)
        if p.returncode == 0 and line is not None:
            return [OpResult(**r) for r in json.loads(line[len("RESULTS "):])]
        why = f"worker exited {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}"
    except subprocess.TimeoutExpired:
        why = f"worker timed out after {timeout_s:.0f} s"
    if len(chunk) == 1:
        db = _op_db()
        return [OpResult(db[chunk[0]].name, db[chunk[0]].variant_test_name, "crash", why[:300])]
    return [r for i in chunk for r in _run_in_subprocess([i], samples, timeout_s)]


def summarize(results: list[OpResult]) -> dict[str, Any]:
    counts = Counter(r.verdict for r in results)
    in_scope = sum(counts[v] for v in VERDICTS if v != "skipped")
    return {"ops": len(results), "in_scope": in_scope, **{v: counts[v] for v in VERDICTS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m novaforge.bench.opinfo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=3, help="sample inputs per op (default 3)")
    ap.add_argument("--ops", help="comma-separated op names (default: all)")
    ap.add_argument("--json", help="write every op's verdict here")
    args = ap.parse_args(argv)
    if args.worker is not None:
        res = _run_batch([int(i) for i in args.worker.split(",") if i], args.samples)
        print("RESULTS " + json.dumps([asdict(r) for r in res]), flush=True)
        return 0
    db = _op_db()
    indices = None
    if args.ops:
        names = set(args.ops.split(","))
        indices = [i for i, op in enumerate(db) if op.name in names]
    t0 = time.time()
    results = run_sweep(indices, args.samples, log=sys.stderr)
    summary = summarize(results)
    summary["seconds"] = round(time.time() - t0, 1)
    for r in results:
        if r.verdict in ("wrong", "crash", "fallback"):
            print(f"{r.verdict:9s} {r.name}{'.' + r.variant if r.variant else ''}: {r.detail}")
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "ops": [asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

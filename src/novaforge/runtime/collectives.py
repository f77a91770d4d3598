"""Collectives issued asynchronously by the CPU runtime, waited on where the program waits.

A program step that runs one `_c10d_functional` collective (not `wait_tensor`) returns as soon as the
process group has the work: its result tensors (allocated by torch, written by the group's worker
thread) are kept in `Pending`, keyed by the step's output slots, out of the arena. The `wait_tensor`
step of such a slot waits on the tensor (the time it blocks is the exposed communication, recorded),
then copies the result into its own output slot. passes/overlap_collectives.py puts compute between
the two. Everywhere else (the interpreter, a collective whose result something other than a wait
reads) a collective completes at once (ir/extern.py `call_extern`).

Invariant: nothing reads a pending result before its wait (a collective is asynchronous only when
every step that reads its outputs is a wait step), and the inputs the process group may still read
are kept alive unchanged until the wait: all_reduce copies its input before it returns (torch's
functional all_reduce clones it), the other collectives get a copy of their inputs (an arena buffer's
bytes may be reused by a later kernel, a mutated input's rewritten).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..ir import OPS
from ..ir.extern import COLLECTIVE, decode, resolve

WAIT = COLLECTIVE + "wait_tensor.default"
_COPIES_INPUT = (COLLECTIVE + "all_reduce.default",)


def step_collective(st: Any) -> str | None:
    """The collective target a torch step runs: one `_c10d_functional` extern, last, after views only, its
    results the step's outputs; else None."""
    if getattr(st, "kind", None) != "torch" or st.body is None or not st.body.nodes:
        return None
    *views, ext = st.body.nodes
    if not ext.op.startswith("extern") or any(not OPS[m.op].has("view") for m in views):
        return None
    if list(st.body.outputs) != list(ext.outputs):
        return None
    target = str(ext.attrs.get("target", ""))
    return target if target.startswith(COLLECTIVE) else None


def plain_wait(st: Any) -> bool:
    """A step that is `wait_tensor` on its one input, nothing else (the form whose input an asynchronous
    collective's result may be)."""
    return step_collective(st) == WAIT and len(st.body.nodes) == 1 and len(st.ins) == 1 and len(st.outs) == 1


def async_steps(steps: Sequence[Any], output_slots: Sequence[int] = ()) -> set[int]:
    """Indices of the collective steps that may run asynchronously: every reader of their outputs is
    a wait step (and none is an output of the program)."""
    targets = [step_collective(st) for st in steps]
    if all(t is None for t in targets):  # (no collective: every program of one process)
        return set()
    waits = [plain_wait(st) for st in steps]
    readers: dict[int, list[int]] = {}
    for i, st in enumerate(steps):
        # (a generated segment's launches: every slot they take, read or written)
        slots = set(st.ins) | {s for s, _ in st.operands} | set(st.attrs.get("slots", ()))
        for s in slots:
            readers.setdefault(s, []).append(i)
    out = set()
    for i, (st, t) in enumerate(zip(steps, targets, strict=True)):
        if t is None or t == WAIT:
            continue
        if not set(st.outs) & set(output_slots) and all(
                waits[j] for s in st.outs for j in readers.get(s, [])):
            out.add(i)
    return out


_PROCESS = {"collectives_async": 0, "waits": 0, "wait_blocked_s": 0.0}  # over every program of the process


def process_stats() -> dict[str, float]:
    """Asynchronous collectives issued, waits and the seconds they blocked, over this process's programs
    (the bench subtracts two snapshots)."""
    return dict(_PROCESS)


class Pending:
    """Results in flight (slot -> (tensor, inputs kept alive)) and the time waits blocked."""

    def __init__(self) -> None:
        self.results: dict[int, tuple[torch.Tensor, tuple]] = {}
        self.blocked_s = 0.0
        self.waits = 0
        self.issued = 0

    def stats(self) -> dict[str, float]:
        return {"collectives_async": self.issued, "waits": self.waits, "wait_blocked_s": self.blocked_s}


def issue_runner(st: Any, env: list, pending: Pending) -> Callable[[], None]:
    *views, ext = st.body.nodes
    target, spec = ext.attrs["target"], ext.attrs["spec"]
    op = resolve(target)
    copy_inputs = target not in _COPIES_INPUT
    inputs = [(bi.value, s) for bi, s in zip(st.body.inputs, st.ins, strict=True)]
    views = [(m, OPS[m.op].impl) for m in views]
    outs = list(st.outs)

    def run_issue() -> None:
        vals = {v: env[s] for v, s in inputs}
        for m, impl in views:
            vals[m.outputs[0]] = impl([vals[v] for v in m.inputs], m.attrs)
        xs = [vals[v].clone() if copy_inputs else vals[v] for v in ext.inputs]
        args, kwargs = decode(spec, xs)
        res = op(*args, **kwargs)
        res = [res] if isinstance(res, torch.Tensor) else list(res)
        for s, r in zip(outs, res, strict=True):
            pending.results[s] = (r, tuple(xs))
        pending.issued += 1
        _PROCESS["collectives_async"] += 1

    return run_issue


def wait_runner(st: Any, env: list, pending: Pending, fallback: Callable[[], None]) -> Callable[[], None]:
    src, dst = st.ins[0], st.outs[0]
    wait = torch.ops._c10d_functional.wait_tensor.default

    def run_wait() -> None:
        item = pending.results.pop(src, None)
        if item is None:  # (its collective completed synchronously)
            fallback()
            return
        t0 = time.perf_counter()
        r = wait(item[0])
        blocked = time.perf_counter() - t0
        pending.blocked_s += blocked
        pending.waits += 1
        _PROCESS["wait_blocked_s"] += blocked
        _PROCESS["waits"] += 1
        env[dst].copy_(r)

    return run_wait

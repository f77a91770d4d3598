"""Shrinking a failing fuzz program to a minimal reproducer.

`shrink(prog, finding, backend)` applies reductions greedily, each kept only when the smaller
program is still valid (`program.analyze`: eager runs it, exactness requirements hold) and
still fails the same way (`oracle.same_failure`: the same kind for wrong values, the same
signature otherwise), until none applies or the check budget is spent:

1. keep only the failing output (else drop outputs one at a time);
2. drop a step, or bypass it (its uses read one of its own inputs instead), last step first;
3. drop inputs no step reads; make inputs contiguous; compile without freezing.

Each check compiles the candidate, so the budget bounds the cost (about a second a check on
the CPU backend). The result is 1-minimal with respect to these reductions when the budget
was not exhausted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .oracle import Finding, check, same_failure
from .program import Program, analyze


def _with(prog: Program, **kw) -> Program:
    return Program(kw.get("seed", prog.seed), kw.get("inputs", list(prog.inputs)), kw.get("steps", list(prog.steps)),
                   kw.get("outputs", list(prog.outputs)), kw.get("freeze", prog.freeze), prog.note)


def _drop_step(prog: Program, i: int, repl: str | None) -> Program | None:
    st = prog.steps[i]
    later = prog.steps[i + 1:]
    if repl is None:
        if any(st.out in s.reads for s in later) or st.out in prog.outputs:
            return None
        return _with(prog, steps=prog.steps[:i] + later)
    steps = prog.steps[:i] + [s.rename(st.out, repl) for s in later]
    return _with(prog, steps=steps, outputs=[repl if o == st.out else o for o in prog.outputs])


def candidates(prog: Program, finding: Finding) -> list[Program]:
    out: list[Program] = []
    if len(prog.outputs) > 1:
        if 0 <= finding.output < len(prog.outputs):
            out.append(_with(prog, outputs=[prog.outputs[finding.output]]))
        for k in range(len(prog.outputs)):
            out.append(_with(prog, outputs=prog.outputs[:k] + prog.outputs[k + 1:]))
    for i in reversed(range(len(prog.steps))):
        st = prog.steps[i]
        c = _drop_step(prog, i, None)
        if c is not None:
            out.append(c)
        for r in dict.fromkeys(st.reads):
            if not r.startswith("self."):
                c = _drop_step(prog, i, r)
                if c is not None:
                    out.append(c)
    used = {r for s in prog.steps for r in s.reads} | set(prog.outputs)
    unused = [x for x in prog.inputs if x.name not in used and not any(x.name in s.expr for s in prog.steps)]
    if unused:
        out.append(_with(prog, inputs=[x for x in prog.inputs if x not in unused]))
    for k, x in enumerate(prog.inputs):
        if x.layout:
            out.append(_with(prog, inputs=prog.inputs[:k] + [replace(x, layout="")] + prog.inputs[k + 1:]))
    if prog.freeze:
        out.append(_with(prog, freeze=False))
    return out


def shrink(prog: Program, finding: Finding, backend: str, budget: int = 60,
           checker: Callable[[Program], Finding | None] | None = None) -> tuple[Program, Finding, int]:
    """(smallest failing program found, its finding, checks spent)."""
    run = checker or (lambda p: _safe_check(p, backend))
    checks = 0
    best, best_f = prog, finding
    progress = True
    while progress and checks < budget:
        progress = False
        for cand in candidates(best, best_f):
            if checks >= budget:
                break
            if not analyze(cand).ok:
                continue
            checks += 1
            f = run(cand)
            if f is not None and same_failure(f, best_f):
                best, best_f = cand, f
                progress = True
                break
    return best, best_f, checks


def _safe_check(prog: Program, backend: str) -> Finding | None:
    try:
        return check(prog, backend)
    except ValueError:
        return None

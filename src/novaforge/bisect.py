"""`novaforge.bisect`: find the pass, and the single decision in it, that makes a result wrong.

Every pass asks `PassContext.take_fuel` before each rewrite or fusion decision (passes/
context.py); the pipeline's option `pass_fuel = {position: n}` lets the pass at that position
take only its first n decisions, the rest of its graph staying as it was. A configuration
"the first i passes in full, pass i with fuel f, every later pass with fuel 0" is compiled
with the public `novaforge.compile(..., pass_fuel=...)` and its result compared with eager
(same inputs, cloned per run). Then:

1. all passes at fuel 0 must agree with eager; if not, no pass decision is to blame (the
   difference is in capture, lowering or code generation: `NOVAFORGE_CHECK=numerics` names the
   kernel) and the result says so;
2. binary search over i for a position where "passes before i in full, i and later at 0"
   agrees and "passes up to i in full" does not: pass i introduces the difference;
3. binary search over pass i's fuel for f with fuel f agreeing and f + 1 differing: decision
   f (0-based) is the one; it is described by compiling once more with `pass_trace=True`.

Each step keeps the invariant "lo agrees, hi differs", so the answer is a real transition even
if agreement is not monotone in the fuel. Cost: about log2(passes) + log2(decisions) + 3
compiles.

Agreement: every output within rtol/atol of eager (defaults by dtype: float32 1e-4/1e-5,
bfloat16 and float16 3e-2/3e-2, float64 1e-7/1e-9; integers and bools exact), same dtypes
and shapes, no exception.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

_TOL = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-2, 3e-2),
        torch.float64: (1e-7, 1e-9)}


@dataclass
class Probe:
    fuel: dict[int, int]
    agrees: bool
    detail: str


@dataclass
class BisectResult:
    """What `bisect` found. `pass_index` is None when no pass decision is to blame."""

    passes: list[str]
    decisions: list[int]  # per pass position, with full fuel
    pass_index: int | None = None
    decision: int | None = None  # 0-based index of the guilty decision in that pass
    description: str = ""
    differs: str = ""  # how the full compile differs from eager
    verdict: str = ""
    probes: list[Probe] = field(default_factory=list)

    @property
    def pass_name(self) -> str | None:
        return None if self.pass_index is None else self.passes[self.pass_index]

    def __str__(self) -> str:
        lines = [f"novaforge bisect: {self.verdict}"]
        if self.differs:
            lines.append(f"  compiled vs eager: {self.differs}")
        if self.pass_index is not None:
            lines.append(f"  pass: {self.pass_name} (position {self.pass_index} of {len(self.passes)}: "
                         f"{' '.join(self.passes)})")
            lines.append(f"  decision: {self.decision} of {self.decisions[self.pass_index]} in {self.pass_name} "
                         f"(pass_fuel={{{self.pass_index}: {self.decision}}} agrees with eager, "
                         f"{{{self.pass_index}: {self.decision + 1 if self.decision is not None else '?'}}} does not)")
            if self.description:
                lines.append(f"  {self.description}")
        lines.append(f"  {len(self.probes)} compiles")
        return "\n".join(lines)


def compare(got: Any, want: Any, rtol: float | None = None, atol: float | None = None) -> str:
    """'' when got agrees with eager's want (pytrees of tensors), else the first difference."""
    g_leaves, g_spec = pytree.tree_flatten(got)
    w_leaves, w_spec = pytree.tree_flatten(want)
    if len(g_leaves) != len(w_leaves):
        return f"{len(g_leaves)} outputs, eager {len(w_leaves)}"
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves, strict=True)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"output {i}: {g!r}, eager {w!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape:
            return (f"output {i}: {getattr(g, 'dtype', type(g).__name__)}{list(getattr(g, 'shape', []))}, "
                    f"eager {w.dtype}{list(w.shape)}")
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return f"output {i}: {int((g != w).sum())} of {w.numel()} elements differ"
            continue
        rt, at = _TOL.get(w.dtype, (1e-4, 1e-5))
        rt, at = rtol if rtol is not None else rt, atol if atol is not None else at
        gd, wd = g.detach().double(), w.detach().double()
        bad = ~torch.isclose(gd, wd, rtol=rt, atol=at, equal_nan=True)
        if bool(bad.any()):
            err = (gd - wd).abs().nan_to_num(float("inf"))
            return (f"output {i}: {int(bad.sum())} of {w.numel()} elements beyond rtol={rt:g}, atol={at:g} "
                    f"(max abs difference {float(err.max()):.4g})")
    return ""


def _clone(x: Any) -> Any:
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def bisect(model: Any, *inputs: Any, backend: str = "cpu", freeze: bool = False, rtol: float | None = None,
           atol: float | None = None, kwargs: dict | None = None, log: Callable[[str], None] | None = None,
           **options: Any) -> BisectResult:
    """Find the pass and the decision in it that make `model(*inputs)` compiled differ from
    eager (see the module docstring). `options` are compile options (docs/options.md)."""
    from . import api
    from .passes.pipeline import default_pipeline

    kwargs = dict(kwargs or {})
    passes = [name for name, _ in default_pipeline()]
    fresh = (lambda: copy.deepcopy(model)) if isinstance(model, torch.nn.Module) else (lambda: model)
    with torch.no_grad():
        want = fresh()(*_clone(inputs), **_clone(kwargs))
    probes: list[Probe] = []
    say = log or (lambda s: None)

    def run(fuel: dict[int, int] | None, trace: bool = False) -> tuple[str, Any]:
        opts = dict(options)
        if fuel is not None:
            opts["pass_fuel"] = fuel
        if trace:
            opts["pass_trace"] = True
        compiled = api.compile(fresh(), backend=backend, freeze=freeze, **opts)
        try:
            with torch.no_grad():
                got = compiled(*_clone(inputs), **_clone(kwargs))
        except Exception as e:  # noqa: BLE001 - a crash is a difference too
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", compiled
        return compare(got, want, rtol, atol), compiled

    def agrees(fuel: dict[int, int]) -> bool:
        diff, _ = run(fuel)
        probes.append(Probe(dict(fuel), not diff, diff))
        say(f"  pass_fuel={fuel}: {diff if diff else 'agrees'}")
        return not diff

    def prefix(i: int, f: int | None = None) -> dict[int, int]:
        """Passes before i in full, pass i with fuel f (0 when None), later passes at 0."""
        return {j: (f if j == i and f is not None else 0) for j in range(max(i, 0), len(passes))}

    full_diff, compiled = run(None)
    probes.append(Probe({}, not full_diff, full_diff))
    stats = compiled.stats()
    decisions = [r.decisions for r in stats.records] if stats is not None else [0] * len(passes)
    res = BisectResult(passes, decisions, differs=full_diff, probes=probes)
    if not full_diff:
        res.verdict = "the compiled result agrees with eager: nothing to bisect"
        return res
    if not agrees(prefix(0)):
        res.verdict = ("the result differs even with every pass at fuel 0: no pass decision introduces it (capture, "
                       "lowering or code generation; run with NOVAFORGE_CHECK=numerics to find the kernel)")
        return res
    lo, hi = 0, len(passes)  # prefix(lo) agrees; passes < hi in full (prefix(hi)) differs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if agrees(prefix(mid)):
            lo = mid
        else:
            hi = mid
    i = lo  # passes < i full and i at 0 agrees; passes <= i full differs
    n = decisions[i]
    res.pass_index = i
    if n == 0 or agrees(prefix(i, n)):
        # the decision count is deterministic given the earlier passes, so fuel n is pass i in full
        res.verdict = (f"pass {passes[i]} (position {i}) introduces the difference, but not through a fuelled "
                       f"decision ({n} counted): a change it makes unconditionally")
        return res
    f_lo, f_hi = 0, n  # fuel f_lo agrees, f_hi differs
    while f_hi - f_lo > 1:
        mid = (f_lo + f_hi) // 2
        if agrees(prefix(i, mid)):
            f_lo = mid
        else:
            f_hi = mid
    res.decision = f_lo
    _, traced = run(prefix(i, f_lo + 1), trace=True)
    rec = traced.stats().records[i] if traced.stats() is not None else None
    if rec is not None and rec.trace:
        res.description = rec.trace[-1]
    res.verdict = f"pass {passes[i]} (position {i}), decision {f_lo}, introduces the difference"
    return res


def main(argv: list[str] | None = None) -> int:
    """`novaforge bisect FILE.py[:NAME]`: FILE defines NAME (default `model`) and `inputs`
    (a tuple, or a function returning one)."""
    ap = argparse.ArgumentParser(prog="novaforge bisect", description=main.__doc__)
    ap.add_argument("target", help="file.py[:name]: a module or function, with `inputs` beside it")
    ap.add_argument("--inputs", default="inputs", help="name of the inputs in the file (default: inputs)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "triton", "interpret"])
    ap.add_argument("--freeze", action="store_true")
    ap.add_argument("--rtol", type=float)
    ap.add_argument("--atol", type=float)
    args = ap.parse_args(argv)
    import runpy

    path, _, name = args.target.partition(":")
    ns = runpy.run_path(path)
    model = ns[name or "model"]
    inputs = ns[args.inputs]
    inputs = inputs() if callable(inputs) else inputs
    if not isinstance(inputs, tuple | list):
        inputs = (inputs,)
    res = bisect(model, *inputs, backend=args.backend, freeze=args.freeze, rtol=args.rtol, atol=args.atol,
                 log=print)
    print(res)
    return 0 if res.pass_index is None and not res.differs else 1

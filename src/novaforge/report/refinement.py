"""The refinement table (`Options.refine`, codegen/cpu/refine.py): per refined kernel, the
model's predicted time, the measured time, the variants tried with their times, and what was
kept; then what happened, call by call.

Invariant: read-only; it shows the refiner's own records and never runs or times anything.
"""

from __future__ import annotations

from typing import Any


def refiner_of(compiled: Any) -> Any:
    """The refiner of a CompiledModule's last program (or of a program), or None."""
    stats = compiled.stats() if hasattr(compiled, "stats") and callable(compiled.stats) else None
    program = stats.program if stats is not None else compiled
    return getattr(program, "refiner", None)


def format_refinement(refiner: Any, limit: int = 30) -> str:
    if refiner is None:
        return "no refinement (option refine=False, or this program is not refined: see the `refine` log)"
    rows = refiner.rows()
    lines = [f"refinement: {refiner.phase} after {refiner.calls} calls "
             f"(one call in {refiner.every} sampled; {refiner.sampled} sampled)",
             f"{'kernel':<28} {'predicted us':>12} {'measured us':>12}  tried (variant: us)        kept  note"]
    for r in rows[:limit]:
        tried = ", ".join(f"{v}: {ns / 1e3:.1f}" for v, ns in sorted(r.tried.items())) or "-"
        kept = "-" if r.kept is None else ("model" if r.kept == 0 else f"v{r.kept}")
        lines.append(f"{r.label[:28]:<28} {r.predicted_ns / 1e3:>12.1f} {r.measured_ns / 1e3:>12.1f}  "
                     f"{tried:<26} {kept:>5}  {r.note}")
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more kernels")
    lines += ["events:"] + [f"  {e}" for e in refiner.events]
    return "\n".join(lines)

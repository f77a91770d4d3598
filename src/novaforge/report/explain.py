"""`novaforge.explain`: what the compiler did, pass by pass, in one printable report.

Sections: capture (ATen ops, IR nodes, times), passes (per-pass time, nodes before/after,
counters), kernels (each fused kernel with the ops inside, its executor, FLOPs, bytes and
arithmetic intensity; identical kernels grouped by structural key), externs with their reason,
the memory plan, and the headline metrics (fusion gain ratio = ATen ops / launches per call).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .metrics import kernel_rows, metrics


@dataclass
class Report:
    stats: Any
    metrics: dict[str, Any]
    max_kernels: int = 40
    profile: str = ""  # "where the time went" (explain(..., profile=True))

    def __str__(self) -> str:
        text = format_report(self.stats, self.metrics, self.max_kernels)
        if self.profile:
            text += "\n\n-- where the time went (measured) --\n" + self.profile
        refiner = getattr(getattr(self.stats, "program", None), "refiner", None)
        if refiner is not None:
            from .refinement import format_refinement

            text += "\n\n-- refinement (measured) --\n" + format_refinement(refiner)
        program = getattr(self.stats, "program", None)
        comm = getattr(program, "collectives", None)
        if comm is not None and comm.issued:
            text += "\n\n-- collectives (measured) --\n" + format_collectives(program)
        return text

    def summary(self) -> str:
        m = self.metrics
        return (f"{m['aten_ops']} ATen ops -> {m['kernels']} kernels ({m['distinct_kernels']} distinct), "
                f"{m['launches']} launches/call, fusion gain ratio {m['fusion_gain_ratio']:.2f}, "
                f"{len(m['externs'])} externs")


def explain(model: Any, *args: Any, freeze: bool = True, backend: str = "auto", profile: bool = False,
            runs: int = 5, **kwargs: Any) -> Report:
    """Compile `model` for `args`/`kwargs` and return the report (print it). With
    profile=True the program also times its launches over `runs` calls and the report adds
    each kernel's time and roofline efficiency, and how kernels + overhead add up to the wall
    time (report/roofline.py)."""
    import torch

    from ..api import CompiledModule
    from .roofline import format_profile, profile_program

    compiled = model if isinstance(model, CompiledModule) else CompiledModule(
        model, freeze=freeze, backend=backend, options={"profile": True} if profile else None)
    from ..frontend.capture import has_meta_state

    no_data = has_meta_state(compiled.fn)  # parameters on the meta device: compile, never run
    with torch.no_grad():
        if no_data:
            compiled.compile_only(*args, **kwargs)
        else:
            compiled(*args, **kwargs)
    stats = compiled.stats()
    prof = format_profile(profile_program(compiled, args, kwargs, runs)) if profile and not no_data else ""
    return Report(stats, metrics(stats), profile=prof)


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def format_collectives(program: Any) -> str:
    """The program's torch.distributed collectives in step order (issued, compute between, waited) and
    how long its waits blocked over its calls so far (runtime/collectives.py)."""
    from ..runtime.collectives import WAIT, step_collective

    line = []
    for st in program.steps:
        t = step_collective(st)
        line.append("wait" if t == WAIT else t.split(".")[1] if t else "k")
    c, calls = program.collectives, max(program.calls, 1)
    return (f"timeline (k: compute steps): {' '.join(line)}\n"
            f"{c.issued} collectives issued asynchronously, {c.waits} waits over {program.calls} calls; the waits "
            f"blocked {1e3 * c.blocked_s / calls:.2f} ms per call (the exposed communication)")


def format_report(stats: Any, m: dict[str, Any], max_kernels: int = 40) -> str:
    lines: list[str] = []
    t = stats.times
    lines.append("== novaforge compile report ==")
    lines.append(f"backend: {stats.backend}    total compile {t.get('total_s', 0):.2f} s "
                 f"(export {t.get('export_s', 0):.2f} s, functionalize {t.get('functionalize_s', 0):.2f} s, "
                 f"lower {t.get('lower_s', 0):.2f} s, passes {t.get('passes_s', 0):.2f} s, "
                 f"codegen+build {t.get('codegen_s', 0):.2f} s)")
    lines.append(f"captured: {m['aten_ops']} ATen ops -> {m['ir_nodes_captured']} IR nodes")
    lines.append("")
    lines.append("-- passes --")
    lines.append(f"{'pass':<16}{'ms':>9}{'nodes':>15}{'values':>15}  effect")
    for r in stats.records:
        eff = ", ".join(f"{k} {v}" for k, v in r.counters.items() if v and not k.endswith("_bytes"))
        byts = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in r.counters.items() if k.endswith("_bytes"))
        lines.append(f"{r.name:<16}{r.ms:>9.2f}{r.nodes_before:>7} -> {r.nodes_after:<5}"
                     f"{r.values_before:>7} -> {r.values_after:<5}  {eff}{'; ' if eff and byts else ''}{byts}")
    lines.append("")
    rows = kernel_rows(stats.graph)
    groups: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
    for r in rows:
        groups.setdefault(r["key"], []).append(r)
    lines.append(f"-- kernels: {len(rows)} launches of {len(groups)} distinct kernels --")
    lines.append(f"{'#':>3} {'x':>3}  {'kernel':<24}{'kind':<11}{'executor':<10}{'MFLOP':>9}{'KiB':>10}"
                 f"{'flop/B':>8}  ops")
    schedules = getattr(stats.program, "schedules", {}) if stats.program is not None else {}
    for i, (_key, rs) in enumerate(groups.items()):
        if i >= max_kernels:
            lines.append(f"    ... {len(groups) - max_kernels} more distinct kernels")
            break
        r = rs[0]
        ai = r["flops"] / max(r["bytes"], 1)
        ops = " ".join(r["ops"])
        if len(ops) > 60:
            ops = ops[:57] + "..."
        lines.append(f"{i:>3} {len(rs):>3}  {r['name'][:23]:<24}{r['kind']:<11}{r['executor']:<10}"
                     f"{r['flops'] / 1e6:>9.2f}{r['bytes'] / 1024:>10.1f}{ai:>8.2f}  {ops}")
        sched = schedules.get(r["node"].attrs["kernel"].structural_key) if isinstance(schedules, dict) else None
        if sched is not None:
            lines.append(f"          schedule: {sched}")
    lines.append("")
    lines.append("-- extern ops (ATen calls kept as is) --")
    if not m["externs"]:
        lines.append("none")
    else:
        counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        for target, reason in m["externs"]:
            counts[(target, reason)] = counts.get((target, reason), 0) + 1
        for (target, reason), c in counts.items():
            lines.append(f"{c:>4} x {target}: {reason}")
    lines.append("")
    lines += user_kernel_lines(stats.graph)
    lines += matrix_path_lines(stats)
    plan = stats.graph.meta.memory_plan
    lines.append("-- memory plan --")
    lines.append(plan.summary() if plan is not None else "none")
    lines.append("")
    lines.append("-- metrics --")
    lines.append(f"fusion gain ratio {m['fusion_gain_ratio']:.2f} = {m['aten_ops']} ATen ops / "
                 f"{m['launches']} launches "
                 f"({', '.join(f'{k} {v}' for k, v in m['kernels_by_kind'].items())}); "
                 f"device transitions {m['transitions']}")
    return "\n".join(lines)


def matrix_precisions(graph: Any) -> dict[str, int]:
    """The program's matrix products per operand precision: "float32", "bf16", "int8 weight"
    (float A times an int8 weight, converted in registers) and "int8 x int8" (exact int32 sums)."""
    import torch

    counts: dict[str, int] = {}
    for n in graph.nodes:
        if n.op != "kernel":
            continue
        for bn in n.attrs["kernel"].body.nodes:
            if bn.op != "matmul":
                continue
            a, b = (v.type.dtype for v in bn.inputs[:2])
            kind = ("int8 x int8" if a == b == torch.int8 else "int8 weight" if b == torch.int8
                    else "bf16" if torch.bfloat16 in (a, b) else "float32")
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def matrix_path_lines(stats: Any) -> list[str]:
    """Which nf_gemm path this CPU runs for each precision of the program's products (the CPU
    backend; chosen at run time from the instructions the CPU has, docs/cpu-gemm.md)."""
    if stats.backend != "cpu":
        return []
    counts = matrix_precisions(stats.graph)
    if not counts:
        return []
    from ..codegen.cpu import gemm

    paths = {"float32": f"{gemm.isa()} FMA micro-kernels",
             "bf16": f"{gemm.bf16_path()} (of amx, avx512_bf16, convert)",
             "int8 weight": "int8 weight converted to float32 in registers (GEMV) or while packing",
             "int8 x int8": f"{gemm.s8_path()} (of vnni, avx2, portable), exact int32 sums"}
    return ["-- matrix products: precision and nf_gemm path on this CPU --"] + [
        f"{c:>4} x {kind}: {paths[kind]}" for kind, c in counts.items()] + [""]


def user_kernel_lines(graph: Any) -> list[str]:
    """The section naming the user's kernels (novaforge.register_kernel) the program calls, if any."""
    from ..passes.user_kernels import is_user_target

    counts: OrderedDict[str, int] = OrderedDict()
    for n in graph.nodes:
        body = n.attrs["kernel"].body.nodes if n.op == "kernel" else [n]
        for m in body:
            if m.op == "extern" and is_user_target(m.attrs["target"]):
                counts[m.attrs["reason"]] = counts.get(m.attrs["reason"], 0) + 1
    if not counts:
        return []
    return ["-- user kernels (novaforge.register_kernel: the user's, not generated) --",
            *(f"{c:>4} x {reason}" for reason, c in counts.items()), ""]

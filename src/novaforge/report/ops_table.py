"""`novaforge ops`: the lowering table as a report, and the generator of docs/ops.md.

For every ATen overload in the table (`frontend/table.py`) the report lists the IR primitives
its rule may emit and the conditions under which it keeps the call as an `extern`. Both are
read from the rule's code, statically: string op names the builder (and the frontend helpers
it calls, and the closures it was built from) passes to `LowerCtx.emit`, to other calls, or
implies through LowerCtx helpers (`cast`, `reshape`, `scalar`, ...). That is an
over-approximation over all branches ("may lower to"); tests/frontend checks that every
primitive a rule really emits on its test cases is listed, so the document cannot omit one.
A second section lists torch's core ATen ops (tagged `torch.Tag.core`) without a rule: they
are decomposed when torch has a CompositeImplicitAutograd kernel for them, else they run as
counted externs.

Invariant: `markdown()` is a pure function of the table, the IR op set and the installed
torch, so docs/ops.md is regenerated, never edited (`novaforge ops --markdown > docs/ops.md`).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir import OPS

# what a LowerCtx helper emits (its own name -> IR ops)
CTX_HELPERS: dict[str, set[str]] = {
    "cast": {"cast"}, "opmath": {"cast"}, "scalar": {"scalar"}, "tensor": {"cast", "scalar"},
    "reshape": {"reshape"}, "permute": {"permute"}, "expand": {"expand"}, "extern": {"extern"},
}
FRONTEND = ("novaforge.frontend", "novaforge.ir.ops")  # modules whose helpers a rule's analysis follows


@dataclass
class RuleInfo:
    target: str
    module: str
    builder: str
    primitives: set[str] = field(default_factory=set)
    extern_when: list[str] = field(default_factory=list)

    @property
    def emits(self) -> set[str]:
        """IR primitives other than `extern`."""
        return self.primitives - {"extern"}


def _source_tree(fn: Callable) -> ast.AST | None:
    try:  # the code object's source: getsource(fn) would follow a __wrapped__ attribute
        return ast.parse(textwrap.dedent(inspect.getsource(fn.__code__)))
    except (OSError, TypeError, SyntaxError):
        return None


def analyze(fn: Callable, seen: set[Any] | None = None, info: RuleInfo | None = None) -> RuleInfo:
    """The primitives `fn` may emit and the reasons it may extern, following frontend helpers."""
    info = info or RuleInfo("", fn.__module__, fn.__name__)
    seen = set() if seen is None else seen
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return info
    seen.add(code)
    for cell in fn.__closure__ or ():
        try:
            val = cell.cell_contents
        except ValueError:
            continue
        if isinstance(val, str) and val in OPS:
            info.primitives.add(val)
        elif callable(val) and getattr(val, "__module__", "").startswith(FRONTEND):
            analyze(val, seen, info)
    tree = _source_tree(fn)
    if tree is None:
        return info
    glb = getattr(fn, "__globals__", {})
    compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare) for c in ast.walk(node)}
    for node in ast.walk(tree):
        # op names: string constants naming an IR op, except in comparisons (`mode == "floor"`)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OPS and (
                id(node) not in compared):
            info.primitives.add(node.value)
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in CTX_HELPERS:
            info.primitives |= CTX_HELPERS[f.attr]
            if f.attr == "extern":
                reason = ast.unparse(node.args[0]) if node.args else "'no lowering rule'"
                info.extern_when.append(reason.strip("'\""))
        elif isinstance(f, ast.Name):
            target = glb.get(f.id)
            if callable(target) and getattr(target, "__module__", "").startswith(FRONTEND):
                analyze(target, seen, info)
    return info


def rule_infos() -> list[RuleInfo]:
    from ..frontend.table import LOWERINGS

    out = []
    for target, fn in LOWERINGS.items():
        info = analyze(fn)
        info.target = str(target)
        info.extern_when = sorted(set(info.extern_when))
        out.append(info)
    return sorted(out, key=lambda r: r.target)


_CACHE: dict[str, list[RuleInfo]] = {}


def rule_infos_cached() -> list[RuleInfo]:
    if "rules" not in _CACHE:
        _CACHE["rules"] = rule_infos()
    return _CACHE["rules"]


def core_ops() -> list[torch._ops.OpOverload]:
    """torch's core ATen op set: every registered overload tagged `torch.Tag.core` (from the
    dispatcher's registry; `dir(torch.ops.aten)` would list only the packets loaded so far)."""
    ops = []
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "aten":
            continue
        name, _, overload = rest.partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in op.tags:
            ops.append(op)
    return sorted(set(ops), key=str)


def has_decomposition(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def uncovered_core_ops() -> list[tuple[str, str]]:
    """(core op, what happens to it) for core ops without a rule."""
    from ..frontend.table import LOWERINGS

    rows = []
    for op in core_ops():
        if op in LOWERINGS or op.overloadpacket in LOWERINGS:
            continue
        schema = op._schema
        if schema.is_mutable:
            fate = "in-place / out= variant: functionalized at capture, else an error"
        elif torch.Tag.dynamic_output_shape in op.tags:
            fate = "output shape depends on tensor data: UnsupportedError naming the op and line"
        elif has_decomposition(op):
            fate = "decomposed (CompositeImplicitAutograd), then lowered"
        elif not any(r.type.kind() == "TensorType" for r in schema.returns):
            fate = "no tensor result: not an op of a captured graph"
        else:
            fate = "extern"
        rows.append((str(op), fate))
    return rows


def summary() -> str:
    infos = rule_infos()
    core = core_ops()
    rows = uncovered_core_ops()
    covered = len(core) - len(rows)
    externs = [op for op, fate in rows if fate == "extern"]
    lines = [
        f"lowering table: {len(infos)} ATen overloads; {sum(1 for r in infos if r.emits)} emit IR primitives, "
        f"{sum(1 for r in infos if not r.emits)} emit none (they return an input, are dropped, or are externs), "
        f"{sum(1 for r in infos if 'extern' in r.primitives)} keep the call as an extern in some cases",
        f"core ATen ops: {len(core)}, {covered} with a rule, {len(rows)} without "
        f"({len(externs)} of them become externs)",
        "core ops that become externs: " + ", ".join(op.removeprefix("aten.") for op in externs),
        "full table: novaforge ops --markdown (docs/ops.md)",
    ]
    return "\n".join(lines + user_kernels_lines())


def user_kernels_lines() -> list[str]:
    """The kernels registered with novaforge.register_kernel (docs/user-kernels.md), marked as the user's."""
    from ..user_kernels import registered_kernels

    ks = registered_kernels()
    if not ks:
        return ["user kernels: none registered (novaforge.register_kernel; `novaforge ops --import MODULE` "
                "imports a module that registers some)"]
    return [f"user kernels: {len(ks)} registered (the user's, used where they match and cost less)"] + [
        f"  user:{k.name}  {k.language}  pattern {k.pattern_text}  cost {k.cost_text}  op {k.target}  "
        f"calls {k.calls}" for k in ks]


_GROUPS = {"Elementwise, creation and copies": ("lower_elementwise", "elementwise", "generators"),
           "Views, data movement, indexing": ("lower_shape", "shape", "indexing"),
           "Reductions, normalization, matmul, attention": ("lower_nn", "reduction", "matmul")}


def _group(module: str) -> str:
    last = module.rsplit(".", 1)[-1]
    return next((g for g, mods in _GROUPS.items() if last in mods), module)


def rule_file(module: str) -> str:
    """Where a rule is defined, relative to src/novaforge ('ir/ops/elementwise.py')."""
    return module.removeprefix("novaforge.").replace(".", "/") + ".py"


def markdown() -> str:
    infos = rule_infos()
    out = [
        "# ATen lowering table",
        "",
        "Generated by `novaforge ops --markdown` from `src/novaforge/frontend/table.py`; do not edit.",
        "",
        "How an ATen op in a captured graph becomes IR, in order:",
        "",
        "1. an in-place op on a fresh intermediate (left by a decomposition) is replaced by its",
        "   functional form; other mutations are an error naming the op and source line;",
        "2. an op whose outputs all have zero elements becomes a zero-size fill;",
        "3. an op with a rule below is lowered by it (to the IR primitives listed; a rule may keep",
        "   the call as an `extern` in the cases listed);",
        "4. an op without a rule that torch implements as a CompositeImplicitAutograd composite is",
        "   decomposed exactly as eager runs it, and the pieces are lowered;",
        "5. anything else becomes an `extern` node (an ATen call), counted in",
        "   `compiled.stats().captured.externs` and reported by `novaforge.explain`; an op whose",
        "   output shape depends on tensor data raises `UnsupportedError` instead.",
        "",
        "A rule that lowers an ATen op to one IR op stands beside that op's record",
        "(`ir/ops/<family>.py`, `@op.lowers(...)`); composites built from several IR ops are in",
        "`frontend/lower_*.py`. The last column says which file holds the rule.",
        "",
        "Primitives are read from each rule's code over all of its branches, so a rule may use",
        "fewer of them for a given call. `scalar` (0-d constants) and `cast` appear wherever",
        "Python numbers or dtype promotion are involved; composites on 16-bit floats compute in",
        "float32 and cast back. \"(none)\" means the rule returns its input (copies, no-op views,",
        "eval-mode dropout), drops the node (assertions) or keeps the call as an extern.",
        "",
    ]
    by_group: dict[str, list[RuleInfo]] = {}
    for r in infos:
        by_group.setdefault(_group(r.module), []).append(r)
    for group in sorted(by_group):
        out += [f"## {group}", "", "| ATen overload | IR primitives | kept as extern when | rule in |",
                "|---|---|---|---|"]
        for r in by_group[group]:
            prims = ", ".join(f"`{p}`" for p in sorted(r.emits)) or "(none)"
            ext = "; ".join(r.extern_when) if r.extern_when else ""
            out.append(f"| `{r.target.removeprefix('aten.')}` | {prims} | {ext} | `{rule_file(r.module)}` |")
        out.append("")
    out.append(backends_markdown())
    rows = uncovered_core_ops()
    out += [
        "## Core ATen ops without a rule",
        "",
        f"torch {torch.__version__.split('+')[0]} tags {len(core_ops())} overloads as core ATen "
        f"(`torch.Tag.core`); {len(rows)} have no rule here:",
        "",
        "| core ATen overload | what happens |",
        "|---|---|",
    ]
    out += [f"| `{op.removeprefix('aten.')}` | {fate} |" for op, fate in rows]
    out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------ the op x backend matrix
BACKENDS = ("interpret", "cpu", "triton")


def backend_cell(op: str, backend: str) -> str:
    """'yes' when the backend generates code for `op` (an expression or a kernel template),
    else 'no: <reason>' (its kernels run through torch), from the backend's own tables."""
    if backend == "interpret":
        return "yes" if OPS[op].impl is not None else "no: no reference implementation"
    if backend == "cpu":
        from ..codegen.cpu import cexpr as tables

        exprs = tables.C_EXPR
    elif backend == "triton":
        from ..codegen.triton import exprs as tables

        exprs = tables.TRITON_EXPR
    else:
        raise ValueError(f"unknown backend {backend!r}")
    if op in exprs or op in tables.TEMPLATES:
        return "yes"
    return f"no: {tables.NOT_RENDERED.get(op, 'no rendering registered')}"


def matrix_ops() -> list[str]:
    """The IR ops of the matrix: every op except `kernel` (a fused group, rendered through its body)."""
    return [op for op, d in OPS.items() if not d.has("fused")]


def backend_matrix() -> list[tuple[str, dict[str, str]]]:
    return [(op, {b: backend_cell(op, b) for b in BACKENDS}) for op in matrix_ops()]


def backends_markdown() -> str:
    rows = backend_matrix()
    gaps = sum(1 for _, cells in rows for c in cells.values() if c != "yes")
    out = ["## IR ops by backend", "",
           "Generated by `novaforge ops --backends` from the op records (`ir/ops/`) and each backend's",
           "renderings (`codegen/cpu/cexpr.py`, `codegen/triton/exprs.py`: an expression per elementwise op,",
           "the ops kernel templates generate, and the ops not rendered with the reason). A kernel",
           "holding an op marked `no` runs through torch on that backend, with the reason in",
           "`novaforge.explain`. `tests/codegen/test_op_matrix.py` runs every op on every backend against",
           "eager (float32 and bfloat16) and checks each `yes`.", "",
           f"{len(rows)} ops, {gaps} gaps.", "",
           "| IR op | family | " + " | ".join(BACKENDS) + " |", "|---|---|" + "---|" * len(BACKENDS)]
    for op, cells in rows:
        out.append(f"| `{op}` | {OPS[op].family} | " + " | ".join(cells[b] for b in BACKENDS) + " |")
    out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="novaforge ops", description="The ATen -> IR lowering table.")
    parser.add_argument("--markdown", action="store_true", help="print docs/ops.md (the full table)")
    parser.add_argument("--backends", action="store_true",
                        help="print the IR op x backend matrix (yes, or no: reason) as markdown")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (one that registers user kernels: novaforge.register_kernel)")
    args = parser.parse_args(argv)
    if args.imports:
        import importlib

        for mod in args.imports:
            importlib.import_module(mod)
    if args.backends:
        print(backends_markdown())
    else:
        print(markdown() if args.markdown else summary())
    return 0

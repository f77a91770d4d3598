"""Imports run one way: each module of src/novaforge imports only its own package and the layers
below it, and no two modules import each other, directly or around a cycle.

The layers, lowest first (docs/design.md "Imports run one way"). A module's layer is that of the
longest prefix in `LAYERS` naming it (`novaforge.cache.store` is base, the rest of `novaforge.cache`
layer 5); the package root `novaforge` (its `__init__`) is named exactly.

    0 base     settings, logs, options, gc_pause, version, cache.store      open
    1 ir       ir                                                           closed
    2 graphs   frontend (capture), passes, schedule                         closed
    3 runtime  runtime                                                      closed
    4 codegen  codegen                                                      closed
    5 cache    cache (the optimized-graph cache, `novaforge cache`)         closed
    6 entry    novaforge (root), __main__, api, compiled_module,            open
               compile_stats, dynamo, train_entry, training, generation, decode_loop,
               report, bench, cli, fuzz, bisect, user_kernels

An import a -> b is legal when b's layer is below a's, or a and b are in the same unit: one prefix
of a closed layer (both in `novaforge.frontend`), or anywhere in an open layer. So capture,
the passes and the schedules know the IR and the base but not each other, and none of them knows
a program, a backend or the API; the IR knows only the base; the backend of a graph is chosen in
the entry layer, which calls both capture and a backend (`compile_stats.resolve_backend`).

Every import counts: at module level or inside a function (lazy), `import a.b`, `from . import
b` (the submodule b), `from .b import name` (b). An import under `if TYPE_CHECKING:` counts for
the layers (a lower layer must not name a higher one's types) but not for cycles (it never
runs). The cycle check covers every module of the package, package `__init__`s included.

Invariant: `test_imports_run_down_the_layers` and `test_no_import_cycles` fail, naming each edge
(file:line, module, imported module), whenever a module imports upward or into a cycle.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "novaforge"

# (name, open, prefixes), lowest first; prefixes are relative to the package
LAYERS: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    ("base", True, ("settings", "logs", "options", "gc_pause", "version", "cache.store")),
    ("ir", False, ("ir",)),
    ("graphs", False, ("frontend", "passes", "schedule")),
    ("runtime", False, ("runtime",)),
    ("codegen", False, ("codegen",)),
    ("cache", False, ("cache",)),
    ("entry", True, ("", "__main__", "api", "compiled_module", "compile_stats", "dynamo", "train_entry", "training",
                     "generation", "decode_loop", "report", "bench", "cli", "fuzz", "bisect", "quantize",
                     "distributed", "user_kernels")),
)

# cycles known and owned elsewhere: each is the set of modules of one cycle, with why it is here.
# The test fails when one no longer exists, so an entry is removed with its fix.
PENDING_CYCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    line: int
    dst: str  # imported module (the deepest module of the package the import names)
    path: str = ""  # the importing file, relative to src/
    type_only: bool = False  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.path or self.src}:{self.line}: {self.src} imports {self.dst}"


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)."""
    out = {}
    for p in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (p, is_pkg)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement anywhere in the tree (functions, classes, branches), with whether
    it sits under `if TYPE_CHECKING:`."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, type_only))
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return found


def _deepest(name: str, known: set[str]) -> str:
    """`name` or its longest prefix that is a module of the package."""
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or name


def edges_of(module: str, is_pkg: bool, source: str, known: set[str], path: str = "") -> list[Edge]:
    """The package-internal imports of one module's source."""
    out = []
    for node, type_only in _imports(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [_deepest(a.name, known) for a in node.names]
        else:
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{origin}.{a.name}"
                targets.append(sub if sub in known else _deepest(origin, known))
        for t in dict.fromkeys(targets):  # (one edge per imported module and line)
            if (t == PACKAGE or t.startswith(PACKAGE + ".")) and t != module:
                out.append(Edge(module, node.lineno, t, path, type_only))
    return out


def import_graph(root: Path = ROOT) -> list[Edge]:
    mods = modules(root)
    known = set(mods)
    out = []
    for name, (p, is_pkg) in mods.items():
        out += edges_of(name, is_pkg, p.read_text(), known, str(p.relative_to(root)))
    return out


def layer_of(module: str) -> tuple[int, str, str] | None:
    """(layer index, layer name, unit) of a module: the unit is the prefix that placed it (the
    whole layer for an open one); None for a module no layer names."""
    best = None
    for i, (name, is_open, prefixes) in enumerate(LAYERS):
        for rel in prefixes:
            full = f"{PACKAGE}.{rel}" if rel else PACKAGE
            hit = module == full or (rel != "" and module.startswith(full + "."))
            if hit and (best is None or len(full) > best[0]):
                best = (len(full), i, name, name if is_open else full)
    return None if best is None else best[1:]


def layer_violations(edges: list[Edge]) -> list[str]:
    bad = []
    for e in edges:
        a, b = layer_of(e.src), layer_of(e.dst)
        if a is None or b is None:
            bad.append(f"{e}: {e.src if a is None else e.dst} is in no layer (add it to LAYERS)")
        elif b[0] > a[0] or (b[0] == a[0] and a[2] != b[2]):
            bad.append(f"{e}  [{a[2]} (layer {a[0]} {a[1]}) -> {b[2]} (layer {b[0]} {b[1]})]")
    return bad


def cycles(edges: list[Edge]) -> list[tuple[frozenset[str], list[Edge]]]:
    """The strongly connected components of more than one module, each with its edges."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.type_only:
            graph.setdefault(e.src, set()).add(e.dst)
            graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return [(c, [e for e in edges if e.src in c and e.dst in c and not e.type_only]) for c in found]


def _report(comps: list[tuple[frozenset[str], list[Edge]]]) -> str:
    lines = []
    for comp, es in comps:
        lines.append(f"cycle of {len(comp)} modules: {', '.join(sorted(comp))}")
        lines += [f"    {e}" for e in sorted(es, key=lambda e: (e.src, e.line))]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- the checks


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in modules() if layer_of(m) is None)
    assert not missing, f"modules in no layer of LAYERS (tests/test_import_layers.py): {missing}"


def test_imports_run_down_the_layers() -> None:
    bad = layer_violations(import_graph())
    assert not bad, f"{len(bad)} imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    comps = cycles(import_graph())
    new = [(c, es) for c, es in comps if c not in PENDING_CYCLES]
    assert not new, f"{len(new)} import cycles:\n" + _report(new)
    gone = [sorted(c) for c in PENDING_CYCLES if c not in {c for c, _ in comps}]
    assert not gone, f"PENDING_CYCLES names cycles that no longer exist (remove them): {gone}"


# ------------------------------------------------------------------------- the checker checked

_SYNTHETIC = '''
from __future__ import annotations
import torch
from .. import settings
from ..codegen import registry
from . import graph
from .graph import Graph
import novaforge.runtime.interpret as interp
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from ..api import CompiledModule

def f():
    from ..frontend.lower import UnsupportedError
    from .. import __version__
'''


def test_the_checker_sees_lazy_relative_and_submodule_imports() -> None:
    known = set(modules())
    es = edges_of("novaforge.ir.fake", False, _SYNTHETIC, known)
    got = {(e.line, e.dst, e.type_only) for e in es}
    assert got == {(4, "novaforge.settings", False), (5, "novaforge.codegen.registry", False),
                   (6, "novaforge.ir.graph", False), (7, "novaforge.ir.graph", False),
                   (8, "novaforge.runtime.interpret", False), (11, "novaforge.api", True),
                   (14, "novaforge.frontend.lower", False), (15, "novaforge", False)}, got
    bad = layer_violations(es)
    # ir may import the base and itself; the codegen, runtime, API, frontend and root imports are upward
    assert sorted(int(b.split(":")[1]) for b in bad) == [5, 8, 11, 14, 15], bad
    assert all("novaforge.ir.fake imports" in b for b in bad)
    pkg = edges_of("novaforge.ir", True, "from . import graph\nfrom .ops import OPS\n", known)
    assert [e.dst for e in pkg] == ["novaforge.ir.graph", "novaforge.ir.ops"]


def test_the_checker_fails_on_an_upward_edge_a_peer_edge_and_a_cycle() -> None:
    up = Edge("novaforge.ir.ops.attention_cuda", 178, "novaforge.codegen.triton.attention_train")
    peer = Edge("novaforge.frontend.capture", 3, "novaforge.passes.pipeline")
    down = Edge("novaforge.codegen.registry", 19, "novaforge.runtime.interpret")
    store = Edge("novaforge.frontend.graph_cache", 9, "novaforge.cache.store")
    admin = Edge("novaforge.codegen.cpu.backend", 9, "novaforge.cache.admin")
    bad = layer_violations([up, peer, down, store, admin])
    assert len(bad) == 3 and str(up) in bad[0] and str(peer) in bad[1] and str(admin) in bad[2], bad
    a = Edge("novaforge.api", 158, "novaforge.compiled_module")
    b = Edge("novaforge.compiled_module", 33, "novaforge.api")
    typed = Edge("novaforge.ir.printer", 9, "novaforge.ir.graph", type_only=True)
    back = Edge("novaforge.ir.graph", 279, "novaforge.ir.printer")
    comps = cycles([a, b, typed, back, down])
    assert [(sorted(c), len(es)) for c, es in comps] == [(["novaforge.api", "novaforge.compiled_module"], 2)]
    assert "novaforge.api:158: novaforge.api imports novaforge.compiled_module" in _report(comps)

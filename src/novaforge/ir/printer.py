"""Readable text form of a graph, used by tests, dumps and `explain`.

Values are numbered %0, %1, ... in definition order (inputs first), so the text does not
depend on global value ids. Fused kernels print their bodies indented below the kernel line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (a type only: graph.py's Graph.__str__ imports this module)
    from .graph import Graph


def format_graph(graph: Graph, indent: str = "", names: dict | None = None, max_nodes: int | None = None) -> str:
    names = {} if names is None else names

    def name(v) -> str:
        if v not in names:
            names[v] = f"%{len(names)}"
        return names[v]

    lines = []
    ins = []
    for gi in graph.inputs:
        extra = "" if gi.kind == "user" else f" {gi.kind}"
        label = f' "{gi.name}"' if gi.name else ""
        ins.append(f"{name(gi.value)}: {gi.value.type}{extra}{label}")
    lines.append(f"{indent}graph({', '.join(ins)}) {{")
    for i, n in enumerate(graph.nodes):
        if max_nodes is not None and i >= max_nodes:
            lines.append(f"{indent}  ... {len(graph.nodes) - max_nodes} more nodes")
            break
        outs = ", ".join(f"{name(o)}: {o.type}" for o in n.outputs)
        args = ", ".join(name(v) for v in n.inputs)
        kernel = n.attrs.get("kernel") if n.op == "kernel" else None
        attrs = "" if kernel is not None or not n.attrs else (", " if args else "") + repr(n.attrs)
        label = f"kernel {kernel.name} [{kernel.kind}]" if kernel is not None else n.op
        where = n.meta.get("source")
        comment = f"  # {where}" if where else ""
        lines.append(f"{indent}  {outs} = {label}({args}{attrs}){comment}")
        if kernel is not None:
            sub = format_graph(kernel.body, indent + "      ")
            lines.append(sub)
    outs = ", ".join(name(v) for v in graph.outputs)
    lines.append(f"{indent}  return {outs}")
    for old, new in graph.mutations:
        lines.append(f"{indent}  write {name(new)} -> {name(old)}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)

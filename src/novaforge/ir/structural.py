"""Structural keys: hashes of computation structure, independent of value names and ids.

key(node) = H(op, canonical attrs, keys of its inputs, output types); a graph input's key is
its position, kind and type. Two nodes with equal keys compute the same values (for nodes that
are neither `random` nor `side_effect`), which is what CSE merges on. A graph's key hashes its
inputs' types and the keys of its outputs, so identical layers of a model give identical
kernel keys and share compiled code. Keys are stable across processes (no Python `hash`).
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

import torch

from .graph import Attrs, Graph, Node, Value
from .symbolic import Sym
from .types import TensorType


def _h(s: str) -> str:
    return hashlib.blake2b(s.encode(), digest_size=16).hexdigest()


def canonical(v: Any) -> str:
    """A stable text form of an attribute value."""
    if isinstance(v, bool) or v is None or isinstance(v, int | str):
        return repr(v)
    if isinstance(v, float):
        return v.hex() if v == v else "nan"
    if isinstance(v, complex):
        return f"complex({canonical(v.real)},{canonical(v.imag)})"
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return str(v)
    if isinstance(v, TensorType):
        return str(v) + "|" + v.device
    if isinstance(v, tuple):
        return "(" + ",".join(canonical(x) for x in v) + ")"
    if isinstance(v, Sym):  # a canonical sympy expression: equal expressions print equally
        return f"sym({v.expr})"
    if isinstance(v, Attrs):
        return "{" + ",".join(f"{k}:{canonical(v[k])}" for k in sorted(v)) + "}"
    key = getattr(v, "structural_key", None)
    if key is not None:
        return key
    if hasattr(v, "__dataclass_fields__"):
        return type(v).__name__ + canonical(tuple(getattr(v, f) for f in v.__dataclass_fields__))
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no canonical form")


def node_key(node: Node, input_keys: list[str]) -> str:
    outs = ",".join(str(o.type) + "|" + o.type.device for o in node.outputs)
    return _h(f"{node.op}|{canonical(node.attrs)}|{','.join(input_keys)}|{outs}")


def value_keys(graph: Graph) -> dict[Value, str]:
    """Structural key of every value of the graph."""
    keys: dict[Value, str] = {}
    for i, gi in enumerate(graph.inputs):
        keys[gi.value] = f"in{i}:{gi.kind}:{gi.value.type}|{gi.value.type.device}"
    for n in graph.nodes:
        nk = node_key(n, [keys[v] for v in n.inputs])
        if len(n.outputs) == 1:
            keys[n.outputs[0]] = nk
        else:
            for j, o in enumerate(n.outputs):
                keys[o] = _h(f"{nk}#{j}")
    return keys


def graph_key(graph: Graph) -> str:
    keys = value_keys(graph)
    ins = ",".join(f"{gi.kind}:{gi.value.type}|{gi.value.type.device}" for gi in graph.inputs)
    outs = ",".join(keys[v] for v in graph.outputs)
    muts = ",".join(f"{keys[a]}<-{keys[b]}" for a, b in graph.mutations)
    return _h(f"graph|{ins}|{outs}|{muts}")

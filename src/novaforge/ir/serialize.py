"""IR graphs to and from plain JSON data (for the on-disk graph cache; never pickles).

`graph_to_data(graph, const_ref)` gives a dict of lists, strings and numbers: values are
numbered, types and attributes are written with explicit tags, and each `const` input's tensor
is described by `const_ref(graph_input)` (a reference to module state by name, or small data
inline, or None: the graph cannot be serialized). `graph_from_data(data, const_tensor)`
rebuilds an equal graph with fresh values, resolving const references through the callback.

Only what the captured graph holds is supported: attributes built from None, bools, ints,
floats (exact, inf and nan included), strings, tuples, dtypes, devices, memory formats and
layouts, TensorTypes and extern tensor markers. Anything else raises `SerializeError`, and the
caller does not cache the graph.

Invariant: `graph_from_data(graph_to_data(g))` has the same nodes, attributes, types, inputs,
outputs and mutations as `g` (hence the same structural keys), and node meta keeps the
'source' and 'aten' provenance strings.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import torch

from .extern import TensorArg
from .graph import Attrs, Graph, GraphInput, Node, Value
from .kernel import Kernel
from .types import TensorType

FORMAT = 1
_META_KEYS = ("source", "aten")
_TORCH_ENUMS = (torch.memory_format, torch.layout)


class SerializeError(ValueError):
    pass


def encode_value(v: Any) -> Any:
    """A JSON-able form of an attribute value (tagged where JSON would lose the type)."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}
    if isinstance(v, tuple):
        return {"t": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return {"l": [encode_value(x) for x in v]}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).replace("torch.", "")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, _TORCH_ENUMS):
        return {"torch": str(v).replace("torch.", "")}
    if isinstance(v, TensorType):
        return {"tt": [list(v.shape), str(v.dtype).replace("torch.", ""), v.device]}
    if isinstance(v, TensorArg):
        return {"arg": v.index}
    raise SerializeError(f"cannot serialize {type(v).__name__} {v!r}")


def decode_value(d: Any) -> Any:
    if d is None or isinstance(d, bool | int | str):
        return d
    if not isinstance(d, dict) or len(d) != 1:
        raise SerializeError(f"bad encoded value {d!r}")
    (tag, x), = d.items()
    if tag == "f":
        return float(x)
    if tag == "t":
        return tuple(decode_value(e) for e in x)
    if tag == "l":
        return [decode_value(e) for e in x]
    if tag == "dtype":
        return _dtype(x)
    if tag == "device":
        return torch.device(x)
    if tag == "torch":
        v = getattr(torch, x, None)
        if not isinstance(v, _TORCH_ENUMS):
            raise SerializeError(f"unknown torch constant {x!r}")
        return v
    if tag == "tt":
        shape, dtype, device = x
        return TensorType(tuple(int(s) for s in shape), _dtype(dtype), str(device))
    if tag == "arg":
        return TensorArg(int(x))
    raise SerializeError(f"unknown tag {tag!r}")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise SerializeError(f"unknown dtype {name!r}")
    return dt


def tensor_to_data(t: torch.Tensor) -> dict[str, Any]:
    """Small tensors inline: dtype, shape and the contiguous bytes in base64."""
    # (a fresh tensor: `contiguous()` keeps a size-1 dimension's stride, 0 when expanded, which
    # the byte view refuses)
    c = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())
    raw = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    return {"dtype": str(c.dtype).replace("torch.", ""), "shape": list(c.shape),
            "device": str(t.device), "b64": base64.b64encode(raw).decode("ascii")}


def tensor_from_data(d: dict[str, Any]) -> torch.Tensor:
    dtype = _dtype(d["dtype"])
    shape = tuple(int(s) for s in d["shape"])
    raw = base64.b64decode(d["b64"])
    t = torch.empty(shape, dtype=dtype)
    if t.numel():
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if flat.numel() != t.numel() * t.element_size():
            raise SerializeError("inline tensor data has the wrong size")
        t.reshape(-1).view(torch.uint8).copy_(flat)
    return t.to(d.get("device", "cpu"))


def _kernel_to_data(k: Kernel, const_ref: Callable[[GraphInput], dict[str, Any] | None]) -> dict[str, Any]:
    return {"kernel": {"name": k.name, "kind": str(k.kind), "anchor": k.anchor, "key": k.structural_key,
                       "body": graph_to_data(k.body, const_ref, kernels=True)}}


def _kernel_from_data(d: dict[str, Any], const_tensor: Callable[[dict[str, Any]], torch.Tensor]) -> Kernel:
    # (the stored structural key: the entry's checksum covers it; recomputing it is most of a load)
    return Kernel(d["name"], d["kind"], graph_from_data(d["body"], const_tensor), d["anchor"], d["key"])


def graph_to_data(graph: Graph, const_ref: Callable[[GraphInput], dict[str, Any] | None],
                  kernels: bool = False) -> dict[str, Any]:
    """`kernels`: a fused graph (kernel nodes with their bodies) may be written too (the
    optimized-graph cache, cache/pipeline_cache.py)."""
    ids: dict[Value, int] = {}

    def vid(v: Value) -> int:
        if v not in ids:
            ids[v] = len(ids)
        return ids[v]

    def vtype(v: Value) -> list:
        return [vid(v), encode_value(v.type)["tt"], v.hint]

    inputs = []
    for gi in graph.inputs:
        entry: dict[str, Any] = {"value": vtype(gi.value), "kind": gi.kind, "name": gi.name}
        if gi.kind == "const":
            ref = const_ref(gi)
            if ref is None:
                raise SerializeError(f"constant {gi.name} cannot be referenced")
            entry["const"] = ref
        inputs.append(entry)
    nodes = []
    for n in graph.nodes:
        if n.op == "kernel" and not kernels:
            raise SerializeError("fused graphs are not serialized (kernels are cached as libraries)")
        nodes.append({
            "op": n.op,
            "in": [vid(v) for v in n.inputs],
            "attrs": {k: _kernel_to_data(v, const_ref) if isinstance(v, Kernel) else encode_value(v)
                      for k, v in n.attrs.items()},
            "out": [vtype(v) for v in n.outputs],
            "meta": {k: n.meta[k] for k in _META_KEYS if isinstance(n.meta.get(k), str)},
        })
    return {
        "format": FORMAT,
        "inputs": inputs,
        "nodes": nodes,
        "outputs": [vid(v) for v in graph.outputs],
        "mutations": [[vid(a), vid(b)] for a, b in graph.mutations],
        "meta": {k: v for k, v in graph.meta.items() if isinstance(v, int | float | str | bool)},
    }


def graph_from_data(data: dict[str, Any], const_tensor: Callable[[dict[str, Any]], torch.Tensor]) -> Graph:
    if data.get("format") != FORMAT:
        raise SerializeError(f"graph format {data.get('format')!r}, expected {FORMAT}")
    values: dict[int, Value] = {}

    def new(entry: list) -> Value:
        i, tt, hint = entry
        v = Value(decode_value({"tt": tt}), hint=str(hint))
        values[int(i)] = v
        return v

    def get(i: int) -> Value:
        if i not in values:
            raise SerializeError(f"value {i} used before it is defined")
        return values[i]

    inputs = []
    for e in data["inputs"]:
        v = new(e["value"])
        tensor = None
        if e["kind"] == "const":
            tensor = const_tensor(e["const"])
            if tuple(tensor.shape) != v.type.shape or tensor.dtype != v.type.dtype:
                raise SerializeError(f"constant {e['name']}: {tensor.dtype}{list(tensor.shape)}, graph has {v.type}")
        inputs.append(GraphInput(v, e["kind"], e["name"], tensor))
    nodes = []
    for e in data["nodes"]:
        ins = [get(i) for i in e["in"]]
        attrs = Attrs({k: _kernel_from_data(x["kernel"], const_tensor) if isinstance(x, dict) and "kernel" in x
                       else decode_value(x) for k, x in e["attrs"].items()})
        outs = [new(o) for o in e["out"]]
        nodes.append(Node(e["op"], ins, attrs, outs, dict(e.get("meta") or {})))
    outputs = [get(i) for i in data["outputs"]]
    mutations = [(get(a), get(b)) for a, b in data["mutations"]]
    graph = Graph(inputs, nodes, outputs, mutations, dict(data.get("meta") or {}))
    unknown = {n.op for n in nodes} - _known_ops()
    if unknown:
        raise SerializeError(f"unknown ops {sorted(unknown)}")
    return graph


def _known_ops() -> set[str]:
    from .ops import OPS

    return set(OPS)


"""Module state held in tensor subclasses (a torchao-quantized weight), seen as its plain tensors.

A torchao `Int8WeightOnlyConfig` linear keeps its weight as a wrapper subclass (`Int8Tensor`: int8
`qdata` [N, K], float32 `scale`, ...) whose operations decompose to ATen ops on those inner
tensors. Capture binds the inner tensors as the program's inputs, under the names
`<state name>#<attribute>` (`#` nests: `w#a#b`), and rebuilds the subclass from them inside the
traced call (`__tensor_unflatten__`), so the graph sees int8 data (passes/recognize_int8_weights.py)
and the runtime binds, checks and rebinds plain tensors (runtime/state.py resolves the names).

Invariant: `flatten_state` maps each plain tensor to itself and each traceable wrapper subclass
to its inner tensors, recursively, in `__tensor_flatten__` order; `rebuild_state` inverts it on
any tensors of the same structure (real, fake or traced).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

SEP = "#"


def is_subclass_state(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t)


def flatten_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with every wrapper subclass replaced by its inner tensors (`name#attr`)."""
    if not any(is_subclass_state(t) for t in state.values()):
        return state
    out: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        if not is_subclass_state(t):
            out[name] = t
            return
        attrs, _ctx = t.__tensor_flatten__()
        for a in attrs:
            put(f"{name}{SEP}{a}", getattr(t, a))

    for name, t in state.items():
        put(name, t)
    return out


def rebuild_state(originals: dict[str, torch.Tensor], flat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict for the traced call: `originals`' names, each subclass rebuilt from `flat`."""
    if not any(is_subclass_state(t) for t in originals.values()):
        return flat

    def build(name: str, t: torch.Tensor) -> torch.Tensor:
        if not is_subclass_state(t):
            return flat[name]
        attrs, ctx = t.__tensor_flatten__()
        inner = {a: build(f"{name}{SEP}{a}", getattr(t, a)) for a in attrs}
        return type(t).__tensor_unflatten__(inner, ctx, t.shape, t.stride())

    return {name: build(name, t) for name, t in originals.items()}


def split_name(name: str) -> tuple[str, list[str]]:
    """('0.weight', ['qdata']) for '0.weight#qdata'; (name, []) for a plain state name."""
    outer, *path = name.split(SEP)
    return outer, path


def resolve_inner(t: Any, path: list[str]) -> Any:
    """The inner tensor at `path` of `t` (t itself for an empty path; None when it has none)."""
    for a in path:
        t = getattr(t, a, None)
        if t is None:
            return None
    return t

"""Attrs: the immutable attribute mapping of an IR node (`Node.attrs`).

In a module of its own, below graph.py and the op records (ir/ops/core.py checks a node's
attributes into one), so that neither imports the other for it.

Invariant: an Attrs never changes after construction; lists become tuples, so equal mappings
hash equal and every value is hashable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


class Attrs(Mapping[str, Any]):
    """Immutable attribute mapping; values must be hashable (ints, floats, strs, tuples,
    dtypes, TensorTypes, frozen objects)."""

    __slots__ = ("_d", "_h")

    def __init__(self, d: Mapping[str, Any] | None = None, **kw: Any) -> None:
        data = dict(d or {})
        data.update(kw)
        for k, v in data.items():
            if isinstance(v, list):
                data[k] = _freeze(v)
        self._d = data
        self._h: int | None = None

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._h is None:
            self._h = hash(tuple(sorted(self._d.items(), key=lambda kv: kv[0])))
        return self._h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._d == other._d

    def replace(self, **kw: Any) -> Attrs:
        d = dict(self._d)
        d.update(kw)
        return Attrs(d)

    def __repr__(self) -> str:
        return ", ".join(f"{k}={_fmt(v)}" for k, v in self._d.items())


def _freeze(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


def _fmt(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


EMPTY_ATTRS = Attrs()

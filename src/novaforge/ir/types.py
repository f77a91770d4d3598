"""Tensor types of IR values.

Invariant: a `TensorType` is immutable; its dtype and device are concrete, and each
dimension is a non-negative int or a `Sym` (a symbolic size, ir/symbolic.py; graphs with
symbols are specialized to ints before the passes run). Values are logically contiguous
tensors: strides are a property of buffers at run time, never of IR values (value semantics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .symbolic import Sym

DTYPE_SHORT: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
}
SHORT_DTYPE: dict[str, torch.dtype] = {v: k for k, v in DTYPE_SHORT.items()}

FLOAT_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


def is_int(dtype: torch.dtype) -> bool:
    return dtype in INT_DTYPES


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen kernels compute 16-bit float math in (float32); other dtypes are unchanged."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Does `shape`, right-aligned, broadcast to `target` (each dim 1 or equal; rank not higher)?"""
    off = len(target) - len(shape)
    return off >= 0 and all(s in (1, target[off + i]) for i, s in enumerate(shape))


def normalize_device(device: torch.device | str) -> str:
    """'cpu', 'cuda:0', ... (a bare 'cuda' becomes 'cuda:<current>')."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda:0"
    return str(d)


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str = "cpu"

    def __post_init__(self) -> None:
        for s in self.shape:
            if isinstance(s, Sym):
                continue
            if not isinstance(s, int) or s < 0:
                raise ValueError(f"TensorType shape must be non-negative ints or Syms, got {self.shape}")
        if self.dtype not in DTYPE_SHORT:
            raise ValueError(f"unsupported dtype {self.dtype}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype, self.device)

    def with_dtype(self, dtype: torch.dtype) -> TensorType:
        return TensorType(self.shape, dtype, self.device)

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        return TensorType(tuple(int(s) for s in t.shape), t.dtype, normalize_device(t.device))

    def __str__(self) -> str:
        dims = ",".join(str(s) for s in self.shape)
        dev = "" if self.device == "cpu" else f"@{self.device}"
        return f"{DTYPE_SHORT[self.dtype]}[{dims}]{dev}"


_ITEMSIZE = {
    torch.float32: 4,
    torch.float64: 8,
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.int64: 8,
    torch.int32: 4,
    torch.int16: 2,
    torch.int8: 1,
    torch.uint8: 1,
    torch.bool: 1,
}


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting of static shapes; raises ValueError when incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim not in (1, d):
                raise ValueError(f"shapes {shapes} do not broadcast")
            dim = d
        out.append(dim)
    return tuple(out)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def normalize_axis(axis: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= axis < r:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % r

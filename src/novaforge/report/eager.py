"""Eager PyTorch's side of the report: its time per call and its peak of live tensor memory.

`eager_peak_bytes` runs the model once under a `TorchDispatchMode` that sees every tensor an
ATen op returns. A storage is counted from the first op that returns it until the last tensor
viewing it dies (weak references to each tensor; views share their base's count), so the peak
is the largest sum of live storages allocated during the call: intermediates and outputs, the
memory an arena must hold plus the outputs. Parameters, buffers and inputs (alive before the
call) are never counted, nor are views of them.

Invariant: measuring does not change the model's results (the mode only observes); the count
is exact for the CPU allocator, which frees a storage when its last tensor dies.
"""

from __future__ import annotations

import statistics
import time
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _LiveBytes(TorchDispatchMode):
    def __init__(self, preexisting: set[int]) -> None:
        super().__init__()
        self.preexisting = preexisting
        self.refs: dict[int, int] = {}  # storage data_ptr -> live tensors viewing it
        self.sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def _release(self, ptr: int) -> None:
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            del self.refs[ptr]
            self.live -= self.sizes.pop(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ptr, nbytes = st.data_ptr(), st.nbytes()
            if ptr in self.preexisting or nbytes == 0:
                continue
            if ptr not in self.refs:
                self.refs[ptr] = 0
                self.sizes[ptr] = nbytes
                self.live += nbytes
                self.peak = max(self.peak, self.live)
            self.refs[ptr] += 1
            weakref.finalize(t, self._release, ptr)
        return out


def _storages(objs: Any) -> set[int]:
    ptrs = set()
    for t in objs:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            ptrs.add(t.untyped_storage().data_ptr())
    return ptrs


def eager_peak_bytes(model: Any, args: tuple, kwargs: dict | None = None) -> int:
    """Peak bytes of tensors allocated and alive at once during one eager call."""
    kwargs = kwargs or {}
    before = pytree.tree_leaves((args, kwargs))
    if isinstance(model, torch.nn.Module):
        before += list(model.parameters()) + list(model.buffers())
    mode = _LiveBytes(_storages(before))
    with torch.no_grad(), mode:
        out = model(*args, **kwargs)
    del out
    return mode.peak


def eager_ms(model: Any, args: tuple, kwargs: dict | None = None, runs: int = 5) -> float:
    """Median milliseconds of an eager call (after one warm-up call)."""
    kwargs = kwargs or {}
    times = []
    with torch.no_grad():
        model(*args, **kwargs)
        for _ in range(runs):
            t0 = time.perf_counter()
            model(*args, **kwargs)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)

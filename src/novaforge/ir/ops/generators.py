"""Generators: ops without tensor inputs (a 0-d scalar, a fill, an arithmetic sequence).

Fusion replicates generators into every kernel that reads them, where they become literals
or index arithmetic; they never occupy memory of their own.

Invariant: every op here has the `generator` flag and no inputs; `literal` ones hold one
value in `attrs["value"]`.
"""

from __future__ import annotations

import torch

from ..types import TensorType, is_float
from .core import REQUIRED, define

aten = torch.ops.aten
FAMILY = "generator"


def _scalar_infer(ts, a):
    return [TensorType((), a["dtype"], a["device"])]


# (a fill, not torch.tensor: that copies from host memory, which a CUDA graph capture forbids;
# the H200's compile_step capture failed on it)
scalar = define("scalar", 0, _scalar_infer,
                lambda xs, a: torch.full((), a["value"], dtype=a["dtype"], device=a["device"]),
                attrs={"value": REQUIRED, "dtype": REQUIRED, "device": "cpu"}, flags={"generator", "literal"},
                flops=0, doc="a 0-d constant; codegen emits it as a literal", family=FAMILY)


@scalar.lowers(aten.scalar_tensor.default)
def _lower_scalar_tensor(ctx, value, **kwargs):
    t = ctx.out_type
    return ctx.scalar(value, t.dtype, t.device)


define("full", 0, lambda ts, a: [TensorType(tuple(a["shape"]), a["dtype"], a["device"])],
       lambda xs, a: torch.full(a["shape"], a["value"], dtype=a["dtype"], device=a["device"]),
       attrs={"shape": REQUIRED, "value": REQUIRED, "dtype": REQUIRED, "device": "cpu"},
       flags={"generator", "literal"}, flops=0, family=FAMILY)

iota = define("iota", 0, lambda ts, a: [TensorType((a["length"],), a["dtype"], a["device"])],
              lambda xs, a: (torch.arange(a["length"], dtype=torch.float64 if is_float(a["dtype"]) else torch.int64,
                                          device=a["device"]) * a["step"] + a["start"]).to(a["dtype"]),
              attrs={"length": REQUIRED, "start": 0, "step": 1, "dtype": torch.int64, "device": "cpu"},
              flags={"generator"}, flops=0, doc="start + step * arange(length)", family=FAMILY)


@iota.lowers(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _lower_arange(ctx, *args, **kwargs):
    nums = [a for a in args]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    t = ctx.out_type
    if not all(isinstance(x, int | float) for x in (start, step)):
        raise ctx.unsupported("arange with tensor bounds")
    return ctx.emit("iota", (), length=t.shape[0], start=start, step=step, dtype=t.dtype, device=t.device)

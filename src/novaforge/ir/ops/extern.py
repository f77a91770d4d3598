"""Ops the compiler does not generate code for itself: `extern` / `extern_effect` (an ATen
call kept as is, see ir/extern.py) and `kernel` (a fused group built by the fuse pass).

Externs are created by the lowering driver (frontend/lower.py, `LowerCtx.extern`) for ATen
ops without a rule or decomposition, and by rules for cases they do not lower; they have no
ATen rules of their own.

Invariant: an extern's output types are its `out_types` attribute (the FX node's recorded
fake values); an `extern_effect` (random or side-effecting ATen op) is never merged, folded
or removed.
"""

from __future__ import annotations

from .core import REQUIRED, define

FAMILY = "extern"


def _extern_infer(ts, a):
    return list(a["out_types"])


def _extern_impl(xs, a):
    from ..extern import call_extern

    out = call_extern(a["target"], a["spec"], xs)
    keep = a.get("keep")
    return out if keep is None else tuple(out[i] for i in keep)


# keep: the positions of the ATen results that are tensors, when some are None (the extern's
# outputs are those, in order)
EXTERN_ATTRS = {"target": REQUIRED, "spec": REQUIRED, "out_types": REQUIRED, "reason": "", "keep": None}
define("extern", (0, None), _extern_infer, _extern_impl, attrs=EXTERN_ATTRS, flags={"extern"},
       doc="an ATen call kept as is (see ir/extern.py); counted and reported", family=FAMILY)
define("extern_effect", (0, None), _extern_infer, _extern_impl, attrs=EXTERN_ATTRS,
       flags={"extern", "side_effect", "random"},
       doc="an ATen call with randomness or side effects: never merged, folded or removed", family=FAMILY)


def _kernel_infer(ts, a):
    k = a["kernel"]
    want = [gi.value.type for gi in k.body.inputs]
    if list(ts) != want:
        raise TypeError(f"kernel {k.name}: input types {[str(t) for t in ts]} != {[str(t) for t in want]}")
    return [v.type for v in k.body.outputs]


define("kernel", (0, None), _kernel_infer, None, attrs={"kernel": REQUIRED}, flags={"fused"}, flops=0,
       doc="a fused group from the fuse pass; attrs['kernel'] is an ir.kernel.Kernel", family="fused")

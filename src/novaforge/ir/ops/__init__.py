"""The op records: every IR primitive, defined once with all its rules beside it.

One file per family, each a list of records (`core.OpDef`, see core.py for the fields and
flags): elementwise.py, generators.py, reduction.py, shape.py, indexing.py, matmul.py
(anchors), extern.py; attention_cuda.py lowers CUDA's SDPA forms to matmul.py's
records (attention_cuda_impl.py: their implementations on CUDA tensors). To add an op: define
it in its family's file (name, arity, inference, reference implementation, flags, cost; its
ATen rules with `@op.lowers(...)` and its VJP with `@op.defvjp` beside it), then register one rendering per backend
(codegen/cpu/cexpr.py, codegen/triton/exprs.py) or a "not rendered: reason" there;
`novaforge ops --backends` lists what each backend does with every op.

Invariant: importing this package defines every op exactly once, in a fixed order (the
order of `OPS`, which docs and printers follow).
"""

from __future__ import annotations

# isort: off
from . import elementwise, generators, reduction, shape, indexing, matmul, extern, random  # noqa: F401  (definition order)
from . import attention_cuda  # noqa: F401  (CUDA's SDPA forms, lowered to matmul.py's records)
# isort: on
from .core import ATEN_OWNER, OPS, REQUIRED, OpDef, Reduction, define, extreme, node_flops
from .matmul import attention_flops

FAMILIES = ("elementwise", "generator", "reduction", "shape", "indexing", "matmul", "extern", "fused")

__all__ = ["ATEN_OWNER", "FAMILIES", "OPS", "REQUIRED", "OpDef", "Reduction", "attention_flops", "define", "extreme",
           "node_flops"]

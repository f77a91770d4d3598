"""The lowering table: ATen overload -> builder.

Two sources, assembled here in one place: the rules that stand beside the IR op they lower
to, in its record (`OpDef.aten`, ir/ops/<family>.py: exp, add, sum, permute, mm, sdpa, ...),
and the composite rules of the frontend's family files (lower_elementwise, lower_nn,
lower_shape: ATen ops built from several IR ops), which add themselves to
`lower_elementwise.RULES` with the `rule` decorator. An overload has one rule; one claimed by
both sources is an error at import. `docs/ops.md` is generated from the table
(`novaforge ops --markdown`).
"""

from __future__ import annotations

from typing import Any

from ..ir.ops import OPS
from . import lower_elementwise, lower_nn, lower_shape

RULE_MODULES = (lower_elementwise, lower_nn, lower_shape)


def _assemble() -> dict[Any, Any]:
    table: dict[Any, Any] = {}
    for d in OPS.values():
        table.update(d.aten)
    clash = sorted(str(t) for t in lower_elementwise.RULES if t in table)
    if clash:
        raise AssertionError(f"ATen overloads with a rule in an op record and in the frontend: {clash}")
    table.update(lower_elementwise.RULES)
    return table


LOWERINGS: dict[Any, Any] = _assemble()

"""The lowering table: ATen overload -> builder.

The rule modules add their builders to one dict (`lower_elementwise.RULES`) with the `rule`
decorator; this module imports each of them explicitly, so the table is assembled in one
place. `docs/ops.md` is generated from it (`novaforge ops --markdown`).
"""

from __future__ import annotations

from typing import Any

from . import lower_elementwise, lower_nn, lower_shape

LOWERINGS: dict[Any, Any] = lower_elementwise.RULES
RULE_MODULES = (lower_elementwise, lower_nn, lower_shape)

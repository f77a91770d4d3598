"""Every lowering rule in the table against eager ATen on random inputs.

Cases come from cases_*.py; the coverage test fails when a rule in the table has no case,
so a new rule cannot go untested. Each case runs with every dtype it lists and with
contiguous and non-contiguous inputs (see harness.py).
"""

from __future__ import annotations

import pytest
import torch

from novaforge.frontend.table import LOWERINGS

from . import cases_elementwise, cases_nn, cases_shape
from .harness import Case, run_case

ALL_CASES: list[Case] = cases_elementwise.CASES + cases_shape.CASES + cases_nn.CASES


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in ALL_CASES:
        k = seen.get(c.id, 0)
        seen[c.id] = k + 1
        out.append(c.id if k == 0 else f"{c.id}#{k}")
    return out


@pytest.mark.parametrize("case", ALL_CASES, ids=_ids())
def test_rule_matches_eager(case: Case) -> None:
    for dtype in case.dtypes:
        run_case(case, dtype)


# CUDA's SDPA forms: eager cannot run them on the CPU, so tests/ir/test_attention_cuda.py lowers each
# on hand-built graphs and compares with SDPA and autograd instead
_aten = torch.ops.aten
CUDA_ONLY = {getattr(_aten, f"_scaled_dot_product_{form}_attention{part}").default
             for form in ("cudnn", "efficient", "flash") for part in ("", "_backward")}


def test_every_rule_has_a_case() -> None:
    covered = {c.target for c in ALL_CASES} | CUDA_ONLY
    missing = sorted(str(t) for t in LOWERINGS if t not in covered)
    assert not missing, f"lowering rules without a test case: {missing}"


def test_every_case_targets_a_rule() -> None:
    stray = sorted({str(c.target) for c in ALL_CASES if c.target not in LOWERINGS})
    assert not stray, f"cases for ops that have no rule: {stray}"


def test_case_ids_are_stable() -> None:
    # the random inputs are seeded by the case id: duplicate ids would share inputs
    dups = [k for k in _ids() if "#" in k]
    assert not dups, f"duplicate case ids: {dups}"


def test_every_rule_is_reachable() -> None:
    """Mutating overloads never reach a rule (the driver rejects them): no dead entries."""
    dead = sorted(str(t) for t in LOWERINGS
                  if isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable)
    assert not dead, f"rules for mutating ops can never run: {dead}"

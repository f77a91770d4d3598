"""Symbolic sizes (ir/symbolic.py): canonical arithmetic, decisions from ranges only, binding."""

from __future__ import annotations

import pytest

from novaforge.ir.symbolic import (
    Sym,
    SymbolicDecision,
    SymbolTable,
    as_dim,
    bind_symbols,
    substitute,
    symbol,
    using_ranges,
)
from novaforge.ir.types import TensorType

s0, s1 = symbol(0), symbol(1)
S0, S1 = Sym(s0), Sym(s1)


def test_arithmetic_is_canonical_and_constants_come_back_as_ints():
    assert S0 * 12 == 12 * S0
    assert (S0 + 1) * 2 == 2 * S0 + 2
    assert S0 - S0 == 0 and isinstance(S0 - S0, int)
    assert (S0 * 8) // 8 == S0
    assert (S0 * 8) % 4 == 0 and isinstance((S0 * 8) % 4, int)
    assert hash(S0 * 3) == hash(3 * S0)
    assert str(S0 * 768) == "768*s0"


def test_comparisons_decide_from_ranges_or_refuse():
    with using_ranges({s0: (2, 512)}):
        assert S0 != 1 and S0 > 1 and S0 <= 512 and not S0 < 2
        assert S0 * 768 > 1000
        with pytest.raises(SymbolicDecision):
            _ = S0 < 100  # true for some sizes only: never guessed
        assert S0 != S1 and S0 != S0 * S1  # different expressions: different sizes
    with pytest.raises(SymbolicDecision):
        int(S0)
    with pytest.raises(SymbolicDecision):
        range(S0)


def test_types_hold_symbols_and_substitute():
    t = TensorType((1, S0, 768), __import__("torch").float32)
    assert str(t) == "f32[1,s0,768]"
    assert t.numel == 768 * S0
    assert substitute(t, {s0: 7}).shape == (1, 7, 768)
    assert substitute({"shape": [S0, S0 * 2], "x": 3}, {s0: 5}) == {"shape": [5, 10], "x": 3}
    with pytest.raises(ValueError):
        TensorType((-1,), __import__("torch").float32)


def test_bind_symbols_and_table_admits():
    assert bind_symbols([(1, 1), (S0, 7), (768, 768)]) == {s0: 7}
    assert isinstance(bind_symbols([(S0, 7), (S0, 8)]), str)
    assert isinstance(bind_symbols([(768, 767)]), str)
    assert bind_symbols([(S0 * 2, 14), (S0, 7)]) == {s0: 7}
    assert isinstance(bind_symbols([(S0 * 2, 15), (S0, 7)]), str)
    table = SymbolTable()
    table.add(s0, 16, 2, 512)
    assert table.admits({s0: 40}) is None
    assert "outside" in table.admits({s0: 600})
    table.guards.append(s0 > 8)
    assert table.admits({s0: 9}) is None and "guard" in table.admits({s0: 5})
    assert as_dim(s0 * 0 + 4) == 4

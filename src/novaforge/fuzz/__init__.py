"""novaforge's differential fuzzer: random programs compiled with novaforge against eager.

    generator.py  seed -> Program (random steps over live values, validated eagerly)
    program.py    the Program as data and as Python text; exactness/rounding metadata
    oracle.py     one program: compile, call three times, compare values/dtypes/shapes/
                  aliasing/layout/mutation/repeat with eager and a float64 reference
    shrink.py     a failing program -> a minimal one that fails the same way
    runner.py     seeds in subprocess batches (a crash is a finding), `novaforge fuzz`

Invariant: everything is a function of (seed, backend); a reported seed reproduces alone.
docs/debugging.md describes the tool and how its error bound is derived.
"""

from __future__ import annotations

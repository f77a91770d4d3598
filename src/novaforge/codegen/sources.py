"""`sources_digest(*paths)`: the digest of a backend's source files, part of its `hash()` and so
of every cache key of what it builds (codegen/cpu/backend.py, codegen/triton/backend.py).

In a module of its own so that the backends need not import the registry, which imports them.

Invariant: any change to any source file under the given paths (a new file included) changes
the digest; no list of files is kept by hand.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # src/novaforge
_SOURCE_SUFFIXES = (".py", ".h", ".c", ".cc", ".cpp", ".hpp")


@cache
def sources_digest(*paths: str) -> str:
    """sha256 of every source file under `paths` (folders, recursively, or files; relative to
    the package), names included: what a backend's hash covers, so that any change to its code,
    the IR or the shared body analysis invalidates its cached artifacts. No hand-kept list."""
    h = hashlib.sha256()
    for rel in paths:
        root = PACKAGE / rel
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES
                                                     and "__pycache__" not in p.parts)
        for p in files:
            h.update(str(p.relative_to(PACKAGE)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()

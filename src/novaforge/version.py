"""novaforge's version, in a module of its own: the caches key their entries by it (cache/store.py,
frontend/graph_cache.py) and reports print it, and none of them may import the package root,
which imports the whole compiler (tests/test_import_layers.py).

Invariant: `__version__` equals `[project] version` in pyproject.toml.
"""

from __future__ import annotations

__version__ = "0.1.0"

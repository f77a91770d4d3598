"""Test-wide settings: the verifier runs after every pass and the interpreter type-checks
every op (NOVAFORGE_CHECK=1); a dynamic graph builds every size it is called at
(NOVAFORGE_TIERED=0, so tests check programs, not the eager tier); two threads like the
benchmarks; a private cache directory."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("NOVAFORGE_CHECK", "1")
os.environ.setdefault("NOVAFORGE_TIERED", "0")  # dynamic graphs build every size (tests/runtime/test_tiering.py: on)
os.environ.setdefault("NOVAFORGE_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"novaforge-test-cache-{os.getuid()}"))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield

"""Triton tests run in Triton's CPU interpreter on CPU tensors.

TRITON_INTERPRET=1 must be in the environment before anything imports triton (torch.export
does, lazily), so it is set here, at collection. When triton is missing, or was imported
without the interpreter before this file ran, the directory is skipped with the reason. Also
makes the helpers in nf_triton_testing.py importable.
"""

from __future__ import annotations

import os
import sys

if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(__file__))  # nf_triton_testing

import pytest  # noqa: E402

triton = pytest.importorskip("triton")

from novaforge.codegen.triton.loader import triton_interprets  # noqa: E402

if not triton_interprets():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 before these tests were collected; "
                "run them with TRITON_INTERPRET=1 in the environment", allow_module_level=True)

"""Makes the CPU-backend test helpers (cpu_check.py) importable."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

"""Every environment variable novaforge reads, in one place (docs/options.md lists them).

Each is read when asked for (tests and users change the environment between compiles), never
cached at import. Nothing else in the package calls `os.environ`; the one exception is
`TRITON_INTERPRET`, which Triton itself reads and which the Triton loader sets for CPU runs.

Invariant: a function here returns a validated value or raises `ValueError` naming the
variable and what it accepts.
"""

from __future__ import annotations

import os
from pathlib import Path


def _get(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def cache_root() -> Path:
    """The kernel/graph cache: $NOVAFORGE_CACHE_DIR, else $XDG_CACHE_HOME/novaforge, else
    ~/.cache/novaforge."""
    env = _get("NOVAFORGE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(_get("XDG_CACHE_HOME") or Path.home() / ".cache") / "novaforge"


def cache_dir_override() -> str:
    """$NOVAFORGE_CACHE_DIR itself ('' when unset): whether a cache root was chosen explicitly."""
    return _get("NOVAFORGE_CACHE_DIR")


def backend_override() -> str:
    """$NOVAFORGE_BACKEND: replaces backend='auto' ('' when unset)."""
    return _get("NOVAFORGE_BACKEND")


def check_mode() -> str:
    """$NOVAFORGE_CHECK: '' (off), '1' (IR verifier after every pass, interpreter type checks)
    or 'numerics' (also compare every kernel with the interpreter)."""
    v = _get("NOVAFORGE_CHECK")
    if v in ("", "0"):
        return ""
    if v not in ("1", "numerics"):
        raise ValueError(f"NOVAFORGE_CHECK={v!r}; expected 0, 1 or numerics")
    return v


def check_enabled() -> bool:
    return check_mode() != ""


def cxx() -> str:
    """The C++ compiler: $NOVAFORGE_CXX, else $CXX, else g++."""
    return _get("NOVAFORGE_CXX") or _get("CXX") or "g++"


def cpu_pch() -> bool:
    """$NOVAFORGE_CPU_PCH: '0' compiles generated kernels without the precompiled nf_cpu.h
    (default on where the compiler is GCC)."""
    v = _get("NOVAFORGE_CPU_PCH", "1")
    if v not in ("0", "1"):
        raise ValueError(f"NOVAFORGE_CPU_PCH={v!r}; expected 0 or 1")
    return v == "1"


def gemm_isa() -> str:
    """$NOVAFORGE_GEMM_ISA: the instruction set nf_gemm is built for (default 'native')."""
    return _get("NOVAFORGE_GEMM_ISA", "native")


def cpu_simd_override() -> str:
    """$NOVAFORGE_CPU_SIMD: force the CPU target's SIMD level (avx512, avx2, scalar; tests)."""
    v = _get("NOVAFORGE_CPU_SIMD")
    if v and v not in ("avx512", "avx2", "scalar"):
        raise ValueError(f"NOVAFORGE_CPU_SIMD={v!r}; expected avx512, avx2 or scalar")
    return v


def cpu_fork_ns() -> float:
    """$NOVAFORGE_CPU_FORK_NS: the modelled cost of one OpenMP parallel region (experiments)."""
    return float(_get("NOVAFORGE_CPU_FORK_NS", "1500"))


def debug_dir() -> str:
    """$NOVAFORGE_DEBUG: a directory that keeps generated sources ('' when unset or '0')."""
    v = _get("NOVAFORGE_DEBUG")
    return "" if v == "0" else v


def triton_interpret() -> bool:
    return _get("TRITON_INTERPRET") == "1"


def logs_spec() -> str:
    """$NOVAFORGE_LOGS: comma-separated topics to log (`passes,fusion,...`; `+topic` for debug
    level, `all` / `+all` for every topic); '' when unset. Validated by `novaforge.logs`."""
    return _get("NOVAFORGE_LOGS").strip()


def dump_dir() -> str:
    """$NOVAFORGE_DUMP: a directory that receives the IR after every pass and every generated
    source, with an index file ('' when unset or '0')."""
    v = _get("NOVAFORGE_DUMP").strip()
    return "" if v == "0" else v


def progress_enabled() -> bool:
    """$NOVAFORGE_PROGRESS: '0' silences the compile progress line (default on; it is shown only
    on a terminal and only for compiles longer than about a second)."""
    v = _get("NOVAFORGE_PROGRESS", "1").strip()
    if v not in ("0", "1", ""):
        raise ValueError(f"NOVAFORGE_PROGRESS={v!r}; expected 0 or 1")
    return v != "0"


def graph_cache_enabled() -> bool:
    """$NOVAFORGE_GRAPH_CACHE=0 turns off the captured-graph cache (default on)."""
    return _get("NOVAFORGE_GRAPH_CACHE", "1") != "0"


def replicate_layers_enabled() -> bool:
    """$NOVAFORGE_REPLICATE_LAYERS=0 traces every layer of a module list instead of tracing each
    distinct layer once and replaying it (frontend/replicate_layers.py; default on)."""
    return _get("NOVAFORGE_REPLICATE_LAYERS", "1") != "0"


def tiered_enabled() -> bool:
    """$NOVAFORGE_TIERED=0 builds every size of a dynamic graph at once, whatever the `tiered`
    option says (default 1: the option decides). The test suite sets 0, so that tests calling a
    dynamic graph at several sizes check compiled programs, not the eager tier."""
    v = _get("NOVAFORGE_TIERED", "1")
    if v not in ("0", "1", ""):
        raise ValueError(f"NOVAFORGE_TIERED={v!r}; expected 0 or 1")
    return v != "0"

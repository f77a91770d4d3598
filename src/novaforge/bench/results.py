"""Result files: the machine, the versions, the date, and strict JSON.

A results file holds everything needed to read a ratio later: the command line, the machine
(CPU model, cores, memory, GPU from the workers), the versions of every package that ran, the
git commit of the tree, the date, the raw per-process measurements and the aggregated rows.

Invariant: what `dumps` writes is strict JSON (non-finite floats become null, tuples lists,
anything else unknown its `str`), so any JSON reader can load a results file.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("novaforge", "torch", "transformers", "numpy", "onnx", "onnxscript", "onnxruntime", "openvino",
            "jax", "jaxlib", "triton", "psutil")


def clean(x: Any) -> Any:
    """`x` with non-finite floats replaced by None and containers made JSON-native."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set | frozenset):
        return [clean(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return str(x)


def dumps(x: Any, indent: int | None = None) -> str:
    return json.dumps(clean(x), indent=indent, allow_nan=False)


def versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            continue
    out["python"] = platform.python_version()
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return sorted(f for f in flags if f in {"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16",
                                                            "amx_tile", "avx512_vnni"})
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    return {
        "hostname": platform.node(), "platform": platform.platform(), "cpu": _cpu_model(), "cpu_flags": _cpu_flags(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cores_total": os.cpu_count(), "memory_gib": _memory_gib(),
    }


def git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def repo_root() -> Path | None:
    """The source checkout this package runs from (it has benchmarks/ and pyproject.toml), if any."""
    root = Path(__file__).resolve().parents[3]
    if (root / "pyproject.toml").is_file() and (root / "benchmarks").is_dir():
        return root
    return None


def default_results_path(workloads: list[str], device: str, now: _dt.datetime) -> Path:
    root = repo_root()
    folder = (root / "benchmarks" / "results") if root else Path.cwd() / "benchmarks" / "results"
    stamp = now.strftime("%Y%m%d-%H%M%S")
    name = "+".join(workloads)
    return folder / f"{stamp}-{name}-{device}.json"


def now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def write(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)
    return path

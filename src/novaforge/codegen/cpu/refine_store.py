"""Refined schedule choices on disk, so that the next process starts with them.

One JSON file per (CPU target, CPU backend sources) under the CPU library cache:
`<cache root>/cpu/refined/<sha256(target key, backend hash)[:24]>.json`, mapping a kernel's
structural key to the schedule variant that refinement measured fastest (codegen/cpu/refine.py)
and what it measured. A build with `Options.refine` reads it (`stored_variants`) and plans
those kernels at their stored variant; a build without `refine` never reads it.

Invariant: the file is replaced atomically under a lock, merged with what other processes wrote
meanwhile; an unreadable or damaged file reads as empty (refinement then measures again) and
never fails a build. Variants are indices into `schedule.cpu.candidates`, which depends only on
the target and the backend's sources, both in the file's name.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ... import logs
from ...cache.store import atomic_write, file_lock, library_cache
from ...schedule.target import CpuTarget
from ..sources import sources_digest

_log = logs.get_logger("refine")
_memo: dict[str, tuple[float, dict[str, dict[str, Any]]]] = {}  # path -> (mtime, records)


def store_path(target: CpuTarget) -> Path:
    backend = sources_digest("codegen/cpu", "codegen/body.py", "ir", "schedule/cpu.py", "schedule/target.py")
    name = hashlib.sha256(f"{target.key()}|{backend}".encode()).hexdigest()[:24]
    return library_cache("cpu").root / "refined" / f"{name}.json"


def stored_records(target: CpuTarget) -> dict[str, dict[str, Any]]:
    """Kernel structural key -> its record ({"variant": k, ...}); {} when there is none."""
    path = store_path(target)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return {}
    hit = _memo.get(str(path))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        records = json.loads(path.read_text())
        if not isinstance(records, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as e:
        _log.info("refined choices in %s unreadable (%s): ignored", path, e)
        records = {}
    _memo[str(path)] = (mtime, records)
    return records


def stored_variants(target: CpuTarget) -> dict[str, int]:
    return {k: int(r.get("variant", 0)) for k, r in stored_records(target).items() if isinstance(r, dict)}


def store_choices(target: CpuTarget, records: dict[str, dict[str, Any]]) -> Path | None:
    """Merge `records` into the target's file (atomically, under its lock). None when the
    cache cannot be written (the choice then lives only in this process)."""
    path = store_path(target)
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        with file_lock(path.with_suffix(".lock")):
            try:
                current = json.loads(path.read_text())
                if not isinstance(current, dict):
                    current = {}
            except (OSError, ValueError):
                current = {}
            current.update(records)
            atomic_write(path, json.dumps(current, indent=1, sort_keys=True))
    except OSError as e:
        _log.warning("refined choices not stored in %s: %s", path, e)
        return None
    _memo.pop(str(path), None)
    return path

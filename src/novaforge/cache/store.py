"""The compiled-library cache: structural key -> shared library, in memory and on disk.

Layout: `<root>/<kind>/<key[:2]>/<key>/` holds the library `lib-<sha256[:16]>.so`, the
generated sources (`src/`) and `meta.json` (key, novaforge version, library file name, size and
sha256), where root is `$NOVAFORGE_CACHE_DIR` or `~/.cache/novaforge`, created user-only (0o700).
The library's name carries its content hash because the dynamic loader caches libraries by path:
a rebuilt entry must not be answered with the stale handle of the file it replaced.

* Keys are sha256 digests of (novaforge version, the kernels' structural keys and schedules,
  backend hash, target, compiler and flags): `cache_key(...)`. Never `str(ir)`, never pickles.
* Writes are atomic: files are built in a private temp directory and moved in with
  `os.replace`; `meta.json`, written last, is the commit record.
* Loads are verified: the library's size and sha256 must match `meta.json`, and the caller's
  `verify(lib)` (it checks the embedded key and the entry points) must accept it; a corrupt or
  truncated entry is rebuilt, not trusted.
* Two processes compiling the same key serialize on a lock file (`fcntl.flock`); the second
  finds the first's entry and loads it. A lock file is never trusted for more than that: its
  content is ignored, a lock path that is not a regular file is replaced, and a lock held
  longer than `lock_timeout` seconds (a hung process) is given up on: the build goes ahead
  unlocked, which is safe because entries are committed by atomic renames.
* Any bytes in any file of an entry (garbage, truncation, another encoding, a valid library of
  another key) fail one of the checks above and the entry is rebuilt; a path of the wrong type
  (a file where a directory belongs) is removed first. `novaforge cache verify` runs the same
  checks over the whole cache (`cache/admin.py`).

Invariant: `load_or_build` returns a library whose bytes are exactly what was built for `key`
(or raises); it never returns a partially written or foreign library.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .. import logs, settings

_log = logs.get_logger("cache")
LOCK_TIMEOUT_S = 600.0  # no build takes this long: a lock held longer belongs to a hung process


def _version() -> str:
    from ..version import __version__

    return __version__


def cache_key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in (f"novaforge-{_version()}", *parts):
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def default_root() -> Path:
    return settings.cache_root()


def _makedirs(path: Path) -> None:
    """Create path and missing parents, each user-only (mkdir's `parents` would ignore the mode);
    a non-directory in the way inside the cache is removed (it can only be damage)."""
    missing = []
    p = path
    while not p.is_dir():
        if p.exists() or p.is_symlink():
            with contextlib.suppress(OSError):
                p.unlink()
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _open_lock(path: Path) -> int | None:
    for _ in range(2):
        try:
            return os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:  # a directory or an unreadable file in the lock's place: replace it
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
    return None


def _replace(src: Path, dst: Path) -> None:
    """os.replace, after removing a directory that damage left at `dst`."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst, ignore_errors=True)
    os.replace(src, dst)


@contextlib.contextmanager
def _locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[bool]:
    """Hold `path`'s flock; yields False (no lock) if it cannot be had within `timeout`."""
    fd = _open_lock(path)
    if fd is None:
        _log.warning("cannot create the lock file %s: building without it", path)
        yield False
        return
    held = False
    try:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    _log.warning("lock %s held for more than %.0f s: building without it", path, timeout)
                    break
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        yield held
    finally:
        if held:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class CacheStats:
    def __init__(self) -> None:
        self.memory_hits = 0
        self.disk_hits = 0
        self.builds = 0
        self.rebuilt_corrupt = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class LibraryCache:
    """Shared libraries by key; one instance per (root, kind)."""

    def __init__(self, root: Path | None = None, kind: str = "cpu", lock_timeout: float = LOCK_TIMEOUT_S) -> None:
        self.root = (root or default_root()) / kind
        self.lock_timeout = lock_timeout
        self._memory: dict[str, ctypes.CDLL] = {}
        self._lock = threading.Lock()
        self.stats = CacheStats()

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()

    def _load_entry(self, key: str, verify: Callable[[ctypes.CDLL], bool]) -> ctypes.CDLL | None:
        d = self.entry_dir(key)
        meta_path = d / "meta.json"
        if not d.exists():
            return None
        try:
            meta = json.loads(meta_path.read_bytes())
            name = str(meta["lib"])
        except (OSError, ValueError, KeyError, TypeError):  # missing, garbage, another encoding
            if meta_path.exists() or not d.is_dir():
                self._discard(d)
            return None
        if "/" in name or not name.startswith("lib-") or not name.endswith(".so"):
            self._discard(d)
            return None
        lib_path = d / name
        try:
            if (meta.get("key") != key or meta.get("version") != _version()
                    or lib_path.stat().st_size != meta.get("size") or _sha256(lib_path) != meta.get("sha256")):
                self._discard(d)
                return None
            lib = ctypes.CDLL(str(lib_path))
        except OSError:
            self._discard(d)
            return None
        if not verify(lib):
            self._discard(d)
            return None
        return lib

    def _discard(self, d: Path) -> None:
        """Move a bad entry out of the way: its commit record goes, so it is rebuilt (the library
        file stays until superseded: another process may have it mapped)."""
        self.stats.rebuilt_corrupt += 1
        _log.info("corrupt cache entry %s: rebuilding it", d)
        with contextlib.suppress(OSError):
            if d.is_dir():
                meta = d / "meta.json"
                if meta.is_dir() and not meta.is_symlink():
                    shutil.rmtree(meta)
                else:
                    meta.unlink()
            else:
                d.unlink()

    def load_or_build(self, key: str, build: Callable[[Path], tuple[Path, list[Path]]],
                      verify: Callable[[ctypes.CDLL], bool]) -> tuple[ctypes.CDLL, str]:
        """The library for `key`, and how it was found: 'memory', 'disk' or 'built'.

        `build(workdir)` compiles into `workdir` and returns (library path, source paths).
        """
        with self._lock:
            lib = self._memory.get(key)
            if lib is not None:
                self.stats.memory_hits += 1
                _log.debug("%s %s: memory hit", self.root.name, key[:16])
                return lib, "memory"
            _makedirs(self.root / key[:2])
            lib = self._load_entry(key, verify)
            if lib is not None:
                self.stats.disk_hits += 1
                self._memory[key] = lib
                _log.info("%s %s: disk hit", self.root.name, key[:16])
                return lib, "disk"
            t0 = time.perf_counter()
            with _locked(self.root / key[:2] / f"{key}.lock", self.lock_timeout):
                lib = self._load_entry(key, verify)  # another process may have built it meanwhile
                how = "disk"
                if lib is None:
                    lib = self._build(key, build, verify)
                    how = "built"
            if how == "disk":
                self.stats.disk_hits += 1
            self._memory[key] = lib
            _log.info("%s %s: %s in %.2f s", self.root.name, key[:16], "miss, built" if how == "built" else
                      "disk hit after waiting for another process", time.perf_counter() - t0)
            return lib, how

    def _build(self, key: str, build: Callable[[Path], tuple[Path, list[Path]]],
               verify: Callable[[ctypes.CDLL], bool]) -> ctypes.CDLL:
        parent = self.root / key[:2]
        work = Path(tempfile.mkdtemp(dir=parent, prefix=f"build-{key[:16]}-"))
        lib_tmp, sources = build(work)  # on CompileError the work dir (with the source) is kept
        d = self.entry_dir(key)
        _makedirs(d)
        _makedirs(d / "src")
        for s in sources:
            _replace(s, d / "src" / s.name)
        digest = _sha256(lib_tmp)
        name = f"lib-{digest[:16]}.so"
        _replace(lib_tmp, d / name)
        meta = {"key": key, "version": _version(), "lib": name, "size": (d / name).stat().st_size, "sha256": digest}
        _atomic_write(d / "meta.json", json.dumps(meta, indent=1))
        for old in d.glob("lib-*.so"):  # superseded builds (another process may still map them: unlink is safe)
            if old.name != name:
                with contextlib.suppress(OSError):
                    old.unlink()
        shutil.rmtree(work, ignore_errors=True)
        self.stats.builds += 1
        lib = ctypes.CDLL(str(d / name))
        if not verify(lib):
            raise RuntimeError(f"freshly built library {d / 'lib.so'} failed verification")
        return lib


_caches: dict[tuple[str, str], LibraryCache] = {}


def library_cache(kind: str = "cpu") -> LibraryCache:
    """The process-wide cache for the current cache root."""
    root = default_root()
    k = (str(root), kind)
    if k not in _caches:
        _caches[k] = LibraryCache(root, kind)
    return _caches[k]


# for small records kept beside the libraries (codegen/cpu/refine_store.py)
atomic_write = _atomic_write
file_lock = _locked

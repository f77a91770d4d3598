"""`novaforge cache info|verify|clear`: what the on-disk cache holds, checked and pruned;
`novaforge cache install-gemm`: the install-time build of the GEMM library (`make venv`).

The cache root (`settings.cache_root()`) holds one folder per kind:

* `cpu/`, `probe/` (any folder in the `LibraryCache` layout `<kind>/<key[:2]>/<key>/`): one
  entry per key with `meta.json`, the library and `src/`; plus `<key>.lock` files and
  `build-*` work folders of builds in progress (or of crashed ones);
* `gemm/`: `libnf_gemm-<isa>-<key>.so` with its `.sha256` sidecar (codegen/cpu/gemm/build.py);
* `triton-src/`: `nf_<digest>.py` Triton sources named by the digest of their text;
* `cpu-pch/<key>/nf_cpu.h.gch`: the generated kernels' precompiled header, one per compiler,
  flags, CPU and header text (codegen/cpu/build.py); GCC itself checks that one fits.

`verify` runs every entry through the same checks a load does (meta.json readable, the key of
its folder, this novaforge version, the library's size and sha256, the key embedded in the
library's bytes; the GEMM sidecar; a Triton source's digest) and removes the entries that fail
(`--dry-run` only reports). `clear` removes every entry, or those written more than
`--older-than DAYS` ago, except the work files and locks of builds that may still be running
(younger than an hour). Age is the time since an entry was written.

Invariant: only paths this module recognizes as cache entries are ever removed, so a cache
root pointed at the wrong folder loses nothing else; removing an entry another process has
loaded is safe (its mapping survives the unlink) and only costs a rebuild.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import settings

TEMP_STALE_S = 3600.0  # a build work folder older than this belongs to a crashed build
_KEY = re.compile(r"^[0-9a-f]{64}$")
_GEMM = re.compile(r"^libnf_gemm-[a-z0-9_]+-[0-9a-f]{8,64}\.(so|sha256)$")
_GEMM_TMP = re.compile(r"^libnf_gemm-.*\.(tmp|tmp\.sha256)$|^libnf_gemm-.*\.objs\.")
_TRITON = re.compile(r"^nf_([0-9a-f]{24})\.py$")
_PCH_KEY = re.compile(r"^[0-9a-f]{32}$")
_PCH = "nf_cpu.h.gch"


@dataclass
class Entry:
    kind: str  # cpu, probe, gemm, triton-src, cpu-pch, or "<kind> temp" / "<kind> lock"
    path: Path  # the entry's folder or main file
    files: list[Path] = field(default_factory=list)
    key: str = ""

    @property
    def size(self) -> int:
        total = 0
        for f in self.files:
            with contextlib.suppress(OSError):
                total += f.stat().st_size
        return total

    @property
    def mtime(self) -> float:
        times = []
        for f in self.files or [self.path]:
            with contextlib.suppress(OSError):
                times.append(f.stat().st_mtime)
        return max(times, default=0.0)

    def remove(self) -> None:
        for f in self.files:
            try:
                if f.is_dir() and not f.is_symlink():
                    shutil.rmtree(f, ignore_errors=True)
                else:
                    f.unlink()
            except OSError:
                pass
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path, ignore_errors=True)


def _files(p: Path) -> list[Path]:
    if p.is_dir() and not p.is_symlink():
        return [f for f in p.rglob("*") if not f.is_dir()] or [p]
    return [p]


def _is_library_cache(d: Path) -> bool:
    return any(len(sub.name) == 2 and sub.is_dir() for sub in d.iterdir())


def scan(root: Path | None = None) -> list[Entry]:
    """Every entry under the cache root, by kind; unknown files are not entries."""
    root = root or settings.cache_root()
    entries: list[Entry] = []
    if not root.is_dir():
        return entries
    for kd in sorted(p for p in root.iterdir() if p.is_dir()):
        kind = kd.name
        if kind == "gemm":
            entries += _scan_gemm(kd)
        elif kind == "triton-src":
            for f in sorted(kd.iterdir()):
                m = _TRITON.match(f.name)
                if m:
                    entries.append(Entry(kind, f, [f], m.group(1)))
                elif f.name.startswith(".tmp-"):
                    entries.append(Entry(f"{kind} temp", f, [f]))
        elif kind == "cpu-pch":
            for d in sorted(kd.iterdir()):
                if _PCH_KEY.match(d.name) and d.is_dir():
                    entries.append(Entry(kind, d, _files(d), d.name))
        elif _is_library_cache(kd):
            entries += _scan_library(kd, kind)
    return entries


def _scan_library(kd: Path, kind: str) -> list[Entry]:
    out = []
    for pre in sorted(p for p in kd.iterdir() if len(p.name) == 2):
        if not pre.is_dir():
            continue
        for p in sorted(pre.iterdir()):
            if _KEY.match(p.name) and p.name.startswith(pre.name):
                out.append(Entry(kind, p, _files(p), p.name))
            elif p.name.endswith(".lock") and _KEY.match(p.name[:-5]):
                out.append(Entry(f"{kind} lock", p, [p], p.name[:-5]))
            elif p.name.startswith("build-"):
                out.append(Entry(f"{kind} temp", p, _files(p)))
    return out


def _scan_gemm(kd: Path) -> list[Entry]:
    out: dict[str, Entry] = {}
    temps = []
    for f in sorted(kd.iterdir()):
        m = _GEMM.match(f.name)
        if m:
            stem = f.name.rsplit(".", 1)[0]
            e = out.setdefault(stem, Entry("gemm", kd / f"{stem}.so", [], stem.rsplit("-", 1)[-1]))
            e.files.append(f)
        elif _GEMM_TMP.match(f.name):
            temps.append(Entry("gemm temp", f, _files(f)))
    return list(out.values()) + temps


# ----------------------------------------------------------------------------- checks
def _version() -> str:
    from ..version import __version__

    return __version__


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check(e: Entry, now: float | None = None) -> str:
    """'' when the entry is sound, else what is wrong with it."""
    now = time.time() if now is None else now
    if e.kind.endswith(" temp"):
        return "stale build files" if now - e.mtime > TEMP_STALE_S else ""
    if e.kind.endswith(" lock"):
        return "" if e.path.is_file() else "lock path is not a file"
    try:
        if e.kind == "gemm":
            from ..codegen.cpu.gemm.build import verify_library

            return verify_library(e.path)
        if e.kind == "triton-src":
            return _check_triton(e)
        if e.kind == "cpu-pch":  # (a build in progress writes a .tmp beside it)
            gch = e.path / _PCH
            if gch.is_file() and gch.stat().st_size > 0:
                return ""
            return "" if now - e.mtime < TEMP_STALE_S else f"no {_PCH}"
        return _check_library(e)
    except OSError as err:
        return f"unreadable ({type(err).__name__})"


def _check_library(e: Entry) -> str:
    d = e.path
    if not d.is_dir():
        return "not a folder"
    try:
        meta = json.loads((d / "meta.json").read_bytes())
        name = str(meta["lib"])
    except FileNotFoundError:
        return "no meta.json (an unfinished build)"
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable meta.json"
    if not isinstance(meta, dict) or meta.get("key") != e.key:
        return "meta.json of another key"
    if meta.get("version") != _version():
        return f"built by novaforge {meta.get('version')!r}"
    lib = d / name
    if "/" in name or not lib.is_file():
        return "library missing"
    if lib.stat().st_size != meta.get("size"):
        return "size mismatch"
    if _sha256(lib) != meta.get("sha256"):
        return "sha256 mismatch"
    if e.key.encode() not in lib.read_bytes():
        return "library does not embed its key"
    return ""


def _check_triton(e: Entry) -> str:
    raw = e.path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8"
    for mode in ("interpret\n", "cuda\n"):  # codegen/triton/loader.py's digest
        if hashlib.sha256((mode + text).encode()).hexdigest()[:24] == e.key:
            return ""
    return "content does not match its name"


# --------------------------------------------------------------------------- commands
def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _fmt_age(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def info(root: Path | None = None) -> str:
    root = root or settings.cache_root()
    entries = scan(root)
    now = time.time()
    lines = [f"novaforge cache: {root}" + ("" if root.exists() else " (does not exist yet)")]
    by_kind: dict[str, list[Entry]] = {}
    for e in entries:
        by_kind.setdefault(e.kind, []).append(e)
    lines.append(f"{'kind':<18}{'entries':>8}{'size':>12}{'oldest':>10}{'newest':>10}")
    for kind in sorted(by_kind):
        es = by_kind[kind]
        ages = [now - e.mtime for e in es]
        lines.append(f"{kind:<18}{len(es):>8}{_fmt_bytes(sum(e.size for e in es)):>12}"
                     f"{_fmt_age(max(ages)):>10}{_fmt_age(min(ages)):>10}")
    lines.append(f"{'total':<18}{len(entries):>8}{_fmt_bytes(sum(e.size for e in entries)):>12}")
    return "\n".join(lines)


def verify(root: Path | None = None, remove: bool = True) -> tuple[int, list[tuple[Entry, str]]]:
    """(entries checked, [(bad entry, why)]); bad entries are removed unless `remove=False`."""
    entries = scan(root)
    now = time.time()
    bad = [(e, why) for e in entries if (why := check(e, now))]
    if remove:
        for e, _ in bad:
            e.remove()
    return len(entries), bad


def clear(root: Path | None = None, older_than_days: float | None = None) -> tuple[int, int]:
    """Remove every entry (or those written more than `older_than_days` ago): (count, bytes)."""
    now = time.time()
    n = size = 0
    for e in scan(root):
        if older_than_days is not None and now - e.mtime < older_than_days * 86400:
            continue
        if e.kind.endswith((" temp", " lock")) and now - e.mtime < TEMP_STALE_S:
            continue  # a build in progress in another process
        size += e.size
        e.remove()
        n += 1
    return n, size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="novaforge cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["info", "verify", "clear", "install-gemm"])
    p.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="clear: only entries older than this")
    p.add_argument("--dry-run", action="store_true", help="verify: report bad entries without removing them")
    args = p.parse_args(argv)
    root = settings.cache_root()
    if args.action == "info":
        print(info(root))
    elif args.action == "verify":
        n, bad = verify(root, remove=not args.dry_run)
        for e, why in bad:
            print(f"{'bad' if args.dry_run else 'removed'}: {e.kind} {e.path}: {why}")
        print(f"checked {n} entries under {root}: {len(bad)} bad" + ("" if args.dry_run or not bad else ", removed"))
    elif args.action == "install-gemm":  # make venv: this machine's GEMM library, built once per environment
        from ..codegen.cpu.gemm.build import build_installed

        print(f"nf_gemm installed: {build_installed()}")
    else:
        n, size = clear(root, args.older_than)
        scope = f" older than {args.older_than:g} days" if args.older_than is not None else ""
        print(f"removed {n} entries{scope} ({_fmt_bytes(size)}) from {root}")
    return 0

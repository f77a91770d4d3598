"""Compile, cache and load the CPU GEMM library (nf_gemm.cpp) as a shared object.

Invariant: a cached library is only ever used for exactly the sources, flags, compiler and CPU
it was built from (all part of its file name), it is written with an atomic rename, and it is
verified before being loaded against its sidecar `<name>.sha256` ("<sha256> <size> <build
key>", ASCII); anything that fails verification or loading (any bytes in either file: garbage,
truncation, another encoding, the files of another build key) is rebuilt, never trusted.
Generated C++ can `#include "nf_gemm.h"` from `include_dir()` and link `library_path()` (or
compile `source_files()` itself).

Install-time build: `novaforge cache install-gemm` (run by `make venv`) builds
this machine's library into the environment (`installed_dir()`: <sys.prefix>/share/novaforge/
gemm). A cache without the library takes a verified copy from there instead of compiling
(~2.4 s on 2 cores, otherwise part of the first compile in every new cache folder); the copy is
checked like any cached file, and one that fails is rebuilt.

Environment: NOVAFORGE_CACHE_DIR (default ~/.cache/novaforge), CXX (default g++),
NOVAFORGE_GEMM_ISA = native (default) | avx2 (no AVX-512 even where present) | generic.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .... import settings

_HERE = Path(__file__).resolve().parent
SOURCES = ("nf_gemm.cpp", "nf_gemm_nt.cpp", "nf_gemm_bf16.cpp", "nf_gemv.cpp", "nf_gemm_s8.cpp")
HEADERS = ("nf_gemm.h", "nf_gemm_simd.h", "nf_gemm_kernel.h", "nf_gemm_dot.h", "nf_gemm_bcast.h", "nf_gemm_internal.h")
BASE_FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fvisibility=hidden")
ISA_FLAGS = {
    "native": ("-march=native",),
    "avx2": ("-march=native", "-DNF_GEMM_NO_AVX512"),
    "generic": ("-march=x86-64", "-mtune=generic") if os.uname().machine == "x86_64" else (),
}
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    """A process forked during the background build (`start_background_build`) would wait on its
    lock forever: the child gets a free one (and compiles or copies the library itself if it
    needs it before the parent's is in)."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def include_dir() -> Path:
    """Directory holding nf_gemm.h (pass as -I to generated code)."""
    return _HERE


def source_files() -> list[Path]:
    return [_HERE / s for s in SOURCES]


def cache_dir() -> Path:
    d = settings.cache_root() / "gemm"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def installed_dir() -> Path:
    """Where the install-time build puts the library (see the module docstring)."""
    return Path(sys.prefix) / "share" / "novaforge" / "gemm"


def compiler() -> str:
    return settings.cxx()


def isa_choice() -> str:
    isa = settings.gemm_isa()
    if isa not in ISA_FLAGS:
        raise ValueError(f"NOVAFORGE_GEMM_ISA={isa!r}; expected one of {sorted(ISA_FLAGS)}")
    return isa


def compile_flags(isa: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    return [*BASE_FLAGS, *ISA_FLAGS[isa or isa_choice()], *extra]


@functools.cache
def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0] if out.stdout else cxx


@functools.cache
def _cpu_identity() -> str:
    """What -march=native depends on: the CPU model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(keep)))


def build_key(isa: str | None = None, extra: tuple[str, ...] = ()) -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode() + b"\0" + (_HERE / name).read_bytes() + b"\0")
    cxx = compiler()
    h.update("\0".join([cxx, _compiler_version(cxx), *compile_flags(isa, extra), _cpu_identity()]).encode())
    return h.hexdigest()[:24]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sidecar(digest: str, size: int, key: str) -> str:
    return f"{digest} {size} {key}\n"


def _key_of(so: Path) -> str:
    """The build key in a library's file name (`libnf_gemm-<isa>-<key>.so`)."""
    return so.stem.rsplit("-", 1)[-1]


def verify_library(so: Path) -> str:
    """'' when `so` and its sidecar agree (size, sha256, the build key of the file name), else why
    not. Reads bytes only: nothing in the files can raise here."""
    try:
        if not so.is_file():
            return "missing"
        raw = so.with_suffix(".sha256").read_bytes()
    except OSError:
        return "no sidecar"
    try:
        digest, size, key = raw.decode("ascii").split()
        size_n = int(size)
    except (UnicodeDecodeError, ValueError):
        return "unreadable sidecar"
    if key != _key_of(so):
        return "sidecar of another build"
    try:
        if so.stat().st_size != size_n:
            return "size mismatch"
        if _sha256(so) != digest:
            return "sha256 mismatch"
    except OSError:
        return "unreadable library"
    return ""


def _verified(so: Path) -> bool:
    return verify_library(so) == ""


def library_path(isa: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """Path of the compiled library for the current sources/flags/CPU; builds it if missing or corrupt.

    `extra` adds compiler flags (tests use -DNF_GEMM_MR=.. to run other tile heights)."""
    isa = isa or isa_choice()
    so = cache_dir() / f"libnf_gemm-{isa}-{build_key(isa, extra)}.so"
    copy_ok = not extra  # test builds with extra flags are never installed
    return _ensure(so, isa, extra, copy_ok)


def _ensure(so: Path, isa: str, extra: tuple[str, ...], copy_installed: bool) -> Path:
    """`so` verified: as it is, copied from the install-time build, or compiled."""
    with _lock:
        if _verified(so) or (copy_installed and _copy_installed(so)):
            return so
        _compile(so, isa, extra)
    return so


def _put(tmp: str, dst: Path) -> None:
    """Atomically rename a finished file into place (damage may have left a directory there)."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


def _copy_installed(so: Path) -> bool:
    """Put the install-time build of `so` (same file name: same build key) into the cache, with
    an atomic rename of each file; True when the copy verifies."""
    src = installed_dir() / so.name
    if src.resolve().parent == so.resolve().parent or not _verified(src):
        return False
    with contextlib.suppress(OSError):
        for a, b in ((src.with_suffix(".sha256"), so.with_suffix(".sha256")), (src, so)):
            fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=so.stem + ".", suffix=".tmp")
            os.close(fd)
            try:
                shutil.copyfile(a, tmp)
                _put(tmp, b)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return _verified(so)


def build_installed(isa: str | None = None) -> Path:
    """Build this machine's library into `installed_dir()` (the install-time build)."""
    isa = isa or isa_choice()
    d = installed_dir()
    d.mkdir(parents=True, exist_ok=True)
    return _ensure(d / f"libnf_gemm-{isa}-{build_key(isa, ())}.so", isa, (), False)


def start_background_build(isa: str | None = None) -> None:
    """Build the library in a daemon thread if it is not in the cache yet (once per process).

    `novaforge.compile` calls this before capturing a model for the CPU backend, so that the
    compiler runs while Python traces and optimizes the graph; `load()` later takes `_lock` and
    finds the finished library. Failures are left to the foreground `load()` to report."""
    isa = isa or isa_choice()
    if isa in _background:
        return
    _background.add(isa)
    so = cache_dir() / f"libnf_gemm-{isa}-{build_key(isa, ())}.so"
    if _verified(so):
        return

    def build() -> None:
        with contextlib.suppress(Exception):  # reported again by the foreground load()
            library_path(isa)

    threading.Thread(target=build, name="nf_gemm-build", daemon=True).start()


_background: set[str] = set()


def _compile(so: Path, isa: str, extra: tuple[str, ...]) -> None:
    fd, tmp = tempfile.mkstemp(dir=so.parent, prefix=so.stem + ".", suffix=".tmp")
    os.close(fd)
    try:
        flags = compile_flags(isa, extra)
        with tempfile.TemporaryDirectory(dir=so.parent, prefix=so.stem + ".objs.") as work:
            # one compiler process per translation unit (in parallel), then one link
            objs, procs = [], []
            for src in source_files():
                obj = str(Path(work) / (src.stem + ".o"))
                cmd = [compiler(), *flags, "-c", str(src), "-o", obj]
                objs.append(obj)
                procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
            for cmd, proc in procs:
                _, err = proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"nf_gemm build failed ({' '.join(cmd)}):\n{err[-4000:]}")
            cmd = [compiler(), *flags, *objs, "-o", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"nf_gemm link failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
        digest = _sha256(Path(tmp))
        side_tmp = tmp + ".sha256"
        Path(side_tmp).write_text(_sidecar(digest, Path(tmp).stat().st_size, _key_of(so)))
        _put(tmp, so)
        _put(side_tmp, so.with_suffix(".sha256"))
    finally:
        for p in (tmp, tmp + ".sha256"):
            if os.path.exists(p):
                os.unlink(p)


def link_args(isa: str | None = None) -> list[str]:
    """Linker arguments for a generated shared library that calls nf_gemm (absolute path + rpath)."""
    so = library_path(isa)
    return [str(so), f"-Wl,-rpath,{so.parent}"]


def cache_sizes() -> dict[str, int]:
    """Data/unified cache sizes in bytes of cpu0 from sysfs: {'l1d': .., 'l2': .., 'l3': ..} (missing -> 0)."""
    sizes = {"l1d": 0, "l2": 0, "l3": 0}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            text = (idx / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024 * 1024, "G": 1024**3}.get(text[-1:], 1)
        size = int(text.rstrip("KMG")) * mult
        key = "l1d" if level == 1 else f"l{level}"
        if key in sizes:
            sizes[key] = size
    return sizes


class Epilogue(ctypes.Structure):
    """Mirror of `nf_epilogue` in nf_gemm.h."""

    _fields_ = [
        ("bias", ctypes.c_void_p),
        ("act", ctypes.c_int),
        ("residual", ctypes.c_void_p),
        ("ld_residual", ctypes.c_long),
        ("bs_residual", ctypes.c_long),
        ("tile_fn", ctypes.c_void_p),
        ("tile_ctx", ctypes.c_void_p),
        ("tile_prefetch", ctypes.c_void_p),
        ("bias_bf16", ctypes.c_void_p),
    ]


ACTS = {"none": 0, "relu": 1, "gelu": 2, "gelu_erf": 2, "gelu_tanh": 3, "silu": 4}
ISAS = {0: "generic", 1: "avx2", 2: "avx512"}
BF16_PATHS = {0: "convert", 1: "avx512_bf16", 2: "amx"}  # enum nf_bf16_path
S8_PATHS = {0: "portable", 1: "avx2", 2: "vnni"}  # enum nf_s8_path

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
_EP = ctypes.POINTER(Epilogue)
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "nf_gemm_isa": (_I, []),
    "nf_sgemm_nr": (_I, []),
    "nf_sgemm_mr": (_I, []),
    "nf_gemm_mc": (_L, []),
    "nf_gemm_set_cache_sizes": (None, [_L, _L, _L]),
    "nf_gemm_get_blocking": (None, [_P, _P, _P]),
    "nf_gemm_partition": (None, [_L, _L, _L, _I, _P, _P]),
    "nf_sgemm_packed_size": (_L, [_L, _L]),
    "nf_sgemm_pack_b": (None, [_L, _L, _P, _L, _L, _P]),
    "nf_sgemm_pack_b_bf16": (None, [_L, _L, _P, _L, _L, _P]),
    "nf_sgemm_packed_block": (None, [_L, _L, _L, _P, _L, _L, _P, _P, _L, _L, _L, _L, _L, _I, _EP]),
    "nf_sgemm_packed": (None, [_L, _L, _L, _P, _L, _L, _P, _P, _L, _I, _EP, _I]),
    "nf_sgemm_packed_batched": (None, [_L, _L, _L, _L, _P, _L, _L, _L, _P, _L, _P, _L, _L, _I, _EP, _I]),
    "nf_sgemm": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _I, _EP, _I]),
    "nf_sgemm_block": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _L, _L, _L, _L, _I, _EP]),
    "nf_sgemm_batched": (None, [_L, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _L, _L, _I, _EP, _I]),
    "nf_gemm_bf16_packed": (None, [_L, _L, _L, _P, _L, _L, _P, _P, _L, _I, _EP, _I]),
    "nf_gemm_mixed": (None, [_L, _L, _L, _P, _I, _L, _L, _P, _I, _L, _L, _P, _L, _I, _EP, _I]),
    "nf_gemm_i8w": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _I, _EP, _I]),
    "nf_sgemm_nt_mr": (_I, []),
    "nf_sgemm_nt_nr": (_I, []),
    "nf_sgemm_nt": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _P, _L, _I, _EP, _I]),
    "nf_sgemm_nt_block": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _P, _L, _L, _L, _L, _L, _I, _EP]),
    "nf_gemm_nt_mixed": (None, [_L, _L, _L, _P, _I, _L, _L, _P, _I, _L, _P, _L, _I, _EP, _I]),
    "nf_gemm_bf16_path": (_I, []),
    "nf_gemm_bf16_hw_path": (_I, []),
    "nf_gemm_set_bf16_path": (None, [_I]),
    "nf_gemm_bf16_counts": (None, [_P]),
    "nf_gemm_i8_counts": (None, [_P]),
    "nf_gemm_vnni_size": (_L, [_L, _L]),
    "nf_gemm_pack_b_vnni": (None, [_L, _L, _P, _L, _L, _P]),
    "nf_gemm_bf16_vnni_packed": (None, [_L, _L, _L, _P, _L, _L, _P, _P, _L, _I, _EP, _I]),
    "nf_gemm_s8_path": (_I, []),
    "nf_gemm_set_s8_path": (None, [_I]),
    "nf_gemm_s8_counts": (None, [_P]),
    "nf_gemm_s8_packed_size": (_L, [_L, _L]),
    "nf_gemm_pack_b_s8": (None, [_L, _L, _P, _L, _L, _P]),
    "nf_gemm_s8s8": (None, [_L, _L, _L, _P, _L, _L, _P, _L, _L, _P, _L, _I, _I, _EP, _I]),
    "nf_gemm_s8s8_packed": (None, [_L, _L, _L, _P, _L, _L, _P, _P, _L, _I, _I, _EP, _I]),
}


@functools.cache
def load(isa: str | None = None, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Build (or reuse) and load the library; configure its blocking from this machine's caches."""
    so = library_path(isa, extra)
    try:
        lib = ctypes.CDLL(str(so))
    except OSError:
        so.unlink(missing_ok=True)
        so = library_path(isa, extra)
        lib = ctypes.CDLL(str(so))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    c = cache_sizes()
    lib.nf_gemm_set_cache_sizes(c["l1d"], c["l2"], c["l3"])
    return lib

"""Building generated C++ into a shared library with the system compiler.

`compile_library(sources, out_path, target)` writes the translation units next to the output,
compiles them in parallel (one compiler process per unit, up to the core count) and links one
`.so`. Flags: -O2 (vectorization of `omp simd` loops is forced; -O3 buys nothing measurable
here and compiles slower), -march=native for the detected target (or a generic x86-64 level
when the SIMD width is overridden), -fopenmp, -fno-math-errno -fno-trapping-math (lets the
compiler if-convert and vectorize selects; results are unchanged: no -ffast-math), -fwrapv
(integer overflow wraps as in torch).

Precompiled header: every generated unit starts with `#include "nf_cpu.h"`, whose parse
(<cmath>, the SIMD intrinsics headers) was ~0.8 s of a small unit's ~1 s. With GCC, the first
compile for a set of flags builds `nf_cpu.h.gch` once into the cache (`<cache>/cpu-pch/<key>/`,
key: compiler, flags but include paths, the CPU's flags, the text of every header here) and
later units put that folder first on the include path, where GCC takes the .gch in place of the
header (0.14 s for the same unit). GCC checks that the flags match and otherwise reads the
header itself, so the .gch changes compile time only; a unit that fails with it is compiled
again without it. `$NOVAFORGE_CPU_PCH=0` turns it off.

Invariant: on success the library exists at `out_path`; on failure `CompileError` is raised
with the compiler's message and the path of the kept source, never a half-written library.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ... import settings
from ...schedule.target import CpuTarget

HEADER_DIR = Path(__file__).resolve().parent


class CompileError(RuntimeError):
    pass


def compiler() -> str:
    cxx = settings.cxx()
    if shutil.which(cxx) is None:
        raise CompileError(f"C++ compiler {cxx!r} not found (set NOVAFORGE_CXX or CXX)")
    return cxx


def _host_simd() -> str:
    from ...schedule.target import _cpu_flags

    flags, _ = _cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "sse" if "sse4_2" in flags else "scalar"


def arch_flags(target: CpuTarget) -> list[str]:
    if target.simd == _host_simd():
        return ["-march=native"]
    return {
        "avx512": ["-march=x86-64-v4"],
        "avx2": ["-march=x86-64-v3"],
        "sse": ["-march=x86-64-v2"],
    }.get(target.simd, ["-march=x86-64", "-fno-tree-vectorize"])


def compile_flags(target: CpuTarget, opt: str = "-O2") -> list[str]:
    return [opt, *arch_flags(target), "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fwrapv", "-fPIC",
            "-std=c++17", "-w", f"-DNF_VEC={target.vector_floats}", f"-I{HEADER_DIR}"]


_version_cache: dict[str, str] = {}


def compiler_version(cxx: str | None = None) -> str:
    cxx = cxx or compiler()
    if cxx not in _version_cache:
        try:
            out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
            _version_cache[cxx] = out.splitlines()[0] if out else cxx
        except (OSError, subprocess.SubprocessError):
            _version_cache[cxx] = cxx
    return _version_cache[cxx]


PCH_HEADER = "nf_cpu.h"
_pch_lock = threading.Lock()
_pch_failed: set[str] = set()  # keys whose build failed in this process (not tried again)


def _new_lock_in_child() -> None:
    """A process forked while the background build held the lock would wait on it forever: the
    child gets a free one (it builds its own header if it needs one before the parent's is in)."""
    global _pch_lock
    _pch_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


@functools.lru_cache(maxsize=64)
def _pch_key(cxx: str, flags: tuple[str, ...]) -> str:
    from ...schedule.target import _cpu_flags

    h = hashlib.sha256()
    cpu_flags, model = _cpu_flags()
    for part in (compiler_version(cxx), " ".join(f for f in flags if not f.startswith("-I")),
                 " ".join(sorted(cpu_flags)), model):
        h.update(part.encode() + b"\0")
    for header in sorted(HEADER_DIR.rglob("*.h")):
        h.update(header.relative_to(HEADER_DIR).as_posix().encode() + b"\0" + header.read_bytes())
    return h.hexdigest()[:32]


def _pch_file(cxx: str, flags: list[str]) -> Path:
    """Where the precompiled header for units compiled with `flags` is kept."""
    return settings.cache_root() / "cpu-pch" / _pch_key(cxx, tuple(flags)) / (PCH_HEADER + ".gch")


def precompiled_header(cxx: str, flags: list[str]) -> Path | None:
    """The folder holding nf_cpu.h.gch for units compiled with `flags` (built on first use), or
    None: turned off, not GCC, or its build failed (the units then read the header itself)."""
    if not settings.cpu_pch() or "clang" in compiler_version(cxx).lower():
        return None
    gch = _pch_file(cxx, flags)
    folder, key = gch.parent, gch.parent.name
    if gch.is_file():
        return folder
    with _pch_lock:
        if key in _pch_failed:
            return None
        if gch.is_file():
            return folder
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=PCH_HEADER + ".", suffix=".tmp")
            os.close(fd)
            try:
                r = subprocess.run([cxx, *flags, "-x", "c++-header", str(HEADER_DIR / PCH_HEADER), "-o", tmp],
                                   capture_output=True, text=True, timeout=600)
                if r.returncode != 0:
                    raise CompileError(r.stdout + r.stderr)
                os.replace(tmp, gch)  # (another process may have put the same file there: either is whole)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except (OSError, subprocess.SubprocessError, CompileError):
            _pch_failed.add(key)
            return None
    return folder


def start_background_pch(target: CpuTarget, extra_flags: list[str]) -> None:
    """Build the precompiled header for units of `target` with `extra_flags` in a daemon thread
    if the cache has none yet, so that it compiles while the model is captured (a compile that
    needs it meanwhile waits for it under the lock instead of building it again)."""
    cxx = settings.cxx()
    if not settings.cpu_pch() or shutil.which(cxx) is None:
        return
    flags = compile_flags(target) + list(extra_flags)
    if _pch_file(cxx, flags).is_file():
        return
    threading.Thread(target=precompiled_header, args=(cxx, flags), name="nf_cpu-pch", daemon=True).start()


def compile_library(sources: list[str], out_path: Path, target: CpuTarget, workdir: Path,
                    extra_flags: list[str] | None = None, link_flags: list[str] | None = None,
                    use_pch: bool = True) -> Path:
    """Compile `sources` (one translation unit each) into the shared library `out_path`."""
    cxx = compiler()
    flags = compile_flags(target) + list(extra_flags or [])
    pch = precompiled_header(cxx, flags) if use_pch else None
    if pch is not None:
        flags = [f"-I{pch}", *flags]  # first on the path: GCC takes nf_cpu.h.gch from there
    workdir.mkdir(parents=True, exist_ok=True)
    cpps, objs, procs = [], [], []
    for i, src in enumerate(sources):
        cpp = workdir / f"kernels_{i}.cpp"
        cpp.write_text(src)
        obj = workdir / f"kernels_{i}.o"
        cpps.append(cpp)
        objs.append(obj)
    jobs = max(1, min(len(cpps), os.cpu_count() or 1))
    pending = list(zip(cpps, objs, strict=True))
    errors: list[str] = []
    while pending or procs:
        while pending and len(procs) < jobs:
            cpp, obj = pending.pop(0)
            p = subprocess.Popen([cxx, *flags, "-c", str(cpp), "-o", str(obj)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            procs.append((p, cpp))
        p, cpp = procs.pop(0)
        out, _ = p.communicate()
        if p.returncode != 0:
            errors.append(f"{cpp}:\n{out}")
    if errors and pch is not None:
        # GCC reads the header itself where a .gch does not fit, but a damaged one (truncated) is
        # fatal: without it, and if that compiles, the .gch was at fault (dropped, rebuilt later)
        done = compile_library(sources, out_path, target, workdir, extra_flags, link_flags, use_pch=False)
        with _pch_lock:
            _pch_failed.add(pch.name)
            (pch / (PCH_HEADER + ".gch")).unlink(missing_ok=True)
        return done
    if errors:
        raise CompileError("C++ compilation failed; source kept at "
                           f"{', '.join(str(c) for c in cpps)}\n" + "\n".join(e[:4000] for e in errors))
    tmp_out = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
    link = [cxx, "-shared", "-fopenmp", *[str(o) for o in objs], *(link_flags or []), "-o", str(tmp_out)]
    r = subprocess.run(link, capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"linking failed; sources kept at {workdir}\n{r.stdout}{r.stderr}"[:6000])
    os.replace(tmp_out, out_path)
    for o in objs:
        o.unlink(missing_ok=True)
    return out_path


def vectorization_report(source: str, target: CpuTarget, workdir: Path) -> dict[int, bool]:
    """{line of every loop under `#pragma omp simd`: did the compiler vectorize it?} (from GCC's
    -fopt-info-vec report; used by tests and `NOVAFORGE_DEBUG` dumps to check the hot loops)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cpp = workdir / "vec_report.cpp"
    source = source.replace("static int nf_", "__attribute__((used)) static int nf_")  # keep unreferenced kernels
    cpp.write_text(source)
    r = subprocess.run([compiler(), *compile_flags(target), "-fopt-info-vec", "-fopt-info-vec-missed", "-c",
                        str(cpp), "-o", os.devnull], capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(r.stderr[:4000])
    vectorized = set()
    for line in r.stderr.splitlines():
        if not line.startswith(str(cpp)):
            continue
        # a vectorized loop, or one GCC turned into memset/memcpy (already vector code)
        if "loop vectorized" in line or "__builtin_memset" in line or "__builtin_memcpy" in line:
            vectorized.add(int(line[len(str(cpp)) + 1:].split(":")[0]))
    lines = source.splitlines()
    out = {}
    for i, text in enumerate(lines):
        if text.strip().startswith("#pragma omp simd") and i + 1 < len(lines):
            loop = i + 2  # 1-based line of the loop; GCC reports a vectorized loop at its first statements
            out[loop] = any(ln in vectorized for ln in range(loop, loop + 3))
    return out

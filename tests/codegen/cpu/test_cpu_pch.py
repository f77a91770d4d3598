"""The precompiled nf_cpu.h (codegen/cpu/build.py): built once per set of flags into the cache,
taken by GCC in place of the header, off with NOVAFORGE_CPU_PCH=0, and never the cause of a
failed build when damaged."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time

import pytest
import torch

import novaforge
from novaforge.codegen.cpu import build
from novaforge.codegen.cpu.gemm import build as gemm_build
from novaforge.schedule.target import detect_cpu_target

pytestmark = pytest.mark.skipif("clang" in build.compiler_version(build.compiler()).lower(),
                                reason="the precompiled header is GCC's")

SRC = '#include "nf_cpu.h"\nextern "C" int nf_answer(float x) { return (int)nf_exp(x); }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NOVAFORGE_CPU_PCH", raising=False)
    build._pch_failed.clear()
    yield tmp_path
    build._pch_failed.clear()


def _answer(root, name: str) -> int:
    work = root / name
    out = build.compile_library([SRC], work / "lib.so", detect_cpu_target(), work)
    fn = ctypes.CDLL(str(out)).nf_answer
    fn.argtypes = [ctypes.c_float]
    return fn(2.0)  # int(e^2)


def _headers(root):
    return sorted((root / "cpu-pch").rglob("nf_cpu.h.gch"))


def test_units_take_the_precompiled_header(cache):
    assert _answer(cache, "a") == 7
    (gch,) = _headers(cache)
    # GCC's -H lists the headers a unit reads; a precompiled one it used is marked "!"
    unit = cache / "u.cpp"
    unit.write_text(SRC)
    r = subprocess.run([build.compiler(), f"-I{gch.parent}", *build.compile_flags(detect_cpu_target()), "-H", "-c",
                        str(unit), "-o", str(cache / "u.o")], capture_output=True, text=True)
    assert r.returncode == 0 and f"! {gch}" in r.stderr, r.stderr[:2000]
    stamp = gch.stat().st_mtime_ns
    assert _answer(cache, "b") == 7 and _headers(cache) == [gch] and gch.stat().st_mtime_ns == stamp  # reused


def test_a_model_compiles_the_same_without_it(cache, monkeypatch):
    lin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = lin(x)
        monkeypatch.setenv("NOVAFORGE_CPU_PCH", "0")
        off = novaforge.compile(lin, graph_cache=False)(x)
        assert not (cache / "cpu-pch").exists()
        monkeypatch.setenv("NOVAFORGE_CPU_PCH", "1")
        x2 = torch.randn(5, 8)  # another size: a new library, built with the header
        on = novaforge.compile(lin, graph_cache=False)(x2)
    assert len(_headers(cache)) == 1
    torch.testing.assert_close(off, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(on, lin(x2).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_precompiled_header_never_fails_a_build(cache, damage):
    """A truncated .gch is fatal to GCC: the unit is compiled again without it and the file is
    dropped (built again by a later process); one GCC does not recognize is read past."""
    assert _answer(cache, "a") == 7
    (gch,) = _headers(cache)
    data = gch.read_bytes()
    gch.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00not a header" * 64)
    assert _answer(cache, "b") == 7
    assert gch.exists() == (damage == "garbage")
    build._pch_failed.clear()  # (a new process)
    assert _answer(cache, "c") == 7 and gch.is_file()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_background_build_holds_its_lock_does_not_wait_forever(cache):
    """The header and nf_gemm are built in background threads under locks; a process forked then
    (multiprocessing's default start method on Linux) gets free locks and builds what it needs."""
    build._pch_lock.acquire()
    gemm_build._lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: both builds need their lock
            code = 1
            try:
                code = 0 if _answer(cache, "child") == 7 and gemm_build.library_path().is_file() else 2
            finally:
                os._exit(code)
        deadline = time.time() + 300
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.time() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child waited on a lock its parent's thread held")
            time.sleep(0.1)
    finally:
        gemm_build._lock.release()
        build._pch_lock.release()
    assert os.waitstatus_to_exitcode(done[1]) == 0

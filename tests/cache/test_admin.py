"""`novaforge cache info|verify|clear` over a cache holding every kind of entry, good and bad."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from novaforge import cli
from novaforge.cache import admin
from novaforge.cache.store import LibraryCache, cache_key
from novaforge.codegen.cpu.build import compile_library
from novaforge.codegen.cpu.gemm import build as gemm_build
from novaforge.schedule.target import detect_cpu_target

SRC = 'extern "C" const char* nf_lib_key() {{ return "{key}"; }}\n'


def _build_entry(root: Path, name: str) -> str:
    key = cache_key("admin-test", name)

    def build(work: Path):
        compile_library([SRC.format(key=key)], work / "lib.so", detect_cpu_target(), work)
        return work / "lib.so", sorted(work.glob("*.cpp"))

    def verify(lib) -> bool:
        lib.nf_lib_key.restype = ctypes.c_char_p
        return lib.nf_lib_key() == key.encode()

    LibraryCache(root).load_or_build(key, build, verify)
    return key


def _triton_name(text: str) -> str:
    digest = hashlib.sha256(("interpret\n" + text).encode()).hexdigest()
    return f"nf_{digest[:24]}.py"


def _age(paths, days: float) -> None:
    t = time.time() - days * 86400
    for p in paths:
        for f in [p, *p.rglob("*")] if p.is_dir() else [p]:
            os.utime(f, (t, t))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Three library entries, built once (compiling is the slow part); each test copies them."""
    root = tmp_path_factory.mktemp("admin-src")
    return root, [_build_entry(root, n) for n in ("a", "b", "c")]


@pytest.fixture
def cache(built, tmp_path, monkeypatch):
    src, keys = built
    root = tmp_path / "cache"
    shutil.copytree(src, root)
    so = gemm_build.library_path()  # the session's GEMM library, copied in
    (root / "gemm").mkdir()
    for f in (so, so.with_suffix(".sha256")):
        shutil.copy(f, root / "gemm" / f.name)
    (root / "triton-src").mkdir()
    text = "import triton\n@triton.jit\ndef kernel(x):\n    pass\n"
    (root / "triton-src" / _triton_name(text)).write_text(text)
    pch = root / "cpu-pch" / ("ab" * 16)  # a precompiled header's folder (GCC checks the file itself)
    pch.mkdir(parents=True)
    (pch / "nf_cpu.h.gch").write_bytes(b"gpch" + b"\x00" * 60)
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(root))
    return root, keys


def test_info_counts_entries_by_kind(cache, capsys):
    root, _ = cache
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"novaforge cache: {root}"
    rows = {ln[:18].strip(): ln[18:].split()[0] for ln in out.splitlines()[2:]}
    assert rows["cpu"] == "3" and rows["cpu lock"] == "3" and rows["gemm"] == "1" and rows["triton-src"] == "1"
    assert rows["cpu-pch"] == "1"
    assert rows["total"] == str(len(admin.scan(root)))


def test_verify_finds_and_removes_every_bad_entry(cache, capsys):
    root, (ka, kb, kc) = cache
    lc = LibraryCache(root)
    # a: bytes appended to the library (sha256 and size mismatch)
    meta_a = json.loads((lc.entry_dir(ka) / "meta.json").read_text())
    with open(lc.entry_dir(ka) / meta_a["lib"], "ab") as f:
        f.write(b"\x00" * 16)
    # b: c's library under b's key, with a meta.json that matches its bytes: only the embedded key tells
    eb, ec = lc.entry_dir(kb), lc.entry_dir(kc)
    meta_c = json.loads((ec / "meta.json").read_text())
    shutil.rmtree(eb)
    shutil.copytree(ec, eb)
    (eb / "meta.json").write_text(json.dumps(dict(meta_c, key=kb)))
    # gemm: a non-UTF-8 sidecar; triton: a source whose text does not match its name
    (so,) = (root / "gemm").glob("*.so")
    so.with_suffix(".sha256").write_bytes(b"\xff\xfe\x00")
    (root / "triton-src" / ("nf_" + "0" * 24 + ".py")).write_text("tampered = True\n")
    # a crashed build's work folder, two hours old; a precompiled header's folder a crashed build left empty
    temp = lc.root / kc[:2] / f"build-{kc[:16]}-x"
    temp.mkdir()
    (temp / "kernels_0.cpp").write_text("int x;")
    empty_pch = root / "cpu-pch" / ("cd" * 16)
    empty_pch.mkdir()
    _age([temp, empty_pch], 2 / 24)
    n, bad = admin.verify(root, remove=False)
    reasons = sorted(why for _, why in bad)
    assert reasons == ["content does not match its name", "library does not embed its key", "no nf_cpu.h.gch",
                       "size mismatch", "stale build files", "unreadable sidecar"], reasons
    assert len(admin.scan(root)) == n  # a dry run removes nothing
    assert cli.main(["cache", "verify"]) == 0
    assert "6 bad, removed" in capsys.readouterr().out
    assert admin.verify(root)[1] == []
    kinds = sorted(e.kind for e in admin.scan(root) if not e.kind.endswith("lock"))
    assert kinds == ["cpu", "cpu-pch", "triton-src"]
    assert (lc.entry_dir(kc) / "meta.json").exists()


def test_clear_older_than_and_all_leaves_foreign_files(cache, capsys):
    root, (ka, kb, kc) = cache
    lc = LibraryCache(root)
    _age([root], 2 / 24)  # no build in progress: locks and work files are fair game
    _age([lc.entry_dir(ka)], 10)
    (root / "notes.txt").write_text("mine")
    (root / "cpu" / "README").write_text("mine too")
    assert cli.main(["cache", "clear", "--older-than", "5"]) == 0
    assert "removed 1 entries older than 5 days" in capsys.readouterr().out
    assert not lc.entry_dir(ka).exists() and lc.entry_dir(kb).exists()
    n, size = admin.clear(root)
    assert n >= 4 and size > 0
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert left == ["cpu/README", "notes.txt"]


def test_install_gemm_builds_into_the_environment_once(tmp_path, monkeypatch, capsys):
    """`novaforge cache install-gemm` (make venv) puts this machine's verified GEMM library in the
    environment's folder; a second run finds it there."""
    calls: list[str] = []
    real = gemm_build.library_path()

    def fake_compile(so, isa, extra):  # the command's logic, not the compiler, is under test
        calls.append(so.name)
        shutil.copyfile(real, so)
        so.with_suffix(".sha256").write_text(
            gemm_build._sidecar(gemm_build._sha256(so), so.stat().st_size, gemm_build._key_of(so)))

    monkeypatch.setattr(gemm_build, "_compile", fake_compile)
    monkeypatch.setattr(gemm_build, "installed_dir", lambda: tmp_path / "share")
    for _ in range(2):
        assert cli.main(["cache", "install-gemm"]) == 0
    path = Path(capsys.readouterr().out.splitlines()[-1].split(": ", 1)[1])
    assert path.parent == tmp_path / "share" and gemm_build._verified(path) and len(calls) == 1

"""The nf_gemm library cache: any bytes in the library or its sidecar are detected and rebuilt
(regression: a non-UTF-8 `.sha256` made every later compile fail with UnicodeDecodeError)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from novaforge.codegen.cpu.gemm import build


@pytest.fixture
def good_library(tmp_path, monkeypatch) -> Path:
    """A valid library and sidecar, copied from the session cache into a private cache root."""
    src = build.library_path()
    monkeypatch.setenv("NOVAFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "installed_dir", lambda: tmp_path / "none")  # no install-time build to copy
    dst = build.cache_dir() / src.name
    shutil.copy(src, dst)
    shutil.copy(src.with_suffix(".sha256"), dst.with_suffix(".sha256"))
    assert build.verify_library(dst) == ""
    return dst


DAMAGE = {
    "sidecar_not_utf8": lambda so: so.with_suffix(".sha256").write_bytes(b"\xff\xfe\x80 \xc3\x28 \x00"),
    "sidecar_garbage": lambda so: so.with_suffix(".sha256").write_text("not a digest at all"),
    "sidecar_old_format": lambda so: so.with_suffix(".sha256").write_text(build._sha256(so)),
    "sidecar_missing": lambda so: so.with_suffix(".sha256").unlink(),
    "sidecar_dir": lambda so: (so.with_suffix(".sha256").unlink(), so.with_suffix(".sha256").mkdir()),
    "library_truncated": lambda so: so.write_bytes(so.read_bytes()[:1000]),
    "library_garbage": lambda so: so.write_bytes(b"\x7fELF" + b"\xff" * 5000),
    "library_missing": lambda so: so.unlink(),
}


def _other_build(so: Path) -> None:
    """The files of another build key under this name: the sidecar names the other key."""
    side = so.with_suffix(".sha256")
    digest, size, _ = side.read_text().split()
    side.write_text(f"{digest} {size} {'0' * 24}\n")


DAMAGE["sidecar_of_another_build"] = _other_build


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damage_is_detected_and_rebuilt(good_library, monkeypatch, damage):
    so = good_library
    good = so.read_bytes(), so.with_suffix(".sha256").read_bytes()
    DAMAGE[damage](so)
    assert build.verify_library(so) != ""
    rebuilt = []

    def fake_compile(path: Path, isa: str, extra: tuple) -> None:  # the real build is tested below
        rebuilt.append(path)
        side = path.with_suffix(".sha256")
        if side.is_dir():
            side.rmdir()
        path.write_bytes(good[0])
        side.write_bytes(good[1])

    monkeypatch.setattr(build, "_compile", fake_compile)
    assert build.library_path() == so
    assert rebuilt == [so] and build.verify_library(so) == ""


def test_damage_is_replaced_by_the_install_time_build(good_library, tmp_path, monkeypatch):
    """With an install-time build of the same key, a damaged cache entry is replaced by a copy of
    it (verified), not compiled."""
    so = good_library
    inst = tmp_path / "installed"
    inst.mkdir()
    shutil.copy(so, inst / so.name)
    shutil.copy(so.with_suffix(".sha256"), inst / so.with_suffix(".sha256").name)
    monkeypatch.setattr(build, "installed_dir", lambda: inst)
    good = so.read_bytes()
    so.write_bytes(b"\x7fELF" + b"\xff" * 5000)
    monkeypatch.setattr(build, "_compile", lambda *a: pytest.fail("compiled instead of copying"))
    assert build.library_path() == so
    assert build.verify_library(so) == "" and so.read_bytes() == good


def test_non_utf8_sidecar_real_rebuild(good_library):
    """The reported bug end to end: the library is really rebuilt, the sidecar is ASCII again."""
    so = good_library
    so.with_suffix(".sha256").write_bytes(b"\x89\xff\xfe\xfd garbage")
    assert build.library_path() == so
    assert build.verify_library(so) == ""
    digest, size, key = so.with_suffix(".sha256").read_text("ascii").split()
    assert key == build.build_key() and int(size) == so.stat().st_size

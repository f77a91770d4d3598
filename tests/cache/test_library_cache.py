"""The library cache: miss, memory and disk hits, corrupt and truncated entries, two processes."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from novaforge.cache.store import LibraryCache, cache_key
from novaforge.codegen.cpu.build import CompileError, compile_library
from novaforge.schedule.target import detect_cpu_target

SRC = '#include "nf_cpu.h"\nextern "C" const char* nf_lib_key() {{ return "{key}"; }}\n' \
      'extern "C" int nf_answer() {{ return {answer}; }}\n'


def _builder(key: str, answer: int = 42, source: str | None = None):
    def build(work: Path):
        out = work / "lib.so"
        compile_library([source or SRC.format(key=key, answer=answer)], out, detect_cpu_target(), work)
        return out, sorted(work.glob("*.cpp"))

    return build


def _verify(key: str):
    def verify(lib) -> bool:
        try:
            f = lib.nf_lib_key
        except AttributeError:
            return False
        f.restype = ctypes.c_char_p
        return f() == key.encode()

    return verify


def _answer(lib) -> int:
    return lib.nf_answer()


def test_key_depends_on_every_part():
    assert cache_key("a", "b") == cache_key("a", "b")
    assert cache_key("a", "b") != cache_key("a", "c") != cache_key("ab")
    assert len(cache_key("x")) == 64


def test_miss_then_memory_and_disk_hits(tmp_path):
    key = cache_key("test", "hits")
    c = LibraryCache(tmp_path)
    lib, how = c.load_or_build(key, _builder(key), _verify(key))
    assert how == "built" and _answer(lib) == 42
    lib2, how = c.load_or_build(key, _builder(key), _verify(key))
    assert how == "memory" and lib2 is lib
    c2 = LibraryCache(tmp_path)
    lib3, how = c2.load_or_build(key, _builder(key, answer=7), _verify(key))
    assert how == "disk" and _answer(lib3) == 42
    entry = c.entry_dir(key)
    meta = json.loads((entry / "meta.json").read_text())
    assert (entry / meta["lib"]).exists() and (entry / "src" / "kernels_0.cpp").exists()
    assert meta["key"] == key and meta["size"] == (entry / meta["lib"]).stat().st_size
    mode = stat.S_IMODE(os.stat(tmp_path / "cpu").st_mode)
    assert mode == 0o700


@pytest.mark.parametrize("damage", ["garbage", "truncate", "meta", "foreign", "meta_bytes", "meta_list", "meta_dir",
                                    "meta_version", "entry_file", "src_file", "lib_empty"])
def test_corrupt_entry_is_rebuilt(tmp_path, damage):
    key = cache_key("test", "corrupt", damage)
    if damage in ("garbage", "truncate", "foreign", "lib_empty"):
        assert _in_subprocess(tmp_path, key) == ("built", 42)  # (the damaged file is never mapped here)
    else:  # the library's bytes stay intact: building it here is as good and cheaper
        assert LibraryCache(tmp_path).load_or_build(key, _builder(key), _verify(key))[1] == "built"
    entry = LibraryCache(tmp_path).entry_dir(key)
    lib_path = entry / json.loads((entry / "meta.json").read_text())["lib"]
    if damage == "garbage":
        data = bytearray(lib_path.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
        lib_path.write_bytes(bytes(data))
    elif damage == "truncate":
        lib_path.write_bytes(lib_path.read_bytes()[:100])
    elif damage == "meta":
        (entry / "meta.json").write_text("{not json")
    elif damage == "meta_bytes":  # another encoding / random bytes: never a UnicodeDecodeError
        (entry / "meta.json").write_bytes(b"\xff\xfe{\x00\x80\x81 garbage \xc3\x28")
    elif damage == "meta_list":
        (entry / "meta.json").write_text('["lib", 1]')
    elif damage == "meta_dir":
        (entry / "meta.json").unlink()
        (entry / "meta.json").mkdir()
    elif damage == "meta_version":  # an entry written by another novaforge version
        meta = json.loads((entry / "meta.json").read_text())
        meta["version"] = "0.0.0-other"
        (entry / "meta.json").write_text(json.dumps(meta))
    elif damage == "entry_file":
        shutil.rmtree(entry)
        entry.write_bytes(b"not a folder")
    elif damage == "src_file":
        shutil.rmtree(entry / "src")
        (entry / "src").write_bytes(b"\x00")
        (entry / "meta.json").unlink()  # an interrupted build: no commit record
    elif damage == "lib_empty":
        lib_path.write_bytes(b"")
    else:  # a valid library built for another key, with matching meta: the key check rejects it
        other = cache_key("other")
        _in_subprocess(tmp_path / "o", other)
        o_entry = LibraryCache(tmp_path / "o").entry_dir(other)
        meta = json.loads((o_entry / "meta.json").read_text())
        lib_path.write_bytes((o_entry / meta["lib"]).read_bytes())
        meta["key"] = key
        meta["lib"] = lib_path.name
        (entry / "meta.json").write_text(json.dumps(meta))
    c = LibraryCache(tmp_path)
    lib, how = c.load_or_build(key, _builder(key, answer=43), _verify(key))
    assert how == "built" and _answer(lib) == 43
    assert c.stats.builds == 1


def _script(root: Path, key: str) -> str:
    return textwrap.dedent(f"""
        import sys, ctypes
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from test_library_cache import _builder, _verify
        from novaforge.cache.store import LibraryCache
        key = {key!r}
        lib, how = LibraryCache(Path({str(root)!r})).load_or_build(key, _builder(key), _verify(key))
        print(how, lib.nf_answer())
    """)


def _in_subprocess(root: Path, key: str) -> tuple[str, int]:
    r = subprocess.run([sys.executable, "-c", _script(root, key)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    how, answer = r.stdout.split()
    return how, int(answer)


def test_two_processes_compile_once(tmp_path):
    key = cache_key("test", "two-processes")
    script = _script(tmp_path, key)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = sorted(o.split()[0] for o, _ in outs)
    assert results == ["built", "disk"], outs
    assert all(o.split()[1] == "42" for o, _ in outs)


def test_compile_error_keeps_source(tmp_path):
    key = cache_key("test", "broken")
    with pytest.raises(CompileError) as ei:
        LibraryCache(tmp_path).load_or_build(key, _builder(key, source="this is not C++"), _verify(key))
    msg = str(ei.value)
    assert "kernels_0.cpp" in msg
    path = msg.split("source kept at ")[1].split()[0].rstrip(",")
    assert Path(path).read_text() == "this is not C++"


def test_lock_held_by_a_hung_process_is_given_up_on(tmp_path):
    key = cache_key("test", "hung-lock")
    c = LibraryCache(tmp_path, lock_timeout=0.5)
    lock = c.root / key[:2] / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(lock)!r}, os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        lib, how = c.load_or_build(key, _builder(key), _verify(key))
        assert how == "built" and _answer(lib) == 42
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("damage", ["dir", "garbage"])
def test_damaged_lock_path_is_replaced(tmp_path, damage):
    key = cache_key("test", "bad-lock", damage)
    c = LibraryCache(tmp_path)
    lock = c.root / key[:2] / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    if damage == "dir":
        (lock / "inner").mkdir(parents=True)
    else:
        lock.write_bytes(b"\xff" * 100)
    lib, how = c.load_or_build(key, _builder(key), _verify(key))
    assert how == "built" and _answer(lib) == 42
    assert LibraryCache(tmp_path).load_or_build(key, _builder(key, answer=1), _verify(key))[1] == "disk"

"""Topic logs (NOVAFORGE_LOGS), the dump folder (NOVAFORGE_DUMP) and the progress line."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import novaforge
from novaforge import logs, settings
from novaforge.passes.pipeline import default_pipeline, run_pipeline


def _fn(x):
    return torch.tanh(x) * 2 + 1


@pytest.fixture
def fresh_logs(monkeypatch):
    yield monkeypatch
    monkeypatch.delenv("NOVAFORGE_LOGS", raising=False)
    logs.configure("")


def _compile_and_run(backend: str = "cpu"):
    x = torch.randn(4, 8)
    c = novaforge.compile(_fn, backend=backend)
    torch.testing.assert_close(c(x), _fn(x))
    return c


def test_topics_at_info_and_debug_levels(fresh_logs, capsys):
    fresh_logs.setenv("NOVAFORGE_LOGS", "passes,+fusion,codegen,schedule")
    _compile_and_run()
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert any(ln.startswith("[novaforge.passes] dce: ") and " nodes" in ln for ln in lines), err
    assert any(ln.startswith("[novaforge.passes] plan_memory: ") for ln in lines), err
    assert any(ln.startswith("[novaforge.fusion] fuse: ") and "kernels 1" in ln for ln in lines), err
    assert any(ln.startswith("[novaforge.fusion] kernel ") and "tanh" in ln for ln in lines), err  # debug level
    assert any(ln.startswith("[novaforge.schedule] ") and "sched(" in ln for ln in lines), err
    assert any(ln.startswith("[novaforge.codegen] cpu: 1 kernels") for ln in lines), err
    assert not any(ln.startswith(("[novaforge.cache]", "[novaforge.runtime]")) for ln in lines), err
    # passes is at INFO: its logger does not emit debug records; unset topics propagate untouched
    assert not logging.getLogger("novaforge.passes").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("novaforge.cache").propagate

    fresh_logs.setenv("NOVAFORGE_LOGS", "")
    _compile_and_run()
    assert "[novaforge." not in capsys.readouterr().err
    assert logging.getLogger("novaforge.passes").level == logging.NOTSET


def test_all_topics_and_cache_runtime_lines(fresh_logs, capsys):
    fresh_logs.setenv("NOVAFORGE_LOGS", "all,+cache")
    _compile_and_run()
    err = capsys.readouterr().err
    assert "[novaforge.runtime] new input signature: program 1 compiled" in err, err
    assert "[novaforge.runtime] compiled _fn in " in err
    assert "[novaforge.cache] cpu " in err  # a hit or a build of the kernel library


def test_spec_errors_name_the_variable():
    assert logs.parse_spec("passes, +cache") == {"passes": logging.INFO, "cache": logging.DEBUG}
    assert set(logs.parse_spec("+all").values()) == {logging.DEBUG}
    with pytest.raises(ValueError, match="NOVAFORGE_LOGS.*'pases'"):
        logs.parse_spec("pases")
    with pytest.raises(ValueError, match="unknown log topic"):
        logs.get_logger("nope")


def test_dump_writes_every_pass_and_the_cpu_sources(monkeypatch, tmp_path):
    monkeypatch.setenv("NOVAFORGE_DUMP", str(tmp_path))
    _compile_and_run()
    _compile_and_run()  # a second compile (new module, memory cache hit) gets its own folder
    dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [d.name for d in dirs] == ["000-_fn", "001-_fn"]
    for d in dirs:
        index = (d / "index.txt").read_text().splitlines()
        listed = {ln.split("\t")[0] for ln in index[1:]}
        on_disk = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() and p.name != "index.txt"}
        assert listed == on_disk
        passes = sorted((d / "passes").iterdir())
        n_passes = len(default_pipeline())
        assert passes[0].name == "00-input.txt" and passes[-1].name == f"{n_passes:02d}-plan_memory.txt", passes
        assert len(passes) == n_passes + 1
        last = passes[-1].read_text()
        assert last.startswith("# after plan_memory: ") and "kernel " in last and "tanh" in last
        cpp = [p for p in on_disk if p.startswith("cpu/") and p.endswith(".cpp")]
        assert cpp and "nf_" in (d / cpp[0]).read_text()
        assert any("IR after fuse (" in ln for ln in index)
    top = (tmp_path / "index.txt").read_text().splitlines()
    assert len(top) == 2 and top[0].startswith("000-_fn/\tcpu backend")


@pytest.mark.triton
def test_dump_has_the_triton_sources(tmp_path):
    pytest.importorskip("triton")
    script = (
        "import torch, novaforge\n"
        "f = lambda x: torch.tanh(x) * 2 + 1\n"
        "x = torch.randn(4, 8)\n"
        "torch.testing.assert_close(novaforge.compile(f, backend='triton')(x), f(x))\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1", NOVAFORGE_DUMP=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (d,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    index = (d / "index.txt").read_text()
    srcs = sorted((d / "triton").glob("*.py"))
    assert srcs and "@triton.jit" in srcs[0].read_text()
    assert f"triton/{srcs[0].name}\tgenerated Triton source" in index
    assert f"passes/{len(default_pipeline()):02d}-plan_memory.txt" in index


def test_keep_graphs_keeps_each_pass_output():
    c = _compile_and_run(backend="interpret")
    captured = c.stats().captured.graph
    g, records = run_pipeline(captured, keep_graphs=True)
    assert all(r.graph is not None for r in records)
    assert records[-1].graph is g
    assert [len(r.graph.nodes) for r in records] == [r.nodes_after for r in records]
    _, plain = run_pipeline(captured)
    assert all(r.graph is None for r in plain)


def test_progress_line_after_the_delay_then_erased():
    out = io.StringIO()
    p = logs.Progress("model", enabled=True, delay=0.05, stream=out)
    p.stage("pass fuse")
    time.sleep(0.5)
    p.stage("codegen and build, 3 kernels")
    time.sleep(0.5)
    p.close()
    text = out.getvalue()
    assert "\rnovaforge: model: pass fuse ... " in text
    assert "codegen and build, 3 kernels" in text
    assert text.endswith("\r\x1b[K")
    quick = io.StringIO()
    q = logs.Progress("model", enabled=True, delay=5.0, stream=quick)
    q.close()  # a compile shorter than the delay prints nothing
    assert quick.getvalue() == ""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal_and_not_when_disabled(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not logs.progress_wanted()
    monkeypatch.setattr(sys, "stderr", _Tty())
    monkeypatch.delenv("NOVAFORGE_PROGRESS", raising=False)
    assert logs.progress_wanted()
    monkeypatch.setenv("NOVAFORGE_PROGRESS", "0")
    assert not logs.progress_wanted()
    monkeypatch.setenv("NOVAFORGE_PROGRESS", "maybe")
    with pytest.raises(ValueError, match="NOVAFORGE_PROGRESS"):
        settings.progress_enabled()


def test_no_environment_reads_outside_settings():
    src = Path(novaforge.__file__).parent
    mine = ["logs.py", "cache/store.py", "cache/admin.py", "passes/pipeline.py", "api.py", "cli.py",
            *(str(p.relative_to(src)) for p in (src / "report").glob("*.py"))]
    for rel in mine:
        text = (src / rel).read_text()
        assert "os.environ" not in text and "os.getenv" not in text, rel

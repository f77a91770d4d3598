"""`novaforge report`: the HTML page for GPT-2, BERT and Llama-style tiny models, checked as text
and, where /usr/bin/chromium exists, rendered in headless Chromium (no console messages, the
plots drawn, the kernel table sortable)."""

from __future__ import annotations

import re
import subprocess
from html import unescape
from pathlib import Path

import pytest
import torch

import novaforge
from novaforge import cli
from novaforge.bench.workloads import build_inference_model, input_ids
from novaforge.passes.pipeline import default_pipeline
from novaforge.report import html_report
from novaforge.report.metrics import kernel_rows
from novaforge.report.plots import memory_timeline

MODELS = ("gpt2-tiny", "bert-tiny", "llama-tiny")
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{model: (html path, CompileStats)}: gpt2 through the CLI, the others through the API; the
    stats are those the page was rendered from (caught on their way out of `collect`)."""
    out = tmp_path_factory.mktemp("reports")
    seen = []
    real_collect = html_report.collect

    def collect(*args, **kwargs):
        d = real_collect(*args, **kwargs)
        seen.append(d["stats"])
        return d

    html_report.collect = collect
    result = {}
    try:
        for name in MODELS:
            path = out / f"{name}.html"
            if name == "gpt2-tiny":
                assert cli.main(["report", "--model", name, "--seq", "16", "--runs", "3", "--out", str(path)]) == 0
            else:
                model, vocab = build_inference_model(name)
                with torch.inference_mode():
                    assert novaforge.report(model, input_ids(vocab, 1, 16), path=path, runs=3, title=name) == path
            result[name] = (path, seen[-1])
    finally:
        html_report.collect = real_collect
    return result


def _rows(html: str, table_id: str) -> list[str]:
    m = re.search(rf'<table id="{table_id}"[^>]*>.*?<tbody>(.*?)</tbody>', html, re.S)
    assert m, table_id
    return re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)


@pytest.mark.parametrize("name", MODELS)
def test_page_holds_every_section(reports, name):
    path, stats = reports[name]
    html = path.read_text()
    for ident in ("summary", "passes", "kernels", "graph", "memory", "compile", "training", "externs", "ir"):
        assert f'<section id="{ident}">' in html, ident
    # passes: one row each, each linked to its IR, which carries the provenance line
    prows = _rows(html, "pass-table")
    assert len(prows) == len(stats.records) == len(default_pipeline())
    for i, r in enumerate(stats.records, start=1):
        assert f'href="#ir-{i}"' in prows[i - 1] and f">{r.name}<" in prows[i - 1]
        assert f'<details id="ir-{i}">' in html
    assert unescape(html).count("# after plan_memory: ") == 1
    assert re.search(r"# [^\n<]*\.py:\d+", unescape(html)), "source-line provenance in the IR"
    # kernels: one row per distinct kernel; the graph: one node per kernel, edges between them
    rows = kernel_rows(stats.graph)
    distinct = {r["node"].attrs["kernel"].structural_key for r in rows}
    krows = _rows(html, "kernel-table")
    assert len(krows) == len(distinct)
    times = [float(re.findall(r'data-v="([^"]+)"', r)[8]) for r in krows]
    assert all(t > 0 for t in times) and times == sorted(times, reverse=True)
    assert html.count('<g class="knode"') == len(rows)
    assert html.count('<path class="kedge"') >= len(rows) - 1
    # the three matplotlib plots, inline, text kept as text
    plots = re.findall(r'<div class="plot"><svg[^>]*>', html)
    assert len(plots) == 3
    assert "memory timeline" in html and "compile time" in html and "measured time per kernel" in html
    assert "eager measured peak" in html
    assert '<p id="no-training">no training program</p>' in html
    if stats.backend == "cpu":  # the path each precision's products take on this CPU
        assert re.search(r'<p class="note" id="matrix-paths">Matrix products: \d+ x float32: \w+ FMA', html)
    assert re.search(r"kernels [\d.]+ ms \+ runtime overhead [\d.]+ ms .* wall [\d.]+ ms over the same 3 calls",
                     html)


@pytest.mark.parametrize("name", MODELS)
def test_page_is_self_contained(reports, name):
    html = reports[name][0].read_text()
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html)
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?https?:", html)
    assert "<!DOCTYPE svg" not in html and "<?xml" not in html
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate element ids across the inline SVGs"


def test_memory_timeline_matches_the_plan(reports):
    _, stats = reports["gpt2-tiny"]
    tl = memory_timeline(stats.graph)
    plan = stats.graph.meta["memory_plan"]
    assert len(tl.live) == len(kernel_rows(stats.graph))
    assert max(plan.sizes.values()) <= tl.live[tl.peak_at] <= plan.arena_bytes
    assert sum(b for _, b in tl.alive_at_peak) == tl.live[tl.peak_at]


def _chromium(args: list[str], url: str, tmp: Path) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp}"]
    return subprocess.run([CHROMIUM, *flags, *args, url], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="headless Chromium (Debian package chromium) not installed")
@pytest.mark.parametrize("name", MODELS)
def test_renders_in_headless_chromium(reports, name, tmp_path):
    from PIL import Image

    path = reports[name][0]
    shot = tmp_path / "shot.png"
    r = _chromium(["--enable-logging=stderr", "--v=0", "--window-size=1400,2400", "--hide-scrollbars",
                   f"--screenshot={shot}"], path.as_uri(), tmp_path / "profile1")
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console  # the page logs nothing: no errors, no failed loads
    with Image.open(shot) as im:
        assert im.size == (1400, 2400)
        gray = im.convert("L").resize((140, 240))
        ink = sum(gray.histogram()[:200]) / (140 * 240)
    assert ink > 0.05, f"page looks empty ({ink:.1%} non-background)"
    r = _chromium(["--dump-dom", "--virtual-time-budget=3000"], path.as_uri() + "#selftest", tmp_path / "profile2")
    dom = r.stdout
    assert 'data-ready="1"' in dom
    m = re.search(r'data-selftest="(asc|desc):([^"]*)"', dom)
    assert m, "the sort self-test did not run"
    values = [float(v) for v in m.group(2).split(",")]
    assert values == sorted(values, reverse=m.group(1) == "desc") and len(values) >= 4
    assert dom.count("<svg") >= 4 and dom.count('class="knode"') == len(kernel_rows(reports[name][1].graph))



def test_demo_writes_the_report_from_its_own_runs(tmp_path, capsys):
    from novaforge.report.demo import main as demo_main

    out = tmp_path / "demo.html"
    assert demo_main(["--model", "gpt2-tiny", "--seq", "16", "--runs", "6", "--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"HTML report: {out.resolve()}" in text
    assert "-- where the time went (measured) --" in text and " + runtime overhead " in text
    html = out.read_text()
    assert '<p id="profile-sum">kernels ' in html and html.count('<div class="plot"><svg') == 3

"""Typed options: validated at compile(), passed down as one Options, every field and every
environment variable documented; backend hashes cover their sources."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

import novaforge
from novaforge.codegen import sources
from novaforge.options import Options
from novaforge.passes.context import PassContext
from novaforge.passes.pipeline import run_pipeline

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "options.md").read_text()


def test_unknown_option_is_an_error_naming_the_valid_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown option 'pack_weight'; valid options: .*pack_weights"):
        novaforge.compile(torch.nn.Linear(2, 2), pack_weight=True)


@pytest.mark.parametrize("bad", [{"capture": "trace"}, {"check": "yes"}, {"inplace": "no"},
                                 {"fold_max_elements": 1.5}, {"matmul_loader": "fast"}])
def test_bad_values_are_errors(bad) -> None:
    with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
        novaforge.compile(torch.nn.Linear(2, 2), **bad)


def test_options_reach_the_passes_typed() -> None:
    seen = []

    def probe(graph, ctx: PassContext):
        seen.append(ctx.options)
        return graph

    from novaforge.ir import Graph

    run_pipeline(Graph([], [], []), passes=[("probe", probe)], options={"fold_max_elements": 7, "inplace": False})
    (opts,) = seen
    assert isinstance(opts, Options) and opts.fold_max_elements == 7 and opts.inplace is False


def test_options_as_a_mapping_and_replace() -> None:
    o = Options.of(pack_weights=True)
    assert {**o, "backend": "cpu"}["backend"] == "cpu" and dict(o)["pack_weights"] is True
    assert o.replace(profile=True).changed() == {"pack_weights": True, "profile": True}
    assert Options.of(check=False).check == "0" and Options.of(check="").check is None
    assert not hasattr(o, "get")  # readers use the typed fields


def test_every_option_is_documented() -> None:
    missing = [name for name in Options.names() if f"`{name}`" not in DOC]
    assert not missing, f"options missing from docs/options.md: {missing}"


def test_every_environment_variable_is_read_in_settings_and_documented() -> None:
    settings_src = (ROOT / "src" / "novaforge" / "settings.py").read_text()
    names = set(re.findall(r'"(NOVAFORGE_[A-Z_]+|XDG_CACHE_HOME)"', settings_src))
    assert names and all(f"`{n}" in DOC for n in names), sorted(n for n in names if f"`{n}" not in DOC)
    offenders = []
    for p in (ROOT / "src" / "novaforge").rglob("*.py"):
        if p.name == "settings.py":
            continue
        text = p.read_text()
        for m in re.finditer(r"os\.environ(?:\.get)?\(?\[?\"(NOVAFORGE_[A-Z_]+)", text):
            offenders.append(f"{p.relative_to(ROOT)}: {m.group(1)}")
    assert not offenders, f"environment read outside settings.py: {offenders}"


def test_backend_hash_covers_every_source_file(tmp_path, monkeypatch) -> None:
    (tmp_path / "be").mkdir()
    (tmp_path / "be" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(sources, "PACKAGE", tmp_path)
    digest = sources.sources_digest.__wrapped__
    before = digest("be")
    (tmp_path / "be" / "new_file.py").write_text("y = 2\n")  # a new file, in no list anywhere
    after = digest("be")
    (tmp_path / "be" / "new_file.py").write_text("y = 3\n")
    assert len({before, after, digest("be")}) == 3

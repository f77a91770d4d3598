"""docs/ops.md is generated from the lowering table, and what it says is true."""

from __future__ import annotations

import pathlib

import pytest
import torch

from novaforge.cli import main as cli_main
from novaforge.frontend.table import LOWERINGS
from novaforge.report import ops_table

from .harness import lower_case
from .test_lowering_rules import ALL_CASES

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def test_docs_ops_md_is_up_to_date() -> None:
    assert DOC.read_text() == ops_table.markdown() + "\n", (
        "docs/ops.md is stale: regenerate it with `novaforge ops --markdown > docs/ops.md`")


def test_every_rule_is_listed() -> None:
    listed = {r.target for r in ops_table.rule_infos()}
    assert listed == {str(t) for t in LOWERINGS}


def test_uncovered_core_ops_have_no_rule() -> None:
    for op, _fate in ops_table.uncovered_core_ops():
        assert all(str(t) != op for t in LOWERINGS)
    fates = dict(ops_table.uncovered_core_ops())
    assert fates["aten.topk.default"] == "extern"
    assert "UnsupportedError" in fates["aten.nonzero.default"]


_ONE_CASE_PER_RULE = list({c.target: c for c in ALL_CASES}.values())


@pytest.mark.parametrize("case", _ONE_CASE_PER_RULE, ids=[c.id for c in _ONE_CASE_PER_RULE])
def test_listed_primitives_cover_what_the_rule_emits(case) -> None:
    """The static listing over-approximates: every op a rule emits on its test case is listed."""
    info = {r.target: r for r in ops_table.rule_infos_cached()}[str(case.target)]
    graph, _ = lower_case(case, case.dtypes[0])
    emitted = {n.op for n in graph.nodes}
    out_empty = all(v.type.numel == 0 for v in graph.outputs)
    if out_empty:  # zero-size outputs become fills, whatever the rule
        emitted -= {"scalar", "expand"}
    missing = emitted - info.primitives - {"extern_effect" if "extern" in info.primitives else ""}
    assert not missing, f"{case.target}: emits {sorted(missing)}, docs/ops.md does not list them"


def test_cli_summary_and_markdown(capsys) -> None:
    assert cli_main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "lowering table:" in out and "core ATen ops:" in out
    assert cli_main(["ops", "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("# ATen lowering table")


def test_markdown_mentions_every_core_op() -> None:
    md = ops_table.markdown()
    for op in ops_table.core_ops():
        name = str(op).removeprefix("aten.")
        assert f"`{name}`" in md, name
    assert torch.__version__.split("+")[0] in md

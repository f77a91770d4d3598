"""Every IR op on every backend against eager, float32 and bfloat16, generated over the op records.

For each backend and dtype one graph holds every op of the op x backend matrix
(`novaforge ops --backends`), each applied to its own random inputs (`sample`), each its own
kernel. The graph goes through fusion, placement and memory planning, is built by the backend
and run; every op's result must match its reference implementation (the torch call the
interpreter makes, i.e. eager) and, for the CPU and Triton backends, the matrix must be right
both ways: a `yes` op's kernel runs as generated code, a `no` op's kernel runs through torch.
Triton runs in its CPU interpreter (TRITON_INTERPRET=1, set here before anything imports
triton, as tests/codegen/triton/conftest.py does).

A new op is covered as soon as its record exists: elementwise ops need no sample unless their
domain is not the reals (`DOMAIN` in tests/nf_op_samples.py); other ops get one in `SPECIAL`
there (the coverage test fails until they do).
"""

from __future__ import annotations

import os
import sys

if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from nf_op_samples import sample  # noqa: E402
from novaforge.codegen.registry import get_backend  # noqa: E402
from novaforge.ir import OPS, Graph, GraphInput, Value, make_node  # noqa: E402
from novaforge.ir.types import TensorType  # noqa: E402
from novaforge.passes.pipeline import lowering_passes, run_pipeline  # noqa: E402
from novaforge.report.ops_table import BACKENDS, backend_cell, matrix_ops  # noqa: E402

f32, bf16 = torch.float32, torch.bfloat16


def _views_need_a_kernel(op: str) -> bool:
    d = OPS[op]
    return d.has("view") or d.has("generator")


def build_graph(dtype: torch.dtype) -> tuple[Graph, list[torch.Tensor], dict[str, tuple[list[int], Any]]]:
    """(graph with every matrix op, its inputs, op -> (output indices, reference results))."""
    inputs: list[GraphInput] = []
    tensors: list[torch.Tensor] = []
    nodes, outs, where = [], [], {}
    for k, op in enumerate(matrix_ops()):
        ts, attrs = sample(op, dtype, seed=1000 + k)
        vals = []
        for t in ts:
            v = Value(TensorType.of(t), hint=f"{op}{len(vals)}")
            inputs.append(GraphInput(v, "user", f"{op}_{len(vals)}"))
            tensors.append(t)
            vals.append(v)
        node = make_node(op, vals, attrs, meta={"matrix_op": op})
        nodes.append(node)
        results = list(node.outputs)
        if _views_need_a_kernel(op):  # a view or generator alone is no kernel: materialize it
            c = make_node("copy", results, {}, meta={"matrix_op": op})
            nodes.append(c)
            results = list(c.outputs)
        ref = OPS[op].impl(ts, node.attrs)
        where[op] = (list(range(len(outs), len(outs) + len(results))), ref if isinstance(ref, tuple) else (ref,))
        outs.extend(results)
    return Graph(inputs, nodes, outs), tensors, where


def _tolerance(op: str, dtype: torch.dtype) -> tuple[float, float]:
    d = OPS[op]
    heavy = d.has("anchor") or d.has("reduction") or d.has("scan")
    if dtype == bf16:
        return (3e-2, 3e-2) if heavy else (1.6e-2, 1e-2)
    return (1e-4, 1e-4) if heavy else (2e-5, 1e-5)


def _triton_ok() -> str:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    from novaforge.codegen.triton.loader import triton_interprets

    return "" if triton_interprets() else "triton was imported without TRITON_INTERPRET=1"


_RUNS: dict[tuple[str, torch.dtype], Any] = {}


def run_matrix(backend: str, dtype: torch.dtype):
    """(backend object, fused graph, outputs, op -> (output indices, refs)) for one backend and dtype."""
    key = (backend, dtype)
    if key not in _RUNS:
        be = get_backend(backend)
        graph, tensors, where = build_graph(dtype)
        fused, _ = run_pipeline(graph, passes=lowering_passes(), backend=be, target=be.target())
        program = be.build(fused, {})
        _RUNS[key] = (be, fused, program.run(tensors), where)
    return _RUNS[key]


def _kernel_of(fused: Graph, op: str):
    for n in fused.nodes:
        if n.op == "kernel" and any(b.meta.get("matrix_op") == op for b in n.attrs["kernel"].body.nodes):
            return n.attrs["kernel"]
    return None


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_matches_eager_and_the_matrix(backend: str, dtype: torch.dtype) -> None:
    if backend == "triton" and _triton_ok():
        pytest.skip(_triton_ok())
    be, fused, outs, where = run_matrix(backend, dtype)
    wrong, mislabelled = [], []
    for op in matrix_ops():
        idx, refs = where[op]
        rtol, atol = _tolerance(op, dtype)
        for i, ref in zip(idx, refs, strict=True):
            got = outs[i]
            if got.shape != ref.shape or got.dtype != ref.dtype:
                wrong.append(f"{op}: {got.dtype}{list(got.shape)} != {ref.dtype}{list(ref.shape)}")
                continue
            try:
                torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as e:
                wrong.append(f"{op}: {str(e).splitlines()[2:5]}")
        if backend == "interpret":
            continue
        k = _kernel_of(fused, op)
        assert k is not None, f"{op}: no kernel holds it"
        generated = be.executor_for(k) != "torch"
        if generated != (backend_cell(op, backend) == "yes"):
            mislabelled.append(f"{op}: matrix says {backend_cell(op, backend)!r}, the kernel "
                               f"{'is generated' if generated else 'runs through torch'}")
    assert not wrong, "results differ from eager:\n" + "\n".join(wrong)
    assert not mislabelled, "the op x backend matrix is wrong:\n" + "\n".join(mislabelled)


def test_every_op_has_a_sample_and_a_rendering_decision() -> None:
    from novaforge.codegen.cpu import cexpr
    from novaforge.codegen.triton import exprs

    for op in matrix_ops():
        sample(op, f32, 0)
        sample(op, bf16, 0)
    for name, exprs_, templates, missing in (("cpu", cexpr.C_EXPR, cexpr.TEMPLATES, cexpr.NOT_RENDERED),
                                             ("triton", exprs.TRITON_EXPR, exprs.TEMPLATES, exprs.NOT_RENDERED)):
        sets = [set(exprs_), set(templates), set(missing)]
        for a in range(3):
            for b in range(a + 1, 3):
                assert not sets[a] & sets[b], f"{name}: {sorted(sets[a] & sets[b])} are in two tables"
        lacking = sorted(set(matrix_ops()) - set().union(*sets))
        assert not lacking, f"{name}: ops without a rendering or a 'not rendered' reason: {lacking}"
        assert all(OPS[op].has("elementwise") for op in exprs_), f"{name}: expressions for non-elementwise ops"

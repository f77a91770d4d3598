"""Collectives overlap compute (passes/overlap_collectives.py, runtime/collectives.py), in one gloo process.

A function with functional collectives (`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`)
and compute that does not depend on them, through `torch.compile(backend="novaforge")` on a one-process
gloo group: results equal eager's; the CPU program issues each collective without waiting and waits
where the graph first uses its result, with kernels in between; the collectives keep the graph's relative
order; with `overlap_collectives=False` each wait follows its collective. The two-process checks of
tensor parallel (test_tensor_parallel.py) run with the overlap on, against eager.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from novaforge.runtime import cpu_program
from novaforge.runtime.collectives import WAIT, process_stats, step_collective


@pytest.fixture(scope="module")
def group():
    init = os.path.join(tempfile.mkdtemp(prefix="nf-overlap-"), "init")
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _fn(group):
    def fn(x, w, v):
        a = funcol.all_reduce(x @ w, "sum", group)  # issued after its matmul
        g = funcol.all_gather_single(torch.tanh(x), 0, group)
        local = torch.relu(v @ w) * 2 + v.sum()  # independent of both
        r = funcol.reduce_scatter_single(local, "sum", 0, group)
        return (a + 1).sum(-1) + local.mean() + g.sum() + r.sum()

    return fn


def _programs(monkeypatch):
    built = []
    init = cpu_program.CpuProgram.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(cpu_program.CpuProgram, "__init__", record)
    return built


def _order(program) -> list[str]:
    out = []
    for st in program.steps:
        t = step_collective(st)
        out.append("wait" if t == WAIT else t.split(".")[1] if t else "compute")
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_collectives_are_issued_early_and_waited_late(group, monkeypatch, overlap):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x, w, v = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g), torch.randn(8, 16, generator=g)
    fn = _fn(group)
    ref = fn(x, w, v)
    built = _programs(monkeypatch)
    f = torch.compile(fn, backend="novaforge", options={"backend": "cpu", "fallback": "raise",
                                                        "overlap_collectives": overlap})
    before = process_stats()
    torch.testing.assert_close(f(x, w, v), ref)
    after = process_stats()
    assert len(built) == 1
    order = _order(built[0])
    issued = [k for k in order if k not in ("compute", "wait")]
    assert issued == ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"], order  # the graph's order
    assert after["collectives_async"] - before["collectives_async"] == 3
    assert after["waits"] - before["waits"] == 3
    firsts = [order.index(k) for k in issued]
    waits = [i for i, k in enumerate(order) if k == "wait"]
    from novaforge.report.explain import format_collectives

    text = format_collectives(built[0])
    assert "3 collectives issued asynchronously, 3 waits over 1 calls" in text and "all_reduce" in text, text
    if overlap:
        # all three are in flight together before the first wait, with compute between issue and wait
        assert max(firsts) < min(waits), order
        assert any(order[i] == "compute" for i in range(firsts[0] + 1, min(waits))), order
    else:
        assert [order[i + 1] for i in firsts] == ["wait"] * 3, order


def test_a_collective_read_without_its_wait_runs_synchronously():
    from novaforge.runtime.collectives import async_steps

    class Step:  # the parts of a StepSpec that async_steps reads
        def __init__(self, target, ins, outs, nodes=1):
            from novaforge.ir import Graph, GraphInput, Node, Value
            from novaforge.ir.graph import Attrs
            from novaforge.ir.types import TensorType

            t = TensorType((2,), torch.float32)
            vi, vo = Value(t, "i"), Value(t, "o")
            self.kind, self.ins, self.outs, self.operands, self.attrs = "torch", ins, outs, [], {}
            node = (Node("extern", [vi], Attrs(target=target, spec=None), [vo]) if target
                    else Node("neg", [vi], Attrs(), [vo]))
            self.body = Graph([GraphInput(vi, "user", "x")], [node], [vo])

    reduce_ = "_c10d_functional.all_reduce.default"
    steps = [Step(reduce_, [0], [1]), Step(WAIT, [1], [2]), Step(reduce_, [0], [3]), Step(None, [3], [4])]
    assert async_steps(steps) == {0}  # the second's result is read by a compute step: it completes at once
    assert async_steps(steps, output_slots=[1]) == set()  # a program output is never left in flight

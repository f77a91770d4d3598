"""`torch.compile(model, backend="novaforge")`: the Dynamo backend.

Dynamo hands us one FX graph per graph-break-free region; AOTAutograd functionalizes it to
ATen (forward, and for training a backward graph too) and calls `_compile_aten` on each. Every
ATen graph is lowered to the IR, optimized by the same pass pipeline and built by the same
backends as `novaforge.compile`. Graph breaks need nothing special: each region is its own
graph. Shapes: a graph with static example shapes compiles at once; a graph Dynamo made
dynamic is compiled lazily per concrete input signature (re-traced with `make_fx`), since the
code generators specialize on shapes.

Invariant: the callable returned for an ATen graph computes exactly what the graph computes
(outputs in the graph's order), for every input signature it is called with.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

log = logging.getLogger("novaforge.dynamo")

# Decompositions applied while AOTAutograd traces: torch's core-ATen table, minus the ops we
# lower better ourselves (attention stays one op).
_KEEP = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu")


def _decompositions() -> dict[Any, Any]:
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in list(table):
        name = getattr(op, "__name__", str(op))
        if any(k in str(name) for k in _KEEP):
            del table[op]
    return table


def _is_static(inputs: Sequence[Any]) -> bool:
    for x in inputs:
        if isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool):
            return False
        if isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape):
            return False
    return True


class _AtenGraphProgram:
    """A compiled ATen graph: one novaforge program per concrete input signature."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any]) -> None:
        self.gm = gm
        self.options = options
        self.programs: dict[tuple, Any] = {}
        self.stats: list[Any] = []
        if _is_static(example_inputs) and all(isinstance(x, torch.Tensor) for x in example_inputs):
            key = tuple((tuple(x.shape), x.dtype, str(x.device)) for x in example_inputs)
            self.programs[key] = self._build(gm)

    def _build(self, gm: torch.fx.GraphModule):
        from ..api import CompileStats, resolve_backend
        from ..codegen.registry import get_backend
        from ..passes.pipeline import run_pipeline
        from .capture import Captured
        from .lower import InputSpec, lower_fx

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        specs = [InputSpec("user" if isinstance(n.meta.get("val"), torch.Tensor) else "skip", n.name)
                 for n in placeholders]
        out_args = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        tensor_outs = [a for a in out_args if isinstance(a, torch.fx.Node)]
        constants = {i: a for i, a in enumerate(out_args) if not isinstance(a, torch.fx.Node)}
        graph, ctx = lower_fx(gm, specs, output_nodes=tensor_outs)
        aten = sum(1 for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))
        graph.meta["aten_ops"] = aten
        backend = resolve_backend(self.options.get("backend", "auto"), graph)
        be = get_backend(backend)
        opts = dict(self.options)
        opts["backend"] = backend
        optimized, records = run_pipeline(graph, options=opts, target=be.target(), backend=be)
        program = be.build(optimized, opts)
        captured = Captured(graph, None, [], aten, ctx.externs)
        self.stats.append(CompileStats(captured, optimized, records, {}, backend, program))
        return _Runner(program, optimized, constants, len(out_args))

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = tuple((tuple(x.shape), x.dtype, str(x.device)) for x in tensors)
        runner = self.programs.get(key)
        if runner is None:
            from torch.fx.experimental.proxy_tensor import make_fx

            static = make_fx(self.gm, tracing_mode="fake")(*args)
            runner = self._build(static)
            self.programs[key] = runner
        return runner(tensors)


class _Runner:
    """Runs one static program; re-inserts outputs that tracing turned into constants."""

    def __init__(self, program: Any, graph: Any, constants: dict[int, Any], n_out: int) -> None:
        self.program = program
        self.graph = graph
        self.constants = constants
        self.n_out = n_out

    def __call__(self, tensors: list[torch.Tensor]) -> list[Any]:
        from ..runtime.interpret import interpret

        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            outs = interpret(self.graph, tensors)
        else:
            outs = self.program.run(tensors)
        if not self.constants:
            return outs
        it = iter(outs)
        return [self.constants[i] if i in self.constants else next(it) for i in range(self.n_out)]


def _compile_aten(options: dict[str, Any]):
    def compiler(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        from torch._functorch.aot_autograd import make_boxed_func

        program = _AtenGraphProgram(gm, example_inputs, options)

        def run(*args: Any):
            return program(*args)

        run.novaforge = program  # type: ignore[attr-defined]
        return make_boxed_func(run)

    return compiler


def novaforge_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **options: Any):
    """The function registered as Dynamo backend 'novaforge' (entry point torch_dynamo_backends)."""
    from torch._dynamo.backends.common import aot_autograd

    opts = dict(options.get("options") or {})
    compiler = _compile_aten(opts)
    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, decompositions=_decompositions())(
        gm, example_inputs)

"""Differentiable compiled calls: `TrainEntry`, one input signature of `novaforge.compile(model)`
whose call needs gradients.

The call is traced by AOTAutograd into a forward and a backward ATen graph (its min-cut
partitioner, as Inductor: the backward recomputes fusible pointwise values instead of keeping
them; below `memory_budget=1` with that activation budget, `dynamo.partition_for`); each graph
goes through novaforge's pass pipeline and backend (dynamo.py's compilers, the same as
`torch.compile(backend="novaforge")`), and the call returns outputs differentiable through one
`autograd.Function` around the two compiled programs: `loss.backward()` fills `.grad` of the
module's parameters as eager does, any optimizer works. Buffers updated in the forward
(BatchNorm statistics) are written back. The whole training step in one program is
`compile_step` (training.py).

It sits below api.py (whose CompiledModule makes these entries) and above dynamo.py, so that
api and training (which compiles through api) import each other in no cycle.

Invariant: a TrainEntry's outputs and the gradients `backward()` computes from them are eager's,
up to float rounding; a first call that cannot be traced raises TraceFailed (and the caller
goes through Dynamo), never a wrong result.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .dynamo import UnreachedGrads, _compile_aten, _decompositions, output_dependencies, partition_for
from .frontend import pytrees
from .frontend.capture import TRACING_LOCK, shadow_module, tensor_attributes_watched
from .frontend.capture_fx import tracing_flags
from .gc_pause import paused_gc


class TraceFailed(RuntimeError):
    """The first call of a TrainEntry could not be traced (control flow on tensor values, a
    plain tensor attribute the functional call does not lift, or an error eager raises too):
    `CompiledModule` then tries the call through Dynamo, which splits graphs where needed."""


class TrainEntry:
    """One input signature of a compiled module, differentiable: AOTAutograd forward/backward
    graphs compiled by novaforge."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict, options: dict[str, Any]) -> None:
        from torch._functorch.aot_autograd import aot_function

        self.module = module
        self.shadow = shadow = shadow_module(module)
        self.pnames = [n for n, _ in module.named_parameters()]
        self.bnames = [n for n, _ in module.named_buffers()]
        flat = pytrees.flatten((tuple(args), dict(kwargs)))
        in_spec = flat.spec
        self.out_spec: pytrees.Spec | None = None
        pn, bn = self.pnames, self.bnames

        def fn(params: list[torch.Tensor], buffers: list[torch.Tensor], *tensors: torch.Tensor) -> list[torch.Tensor]:
            a, k = pytrees.unflatten(in_spec, list(tensors))
            state = {**dict(zip(pn, params, strict=True)), **dict(zip(bn, buffers, strict=True))}
            out = torch.func.functional_call(shadow, state, tuple(a), k, tie_weights=True, strict=False)
            f = pytrees.flatten(out)
            bad = pytrees.non_plain_consts(f.spec)
            if bad:
                raise TypeError(f"{type(module).__name__} returns values novaforge cannot rebuild: {bad[:3]}")
            self.out_spec = f.spec
            return f.leaves

        self.programs: list[Any] = []  # the forward's and the backward's _AtenGraphProgram
        self.compiled = aot_function(fn, fw_compiler=_compile_aten(dict(options), self.programs),
                                     bw_compiler=_compile_aten(dict(options), self.programs, backward=True,
                                                                 name=f"{type(module).__name__} compiled by "
                                                                 "novaforge.compile"),
                                     decompositions=_decompositions(), **partition_for(options))
        self._lock = threading.Lock()
        self.unreached: UnreachedGrads | None = None  # (parameters only some outputs depend on: set at the first call)

    def _unreached(self, tc: Any, inputs: list[torch.Tensor], n_outs: int) -> UnreachedGrads | None:
        """From the first call's forward graph: the parameters whose `.grad` must stay None when
        the outputs they feed are left out of the loss (`dynamo.UnreachedGrads`); None where
        AOTAutograd's metadata does not say which forward outputs are the call's."""
        meta = getattr(tc, "fw_metadata", None)
        if meta is None or not self.programs:
            return None
        n_mut = meta.num_mutated_inp_runtime_indices
        deps = output_dependencies(self.programs[0].gm, slice(n_mut, n_mut + meta.num_outputs))
        return UnreachedGrads(deps, inputs) if len(deps) == n_outs else None

    def stats(self) -> Any:
        """The forward program's CompileStats (None before the first call or where it fell back)."""
        for program in self.programs:
            if program.stats:
                return program.stats[-1]
        return None

    def run(self, tensors: list[torch.Tensor], objs: list[Any]) -> Any:
        params = [p for _, p in self.module.named_parameters()]
        buffers = [b for _, b in self.module.named_buffers()]
        if self.out_spec is None:  # the first call traces (and sets out_spec): one trace at a time per process
            with TRACING_LOCK, self._lock, paused_gc(), tracing_flags():
                try:
                    # (a tracing context carries AOTAutograd's metadata, its donated buffers among
                    # them, to the backward's compiler: dynamo.py `_take_donated`)
                    from torch._subclasses.fake_tensor import FakeTensorMode

                    tc = torch._guards.TracingContext(FakeTensorMode())
                    with torch._guards.tracing(tc), tensor_attributes_watched(self.shadow, type(self.module).__name__):
                        outs = self.compiled(params, buffers, *tensors)
                    self.unreached = self._unreached(tc, [*params, *buffers, *tensors], len(outs))
                except Exception as e:
                    raise TraceFailed(f"AOTAutograd could not trace {type(self.module).__name__} for training: "
                                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        else:
            with self._lock:
                outs = self.compiled(params, buffers, *tensors)
        assert self.out_spec is not None
        if self.unreached is not None and self.unreached.risk and torch.is_grad_enabled():
            self.unreached.install(outs, self.unreached.params([*params, *buffers, *tensors]))
        return pytrees.unflatten(self.out_spec, list(outs), inputs_objs=objs, inputs_tensors=tensors)

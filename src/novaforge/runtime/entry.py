"""One compiled signature of a `CompiledModule` (api.py): binds the call's tensors and the
module's parameters to the program's inputs, runs it, keeps eager's contract on the results.

Per call: the parameters are read from the module (`StateBinding`), the program runs (or the
interpreter, for a call that needs gradients or a program for symbolic sizes), results that
share memory with an input, a parameter or another result are copied, mutated inputs are
written back. A loop that calls the same entry on the same tensors again and again (a decode
loop) binds them once (`bind_call`): the bindings and the memory checks are then made at the
bind, not per call.

Invariant: a bound call returns what the plain call on the same tensors would (the bound
tensors must keep their memory: updated in place only, parameters not reassigned).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..frontend import pytrees
from ..ir import Graph
from ..ir.specialize import specialize
from .interpret import interpret
from .state import StateBinding, fresh_outputs, input_storages, unshared_from, write_back


@dataclass(frozen=True)
class BoundCall:
    """`Entry.bind_call`'s result: the program's inputs in order, their slot bindings
    (`CpuProgram.bind_inputs`) and the storages results must not share (`input_storages`)."""

    inputs: list[torch.Tensor]
    slots: Any
    taken: frozenset[int]


class Entry:
    """One compiled signature: binds inputs and parameters, runs the program."""

    def __init__(self, stats: Any, module: Any) -> None:  # stats: compile_stats.CompileStats
        self.stats = stats
        self.captured = stats.captured
        g = stats.graph
        cap = self.captured
        ref_names = [gi.name for gi in cap.graph.inputs if gi.kind in ("param", "buffer")]
        const_names = {gi.tensor.data_ptr(): gi.name for gi in cap.graph.inputs
                       if gi.kind == "const" and gi.tensor is not None and gi.tensor.device.type != "meta"}
        frozen = [(const_names.get(t.data_ptr(), "") if t.device.type != "meta" else "", t) for t in cap.frozen]
        self.binding = StateBinding(module, ref_names, cap.param_refs, frozen)
        program = stats.program
        self.outputs_fresh = bool(getattr(program, "outputs_fresh", False))
        # results that are constants of the graph: each call gets its own copy
        self.const_outputs = [i for i, v in enumerate(g.outputs)
                              if g.input_of(v) is not None and g.input_of(v).kind == "const"]
        self.input_binding: list[tuple[str, int]] = []
        user = ref = 0
        for gi in g.inputs:
            if gi.kind == "user":
                self.input_binding.append(("user", user))
                user += 1
            elif gi.kind in ("param", "buffer"):
                self.input_binding.append(("ref", ref))
                ref += 1
        self.n_out = len(g.outputs)
        self.mut_targets = self._mutation_targets(g)
        self.compile_only = any(t.device.type == "meta" for t in self.captured.param_refs)
        spec = self.captured.out_spec
        self.out_is_leaf = self.n_out == 1 and spec is not None and spec.is_leaf()
        self.values: dict | None = None  # symbol values (an entry made by `at`)

    def at(self, values: dict) -> Entry:
        """This entry (of a program for symbolic sizes) at one call's sizes: the program
        instantiated there (`CpuProgram.at`), everything else shared."""
        entry = copy.copy(self)
        entry.stats = dataclasses.replace(self.stats, program=self.stats.program.at(values))
        entry.values = values
        return entry

    def _mutation_targets(self, g: Graph) -> list[tuple[str, int]]:
        pos: dict[Any, tuple[str, int]] = {}
        user = ref = 0
        for gi in g.inputs:
            if gi.kind == "user":
                pos[gi.value] = ("user", user)
                user += 1
            elif gi.kind in ("param", "buffer"):
                pos[gi.value] = ("ref", ref)
                ref += 1
        return [pos[old] for old, _ in g.mutations]

    def bind_call(self, tensors: list[torch.Tensor]) -> BoundCall | None:
        """What `run` binds and checks of `tensors` and the parameters, done once for calls that
        pass these same tensors again with the same parameters, each unchanged in memory but
        for in-place updates (`CompiledModule.bind(..., state_each_call=False)`: a decode loop);
        None where a call must do it itself (no program, or `CpuProgram.bind_inputs` declines)."""
        program = self.stats.program
        if self.compile_only or program is None or not hasattr(program, "bind_inputs"):
            return None
        refs = self.binding.refs
        inputs = [tensors[i] if kind == "user" else refs[i] for kind, i in self.input_binding]
        slots = program.bind_inputs(inputs)
        if slots is None:
            return None
        taken = input_storages(tensors, refs)
        return BoundCall(inputs, slots, taken)

    def run(self, tensors: list[torch.Tensor], objs: list[Any], needs_grad: bool,
            once: BoundCall | None = None) -> Any:
        """One call. `once`: `bind_call(tensors)`, made before for these same tensors."""
        if self.compile_only:
            raise RuntimeError("this model's parameters or buffers are on the meta device (no data): its program "
                               "can be compiled and inspected (compile_only, explain) but not run")
        refs = self.binding.refs
        compiled = not needs_grad and self.stats.program is not None
        if not compiled:
            once = None
        if once is not None:
            outs = self.stats.program.run(once.inputs, once.slots)
        else:
            bound = [tensors[i] if kind == "user" else refs[i] for kind, i in self.input_binding]
            if compiled:
                outs = self.stats.program.run(bound)
            elif self.values is not None:  # a program for symbolic sizes: the captured graph at these sizes
                outs = interpret(specialize(self.captured.graph, self.values), bound)
            else:
                outs = interpret(self.stats.graph, bound)
        results, new_vals = outs[: self.n_out], outs[self.n_out:]
        if not (compiled and self.outputs_fresh):
            results = list(results)
            for i in self.const_outputs:
                results[i] = results[i].clone()
            results = fresh_outputs(results, tensors, refs, taken=once.taken if once is not None else None)
        if self.mut_targets:
            # a new value that is its input itself (the program updated it in place, as a training step's
            # parameters and optimizer state) needs no write-back; the others are written back
            pairs = [(d, v) for (kind, i), v in zip(self.mut_targets, new_vals, strict=True)
                     if v is not (d := tensors[i] if kind == "user" else refs[i])]
            if pairs:
                dsts = [d for d, _ in pairs]
                with torch.no_grad():
                    for dst, val in zip(dsts, unshared_from([v for _, v in pairs], dsts), strict=True):
                        write_back(dst, val)
        if self.out_is_leaf:
            return results[0]
        spec = self.captured.out_spec
        if isinstance(spec, pytrees.Spec):
            return pytrees.unflatten(spec, list(results), inputs_objs=objs, inputs_tensors=tensors)
        return pytree.tree_unflatten(list(results), spec)

"""The direct path's dynamic shapes: `novaforge.compile(fn, dynamic=...)` traces each input
structure once with symbolic sizes and specializes that one trace for every new size.

`SymbolicCaptures.specialized(args, kwargs)` returns a static `Captured` for the call's sizes,
or None when the call should be captured the ordinary way:

* the key of a symbolic capture is the input structure with the dynamic sizes left out (shapes
  otherwise, dtypes, devices, contiguity, requires-grad); its first call traces it with those
  dims as symbols (frontend/dynamic.py), later calls only bind the symbols and specialize;
* a call whose sizes lie outside the ranges or fail a guard of the trace, a non-contiguous
  input, or a trace that could not be symbolic (the reason is logged once) returns None.

Invariant: the returned graph is the symbolic graph specialized at values that its table
admits, so it computes what a static capture of this call computes; everything after capture
(passes, codegen, the program's contract) is unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from .. import logs
from ..ir.symbolic import is_symbolic
from . import pytrees
from .capture import Captured, autocast_modes, capture
from .dynamic import DimRanges, OutsideRange, dynamic_dims, specialize, symbol_values
from .module_state import ModuleModes

_log = logs.get_logger("runtime")


def _has_symint(spec: Any) -> bool:
    """Does an output spec hold torch SymInts (a view's recorded layout, a returned size)?"""
    if isinstance(spec, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if isinstance(spec, pytrees.Spec):
        return _has_symint(spec.value) or _has_symint(spec.context) or any(_has_symint(c) for c in spec.children)
    if isinstance(spec, list | tuple):
        return any(_has_symint(x) for x in spec)
    if isinstance(spec, dict):
        return any(_has_symint(x) for x in spec.values())
    return False


class SymbolicCaptures:
    """The symbolic captures of one compiled callable (see the module docstring)."""

    def __init__(self, fn: Any, option: Any, freeze: bool, random: str = "counter") -> None:
        if not (option is True or isinstance(option, Mapping)):
            raise ValueError(f"dynamic must be True, False or {{argument: {{dim: (lo, hi)}}}}, got {option!r}")
        self.fn = fn
        self.modes = ModuleModes(fn)  # (training flags and hooks: part of the structure key)
        self.option = option
        self.freeze = freeze
        self.random = random  # how random ATen ops lower (ir/ops/random.py)
        self.captures: dict[Any, Captured | str] = {}  # str: why this structure is captured statically
        self.traces = 0  # symbolic traces run
        self.specializations = 0  # static graphs made from them
        self._lock = threading.Lock()

    def _by_index(self, args: tuple, kwargs: dict, n_tensors: int) -> Any:
        """The option with argument names resolved to tensor input indices."""
        if self.option is True:
            return True
        names = _parameter_names(self.fn)
        out: dict[int, Any] = {}
        for k, spec in self.option.items():
            if isinstance(k, int):
                out[k] = spec
                continue
            index = _tensor_index(k, names, args, kwargs)
            if index is None:
                raise ValueError(f"dynamic: {k!r} is not a tensor argument of this call")
            out[index] = spec
        return out

    def validate(self, args: tuple, kwargs: dict) -> None:
        """Raise ValueError where the option does not fit this call (an unknown argument or dim),
        as a compile would; for calls that run eagerly (runtime/tiering.py)."""
        tensors = list(pytrees.flatten((tuple(args), dict(kwargs))).leaves)
        with contextlib.suppress(OutsideRange):
            dynamic_dims(self._by_index(args, kwargs, len(tensors)), tensors)

    def bound(self, args: tuple, kwargs: dict, flat: Any = None) -> tuple[Any, Captured, dict] | None:
        """(structure key, symbolic capture, symbol values) of a call, tracing its structure on
        first sight; None when the call is compiled for its own sizes (see the module docstring).
        `flat`: the call's pytree flattening, where the caller has it."""
        if flat is None:
            flat = pytrees.flatten((tuple(args), dict(kwargs)))
        tensors = list(flat.leaves)
        try:
            dims = dynamic_dims(self._by_index(args, kwargs, len(tensors)), tensors)
        except OutsideRange as e:
            _log.info("%s: this call is compiled for its own sizes", e)
            return None
        if dims is None or not all(t.is_contiguous() for t in tensors):
            return None
        key = (flat.spec.key, _structure(tensors, dims), torch.is_grad_enabled(), autocast_modes(), self.modes.key())
        with self._lock:
            cap = self.captures.get(key)
            if cap is None:
                cap = self.captures[key] = self._trace(args, kwargs, dims)
        if isinstance(cap, str):
            return None
        values = symbol_values(cap.symbols, cap.graph, tensors)
        if isinstance(values, str):
            _log.info("dynamic: this call is compiled for its own sizes: %s", values)
            return None
        return key, cap, values

    def specialized(self, args: tuple, kwargs: dict) -> Captured | None:
        bound = self.bound(args, kwargs)
        if bound is None:
            return None
        _, cap, values = bound
        t0 = time.perf_counter()
        graph = specialize(cap.graph, values)
        self.specializations += 1
        times = {"export_s": 0.0, "functionalize_s": 0.0, "lower_s": 0.0,
                 "specialize_s": time.perf_counter() - t0}
        return dataclasses.replace(cap, graph=graph, symbols=None, times=times)

    def _trace(self, args: tuple, kwargs: dict, dims: list[DimRanges]) -> Captured | str:
        try:
            with torch.no_grad() if self.freeze else contextlib.nullcontext():
                cap = capture(self.fn, args, kwargs, freeze=self.freeze, dynamic=dims, random=self.random)
        except Exception as e:  # noqa: BLE001 - the static path captures (and reports) on its own
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            _log.warning("dynamic: no symbolic trace (%s); each size is captured on its own", why[:300])
            return why
        self.traces += 1
        if _has_symint(cap.out_spec) or is_symbolic([gi.value.type for gi in cap.graph.inputs if gi.kind != "user"]):
            why = "the outputs' structure depends on the sizes"
            _log.warning("dynamic: %s; each size is captured on its own", why)
            return why
        if not cap.symbols.symbols:
            why = "the trace specialized every dynamic size (a returned view of an input, or a size-dependent op)"
            _log.warning("dynamic: %s; each size is captured on its own", why)
            return why
        _log.info("dynamic: traced once with %s", cap.symbols.describe())
        return cap


def _structure(tensors: list[torch.Tensor], dims: list[DimRanges]) -> tuple:
    return tuple((tuple(None if d in ds else n for d, n in enumerate(t.shape)), t.dtype, t.device, t.requires_grad)
                 for t, ds in zip(tensors, dims, strict=True))


def _parameter_names(fn: Any) -> list[str]:
    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []


def _tensor_index(name: str, names: list[str], args: tuple, kwargs: dict) -> int | None:
    """The flattened tensor index of argument `name` (a plain tensor argument), or None."""
    if name in kwargs:
        target = kwargs[name]
    elif name in names and names.index(name) < len(args):
        target = args[names.index(name)]
    else:
        return None
    if not isinstance(target, torch.Tensor):
        return None
    leaves = pytrees.flatten((tuple(args), dict(kwargs))).leaves
    return next((i for i, t in enumerate(leaves) if t is target), None)

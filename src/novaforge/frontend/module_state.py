"""What a trace of a module depends on besides its tensors, checked at every compiled call.

A program is kept under a key; `ModuleModes.key()` is the module tree's part of it:

* every submodule's training flag (dropout, BatchNorm, `if self.training` in a forward), read
  with the attribute state below;
* the number of hooks (module and global forward, forward-pre and backward hooks run inside the
  traced call);
* an *attribute state*: the plain values the forward may branch on, compared by value with what
  they were when the state was first seen (as Dynamo's guards on the attributes a trace read):
  - every submodule's plain attributes (numbers, strings, None, dtypes, devices, enums, and
    small tuples / lists / dicts of those: `m.scale = 2.0`, `attn.is_causal = False`);
  - the plain attributes of the non-module objects the modules hold (a transformers config:
    `model.config.output_hidden_states = True` changes what the forward returns);
  - which module sits under each submodule name (`m.act = nn.ReLU()`, a parameterless module
    swapped in: seen here, not through any tensor), and which function under each attribute
    holding one (`mlp.act_fn = torch.tanh`), both by identity.
  A changed value gets the program of the new state (compiled once per state, from the graph
  cache when that state was seen in another process: its key holds the same attributes); a
  value changed back gets the old program again.

Not seen: attributes added after the construction of the watch (the watched names are fixed
then, except for modules swapped in, whose own attributes are watched from the swap on), an
in-place mutation of a mutable attribute value compared equal to itself (a list appended to:
the snapshot holds copies of lists and dicts, so this *is* seen for those up to 64 items), and
globals the forward reads.

`freezable(t)` is capture's rule for which module tensors `freeze=True` may bake into a program
(runtime/state.py checks the frozen ones at every call).

Invariant: `key()` returns equal keys for module trees whose flags, hook counts and watched
attribute values are equal, and different keys otherwise (within one ModuleModes); it never
mutates the modules.
"""

from __future__ import annotations

import enum
import functools
import logging
import operator
import threading
import types
from typing import Any

import torch

_log = logging.getLogger("novaforge.runtime")
_nn_module = torch.nn.modules.module  # (its global hook tables)

# module __dict__ entries that are nn.Module's own bookkeeping (tables and flags handled apart)
NN_INTERNAL = frozenset({
    "_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set",
    "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
    "_state_dict_hooks", "_load_state_dict_pre_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_always_called", "_is_full_backward_hook", "forward"})
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
            torch.memory_format, enum.Enum)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)  # by identity
_MAX_ITEMS = 64
STATE_WARNING = 8  # distinct attribute states of one module tree before a warning


def freezable(t: torch.Tensor) -> bool:
    """Whether `freeze=True` may bake module tensor t into a program (packed, folded): not an
    inference tensor, since inside `torch.inference_mode()` it can be changed in place with no
    version counter to reveal it (`runtime.state.version_of` is -1 there). Those are bound like
    unfrozen parameters, read at every call."""
    return not t.is_inference()


def _plain(v: Any, depth: int = 0) -> bool:
    """A value compared by value: a scalar, or a small tuple / list / dict of plain values."""
    if isinstance(v, _SCALARS):
        return True
    if depth >= 2:
        return False
    if isinstance(v, tuple | list | frozenset):
        return len(v) <= _MAX_ITEMS and all(_plain(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return len(v) <= _MAX_ITEMS and all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _frozen(v: Any) -> Any:
    """A snapshot of a plain value that a later in-place mutation of it does not change."""
    if isinstance(v, tuple):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, list):
        return ("<list>", tuple(_frozen(x) for x in v))
    if isinstance(v, dict):
        return ("<dict>", tuple((k, _frozen(x)) for k, x in v.items()))
    return v


def _stand_in(m: Any) -> bool:
    """A compiled module standing in for the module it compiles (compiled_module.CompiledNNModule,
    which says so by a class attribute: capture knows no compiled module)."""
    return getattr(type(m), "_nf_stand_in", False) is True


def _holder(v: Any) -> bool:
    """A non-module object whose plain attributes are watched (a config object)."""
    return (isinstance(getattr(v, "__dict__", None), dict) and not callable(v)
            and not isinstance(v, torch.nn.Module | torch.Tensor | type | enum.Enum))


def _no_values(d: dict) -> tuple:
    return ()


class _Watch:
    """One __dict__ and the names of its plain entries (`training` first for a module's);
    `get(d)` reads them in one C call."""

    def __init__(self, label: str, d: dict, names: list[str], mutable: bool) -> None:
        self.label, self.d, self.names, self.mutable = label, d, tuple(names), mutable
        self.get = operator.itemgetter(*names) if names else _no_values

    def values(self) -> tuple:
        vals = self.get(self.d)
        if len(self.names) == 1:
            vals = (vals,)
        return tuple(_frozen(v) for v in vals) if self.mutable else vals


def _watch_of(label: str, d: dict, module: bool) -> _Watch:
    names, mutable = (["training"] if module else []), False
    for k, v in d.items():
        if (module and k in NN_INTERNAL) or not (_plain(v) or isinstance(v, _FUNCTIONS)):
            continue
        names.append(k)
        mutable = mutable or isinstance(v, list | dict) or (isinstance(v, tuple)
                                                            and any(isinstance(x, list | dict) for x in v))
    return _Watch(label, d, names, mutable)


class ModuleModes:
    """The module tree's part of a program's key (see the module docstring). The submodules are
    listed at construction and again when one is swapped; `key()` costs about 50 us for GPT-2's
    164 modules (22 us of it the flags and hooks)."""

    def __init__(self, fn: Any) -> None:
        self.root = fn if isinstance(fn, torch.nn.Module) else None
        self._lock = threading.Lock()
        self._states: list[tuple[Any, int]] = []  # (attribute snapshot, state id)
        self._last: tuple[Any, int] | None = None
        self._warned = False
        self._list()

    def _list(self) -> None:
        # (the modules' __dict__s: the flags and hook tables are read there, ~2x faster than
        # through the modules)
        named = list(self.root.named_modules(remove_duplicate=True)) if self.root is not None else []
        # a compiled block inside the tree (compiled_module.py) stands in for its module, whose
        # __dict__ holds the flags and hook tables it shares
        named = [(n, m.__dict__.get("fn", m) if _stand_in(m) else m) for n, m in named]
        self.dicts = [m.__dict__ for _, m in named]
        self.parents = [m.__dict__["_modules"] for _, m in named if m.__dict__["_modules"]]
        watches = [_watch_of(name or "<root>", m.__dict__, True) for name, m in named]
        seen: set[int] = set()
        for name, m in named:
            for k, v in m.__dict__.items():
                if k in NN_INTERNAL or id(v) in seen or not _holder(v):
                    continue
                seen.add(id(v))
                w = _watch_of(f"{name or '<root>'}.{k}", v.__dict__, False)
                if w.names:
                    watches.append(w)
        self.watches = [w for w in watches if w.names]
        # (the snapshot's fast path: one comprehension over (getter, dict) pairs; the few watches whose
        # values hold lists or dicts are copied apart)
        self.plain = [(w.get, w.d) for w in self.watches if not w.mutable]
        self.copied = [w for w in self.watches if w.mutable]
        self.structure = self._structure()

    def _structure(self) -> tuple:
        return tuple([tuple(p.values()) for p in self.parents])

    def _snapshot(self) -> Any:
        return self._structure(), tuple([get(d) for get, d in self.plain]), tuple([w.values() for w in self.copied])

    def _state(self) -> int:
        """The id of the current attribute state (0 for the first one seen)."""
        try:
            snap = self._snapshot()
        except KeyError:  # a watched attribute was deleted: list again
            snap = None
        last = self._last
        if snap is not None and last is not None and _equal(snap, last[0]):
            return last[1]
        with self._lock:
            if snap is None or not _equal(snap[0], self.structure):
                self._list()  # the tree changed (a submodule swapped or removed): watch the new one
                snap = self._snapshot()
            for s, i in self._states:
                if _equal(snap, s):
                    self._last = (s, i)
                    return i
            i = len(self._states)
            if self._states:
                _log.info("module attributes changed since the last call (%s): the program of the new state is used "
                          "(compiled once per state)", self._describe_change(self._states[-1][0], snap))
            if i >= STATE_WARNING and not self._warned:
                self._warned = True
                _log.warning("the module tree has been called in %d different attribute states (%s): each compiles "
                             "its own program; an attribute that changes at every call recompiles at every call",
                             i + 1, self._describe_change(self._states[-1][0], snap))
            self._states.append((snap, i))
            self._last = (snap, i)
            return i

    def _describe_change(self, old: Any, new: Any) -> str:
        if old[0] != new[0] or len(old[1]) != len(new[1]):
            return "a submodule was replaced"
        watches = [w for w in self.watches if not w.mutable] + self.copied
        for w, a, b in zip(watches, old[1] + old[2], new[1] + new[2], strict=True):
            if not _equal(a, b):
                if len(w.names) == 1:
                    a, b = (a,), (b,)
                for name, x, y in zip(w.names, a, b, strict=True):
                    if not _equal(x, y):
                        return f"{w.label}.{name}: {x!r} -> {y!r}"
        return "an attribute"

    def key(self) -> tuple:
        dicts = self.dicts
        if not dicts:
            return ()
        hooks = sum([len(d["_forward_hooks"]) + len(d["_forward_pre_hooks"]) + len(d["_backward_hooks"])
                     + len(d["_backward_pre_hooks"]) for d in dicts])
        hooks += (len(_nn_module._global_forward_hooks) + len(_nn_module._global_forward_pre_hooks)
                  + len(_nn_module._global_backward_hooks) + len(_nn_module._global_backward_pre_hooks))
        return hooks, self._state()


def _equal(a: Any, b: Any) -> bool:
    # (values of another type than the snapshot's, such as a tensor assigned over a number, may
    # not compare to a bool: then they differ)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (any comparison failure means "not the same state")
        return False

"""Trace a repeated layer once: later calls of an identical layer replay its traced subgraph.

A transformer is mostly N copies of one decoder layer. make_fx traces each copy through the
same Python (about 35 ms a layer for a Llama-8B layer on our 2-core machine, most of a cold
capture). While `replicated_layers(root)` is active, the layers of every `nn.ModuleList` (and
`Sequential` / `ModuleDict`) whose members look alike are watched:

* The first call of a member with a given call signature is traced as usual, and the FX nodes
  it created are recorded with where each of their arguments came from: the call's tensor
  inputs, the member's own parameters and buffers, or nodes created inside the call. A
  transformers cache passed to the call cuts the recording at each `cache.update(k, v,
  self.layer_idx)`: the segments between updates are recorded, the update itself is not.
* A later call of a member of the same group with the same call signature does not run the
  member's Python: each segment becomes one placeholder node (`novaforge::replicated_call`)
  taking its inputs (the call's tensors, the member's parameters, values of earlier segments
  and updates), with fake outputs of the recorded types; between segments the real
  `cache.update` runs with the member's own layer index, so the cache object holds every
  layer's states as after a full trace. An update that returns other shapes than recorded
  (layers' caches of different lengths) raises `ReplayMismatch`: capture traces again with
  every layer traced.
* After the trace, `inline(gm)` replaces each placeholder node by a copy of the recorded
  nodes, rewired to the placeholder's inputs. The result is the graph a full trace gives (the
  same nodes, in a valid order; tests compare the lowered IR's structural keys on every model
  family of the test tier, in their default configs and with use_cache=False).

Group signature (what must be equal for two modules to share a recording): the class of every
module in the member's subtree, their relative names, training flags, hooks (none allowed),
parameter and buffer names, shapes, dtypes, devices, requires_grad and ties, and every other
attribute by value (configs and other objects by identity: a shared config is equal, two
distinct ones are not).

Integer attributes that differ between members (`layer_idx`) are left out of the signature but
watched: they are removed from the first member's instance dicts while it is traced and served
by a `__getattr__` as an int subclass that marks the recording unusable at any use (arithmetic,
comparison, hashing, formatting, `__index__`) other than being passed to a cache's `update` as
the layer index, and every read must be so consumed. So a layer whose computation reads its
index (a per-layer choice `config.layer_types[self.layer_idx]`, a scale by the layer's depth)
is traced at every call. The one use not seen: indexing a Python list or tuple with the same
read that is then passed to `update` (CPython indexes with an int subclass without calling it).
A cache the layer reads otherwise than by `update` (its length, its layers) also refuses.

Call signature: grad mode (calls with grad enabled are never replayed: autograd inside the
traced function needs the real ops), autocast state, the tensor inputs' shapes, strides,
dtypes, devices and requires_grad, which inputs are the same tensor, and the non-tensor
arguments by value (a transformers cache object by identity, and only one whose class keeps
the base `Cache.update`; any other object disables it).

A recording is refused (every call is then traced) when the call uses a watched attribute
otherwise than as a cache's layer index, uses nodes made outside it that are not its inputs,
parameters or cache updates' results, contains a random op, an in-place op or a symbolic size
outside its cache updates, or returns a cache or a view of an input.

Invariant: `inline(trace_with_replication)` equals the full trace up to node names and order;
with no group found or every recording refused, the trace is the plain one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree

from .. import logs
from ..ir.ops.random import is_random_target

_log = logs.get_logger("capture")
_MISSING = object()
_local = threading.local()
_recordings: dict[int, _Segment] = {}  # id -> segment, read by the placeholder op's fake impl
_ids = itertools.count()
_subclasses: dict[type, type] = {}
_subclass_lock = threading.Lock()


@torch.library.custom_op("novaforge::replicated_call", mutates_args=())
def replicated_call(tensors: list[torch.Tensor], recording: int) -> list[torch.Tensor]:
    """A replayed layer call inside a trace; `inline` replaces it before anything runs it."""
    raise RuntimeError("novaforge::replicated_call is a tracing placeholder and never runs")


@replicated_call.register_fake
def _replicated_call_fake(tensors: list[torch.Tensor], recording: int) -> list[torch.Tensor]:
    rec = _recordings[recording]
    return [torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device)
            for v in rec.fresh_outputs]


@dataclass
class _Segment:
    """Nodes of a recorded call between two cache updates (or its start and end); replayed as
    one placeholder node whose inputs are `input_nodes`' values and outputs `out_nodes`'."""

    id: int
    nodes: list[torch.fx.Node]
    input_nodes: list[torch.fx.Node]
    out_nodes: list[torch.fx.Node] = field(default_factory=list)

    @property
    def fresh_outputs(self) -> list[Any]:
        return [n.meta["val"] for n in self.out_nodes]


@dataclass
class _Update:
    """A `cache.update(...)` the recorded call made: replayed as the real call."""

    cache: int  # which cache object of the call's arguments
    index_attr: tuple[str, str]  # the watched attribute passed as the layer index
    args: list[Any]  # per leaf of (args, kwargs) after the index: ("node", node) | ("const", v)
    spec: Any
    index_pos: int  # where the layer index stands among the positional arguments
    results: list[torch.fx.Node | None]  # per leaf of the result: its node (None: not a tensor)
    result_spec: Any
    result_meta: list[Any]


@dataclass
class _Recording:
    """A traced call cut at its cache updates: segments[0], updates[0], segments[1], ..."""

    segments: list[_Segment]
    updates: list[_Update]
    n_inputs: int  # the call's tensor inputs, then the member's parameters and buffers
    out_spec: Any  # pytree spec of the call's result
    out_leaves: list[Any]  # per leaf: ("node", node) | ("const", value)


@dataclass
class _Group:
    members: list[torch.nn.Module]
    watched: list[tuple[str, str]]  # (submodule path, attribute) of the differing int attributes
    refused: bool = False
    recordings: dict[Any, int] = field(default_factory=dict)  # call signature -> recording id


class _WatchedInt(int):
    """A watched attribute's value as the first member's trace sees it: any use other than being
    passed to a cache's `update` as the layer index marks the recording unusable. (Indexing a
    Python list with it goes through CPython's fast path unseen; a read that is not then passed
    to `update` is caught by the count of reads.)"""

    watch: _Watch
    plain: int

    def __new__(cls, value: int, watch: _Watch) -> _WatchedInt:
        obj = super().__new__(cls, value)
        obj.watch, obj.plain = watch, int(value)
        return obj


def _flagging(name: str) -> Any:
    def op(self, *args):
        self.watch.used = True
        return getattr(int, name)(self.plain, *args)

    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__divmod__", "__pow__", "__rpow__", "__neg__",
              "__pos__", "__abs__", "__invert__", "__and__", "__or__", "__xor__", "__lshift__", "__rshift__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__index__", "__int__",
              "__float__", "__bool__", "__str__", "__repr__", "__format__", "__round__", "__trunc__", "__floor__",
              "__ceil__"):
    setattr(_WatchedInt, _name, _flagging(_name))


class _Watch:
    """The first member's trace: reads of watched attributes, cache updates, other uses."""

    def __init__(self, graph: torch.fx.Graph, tracer: Any) -> None:
        self.values: dict[tuple[int, str], tuple[tuple[str, str], int]] = {}  # (id(module), attr) -> key, value
        self.served: dict[int, tuple[str, str]] = {}  # id of a served _WatchedInt -> its attribute
        self.reads = 0
        self.used = False  # a watched value was used other than as a layer index, or a cache otherwise
        self.graph, self.tracer = graph, tracer
        self.cuts: list[torch.fx.Node] = [_last(graph)]  # see _recording
        self.updates: list[tuple] = []  # (cache number, index attribute, index position, args, kwargs, result)
        self.caches: list[Any] = []
        self.in_update = False

    def serve(self, key: tuple[str, str], value: int) -> _WatchedInt:
        self.reads += 1
        w = _WatchedInt(value, self)
        self.served[id(w)] = key
        return w


def _last(graph: torch.fx.Graph) -> torch.fx.Node:
    return graph._root.prev  # noqa: SLF001 (the newest node; the root itself for an empty graph)


def _state() -> Any:
    if not hasattr(_local, "active"):
        _local.active = None
    return _local


# ----------------------------------------------------------------------------- signatures

def _value_sig(v: Any) -> Any:
    """A hashable description of an attribute or argument value; objects by identity."""
    if v is None or isinstance(v, bool | int | float | str | complex | torch.dtype | torch.device):
        return (type(v).__name__, v)
    if isinstance(v, tuple | list):
        return (type(v).__name__, tuple(_value_sig(x) for x in v))
    if isinstance(v, functools.partial):
        return ("partial", id(v.func), _value_sig(v.args), _value_sig(v.keywords))
    if isinstance(v, set | frozenset):
        return ("set", tuple(sorted(repr(_value_sig(x)) for x in v)))
    if isinstance(v, dict):
        try:
            items = sorted(v.items(), key=lambda kv: repr(kv[0]))
        except Exception:  # noqa: BLE001
            return ("id", id(v))
        return ("dict", tuple((repr(k), _value_sig(x)) for k, x in items))
    return ("id", id(v))


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _attributes(member: torch.nn.Module) -> dict[tuple[int, str], int]:
    """What the member's modules' instance dicts hold, by identity (a call that sets one changes it)."""
    return {(id(m), k): id(v) for m in member.modules() for k, v in m.__dict__.items()}


def _hooked(member: torch.nn.Module) -> bool:
    """Hooks on the member's subtree or global module hooks, as the call meets them (a library
    may install them during the traced call, as transformers' output capturing does): their
    Python runs at every call, which a replay would skip."""
    from torch.nn.modules import module as nn_module

    if any(getattr(nn_module, g, None) for g in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                  "_global_backward_hooks", "_global_backward_pre_hooks")):
        return True
    return any(getattr(m, h, None) for m in member.modules() for h in _HOOKS)


def _module_sig(member: torch.nn.Module) -> tuple[Any, dict[tuple[str, str], int]] | None:
    """(signature without int attributes, {(path, attr): int value}), or None when the member
    cannot be replayed at all (hooks, plain tensor attributes)."""
    parts: list[Any] = []
    ints: dict[tuple[str, str], int] = {}
    tensor_ids: dict[int, str] = {}
    for path, m in member.named_modules(remove_duplicate=False):
        if any(getattr(m, h, None) for h in _HOOKS):
            return None
        attrs = []
        for k, v in sorted(m.__dict__.items()):
            if k in ("_parameters", "_buffers", "_modules") or k.endswith("hooks") or k.startswith("_forward_hooks"):
                continue
            if isinstance(v, torch.Tensor):
                return None  # a plain tensor attribute: its use inside the call is not an input
            if isinstance(v, int) and not isinstance(v, bool):
                ints[(path, k)] = v
                continue
            attrs.append((k, _value_sig(v)))
        tensors = []
        for kind, table in (("p", m._parameters), ("b", m._buffers)):
            for name, t in table.items():
                if t is None:
                    tensors.append((kind, name, None))
                    continue
                tie = tensor_ids.setdefault(id(t), f"{path}.{name}")
                tensors.append((kind, name, tuple(t.shape), str(t.dtype), str(t.device), t.requires_grad, tie))
        parts.append((path, type(m), tuple(attrs), tuple(tensors), tuple(m._modules)))
    return tuple(parts), ints


def _groups(root: torch.nn.Module) -> list[_Group]:
    groups: list[_Group] = []
    for container in root.modules():
        if not isinstance(container, torch.nn.ModuleList | torch.nn.Sequential | torch.nn.ModuleDict):
            continue
        children = [m for m in container._modules.values() if m is not None]
        by_sig: dict[Any, list[tuple[torch.nn.Module, dict]]] = {}
        for m in children:
            sig = _module_sig(m)
            if sig is not None:
                by_sig.setdefault(sig[0], []).append((m, sig[1]))
        for entries in by_sig.values():
            if len(entries) < 2:
                continue
            first = entries[0][1]
            if any(set(ints) != set(first) for _, ints in entries):
                continue
            watched = [key for key in first if len({ints[key] for _, ints in entries}) > 1]
            groups.append(_Group([m for m, _ in entries], watched))
    return groups


def _is_cache(x: Any) -> bool:
    """A transformers cache whose `update` is the base class's (the one a replay calls)."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    base = getattr(cache_utils, "Cache", None)
    return base is not None and isinstance(x, base) and getattr(type(x), "update", None) is base.update


def _plain(x: Any) -> bool:
    """Only tensors, Python scalars, None, transformers caches (whose updates are replayed) and
    builtin containers of them: any other object may be changed by the call in Python, which a
    replay would skip."""
    if isinstance(x, torch.Tensor) or x is None or isinstance(x, bool | int | float | str) or _is_cache(x):
        return True
    if type(x) in (tuple, list):
        return all(_plain(v) for v in x)
    if type(x) is dict:
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    return False


def _flatten(x: Any) -> tuple[list[Any], Any]:
    return _pytree.tree_flatten(x, is_leaf=_is_cache)


def _call_sig(args: tuple, kwargs: dict) -> tuple[Any, list[torch.Tensor], list[Any]] | None:
    if not _plain(args) or not _plain(kwargs):
        return None
    leaves, spec = _flatten((args, kwargs))
    tensors: list[torch.Tensor] = []
    caches: list[Any] = []
    desc: list[Any] = []
    seen: dict[int, int] = {}
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                desc.append(("same", seen[id(x)]))
                continue
            if any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride())):
                return None
            seen[id(x)] = len(tensors)
            tensors.append(x)
            desc.append(("t", tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device), x.requires_grad))
        elif _is_cache(x):
            desc.append(("cache", id(x)))
            caches.append(x)
        else:
            desc.append(("v", type(x).__name__, x))
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    return (str(spec), tuple(desc), autocast), tensors, caches


# ----------------------------------------------------------------------------- the watch

def _watching_class(cls: type) -> type:
    """A subclass of a member's class whose `__call__` goes through the replicator, and whose
    `__getattr__` serves watched attributes (removed from the instance dict) and counts reads."""
    with _subclass_lock:
        sub = _subclasses.get(cls)
        if sub is not None:
            return sub

        def __call__(self, *args, **kwargs):  # noqa: N807
            st = _state().active
            if st is None:
                return super(sub, self).__call__(*args, **kwargs)
            return st.call(self, super(sub, self).__call__, args, kwargs)

        def __getattr__(self, name):  # noqa: N807
            st = _state().active
            watch = st.watch if st is not None else None
            if watch is not None:
                entry = watch.values.get((id(self), name))
                if entry is not None:
                    return watch.serve(*entry)
            return super(sub, self).__getattr__(name)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__getattr__": __getattr__,
                                         "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                         "_novaforge_watching": True})
        _subclasses[cls] = sub
        return sub


def _watching_cache_class(cls: type) -> type:
    """A subclass of a cache's class for the first member's trace: `update` is recorded, any
    other attribute the layer reads marks the recording unusable."""
    key = ("cache", cls)
    with _subclass_lock:
        sub = _subclasses.get(key)
        if sub is not None:
            return sub

        def __getattribute__(self, name):  # noqa: N807
            st = _state().active
            watch = st.watch if st is not None else None
            if watch is None or watch.in_update or name.startswith("__"):
                return object.__getattribute__(self, name)
            if name == "update":
                return functools.partial(_recorded_update, watch, self)
            watch.used = True
            return object.__getattribute__(self, name)

        sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__,
                                         "__qualname__": cls.__qualname__})
        _subclasses[key] = sub
        return sub


def _recorded_update(watch: _Watch, cache: Any, *args: Any, **kwargs: Any) -> Any:
    """The first member's `cache.update(...)`: runs for real, with the cut points around it."""
    index_pos = 2 if len(args) > 2 else None
    index = args[2] if index_pos is not None else kwargs.get("layer_idx")
    attr = watch.served.get(id(index)) if isinstance(index, _WatchedInt) else None
    if attr is None:
        watch.used = True  # (an index that is not the layer's own attribute)
    else:
        watch.reads -= 1  # consumed as the layer index
        if index_pos is not None:
            args = (*args[:2], index.plain, *args[3:])
        else:
            kwargs = {**kwargs, "layer_idx": index.plain}
    watch.cuts.append(_last(watch.graph))
    watch.in_update = True
    try:
        out = base_update(cache, *args, **kwargs)
    finally:
        watch.in_update = False
    watch.cuts.append(_last(watch.graph))
    number = next((i for i, c in enumerate(watch.caches) if c is cache), -1)
    watch.updates.append((number, attr, index_pos, args, kwargs, out))
    return out


def base_update(cache: Any, *args: Any, **kwargs: Any) -> Any:
    return sys.modules["transformers.cache_utils"].Cache.update(cache, *args, **kwargs)


class ReplayMismatch(Exception):
    """A replayed cache update returned other shapes than the recorded one: trace again with
    every layer traced (`replicated_layers` callers catch it)."""


class _Replicator:
    def __init__(self, groups: list[_Group]) -> None:
        self.groups = groups
        self.group_of = {id(m): g for g in groups for m in g.members}
        self.watch: _Watch | None = None
        self.recordings: dict[int, _Recording] = {}
        self.segments: dict[int, _Segment] = {}
        self.replayed = 0

    def call(self, member: torch.nn.Module, through: Any, args: tuple, kwargs: dict) -> Any:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        group = self.group_of.get(id(member))
        mode = get_proxy_mode()
        if group is None or group.refused or mode is None or self.watch is not None or torch.is_grad_enabled():
            return through(*args, **kwargs)
        sig = _call_sig(args, kwargs)
        if sig is None or _hooked(member):
            return through(*args, **kwargs)
        key, tensors, caches = sig
        state = _member_tensors(member)
        rec_id = group.recordings.get(key)
        if rec_id is not None:
            self.replayed += 1
            return self._replay(self.recordings[rec_id], member, [*tensors, *state], caches)
        self.watch = watch = _Watch(mode.tracer.graph, mode.tracer)
        watch.caches = caches
        before = _attributes(member)
        removed = _hide_watched(member, group.watched, watch)
        swapped = [(c, c.__class__) for c in caches]
        for c, cls in swapped:
            c.__class__ = _watching_cache_class(cls)
        try:
            out = through(*args, **kwargs)
        finally:
            self.watch = None
            for mod, name, v in removed:
                mod.__dict__[name] = v
            for c, cls in swapped:
                c.__class__ = cls
        watch.cuts.append(_last(watch.graph))
        if _attributes(member) != before:
            rec: _Recording | str = "it sets attributes of its modules (a replay would skip that)"
        elif watch.used or watch.reads:
            rec = (f"it uses {', '.join(sorted({a for _, a in group.watched}))} (which differs "
                                     "between the layers) otherwise than as a cache's layer index, or reads its "
                                     "cache otherwise than by update()")
        else:
            rec = _recording(out, watch, [*tensors, *state], self.segments)
        if isinstance(rec, str):
            group.refused = True
            _log.debug("%s layers are traced one by one: %s", type(member).__name__, rec)
        else:
            rec_id = len(self.recordings)
            self.recordings[rec_id] = rec
            group.recordings[key] = rec_id
        return out

    def _replay(self, rec: _Recording, member: torch.nn.Module, inputs: list[torch.Tensor], caches: list[Any]) -> Any:
        env: dict[torch.fx.Node, Any] = dict(zip(rec.segments[0].input_nodes[:rec.n_inputs], inputs, strict=True))
        for k, seg in enumerate(rec.segments):
            outs = torch.ops.novaforge.replicated_call([env[n] for n in seg.input_nodes], seg.id)
            env.update(zip(seg.out_nodes, outs, strict=True))
            if k < len(rec.updates):
                u = rec.updates[k]
                leaves = [env[v] if kind == "node" else v for kind, v in u.args]
                args, kwargs = _pytree.tree_unflatten(leaves, u.spec)
                path, name = u.index_attr
                index = (member.get_submodule(path) if path else member).__dict__[name]
                if u.index_pos is not None:
                    args = (*args[:u.index_pos], index, *args[u.index_pos:])
                else:
                    kwargs = {**kwargs, "layer_idx": index}
                result, _ = _flatten(base_update(caches[u.cache], *args, **kwargs))
                if _meta(result) != u.result_meta:
                    raise ReplayMismatch(f"cache update of layer {index} returned {_meta(result)}")
                env.update((n, t) for n, t in zip(u.results, result, strict=True) if n is not None)
        leaves = [env[v] if kind == "node" else v for kind, v in rec.out_leaves]
        return _pytree.tree_unflatten(leaves, rec.out_spec)


def _meta(leaves: list[Any]) -> list[Any]:
    return [(tuple(t.shape), tuple(t.stride()), t.dtype) if isinstance(t, torch.Tensor) else ("v", repr(t))
            for t in leaves]


def _nodes_after(a: torch.fx.Node, b: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes after `a` up to and including `b` (none when a is b)."""
    out = []
    n = a
    while n is not b:
        n = n.next
        out.append(n)
    return out


def _recording(out: Any, watch: _Watch, inputs: list[torch.Tensor],
               segments: dict[int, _Segment]) -> _Recording | str:
    """The recording of the first member's call, or why it cannot be replayed (see the module
    docstring). `watch.cuts`: the last node before segment 0, then per update the last node
    before and the last node of the update, then the call's last node."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    def node_of(t: torch.Tensor) -> torch.fx.Node | None:
        slot = get_proxy_slot(t, watch.tracer, None)
        return getattr(getattr(slot, "proxy", None), "node", None)

    input_nodes = [node_of(t) for t in inputs]
    if any(n is None for n in input_nodes):
        return "an input or parameter is not a traced tensor"
    cuts = watch.cuts
    seg_nodes = [_nodes_after(cuts[2 * k], cuts[2 * k + 1]) for k in range(len(watch.updates) + 1)]
    available = set(input_nodes)  # nodes a later segment, update or output may read
    owner: dict[torch.fx.Node, int] = {}  # segment node -> its segment
    needs: list[list[torch.fx.Node]] = []  # per segment: the nodes it reads from outside itself
    updates: list[_Update] = []
    input_storages = {_storage(t) for t in inputs}
    for k, nodes in enumerate(seg_nodes):
        inside = set(nodes)
        need: list[torch.fx.Node] = []
        for n in nodes:
            if n.op not in ("call_function", "get_attr"):
                return f"its trace has a {n.op} node"
            if n.op == "call_function" and (_draws_random(n) or _mutates(n)):
                return f"it calls {n.target} (random or in place)"
            val = n.meta.get("val")
            if any(isinstance(d, torch.SymInt) for v in _pytree.tree_leaves(val) if isinstance(v, torch.Tensor)
                   for d in (*v.shape, *v.stride())):
                return "symbolic sizes"
            for a in n.all_input_nodes:
                if a in inside:
                    continue
                if a not in available:
                    return f"{n.target} reads {a.name}, made outside the layer and not passed to it"
                if a not in need:
                    need.append(a)
            owner[n] = k
        needs.append(need)
        available |= inside
        if k == len(watch.updates):
            break
        cache_index, attr, index_pos, args, kwargs, result = watch.updates[k]
        if cache_index < 0 or attr is None:
            return "it updates a cache it was not passed"
        if index_pos is not None:
            args = (*args[:index_pos], *args[index_pos + 1:])
        else:
            kwargs = {a: v for a, v in kwargs.items() if a != "layer_idx"}
        leaves, spec = _flatten((args, kwargs))
        arg_leaves: list[Any] = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                n = node_of(x)
                if n is None or n not in available:
                    return "a cache update reads a tensor made outside the layer"
                arg_leaves.append(("node", n))
            elif x is None or isinstance(x, bool | int | float | str):
                arg_leaves.append(("const", x))
            else:
                return f"a cache update is passed a {type(x).__name__}"
        res_leaves, res_spec = _flatten(result)
        res_nodes = [node_of(t) if isinstance(t, torch.Tensor) else None for t in res_leaves]
        if any(n is None for n, t in zip(res_nodes, res_leaves, strict=True) if isinstance(t, torch.Tensor)):
            return "a cache update returns an untraced tensor"
        available |= {n for n in res_nodes if n is not None}
        updates.append(_Update(cache_index, attr, arg_leaves, spec, index_pos, res_nodes, res_spec,
                               _meta(res_leaves)))
    if not _plain(out):
        return f"it returns a {type(out).__name__}"
    leaves, out_spec = _flatten(out)
    out_leaves: list[Any] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            n = node_of(x)
            if n is None or n not in available:
                return "it returns a tensor made outside it"
            if n in owner and _storage(x) in input_storages:
                return "it returns a view of an input"
            out_leaves.append(("node", n))
        elif _is_cache(x):
            return "it returns a cache"
        else:
            out_leaves.append(("const", x))
    # each segment's outputs: its nodes that a later segment, update or the result reads
    read_later = {a for need in needs for a in need} | {v for u in updates for kind, v in u.args if kind == "node"} \
        | {v for kind, v in out_leaves if kind == "node"}
    segs = []
    for k, nodes in enumerate(seg_nodes[:len(needs)]):
        extra = [a for a in needs[k] if a not in input_nodes]
        seg = _Segment(next(_ids), nodes, [*input_nodes, *extra], [n for n in nodes if n in read_later])
        segments[seg.id] = _recordings[seg.id] = seg
        segs.append(seg)
    return _Recording(segs, updates, len(input_nodes), out_spec, out_leaves)


def _storage(t: torch.Tensor) -> Any:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # noqa: BLE001
        return id(t)


def _draws_random(n: torch.fx.Node) -> bool:
    """A random-tagged op, unless its dropout probability is 0 (SDPA in eval mode is tagged)."""
    if not is_random_target(n.target):
        return False
    schema = getattr(n.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = n.kwargs.get("dropout_p", n.args[i] if i < len(n.args) else schema.arguments[i].default_value)
    return p != 0


def _mutates(n: torch.fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _member_tensors(member: torch.nn.Module) -> list[torch.Tensor]:
    """The member's parameters and buffers as the trace sees them (functional_call's), in a
    fixed order (ties listed once)."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for _, m in member.named_modules(remove_duplicate=False):
        for table in (m._parameters, m._buffers):
            for t in table.values():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
    return out


def _hide_watched(member: torch.nn.Module, watched: list[tuple[str, str]], watch: _Watch) -> list[tuple]:
    removed = []
    for path, name in watched:
        mod = member.get_submodule(path) if path else member
        if name in mod.__dict__:
            v = mod.__dict__.pop(name)
            watch.values[(id(mod), name)] = ((path, name), v)
            removed.append((mod, name, v))
    return removed


# ----------------------------------------------------------------------------- entry points

class Replication:
    """What `replicated_layers` did: counts for the capture's times, and `inline`."""

    def __init__(self, rep: _Replicator | None) -> None:
        self._rep = rep

    @property
    def replayed(self) -> int:
        return self._rep.replayed if self._rep is not None else 0

    def inline(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Replace every placeholder call by a copy of its segment's recorded nodes."""
        if self._rep is None or not self._rep.replayed:
            return gm
        graph = gm.graph
        target = torch.ops.novaforge.replicated_call.default
        for call in [n for n in graph.nodes if n.op == "call_function" and n.target is target]:
            inputs, seg_id = call.args
            seg = self._rep.segments[seg_id]
            env = dict(zip(seg.input_nodes, inputs, strict=True))
            with graph.inserting_before(call):
                for n in seg.nodes:
                    env[n] = graph.node_copy(n, lambda a: env[a])  # noqa: B023
            results = [env[n] for n in seg.out_nodes]
            for user in list(call.users):
                if user.target is not operator.getitem:
                    raise AssertionError(f"unexpected use of a replicated call: {user.format_node()}")
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
            graph.erase_node(call)
        gm.recompile()
        return gm


@contextlib.contextmanager
def replicated_layers(root: torch.nn.Module, enabled: bool = True) -> Iterator[Replication]:
    """While active, identical layers of `root`'s module lists are traced once (see the module
    docstring); call `inline` on the traced graph before using it. `root` must be a module tree
    no other thread runs (a capture's shadow module): its members' classes are swapped for the
    duration."""
    groups = _groups(root) if enabled else []
    if not groups:
        yield Replication(None)
        return
    rep = _Replicator(groups)
    swapped = []
    for g in groups:  # the members, and the submodules holding watched attributes (their __getattr__)
        mods = {id(m): m for m in g.members}
        mods.update((id(sm), sm) for m in g.members for path, _ in g.watched if path
                    for sm in [m.get_submodule(path)])
        for m in mods.values():
            swapped.append((m, m.__class__))
            m.__class__ = _watching_class(m.__class__)
    st = _state()
    outer = st.active
    st.active = rep
    replication = Replication(rep)
    try:
        yield replication
    finally:
        st.active = outer
        for m, cls in swapped:
            m.__class__ = cls
        for seg_id in rep.segments:
            _recordings.pop(seg_id, None)

"""Trace a repeated layer once: later calls of an identical layer replay its traced subgraph.

A transformer is mostly N copies of one decoder layer. make_fx traces each copy through the
same Python (about 35 ms a layer for a Llama-8B layer on our 2-core machine, most of a cold
capture). While `replicated_layers(root)` is active, the layers of every `nn.ModuleList` (and
`Sequential` / `ModuleDict`) whose members look alike are watched:

* The first call of a member with a given call signature is traced as usual, and the FX nodes
  it created are recorded with where each of their arguments came from: the call's tensor
  inputs, the member's own parameters and buffers, or nodes created inside the call.
* A later call of a member of the same group with the same call signature does not run the
  member's Python: one placeholder node (`novaforge::replicated_call`) takes its tensor inputs
  and its parameters, with fake outputs of the recorded types.
* After the trace, `inline(gm)` replaces each placeholder node by a copy of the recorded
  nodes, rewired to the placeholder's inputs. The result is the graph a full trace gives (the
  same nodes, in a valid order; tests compare the lowered IR's structural keys on every model
  family of the test tier).

Group signature (what must be equal for two modules to share a recording): the class of every
module in the member's subtree, their relative names, training flags, hooks (none allowed),
parameter and buffer names, shapes, dtypes, devices, requires_grad and ties, and every other
attribute by value (configs and other objects by identity: a shared config is equal, two
distinct ones are not). Integer attributes that differ between members (`layer_idx`) are left
out of the signature but watched: they are removed from the first member's instance dicts
while it is traced and served by a `__getattr__` that marks the recording unusable, so a layer
whose computation reads its index (a cache update, a per-layer choice `config.layer_types[
self.layer_idx]`, a scale by the layer's depth) is traced at every call.

Call signature: grad mode (calls with grad enabled are never replayed: autograd inside the
traced function needs the real ops), autocast state, the tensor inputs' shapes, strides,
dtypes, devices and requires_grad, which inputs are the same tensor, and the non-tensor
arguments by value (objects by identity; a transformers cache object passed in disables it).

A recording is refused (every call is then traced) when the call reads a watched attribute,
uses nodes made outside it that are not its inputs or parameters, contains a random op, an
in-place op or a symbolic size, returns a non-tensor it computed, or returns a tensor that
shares storage with an input or another output.

Invariant: `inline(trace_with_replication)` equals the full trace up to node names and order;
with no group found or every recording refused, the trace is the plain one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
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
_recordings: dict[int, _Recording] = {}  # id -> recording, read by the placeholder op's fake impl
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
class _Recording:
    """The nodes one traced call created, and where their arguments come from."""

    id: int
    nodes: list[torch.fx.Node]
    input_nodes: list[torch.fx.Node]  # per tensor input of the call, then per parameter/buffer
    out_spec: Any  # pytree spec of the call's result
    out_leaves: list[Any]  # per leaf: ("node", node) | ("input", i) | ("const", value)
    fresh_outputs: list[Any] = field(default_factory=list)  # meta vals of the ("node", ...) leaves


@dataclass
class _Group:
    members: list[torch.nn.Module]
    watched: list[tuple[str, str]]  # (submodule path, attribute) of the differing int attributes
    refused: bool = False
    recordings: dict[Any, int] = field(default_factory=dict)  # call signature -> recording id


class _Watch:
    """Reads of watched attributes while the first member is traced."""

    def __init__(self) -> None:
        self.values: dict[tuple[int, str], Any] = {}
        self.read = False


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


def _module_sig(member: torch.nn.Module) -> tuple[Any, dict[tuple[str, str], int]] | None:
    """(signature without int attributes, {(path, attr): int value}), or None when the member
    cannot be replayed at all (hooks, plain tensor attributes)."""
    parts: list[Any] = []
    ints: dict[tuple[str, str], int] = {}
    tensor_ids: dict[int, str] = {}
    for path, m in member.named_modules(remove_duplicate=False):
        if any(getattr(m, h, None) for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                               "_backward_pre_hooks")):
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


def _plain(x: Any) -> bool:
    """Only tensors, Python scalars, None and builtin containers of them: any other object (a
    transformers cache) may be updated by the call in Python, which a replay would skip."""
    if isinstance(x, torch.Tensor) or x is None or isinstance(x, bool | int | float | str):
        return True
    if type(x) in (tuple, list):
        return all(_plain(v) for v in x)
    if type(x) is dict:
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    return False


def _call_sig(args: tuple, kwargs: dict) -> tuple[Any, list[torch.Tensor]] | None:
    if not _plain(args) or not _plain(kwargs):
        return None
    leaves, spec = _pytree.tree_flatten((args, kwargs))
    tensors: list[torch.Tensor] = []
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
        else:
            desc.append(("v", type(x).__name__, x))
    autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    return (str(spec), tuple(desc), autocast), tensors


# ----------------------------------------------------------------------------- the watch

def _watching_class(cls: type) -> type:
    """A subclass of a member's class whose `__call__` goes through the replicator, and whose
    `__getattr__` serves watched attributes (removed from the instance dict) and marks reads."""
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
                v = watch.values.get((id(self), name), _MISSING)
                if v is not _MISSING:
                    watch.read = True
                    return v
            return super(sub, self).__getattr__(name)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__getattr__": __getattr__,
                                         "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                         "_novaforge_watching": True})
        _subclasses[cls] = sub
        return sub


class _Replicator:
    def __init__(self, groups: list[_Group]) -> None:
        self.groups = groups
        self.group_of = {id(m): g for g in groups for m in g.members}
        self.watch: _Watch | None = None
        self.recordings: dict[int, _Recording] = {}
        self.replayed = 0

    def call(self, member: torch.nn.Module, through: Any, args: tuple, kwargs: dict) -> Any:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        group = self.group_of.get(id(member))
        mode = get_proxy_mode()
        if group is None or group.refused or mode is None or self.watch is not None or torch.is_grad_enabled():
            return through(*args, **kwargs)
        sig = _call_sig(args, kwargs)
        if sig is None:
            return through(*args, **kwargs)
        key, tensors = sig
        rec_id = group.recordings.get(key)
        state = _member_tensors(member)
        if rec_id is not None:
            self.replayed += 1
            return _replay(self.recordings[rec_id], tensors, state)
        graph = mode.tracer.graph
        before = set(graph.nodes)
        self.watch = watch = _Watch()
        removed = _hide_watched(member, group.watched, watch)
        try:
            out = through(*args, **kwargs)
        finally:
            self.watch = None
            for mod, name, v in removed:
                mod.__dict__[name] = v
        rec = (f"it reads {', '.join(sorted({a for _, a in group.watched}))}, which differs between the layers"
               if watch.read else
               _recording(out, [n for n in graph.nodes if n not in before], tensors, state, mode.tracer))
        if isinstance(rec, str):
            group.refused = True
            _log.debug("%s layers are traced one by one: %s", type(member).__name__, rec)
        else:
            self.recordings[rec.id] = _recordings[rec.id] = rec
            group.recordings[key] = rec.id
        return out


def _recording(out: Any, nodes: list[torch.fx.Node], tensors: list[torch.Tensor], state: list[torch.Tensor],
               tracer: Any) -> _Recording | str:
    """The recording of a call that created `nodes` and returned `out`, or why it cannot be
    replayed (see the module docstring)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    def node_of(t: torch.Tensor) -> torch.fx.Node | None:
        slot = get_proxy_slot(t, tracer, None)
        return getattr(getattr(slot, "proxy", None), "node", None)

    input_nodes = [node_of(t) for t in (*tensors, *state)]
    if any(n is None for n in input_nodes):
        return "an input or parameter is not a traced tensor"
    inside = set(nodes)
    allowed = inside | set(input_nodes)
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
            if a not in allowed:
                return f"{n.target} reads {a.name}, made outside the layer and not passed to it"
    if not _plain(out):
        return f"it returns a {type(out).__name__}"
    leaves, out_spec = _pytree.tree_flatten(out)
    in_index = {id(t): i for i, t in enumerate(tensors)}
    out_leaves: list[Any] = []
    fresh: list[Any] = []
    storages = {_storage(t) for t in (*tensors, *state)}
    for x in leaves:
        if isinstance(x, torch.Tensor):
            if id(x) in in_index:
                out_leaves.append(("input", in_index[id(x)]))
                continue
            n = node_of(x)
            if n is None or n not in inside or _storage(x) in storages:
                return "it returns a tensor made outside it or a view"
            storages.add(_storage(x))
            out_leaves.append(("node", n))
            fresh.append(x)
        else:
            out_leaves.append(("const", x))
    return _Recording(next(_ids), nodes, input_nodes, out_spec, out_leaves, fresh)


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
            watch.values[(id(mod), name)] = v
            removed.append((mod, name, v))
    return removed


def _replay(rec: _Recording, tensors: list[torch.Tensor], state: list[torch.Tensor]) -> Any:
    outs = iter(torch.ops.novaforge.replicated_call([*tensors, *state], rec.id))
    leaves = []
    for kind, v in rec.out_leaves:
        leaves.append(next(outs) if kind == "node" else tensors[v] if kind == "input" else v)
    return _pytree.tree_unflatten(leaves, rec.out_spec)


# ----------------------------------------------------------------------------- entry points

class Replication:
    """What `replicated_layers` did: counts for the capture's times, and `inline`."""

    def __init__(self, rep: _Replicator | None) -> None:
        self._rep = rep

    @property
    def replayed(self) -> int:
        return self._rep.replayed if self._rep is not None else 0

    def inline(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Replace every placeholder call by a copy of its recorded nodes."""
        if self._rep is None or not self._rep.replayed:
            return gm
        graph = gm.graph
        target = torch.ops.novaforge.replicated_call.default
        for call in [n for n in graph.nodes if n.op == "call_function" and n.target is target]:
            inputs, rec_id = call.args
            rec = self._rep.recordings[rec_id]
            env = dict(zip(rec.input_nodes, inputs, strict=True))
            with graph.inserting_before(call):
                for n in rec.nodes:
                    env[n] = graph.node_copy(n, lambda a: env[a])  # noqa: B023
            results = [env[v] for kind, v in rec.out_leaves if kind == "node"]
            for user in list(call.users):
                if user.target is not operator.getitem:
                    raise AssertionError(f"unexpected use of a replicated call: {user.format_node()}")
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
            graph.erase_node(call)
        graph.lint()
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
    for g in groups:
        for m in g.members:
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
        for rec_id in rep.recordings:
            _recordings.pop(rec_id, None)

"""The captured-graph cache: a warm compile in a new process skips capture.

Capture (tracing the module with make_fx) is most of a warm compile; its result, the lowered
IR graph with the call's output structure, is cached on disk next to the kernel libraries, as
JSON (`ir/serialize.py`; never pickles), under `<cache root>/graphs/<key[:2]>/<key>.json`.
The passes then run as usual (they are fast) and the kernels come from the library cache.

The key is a sha256 over everything the traced code can depend on:
* novaforge, torch and transformers versions; freeze, the capture options, grad and autocast
  modes;
* the module tree: every submodule's path, class, training flag and hooks; the source of every
  class in its MRO (the whole defining file, so helpers beside a class count); its non-tensor
  attributes by value (configs as their JSON); plain tensor attributes by content;
* parameters and buffers: names, shapes, dtypes, devices, requires_grad, which are tied and
  which are inference tensors;
* the input signature: tensor shapes, dtypes, devices, strides, requires_grad and the
  structure and values of the non-tensor arguments.
Parameter and buffer *values* are not in the key: frozen ones are referenced by name and read
from the module at load, so folding (which runs in the passes) sees the current weights.
Anything that cannot be fingerprinted or serialized exactly (a plain function, an attribute
whose value has no stable description, a large non-state constant, an output type that cannot
be imported) disables the cache for that call; it never guesses.

Entries are written atomically and verified on load (format, key, payload sha256, then the IR
verifier); anything wrong is a miss and the entry is rewritten. `graph_cache=False` or
`NOVAFORGE_GRAPH_CACHE=0` turns the cache off.

Invariant: a hit returns a `Captured` equal to what capture would return for this module and
call (same graph structure, output spec, parameter bindings), with tensors bound from the
module at load time.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .. import settings
from ..ir import verify
from ..ir.serialize import (
    SerializeError,
    decode_value,
    encode_value,
    graph_from_data,
    graph_to_data,
    tensor_from_data,
    tensor_to_data,
)
from ..options import Options
from . import pytrees
from .capture import autocast_modes
from .module_state import NN_INTERNAL as _NN_INTERNAL
from .subclass_state import flatten_state

FORMAT = 1
INLINE_CONST_BYTES = 4 << 20  # non-state constants up to this size are stored in the entry
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_file_digests: dict[tuple[str, int, int], str] = {}


class _NoKey(Exception):
    """This call cannot be keyed exactly: do not cache it."""


def enabled(options: dict[str, Any]) -> bool:
    return Options.of(options).graph_cache and settings.graph_cache_enabled()


def _path(key: str) -> Path:
    return settings.cache_root() / "graphs" / key[:2] / f"{key}.json"


# ----------------------------------------------------------------------------- keys
def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _file_digest(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        path = None
    if not path or not os.path.exists(path):
        raise _NoKey(f"no source file for {_class_path(cls)}")
    st = os.stat(path)
    k = (path, st.st_mtime_ns, st.st_size)
    d = _file_digests.get(k)
    if d is None:
        d = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        _file_digests[k] = d
    return d


_CONFIG_BOOKKEEPING = frozenset({"_original_object_hash", "_commit_hash"})  # transformers' config metadata


def _describe(v: Any, memo: dict[int, tuple[Any, str]], depth: int = 0) -> str:
    """A stable description of an attribute value, or _NoKey. `memo` keeps each described
    object alive beside its description: an id is unique only while its object lives (a
    temporary's id, reused by the next temporary, returned a stale description)."""
    if v is None or isinstance(v, bool | int | float | str | bytes | torch.dtype | torch.device):
        return repr(v)
    if id(v) in memo:
        return memo[id(v)][1]
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta" or v.numel() * v.element_size() > INLINE_CONST_BYTES:
            raise _NoKey("a large or data-less tensor attribute")
        data = v.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        out = f"T{list(v.shape)}{v.dtype}:{hashlib.sha256(data).hexdigest()}"
    elif isinstance(v, list | tuple | set | frozenset):
        items = sorted(v, key=repr) if isinstance(v, set | frozenset) else v
        out = f"{type(v).__name__}[" + ",".join(_describe(x, memo, depth + 1) for x in items) + "]"
    elif isinstance(v, dict):
        out = "{" + ",".join(f"{_describe(k, memo, depth + 1)}:{_describe(x, memo, depth + 1)}"
                             for k, x in v.items()) + "}"
    elif isinstance(v, type):
        out = _class_path(v)
    elif callable(v) and hasattr(v, "__qualname__") and hasattr(v, "__module__"):
        out = f"fn {v.__module__}:{v.__qualname__}"
        code = getattr(v, "__code__", None)
        if code is not None:
            out += ":" + hashlib.sha256(code.co_code).hexdigest()[:16]
    elif hasattr(v, "to_json_string") and callable(v.to_json_string):  # a transformers config
        # its JSON leaves out private settings that steer the traced code (_attn_implementation)
        # (but not the bookkeeping generate() sets lazily: the key would depend on call order)
        private = {k: x for k, x in sorted(vars(v).items()) if k.startswith("_") and k not in _CONFIG_BOOKKEEPING}
        out = f"{_class_path(type(v))}:{v.to_json_string(use_diff=False)}:{_describe(private, memo, depth + 1)}"
    elif isinstance(v, torch.nn.Module):
        out = f"module {_class_path(type(v))}"  # described where it is a submodule
    elif depth < 2 and hasattr(v, "__dict__"):
        out = f"{_class_path(type(v))}(" + ",".join(
            f"{k}={_describe(x, memo, depth + 1)}" for k, x in sorted(vars(v).items())) + ")"
    else:
        r = repr(v)
        if " at 0x" in r:
            raise _NoKey(f"no stable description of a {type(v).__name__}")
        out = f"{type(v).__name__}:{r}"
    memo[id(v)] = (v, out)
    return out


def _module_parts(mod: torch.nn.Module) -> list[str]:
    parts: list[str] = []
    memo: dict[int, tuple[Any, str]] = {}
    for name, sub in mod.named_modules(remove_duplicate=False):
        cls = type(sub)
        parts.append(f"M {name} {_class_path(cls)} {sub.training}")
        for c in cls.__mro__:
            if c in (torch.nn.Module, object):
                break
            parts.append(f"S {_class_path(c)} {_file_digest(c)}")
        for h in _HOOKS:
            hooks = getattr(sub, h, None)
            if hooks:
                parts.append(f"H {h} " + _describe(list(hooks.values()), memo))
        for k, v in sorted(vars(sub).items()):
            if k in _NN_INTERNAL:
                continue
            parts.append(f"A {k}={_describe(v, memo)}")
    first: dict[tuple, str] = {}
    for kind, named in (("P", mod.named_parameters(remove_duplicate=False)),
                        ("B", mod.named_buffers(remove_duplicate=False))):
        for n, t in named:
            tied = first.setdefault(_storage_ident(t), n)
            # an inference tensor is never frozen (frontend/module_state.py `freezable`): its graph differs
            inference = " inference" if t.is_inference() else ""
            parts.append(f"{kind} {n} {list(t.shape)} {t.dtype} {t.device} {t.requires_grad} tied={tied}{inference}"
                         + _subclass_part(t, memo))
    return parts


def _storage_ident(t: torch.Tensor) -> tuple:
    """Where the tensor's data is (ties share it); a wrapper subclass (a torchao int8 weight) has
    no storage of its own: its inner tensors' places name it."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return (type(t).__name__,) + tuple(_storage_ident(getattr(t, a)) for a in names)
    return (t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t), t.storage_offset(),
            tuple(t.shape), tuple(t.stride()))


def _subclass_part(t: torch.Tensor, memo: dict[int, tuple[Any, str]]) -> str:
    """A wrapper subclass's class, flatten context and inner tensors' specs (its graph depends on them)."""
    if not is_traceable_wrapper_subclass(t):
        return ""
    names, ctx = t.__tensor_flatten__()
    inner = [f"{a}:{list(getattr(t, a).shape)}:{getattr(t, a).dtype}{_subclass_part(getattr(t, a), memo)}"
             for a in names]
    return f" subclass={_class_path(type(t))} ctx={_describe(ctx, memo)} inner={inner}"


def key_for(module: Any, flat: pytrees.Flat, freeze: bool, options: dict[str, Any], fake: bool = False) -> str | None:
    """The cache key of this call, or None when it cannot be keyed exactly. `fake`: a capture
    without data (meta parameters, compile_only), whose graph binds parameters as inputs."""
    if not isinstance(module, torch.nn.Module):
        return None
    try:
        parts = [f"novaforge-graph-{FORMAT}", _version(), torch.__version__, _transformers_version(),
                 f"freeze={freeze}", f"fake={fake}", f"capture={Options.of(options).capture}",
                 f"random={Options.of(options).random}",
                 f"grad={torch.is_grad_enabled()}", f"autocast={autocast_modes()}"]
        parts += _module_parts(module)
        for t in flat.leaves:
            parts.append(f"I {list(t.shape)} {t.dtype} {t.device} {list(t.stride())} {t.requires_grad}")
        spec = repr(flat.spec.key)
        if " at 0x" in spec:
            return None
        parts.append("spec " + spec)
    except _NoKey:
        return None
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _version() -> str:
    """novaforge's version and a digest of the sources that shape a captured graph (capture,
    lowering, the IR), so a changed lowering rule never meets a graph cached before it."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        from ..version import __version__

        h = hashlib.sha256(__version__.encode())
        pkg = Path(__file__).resolve().parent.parent
        for sub in ("frontend", "ir"):
            for f in sorted((pkg / sub).rglob("*.py")):
                h.update(f.name.encode())
                h.update(f.read_bytes())
        _SOURCE_DIGEST = f"{__version__}:{h.hexdigest()}"
    return _SOURCE_DIGEST


_SOURCE_DIGEST: str | None = None


def _transformers_version() -> str:
    tf = sys.modules.get("transformers")
    return f"transformers-{getattr(tf, '__version__', 'none')}"


# ------------------------------------------------------------------ spec encoding
def _enc(v: Any) -> Any:
    if isinstance(v, type):
        cls = _resolve(_class_path(v))
        if cls is not v:
            raise SerializeError(f"type {_class_path(v)} cannot be imported by name")
        return {"type": _class_path(v)}
    if isinstance(v, dict):
        return {"dict": [[_enc(k), _enc(x)] for k, x in v.items()]}
    if isinstance(v, tuple):
        return {"tuple": [_enc(x) for x in v]}
    if isinstance(v, list):
        return {"list": [_enc(x) for x in v]}
    return {"v": encode_value(v)}


def _dec(d: Any) -> Any:
    (tag, x), = d.items()
    if tag == "type":
        return _resolve(x)
    if tag == "dict":
        return {_dec(k): _dec(v) for k, v in x}
    if tag == "tuple":
        return tuple(_dec(e) for e in x)
    if tag == "list":
        return [_dec(e) for e in x]
    return decode_value(x)


def _resolve(path: str) -> Any:
    import importlib

    mod, _, qual = path.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise SerializeError(f"cannot import {path}")
    return obj


def _spec_to_data(s: pytrees.Spec) -> dict[str, Any]:
    return {"kind": s.kind, "type": _enc(s.type), "context": _enc(s.context), "value": _enc(s.value),
            "index": s.index, "children": [_spec_to_data(c) for c in s.children]}


def _spec_from_data(d: dict[str, Any]) -> pytrees.Spec:
    return pytrees.Spec(d["kind"], _dec(d["type"]), _dec(d["context"]),
                        tuple(_spec_from_data(c) for c in d["children"]), _dec(d["value"]), int(d["index"]))


# ------------------------------------------------------------------ load / store
def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state by the names capture binds (subclass weights as their inner tensors)."""
    return flatten_state({**dict(module.named_parameters(remove_duplicate=False)),
                          **dict(module.named_buffers(remove_duplicate=False))})


def store(key: str, captured: Any, module: torch.nn.Module) -> bool:
    """Write the entry; False (and nothing written) when the capture cannot be serialized."""
    if not isinstance(captured.out_spec, pytrees.Spec):
        return False
    state = _state(module)

    def const_ref(gi) -> dict[str, Any] | None:
        t = state.get(gi.name)
        if t is not None and t.device.type != "meta" and gi.tensor.data_ptr() == t.data_ptr() \
                and gi.tensor.shape == t.shape:
            return {"state": gi.name}
        if gi.tensor.numel() * gi.tensor.element_size() <= INLINE_CONST_BYTES and gi.tensor.device.type != "meta":
            return {"data": tensor_to_data(gi.tensor)}
        return None

    try:
        payload = {
            "graph": graph_to_data(captured.graph, const_ref),
            "out_spec": _spec_to_data(captured.out_spec),
            "aten_ops": int(captured.aten_ops),
            "externs": [list(e) for e in captured.externs],
            "mutated_inputs": list(captured.mutated_inputs),
        }
        text = json.dumps(payload, sort_keys=True)
    except (SerializeError, TypeError, ValueError):
        return False
    entry = {"format": FORMAT, "key": key, "sha256": hashlib.sha256(text.encode()).hexdigest(), "payload": text}
    path = _path(key)
    from ..cache.store import _atomic_write, _makedirs

    try:
        _makedirs(path.parent)
        _atomic_write(path, json.dumps(entry))
    except OSError:
        return False
    return True


def load(key: str, module: torch.nn.Module) -> Any | None:
    """The cached capture of this key bound to `module`, or None (a miss: absent, corrupt, or
    no longer matching the module; a bad entry is removed)."""
    from .capture import Captured

    path = _path(key)
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_bytes().decode("utf-8"))
        text = entry["payload"]
        if entry.get("format") != FORMAT or entry.get("key") != key \
                or hashlib.sha256(text.encode()).hexdigest() != entry.get("sha256"):
            raise SerializeError("entry does not match its key or checksum")
        payload = json.loads(text)
        state = _state(module)
        frozen: list[torch.Tensor] = []

        def const_tensor(ref: dict[str, Any]) -> torch.Tensor:
            if "state" in ref:
                t = state[ref["state"]]
                frozen.append(t)
                return t.detach()
            return tensor_from_data(ref["data"])

        graph = graph_from_data(payload["graph"], const_tensor)
        verify(graph)
        refs = [state[gi.name] for gi in graph.inputs if gi.kind in ("param", "buffer")]
        out_spec = _spec_from_data(payload["out_spec"])
    except Exception:  # any bytes in the file: a miss, and the entry is rewritten
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    graph.meta["aten_ops"] = payload["aten_ops"]
    return Captured(graph=graph, out_spec=out_spec, param_refs=refs, aten_ops=payload["aten_ops"],
                    externs=[tuple(e) for e in payload["externs"]], times={"graph_cache_hit": 1.0},
                    mutated_inputs=list(payload["mutated_inputs"]), frozen=frozen)

"""The optimized-graph cache: a warm compile in a new process skips the passes too.

With the captured-graph cache (frontend/graph_cache.py) a warm compile still runs every pass:
about 0.25 s for the Llama-8B architecture and 0.5 s for the 70B one, most of such a compile.
This cache keeps the pipeline's result (the fused graph with its kernels, placement and memory
plan, and the pass records `explain` prints) as JSON (never pickles) under
`<cache root>/optimized/<key[:2]>/<key>.json`; the kernels themselves come from the library
cache as always.

Key: sha256 of the captured graph's key (which covers the module, the call's signature and the
capture sources), the sources of every pass and of the IR, every compiler option, the backend's
hash and name, and the target's description. Only graphs that read no module state as a constant
are cached (meta or unfrozen models: their parameters are inputs): a pass may decide on a frozen
constant's values (a mask buffer recognized as causal), which a new process's weights may not
share. Constants the passes made are stored by value when small, else the graph is not cached.
Symbolic memory plans and records that keep graphs (`keep_graphs`, `pass_trace`) are not cached.
The key holds the passes' source files, not functions patched in memory: code that patches a
pass at run time (the test suite's planted bugs) turns the caches off (`graph_cache=False`).

Entries are written atomically and verified on load (format, key, payload sha256, the memory
plan's own checks, and the IR verifier under NOVAFORGE_CHECK: the verifier over every kernel body
would cost a third of a load); anything wrong is a miss and the entry is rewritten.
`graph_cache=False` or `NOVAFORGE_GRAPH_CACHE=0` turns this cache off with the other.

Invariant: a hit returns a graph equal to what the pipeline returns for this captured graph,
options, backend and target (same nodes, kernels, placement and memory plan), and the same
pass records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from .. import settings
from ..ir import Graph, verify
from ..ir.serialize import SerializeError, graph_from_data, graph_to_data, tensor_from_data, tensor_to_data
from ..passes.pipeline import PassRecord
from ..passes.plan_memory import MemoryPlan, verify_plan

FORMAT = 1
INLINE_CONST_BYTES = 4 << 20
_SOURCE_DIGEST: str | None = None


def _path(key: str) -> Path:
    return settings.cache_root() / "optimized" / key[:2] / f"{key}.json"


def _sources() -> str:
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        h = hashlib.sha256()
        pkg = Path(__file__).resolve().parent.parent
        for sub in ("passes", "ir", "schedule"):
            for f in sorted((pkg / sub).rglob("*.py")):
                h.update(f.name.encode())
                h.update(f.read_bytes())
        _SOURCE_DIGEST = h.hexdigest()
    return _SOURCE_DIGEST


def key_for(captured: Any, state_names: set[str], options: Any, backend: Any, target: Any) -> str | None:
    """The key of the pipeline's result for this capture, or None where it is not cached.
    `state_names`: the module's parameter and buffer names."""
    if captured.cache_key is None or options.keep_graphs or options.pass_trace or options.pass_fuel:
        return None
    if any(gi.kind == "const" and gi.name in state_names for gi in captured.graph.inputs):
        return None  # module state frozen as constants (see the module docstring)
    target_text = target.key() if hasattr(target, "key") else repr(target)
    fields = {f.name: repr(getattr(options, f.name)) for f in dataclasses.fields(options) if f.name != "dump_dir"}
    parts = [f"novaforge-optimized-{FORMAT}", captured.cache_key, _sources(), json.dumps(fields, sort_keys=True),
             str(getattr(backend, "name", type(backend).__name__)), backend.hash() if backend is not None else "",
             target_text, f"check={settings.check_mode()}"]
    from ..passes.user_kernels import registry_digest

    if registry_digest():  # (novaforge.register_kernel: the registered kernels decide matches)
        parts.append(f"user_kernels={registry_digest()}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _numbered(graph: Graph) -> list[Any]:
    """The graph's values in serialize's numbering: inputs, then each node's outputs."""
    return [gi.value for gi in graph.inputs] + [o for n in graph.nodes for o in n.outputs]


def _const_ref(gi) -> dict[str, Any] | None:
    t = gi.tensor
    if t is None or t.device.type == "meta" or t.numel() * t.element_size() > INLINE_CONST_BYTES:
        return None
    return {"data": tensor_to_data(t)}


def _plan_to_data(plan: MemoryPlan, index: dict[Any, int]) -> dict[str, Any]:
    if plan.symbolic:
        raise SerializeError("symbolic memory plan")

    def vmap(d: dict) -> list:
        return [[index[k], index[v] if not isinstance(v, int | tuple) else (list(v) if isinstance(v, tuple) else v)]
                for k, v in d.items()]

    return {"arena_bytes": plan.arena_bytes, "offsets": vmap(plan.offsets), "sizes": vmap(plan.sizes),
            "intervals": vmap(plan.intervals), "fresh": sorted(index[v] for v in plan.fresh),
            "inplace": vmap(plan.inplace), "into_output": vmap(plan.into_output),
            "into_input": vmap(plan.into_input), "sum_bytes": plan.sum_bytes}


def _plan_from_data(d: dict[str, Any], values: list[Any]) -> MemoryPlan:
    def ints(pairs: list) -> dict:
        return {values[k]: v for k, v in pairs}

    def pairs(pairs_: list) -> dict:
        return {values[k]: values[v] for k, v in pairs_}

    return MemoryPlan(d["arena_bytes"], ints(d["offsets"]), ints(d["sizes"]),
                      {values[k]: tuple(v) for k, v in d["intervals"]}, {values[i] for i in d["fresh"]},
                      pairs(d["inplace"]), pairs(d["into_output"]), pairs(d["into_input"]), d["sum_bytes"])


def store(key: str, graph: Graph, records: list[PassRecord]) -> bool:
    """Write the entry; False (and nothing written) when the graph cannot be serialized."""
    from .store import _atomic_write, _makedirs

    try:
        values = _numbered(graph)
        index = {v: i for i, v in enumerate(values)}
        node_index = {n: i for i, n in enumerate(graph.nodes)}
        meta = graph.meta
        placement = meta.get("placement")
        plan = meta.get("memory_plan")
        payload = {
            "graph": graph_to_data(graph, _const_ref, kernels=True),
            "placement": [[node_index[n], ex] for n, ex in placement.items()] if placement is not None else None,
            "transitions": meta.get("transitions"),
            "donated": sorted(meta.donated) if meta.donated is not None else None,
            "memory_plan": _plan_to_data(plan, index) if plan is not None else None,
            "records": [{f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name not in ("graph", "trace")}
                        for r in records],
        }
        text = json.dumps(payload, sort_keys=True)
    except (SerializeError, KeyError, TypeError, ValueError):
        return False
    entry = {"format": FORMAT, "key": key, "sha256": hashlib.sha256(text.encode()).hexdigest(), "payload": text}
    path = _path(key)
    try:
        _makedirs(path.parent)
        _atomic_write(path, json.dumps(entry))
    except OSError:
        return False
    return True


def load(key: str) -> tuple[Graph, list[PassRecord]] | None:
    """The cached pipeline result of this key, or None (a miss: absent or damaged; a bad entry
    is removed)."""
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
        graph = graph_from_data(payload["graph"], lambda ref: tensor_from_data(ref["data"]))
        if settings.check_enabled():
            verify(graph)
        values = _numbered(graph)
        if payload["placement"] is not None:
            graph.meta.placement = {graph.nodes[i]: ex for i, ex in payload["placement"]}
        if payload["transitions"] is not None:
            graph.meta.transitions = payload["transitions"]
        if payload["donated"] is not None:
            graph.meta.donated = frozenset(payload["donated"])
        if payload["memory_plan"] is not None:
            plan = _plan_from_data(payload["memory_plan"], values)
            verify_plan(plan)
            graph.meta.memory_plan = plan
        records = [PassRecord(**r) for r in payload["records"]]
    except Exception:  # any bytes in the file: a miss, and the entry is rewritten
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return graph, records

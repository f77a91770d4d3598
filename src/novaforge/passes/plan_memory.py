"""Memory planning: liveness over the top-level order, one arena, best-fit offsets.

Every value produced by a top-level kernel that does not escape (graph outputs and mutation
write-backs escape: they are fresh tensors per call, never views of the arena that the next
call would overwrite) gets a buffer with a live interval [defining step, last reading step].
Buffers are placed largest first at the lowest 64-byte-aligned offset that does not overlap a
placed buffer with an intersecting interval. A pointwise kernel may write an output into the
buffer of an input that dies at that kernel (same size, read at the same index only): the two
then share an offset. `verify_plan` checks the invariant: no two buffers whose intervals
intersect overlap in the arena, except such in-place pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import OPS, Graph, Value
from ..ir.views import view_roots
from .context import PassContext, describe

ALIGN = 64


@dataclass
class MemoryPlan:
    arena_bytes: int
    offsets: dict[Value, int]
    sizes: dict[Value, int]
    intervals: dict[Value, tuple[int, int]]
    fresh: set[Value] = field(default_factory=set)
    inplace: dict[Value, Value] = field(default_factory=dict)  # output -> input whose buffer it reuses
    sum_bytes: int = 0  # all intermediates, as if each had its own allocation

    def summary(self) -> str:
        return (f"arena {self.arena_bytes / 2**20:.2f} MiB for {len(self.offsets)} buffers "
                f"(sum of intermediates {self.sum_bytes / 2**20:.2f} MiB, "
                f"{len(self.inplace)} in place, {len(self.fresh)} fresh outputs)")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _inplace_candidates(graph: Graph, last: dict[Value, int], buffers: set[Value],
                        ctx: PassContext | None = None) -> dict[Value, Value]:
    pairs: dict[Value, Value] = {}
    used_inputs: set[Value] = set()
    for i, n in enumerate(graph.nodes):
        if not OPS[n.op].has("fused") or n.attrs["kernel"].kind != "pointwise":
            continue
        body = n.attrs["kernel"].body
        for bo, o in zip(body.outputs, n.outputs, strict=True):
            if o not in buffers or o in pairs:
                continue
            for bi, v in zip(body.inputs, n.inputs, strict=True):
                if (v in buffers and v not in used_inputs and last.get(v) == i and v.type.nbytes == o.type.nbytes
                        and v.type.shape == o.type.shape and _read_elementwise_only(body, bi.value)
                        and body.producer(bo) is not None and OPS[body.producer(bo).op].has("elementwise")):
                    if ctx is not None and not ctx.take_fuel(
                            lambda n=n, o=o, v=v: f"plan_memory: {o!r} written in place of {v!r} by {describe(n)}"):
                        break
                    pairs[o] = v
                    used_inputs.add(v)
                    break
    return pairs


def _read_elementwise_only(body: Graph, v: Value) -> bool:
    users = body.users(v)
    return bool(users) and all(OPS[u.op].has("elementwise") and u.outputs[0].type.shape == v.type.shape
                               for u in users)


def plan_memory(graph: Graph, ctx: PassContext | None = None) -> Graph:
    ctx = ctx or PassContext()
    escaping = set(graph.outputs) | {new for _, new in graph.mutations}
    last: dict[Value, int] = {}
    defined: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v] = i
        for o in n.outputs:
            defined[o] = i
    # views alias their source: extend the source's life to the view's last use
    root = view_roots(graph.nodes)
    for v, src in root.items():
        if v in last:
            last[src] = max(last.get(src, 0), last[v])
    kernels = [n for n in graph.nodes if OPS[n.op].has("fused")]
    buffers = {o for n in kernels for o in n.outputs if o not in escaping}
    fresh = {o for n in kernels for o in n.outputs if o in escaping}
    intervals = {v: (defined[v], last.get(v, defined[v])) for v in buffers}
    sizes = {v: _align(max(v.type.nbytes, 1)) for v in buffers}
    inplace = _inplace_candidates(graph, last, buffers, ctx) if ctx.options.inplace else {}
    # an in-place output shares its input's slot: plan the pair as one buffer
    merged_into = dict(inplace)

    def slot_of(x: Value) -> Value:
        while x in merged_into:
            x = merged_into[x]
        return x

    slots = [v for v in buffers if v not in merged_into]
    slot_interval = dict(intervals)
    for o in merged_into:
        root = slot_of(o)
        a, b = slot_interval[root]
        slot_interval[root] = (a, max(b, intervals[o][1]))
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, start, end)
    offsets: dict[Value, int] = {}
    for v in sorted(slots, key=lambda x: (-sizes[x], slot_interval[x][0])):
        start, end = slot_interval[v]
        size = sizes[v]
        busy = sorted((off, sz) for off, sz, s, e in placed if s <= end and start <= e)
        offset = 0
        best = None
        for off, sz in busy:
            if off - offset >= size and (best is None or off - offset < best[1]):
                best = (offset, off - offset)
            offset = max(offset, off + sz)
        chosen = best[0] if best is not None else offset
        top = max((off + sz for off, sz, _, _ in placed), default=0)
        if chosen < top and any(off < chosen + size and chosen < off + sz for off, sz, _, _ in placed) \
                and not ctx.take_fuel(lambda v=v, chosen=chosen: f"plan_memory: {v!r} reuses arena bytes "
                                      f"[{chosen}, {chosen + size}) of buffers dead by step {start}"):
            chosen = top  # without fuel: a region of its own
        offsets[v] = chosen
        placed.append((chosen, size, start, end))
    for o in merged_into:
        offsets[o] = offsets[slot_of(o)]
    arena = max((off + sz for off, sz, _, _ in placed), default=0)
    plan = MemoryPlan(arena, offsets, sizes, intervals, fresh, inplace, sum(sizes.values()))
    verify_plan(plan)
    ctx.count("arena_bytes", arena)
    ctx.count("sum_intermediate_bytes", plan.sum_bytes)
    ctx.count("inplace", len(inplace))
    meta = graph.meta.copy()
    meta.memory_plan = plan
    return Graph(graph.inputs, graph.nodes, graph.outputs, graph.mutations, meta)


class PlanError(AssertionError):
    pass


def verify_plan(plan: MemoryPlan) -> None:
    """No two buffers that are live at the same step overlap in the arena (in-place pairs,
    which hand over at one step, share a slot by design)."""
    items = sorted(plan.offsets.items(), key=lambda kv: kv[1])
    pair = {frozenset((o, v)) for o, v in plan.inplace.items()}
    for i, (a, oa) in enumerate(items):
        sa = plan.sizes[a]
        if oa % ALIGN or oa + sa > plan.arena_bytes:
            raise PlanError(f"buffer {a!r} at {oa}+{sa} is misaligned or outside the arena")
        ia = plan.intervals[a]
        for b, ob in items[i + 1:]:
            if ob >= oa + sa:
                break
            ib = plan.intervals[b]
            if ia[0] <= ib[1] and ib[0] <= ia[1] and frozenset((a, b)) not in pair:
                raise PlanError(f"live buffers {a!r} [{oa}, {oa + sa}) steps {ia} and {b!r} at {ob} steps {ib} overlap")

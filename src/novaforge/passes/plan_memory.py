"""Memory planning: liveness over the top-level order, one arena, best-fit offsets.

Every value produced by a top-level kernel that does not escape (graph outputs and mutation
write-backs escape: they are fresh tensors per call, never views of the arena that the next
call would overwrite) gets a buffer with a live interval [defining step, last reading step].
Buffers are placed largest first at the lowest 64-byte-aligned offset that does not overlap a
placed buffer with an intersecting interval. A pointwise kernel may write an output into the
buffer of an input that dies at that kernel (same size, read at the same index only): the two
then share an offset. So may a reduction kernel (log_softmax, a softmax backward) over an input
it reads only along its own rows (elementwise, or into the row's reductions): every backend
computes a row's reductions from loads first and then, in its last pass, stores each output
element after loading the inputs at that element, and a row is never split between threads or
programs, so no element is read after it was overwritten. `verify_plan` checks the invariant:
no two buffers whose intervals intersect overlap in the arena, except such in-place pairs.
The same rule lets a buffer live outside the arena, on backends that bind inputs and allocate
fresh outputs before the program runs (`intermediates_in_io`): in a fresh output's memory, when
the kernel computing that output of its size reads it last (a training forward's logits,
rewritten in place by the log_softmax that the backward keeps: `MemoryPlan.into_output`), or in
a donated input's memory (graph.meta.donated: a backward's saved activation that nothing else
holds), when the kernel computing it reads that input last (the gradient of the logits, computed
over the saved log_softmax: `MemoryPlan.into_input`). Neither then takes arena bytes.

With symbolic sizes (one program for a range of sizes) the liveness and the in-place pairs
are computed once (they do not depend on sizes) and the offsets are placed for each call's
sizes by `MemoryPlan.at` (milliseconds, once per size) and verified there; the plan the pass
records shows the placement at the symbols' planning hints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..ir import OPS, Graph, Value
from ..ir.symbolic import is_symbolic, substitute
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
    into_output: dict[Value, Value] = field(default_factory=dict)  # buffer -> fresh output whose memory it uses
    into_input: dict[Value, Value] = field(default_factory=dict)  # buffer -> donated input whose memory it uses
    sum_bytes: int = 0  # all intermediates, as if each had its own allocation
    symbolic: bool = False  # sizes are expressions of size symbols: offsets are placed per call (`at`)

    def at(self, values: Mapping) -> MemoryPlan:
        """The plan for concrete symbol values: the same buffers, intervals and in-place pairs,
        offsets placed for these sizes (and verified)."""
        plan = MemoryPlan(0, {}, {v: substitute(n, values) for v, n in self.sizes.items()}, self.intervals,
                          self.fresh, self.inplace, self.into_output, self.into_input)
        _place(plan, PassContext())
        verify_plan(plan)
        return plan

    def summary(self) -> str:
        return (f"arena {self.arena_bytes / 2**20:.2f} MiB for {len(self.offsets)} buffers "
                f"(sum of intermediates {self.sum_bytes / 2**20:.2f} MiB, "
                f"{len(self.inplace)} in place, {len(self.fresh)} fresh outputs"
                + (f", {len(self.into_output)} computed in an output's memory" if self.into_output else "")
                + (f", {len(self.into_input)} in a donated input's" if self.into_input else "") + ")")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _inplace_candidates(graph: Graph, last: dict[Value, int], buffers: set[Value],
                        ctx: PassContext | None = None, outputs: set[Value] | None = None) -> dict[Value, Value]:
    """Output -> input pairs of kernels that may write the output over the input: `buffers`
    (arena buffers, or donated graph inputs) as the inputs, and `outputs` (default: the same
    buffers; fresh outputs, or arena buffers for donated inputs) as the outputs."""
    pairs: dict[Value, Value] = {}
    used_inputs: set[Value] = set()
    targets = buffers if outputs is None else outputs
    for i, n in enumerate(graph.nodes):
        if not OPS[n.op].has("fused") or n.attrs["kernel"].kind not in ("pointwise", "reduction"):
            continue
        body = n.attrs["kernel"].body
        reduction = n.attrs["kernel"].kind == "reduction"
        for bo, o in zip(body.outputs, n.outputs, strict=True):
            if o not in targets or o in pairs:
                continue
            for bi, v in zip(body.inputs, n.inputs, strict=True):
                if (v in buffers and v not in used_inputs and last.get(v) == i and v.type.nbytes == o.type.nbytes
                        and v.type.shape == o.type.shape and _read_elementwise_only(body, bi.value, reduction)
                        and body.producer(bo) is not None and OPS[body.producer(bo).op].has("elementwise")):
                    if ctx is not None and not ctx.take_fuel(
                            lambda n=n, o=o, v=v: f"plan_memory: {o!r} written in place of {v!r} by {describe(n)}"):
                        break
                    pairs[o] = v
                    used_inputs.add(v)
                    break
    return pairs


def _read_elementwise_only(body: Graph, v: Value, reduction: bool = False) -> bool:
    """Every read of `v` is at the element being computed; in a reduction kernel reads that feed
    the row's reductions are allowed too (they all happen before the final pass stores)."""
    users = body.users(v)
    return bool(users) and all((OPS[u.op].has("elementwise") and u.outputs[0].type.shape == v.type.shape)
                               or (reduction and OPS[u.op].has("reduction")) for u in users)


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
    into_output: dict[Value, Value] = {}
    into_input: dict[Value, Value] = {}
    if ctx.options.inplace and getattr(ctx.backend, "intermediates_in_io", False):
        returned = set(graph.outputs) - {new for _, new in graph.mutations} - set(root)  # (not views)
        pairs = _inplace_candidates(graph, last, buffers - set(root.values()), ctx, outputs=fresh & returned)
        into_output = {v: o for o, v in pairs.items()}
        buffers -= set(into_output)
        donated = _donated_inputs(graph, root, escaping)
        if donated:
            into_input = _inplace_candidates(graph, last, donated, ctx, outputs=buffers)
            buffers -= set(into_input)
    intervals = {v: (defined[v], last.get(v, defined[v])) for v in buffers}
    sizes = {v: _align(max(v.type.nbytes, 1)) for v in buffers}
    inplace = _inplace_candidates(graph, last, buffers, ctx) if ctx.options.inplace else {}
    plan = MemoryPlan(0, {}, sizes, intervals, fresh, inplace, into_output, into_input)
    if is_symbolic(list(sizes.values())):
        # sizes known per call only: the liveness and in-place pairs hold for every size, the
        # offsets are placed for each call's sizes (`MemoryPlan.at`); the plan shown is at the hints
        plan.symbolic = True
        shown = plan.at(hinted_values())
        plan.arena_bytes, plan.offsets, plan.sum_bytes = shown.arena_bytes, shown.offsets, shown.sum_bytes
    else:
        _place(plan, ctx)
        verify_plan(plan)
    ctx.count("arena_bytes", plan.arena_bytes)
    ctx.count("sum_intermediate_bytes", plan.sum_bytes)
    ctx.count("inplace", len(inplace))
    ctx.count("into_output", len(into_output))
    ctx.count("into_input", len(into_input))
    meta = graph.meta.copy()
    meta.memory_plan = plan
    return Graph(graph.inputs, graph.nodes, graph.outputs, graph.mutations, meta)


def _donated_inputs(graph: Graph, root: dict[Value, Value], escaping: set[Value]) -> set[Value]:
    """The graph's donated inputs (graph.meta.donated) that no output, write-back or mutation
    names, themselves or through a view, and that no view reads (a view would alias them)."""
    names = graph.meta.donated
    if not names:
        return set()
    viewed = set(root.values())
    held = {root.get(v, v) for v in escaping} | {old for old, _ in graph.mutations}
    return {gi.value for gi in graph.inputs
            if gi.name in names and gi.kind == "user" and gi.value not in held and gi.value not in viewed}


def hinted_values() -> dict:
    """The symbols' planning hints of the open context (ir/symbolic.py)."""
    from ..ir import symbolic

    return dict(getattr(symbolic._HINTS, "value", None) or {})


def _place(plan: MemoryPlan, ctx: PassContext) -> None:
    """Best-fit offsets for concrete sizes: largest buffer first, at the lowest 64-byte aligned
    offset that overlaps no placed buffer live at the same time; an in-place output shares
    its input's slot."""
    sizes, intervals = plan.sizes, plan.intervals
    merged_into = dict(plan.inplace)

    def slot_of(x: Value) -> Value:
        while x in merged_into:
            x = merged_into[x]
        return x

    slots = [v for v in sizes if v not in merged_into]
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
    plan.offsets = offsets
    plan.arena_bytes = max((off + sz for off, sz, _, _ in placed), default=0)
    plan.sum_bytes = sum(sizes.values())


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

"""Planning one kernel for the CPU backend: what runs where, with which schedule.

`plan_kernel(kernel, target)` returns a `KernelPlan`:

* ``gen``       a generated C++ function (pointwise, also reading cats piecewise; reduction,
                embedding gather, cat);
* ``gemm``      a generated function calling the nf_gemm library with the epilogue fused
                (see matmul.py): arguments [C buffer] + inputs + outputs [+ packed B];
* ``matmul``    a library matmul (torch.matmul into the output or a scratch buffer, through
                strided views of the inputs) followed by the generated epilogue, if any;
* ``attention`` the library's fused attention (scaled_dot_product_attention) or the generated
                flash kernel, then the epilogue (attention's backward is a ``gen`` kernel:
                attention_backward.py);
* ``torch``     the body through the interpreter's torch ops (anything not generated yet),
                with `reason` saying why.

Invariant: a plan is a pure function of (kernel structure, target); its generated function's
name derives from the kernel's structural key and schedule, so structurally identical kernels
(the identical layers of a model) share one function. Rendering is deferred (`GenKernel.render`)
so that a warm cache hit never renders source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ...ir import OPS, Graph, GraphInput, Kernel, Node, make_node
from ...ir.extern import decode
from ...ir.ops import node_flops
from ...ir.symbolic import SymbolicDecision, hint
from ...ir.types import TensorType
from ...ir.views import Strided, heads_last, permuted_copy
from ...schedule.cpu import KernelShape, configure
from ...schedule.target import CpuTarget
from .analysis import Operand, Unsupported, analyze_body, body_space, operand
from .attention import plan_flash_attention
from .attention_backward import plan_flash_attention_backward
from .cexpr import NOT_RENDERED, check_dtype
from .columns import lane_dim, render_reduction_columns
from .loops import (
    GenKernel,
    body_dtypes,
    function_name,
    pointwise_loops,
    reduction_loops,
    render_pointwise,
    render_reduction,
)
from .matmul import GemmPlan, plan_gemm
from .pieces import has_pieces, plan_pieces
from .singles import plan_arg_reduction, plan_cat, plan_gather, plan_index_copy_inplace, plan_scatter_add, plan_take


class PlanKind(StrEnum):
    GEN = "gen"  # a generated function
    GEMM = "gemm"  # a generated function calling nf_gemm with the epilogue fused
    MATMUL = "matmul"  # a library matmul, then the generated epilogue
    ATTENTION = "attention"  # generated flash attention or the library's, then the epilogue
    TORCH = "torch"  # the body through torch (`reason` says why)


@dataclass
class KernelPlan:
    kind: PlanKind
    gen: GenKernel | None = None  # the kernel (gen) or its epilogue (matmul, attention)
    operands: list[Operand] = field(default_factory=list)
    anchor_type: TensorType | None = None
    anchor_attrs: dict = field(default_factory=dict)
    direct: int | None = None  # the body output the library writes directly (no epilogue)
    inplace: int | None = None  # the body output the library writes and the epilogue updates in place
    reason: str = ""
    gemm: GemmPlan | None = None
    anchor_gen: GenKernel | None = None  # a generated anchor (flash attention) writing the anchor buffer
    # (set by the backend from the configurator's calls: what refinement compares and varies)
    predicted_ns: float = 0.0  # the model's time of the generated functions
    variants: int = 1  # schedule candidates of its most varied configure call (1: nothing to vary)

    def __post_init__(self) -> None:
        self.kind = PlanKind(self.kind)

    @property
    def executor(self) -> str:
        return "torch" if self.kind == "torch" else "cpu"


def kernel_flops(kernel: Kernel) -> float:
    return _cost(kernel.body)[0]


def _cost(body: Graph) -> tuple[float, float]:
    flops = 0.0
    for n in body.nodes:
        d = OPS[n.op]
        if d.has("view") or d.has("generator"):
            continue
        flops += node_flops(n.op, [v.type for v in n.inputs], [o.type for o in n.outputs], n.attrs)
    nbytes = sum(hint(gi.value.type.nbytes) for gi in body.inputs) + sum(hint(o.type.nbytes) for o in body.outputs)
    return flops, float(nbytes)




def plan_loops(key: str, body: Graph, kind: str, target: CpuTarget, space=None, axes=None, tag: str = "k",
               pieces: bool = False) -> GenKernel:
    """A generated pointwise or reduction function for `body` (raises Unsupported); `pieces`:
    the body may read cats (pointwise kernels, see pieces.py)."""
    for gi in body.inputs:
        check_dtype(gi.value.type.dtype, load_only=True)  # (its uses are checked: only a cast reads it)
    for o in body.outputs:
        check_dtype(o.type.dtype)
    if space is None:
        space, axes = body_space(body, kind)
    info = analyze_body(body, space, axes or (), pieces=pieces and kind == "pointwise")
    ins, outs = body_dtypes(body)
    flops, nbytes = _cost(body)
    if has_pieces(info):
        return plan_pieces(key, info, ins, outs, flops, nbytes, target, tag)
    if info.axes:
        for n in info.computed:
            if OPS[n.op].has("reduction") and n.op in ("max", "min") and info.numel == 0 and any(
                    info.space[a] == 0 for a in info.axes):
                raise Unsupported("max/min over an empty axis (torch raises)")
        rows, inner, red, inner_reduced = reduction_loops(info)
        lane = lane_dim(info)
        if lane is not None and hint(info.space[lane]) < target.vector_floats:
            inner_reduced = True  # too few neighbouring rows to fill a vector: row order
        n_red = sum(1 for n in info.computed if OPS[n.op].has("reduction"))
        expensive = any(OPS[n.op].transcendental for n in info.computed) and n_red > 1
        shape = KernelShape("reduction", outer=rows, inner=inner, reduce=red, inner_reduced=inner_reduced,
                            flops=flops, bytes=nbytes, passes=n_red + 1, expensive_cross_pass=expensive)
        sched = configure(shape, target)
        name = function_name(key, sched, tag)
        render = render_reduction_columns if sched.order == "column" else render_reduction
        return GenKernel(name, len(ins) + len(outs), lambda: render(name, ins, outs, info, sched), sched,
                         f"{key}|{sched.key()}", info)
    outer, inner = pointwise_loops(info)
    sched = configure(KernelShape("pointwise", outer=outer, inner=inner, flops=flops, bytes=nbytes), target)
    name = function_name(key, sched, tag)
    return GenKernel(name, len(ins) + len(outs), lambda: render_pointwise(name, ins, outs, info, sched), sched,
                     f"{key}|{sched.key()}", info)


def epilogue_body(body: Graph, anchor: Node) -> Graph:
    """The kernel body with the anchor replaced by a new first input (its result buffer)."""
    producer = {o: n for n in body.nodes for o in n.outputs}
    a_out = anchor.outputs[0]
    needed: set[Node] = set()
    stack = list(body.outputs)
    while stack:
        v = stack.pop()
        n = producer.get(v)
        if n is None or n is anchor or n in needed:
            continue
        needed.add(n)
        stack.extend(n.inputs)
    nodes = [n for n in body.nodes if n in needed]
    inputs = [GraphInput(a_out, "user", "anchor")] + list(body.inputs)
    return Graph(inputs, nodes, body.outputs)


def _plan_anchor(kernel: Kernel, target: CpuTarget, const_bufs: frozenset[int],
                 written_outs: frozenset[int] = frozenset()) -> KernelPlan:
    body = kernel.body
    anchor = kernel.anchor_node
    assert anchor is not None
    a_type = anchor.outputs[0].type
    if a_type.device != "cpu":
        raise Unsupported("anchor not on the CPU")
    if anchor.op == "matmul":
        try:
            gp = plan_gemm(kernel, epilogue_body(body, anchor), target, const_bufs, written_outs)
        except Unsupported:
            gp = None
        if gp is not None:
            return KernelPlan("gemm", gen=gp.gen, anchor_type=gp.scratch, gemm=gp)
    operands = [operand(body, v) for v in anchor.inputs]
    attrs = {k: anchor.attrs[k] for k in anchor.attrs}
    kind = "matmul" if anchor.op == "matmul" else "attention"
    if kind == "attention":
        q, k = anchor.inputs[0].type, anchor.inputs[1].type
        attrs["gqa"] = q.shape[-3] != k.shape[-3]
    epi = epilogue_body(body, anchor)
    computed = [n for n in epi.nodes if not (OPS[n.op].has("view") or OPS[n.op].has("generator"))]
    plan = KernelPlan(kind, operands=operands, anchor_type=a_type, anchor_attrs=attrs)
    if kind == "attention":
        heads_last = _stores_heads_last(body, anchor)
        try:
            plan.anchor_gen = plan_flash_attention(kernel, target, heads_last)
        except Unsupported:
            plan.anchor_gen = None
        if heads_last:
            if plan.anchor_gen is None:
                raise Unsupported("a transposed attention store needs the generated flash kernel")
            plan.direct = 0
            return plan
    if not computed and len(body.outputs) == 1:
        out = body.outputs[0]
        v = out
        producer = {o: n for n in epi.nodes for o in n.outputs}
        while v in producer and producer[v].op == "reshape":
            v = producer[v].inputs[0]
        if v is anchor.outputs[0] and out.type.dtype == a_type.dtype:
            plan.direct = 0
            return plan
    plan.gen = plan_loops(kernel.structural_key + "|epilogue", epi, "pointwise", target, space=a_type.shape,
                          axes=(), tag="e")
    # the library may write into an output that the epilogue then updates in place, when the
    # epilogue reads the anchor result only at the element it writes
    info = plan.gen.info
    assert info is not None
    identity = tuple(0 if n == 1 else s for n, s in zip(a_type.shape, Strided.contiguous(a_type.shape).strides,
                                                        strict=True))
    reads_same = all(lf.strides == identity and lf.offset == 0 for lf in info.leaves.values()
                     if lf.kind == "load" and lf.buf == 0)
    if reads_same:
        for st in info.stores:
            o = body.outputs[st.buf]
            if (o.type.dtype == a_type.dtype and o.type.numel == a_type.numel and st.strides == identity
                    and st.buf not in written_outs):
                plan.inplace = st.buf
                break
    return plan


def _plan_full_reduction(kernel: Kernel, target: CpuTarget) -> GenKernel:
    """A reduction without keepdim (a `single` kernel): reduce with keepdim, then a store view."""
    body = kernel.body
    red = [n for n in body.nodes if not OPS[n.op].has("view") and not OPS[n.op].has("generator")]
    if len(red) != 1 or body.outputs[0] is not red[0].outputs[0] or len(body.outputs) != 1:
        raise Unsupported("reduction kernel with extra nodes")
    n = red[0]
    x = n.inputs[0]
    if x.type.rank == 0:
        raise Unsupported("reduction of a 0-d tensor")
    keep = make_node(n.op, [x], {"axes": n.attrs["axes"], "keepdim": True})
    out = make_node("reshape", [keep.outputs[0]], {"shape": n.outputs[0].type.shape})
    nodes = [m for m in body.nodes if m is not n] + [keep, out]
    new_body = Graph(body.inputs, nodes, [out.outputs[0]])
    return plan_loops(kernel.structural_key + "|keepdim", new_body, "reduction", target)


def plan_kernel(kernel: Kernel, target: CpuTarget, const_bufs: frozenset[int] = frozenset(),
                written_outs: frozenset[int] = frozenset(), inplace: str | None = None) -> KernelPlan:
    """`const_bufs`: body inputs that are constants of the graph (frozen weights: B is packed).
    `written_outs`: body outputs stored into a mutated input's own buffer, which the epilogue
    reads before it writes: the library must not put its raw result there first. `inplace`: the
    in-place ATen op of an extern kernel whose output is a mutated input's own buffer (the
    backend's `_inplace_updates`); `index_copy_` is generated, the others run through torch."""
    try:
        if inplace == "aten.index_copy_.default":
            return KernelPlan("gen", gen=plan_index_copy_inplace(kernel, target, _extern_operands(kernel)))
        if any(gi.value.type.device != "cpu" for gi in kernel.body.inputs):
            raise Unsupported("inputs not on the CPU")
        if kernel.kind in ("pointwise", "reduction"):
            return KernelPlan("gen", gen=plan_loops(kernel.structural_key, kernel.body, kernel.kind, target,
                                                    pieces=True))
        if kernel.kind in ("matmul", "attention"):
            return _plan_anchor(kernel, target, const_bufs, written_outs)
        if kernel.kind == "single" and len(kernel.body.nodes) >= 1:
            op = next((n.op for n in kernel.body.nodes
                       if not OPS[n.op].has("view") and not OPS[n.op].has("generator")), None)
            if kernel.body.nodes[-1].op == "scatter_add":  # (its base may be a fill made in the kernel)
                op = "scatter_add"
            if op == "take":
                return KernelPlan("gen", gen=plan_take(kernel, target))
            if op == "cat":
                return KernelPlan("gen", gen=plan_cat(kernel, target))
            if op == "gather":
                return KernelPlan("gen", gen=plan_gather(kernel, target))
            if op == "scatter_add":
                return KernelPlan("gen", gen=plan_scatter_add(kernel, target))
            if op in ("argmax", "argmin"):
                return KernelPlan("gen", gen=plan_arg_reduction(kernel, target))
            if op == "attention_backward":
                return KernelPlan("gen", gen=plan_flash_attention_backward(kernel, target))
            if op == "attention_lse":
                return KernelPlan("gen", gen=plan_flash_attention(kernel, target))
            if op is not None and OPS[op].reduce is not None:
                return KernelPlan("gen", gen=_plan_full_reduction(kernel, target))
            if op in NOT_RENDERED:
                raise Unsupported(f"{op} not rendered on the CPU: {NOT_RENDERED[op]}")
        raise Unsupported(f"{kernel.kind} kernel {kernel.name} is not generated")
    except Unsupported as e:
        return KernelPlan("torch", reason=str(e))
    except SymbolicDecision as e:  # a choice the sizes' ranges do not settle
        return KernelPlan("torch", reason=f"symbolic sizes: {e}")


class _Operand:
    """The extern's i-th tensor operand in its decoded argument list."""

    def __init__(self, index: int) -> None:
        self.index = index


def _extern_operands(kernel: Kernel) -> tuple:
    """The positional arguments of the kernel's one extern, each tensor as its position among
    the extern's inputs (Unsupported for keyword arguments or tensors inside lists)."""
    ext = [m for m in kernel.body.nodes if m.op in ("extern", "extern_effect")]
    if len(ext) != 1:
        raise Unsupported("not one extern")
    args, kwargs = decode(ext[0].attrs["spec"], [_Operand(i) for i in range(len(ext[0].inputs))])
    if kwargs or any(isinstance(a, list | tuple) for a in args):
        raise Unsupported("extern arguments other than positional tensors and scalars")
    return tuple(a.index if isinstance(a, _Operand) else a for a in args)


def _stores_heads_last(body, anchor) -> bool:
    """Is the kernel's one output copy(permute(attention)) with the head and query axes
    swapped (fusion's permuted store, see passes/fuse.py)?"""
    if len(body.outputs) != 1:
        return False
    pc = permuted_copy(body.producer, body.outputs[0])
    return pc is not None and pc[0] is anchor.outputs[0] and heads_last(pc[1])

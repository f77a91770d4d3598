"""Matmul kernels on the nf_gemm library (codegen/cpu/gemm): one generated C function per kernel.

The generated function calls, by B's layout (B(k, n) = B[k*rs_b + n*cs_b]):

* `nf_sgemm_packed` / `nf_gemm_bf16_packed` when B is a constant that the backend packs at build
  time (option `pack_weights=True`: a packed copy of every weight, the fastest GEMM, 2x the weights'
  memory); for bf16 A and bf16 B on a CPU with bf16 dot instructions (`CpuTarget.has_bf16_dot`:
  AVX512-BF16 or AMX-BF16) the copy is in VNNI panels (`pack_layout == "vnni"`) and the call is
  `nf_gemm_bf16_vnni_packed` (AMX tiles / VDPBF16PS, chosen by the library at run time);
* `nf_gemm_i8w` for a float32 A times an int8 B (weight-only quantization, passes/
  recognize_int8_weights.py): never packed at build time, the weight stays int8; the streaming
  decode path reads W [N, K] int8 in place, larger products convert it while packing a block;
* `nf_gemm_s8s8(_packed)` for an int8 A times an int8 B summed exactly in int32 (`out_dtype=int32`:
  aten._int_mm, dynamic int8 quantization): a constant B is always packed at build time into int8
  k-pair panels (its bytes once more, whatever `pack_weights` says); the library writes float(acc)
  when the epilogue's only use of the int32 result is a cast to float32 (that cast is the library's
  conversion, the rest is the usual epilogue), or the int32 result itself when it is stored as is;
  any other use of the int32 result runs the exact library step instead (runtime/cpu_program.py);
* otherwise nothing is copied: `nf_gemm_nt_mixed` (dot-product kernel) when B is k-contiguous
  (rs_b = 1: an nn.Linear weight [N, K] seen as W^T), `nf_sgemm` / `nf_gemm_mixed` for other
  layouts (row-major B, e.g. a Conv1D weight [K, N], is read in place by the micro-kernel; strided B
  is packed on the fly per block), `nf_sgemm_batched` for batched operands whose batch dims
  coalesce (float32 only);

with the kernel's epilogue fused:

* a leading bias add over the columns, then a GELU / SiLU / ReLU, go into the library's
  register epilogue (`nf_epilogue.bias`, `.act`);
* whatever else the epilogue computes (residual adds, a GELU written out as tanh arithmetic,
  casts, extra outputs) is rendered as a tile function (`loops.render_tile_epilogue`) that the
  library calls on every finished C tile while it is still in L1. Its companion
  (`loops.render_tile_prefetch`, `nf_epilogue.tile_prefetch`) is called one tile ahead and
  prefetches into L2 the rows the epilogue will read or write there (an optimizer update fused
  into a weight gradient reads the parameter and both moments from memory: in GPT-42M's step the
  LM head's weight-gradient GEMM went from 84% to 87% of the FMA roofline).

C (the float32 result) is written into the kernel's output when the epilogue reads it only at
the element it writes (in place); when no output can hold it, the library keeps each block of C
in a per-thread buffer that only the tile function reads (C == NULL), or, on the dot-product
entry, C goes to the program's scratch region. Returns None when
the geometry or dtypes do not fit the library (the kernel then uses torch.matmul).

bf16 x bf16 products without a packed copy (`nf_gemm_nt_mixed`, `nf_gemm_mixed`) take the library's
native bf16 path by themselves where the CPU has one (docs/cpu-gemm.md, "Native bf16").

Invariant: the function computes what the kernel body computes; operands are read through
their strides (transposed weights are never copied), and packed B matches the target's build of
nf_gemm (the library key includes it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ...ir import OPS, Graph, Kernel, Node, Value
from ...ir.graph import Attrs
from ...ir.symbolic import hint, is_symbolic
from ...ir.types import TensorType, contiguous_strides
from ...ir.views import Strided, apply_view
from ...schedule.cpu import CpuSchedule
from ...schedule.target import CpuTarget
from .analysis import BodyInfo, Operand, Unsupported, analyze_body, operand
from .cexpr import check_dtype
from .gemm.build import ACTS
from .loops import (
    Code,
    GenKernel,
    body_dtypes,
    coalesce,
    function_name,
    render_tile_epilogue,
    render_tile_prefetch,
    signature,
    tile_maps,
)

# the IR activation (op, gelu's `approximate`) -> nf_gemm's epilogue code (its ABI, gemm/build.py ACTS)
ACT_CODES = {("gelu", "none"): ACTS["gelu_erf"], ("gelu", "tanh"): ACTS["gelu_tanh"], ("silu", None): ACTS["silu"],
             ("relu", None): ACTS["relu"]}
GEMM_MIN_FLOPS_PER_THREAD = 2.0e5  # below this a GEMM runs on one thread


@dataclass
class GemmPlan:
    gen: GenKernel
    dst: str  # "direct" (output 0) | "inplace" (output `inplace`) | "scratch" | "local" (C never stored)
    inplace: int | None
    scratch: TensorType  # float32 C when dst == "scratch"
    pack: Operand | None  # B operand packed at build time (a constant)
    pack_layout: str = "f32"  # "f32": nf_sgemm_pack_b(_bf16) panels; "vnni": nf_gemm_pack_b_vnni (bf16 x bf16);
    # "s8": nf_gemm_pack_b_s8 (int8 x int8)
    entry: str = ""  # the nf_gemm entry the function calls (the report names it)


@dataclass
class _Geometry:
    batch: int
    M: int
    N: int
    K: int
    a: tuple[int, int, int]  # (bs, rs, cs) element strides
    b: tuple[int, int, int]
    bs_c: int
    batched: bool


def _broadcast_batch(op: Operand, out_batch: tuple[int, ...]) -> list[int]:
    """Strides of the operand's batch dims expanded to `out_batch` (0 where they broadcast)."""
    lay = op.layout
    batch = Strided(tuple(lay.shape[:-2]), tuple(lay.strides[:-2]), lay.offset)
    return list(apply_view(batch, "expand", {"shape": tuple(out_batch)}).strides)


def _geometry(a: Operand, b: Operand, out: TensorType) -> _Geometry | None:
    M, K = a.layout.shape[-2:]
    N = out.shape[-1]
    out_batch = out.shape[:-2]
    a_st, b_st = a.layout.strides, b.layout.strides
    b_batched = any(s != 1 for s in b.layout.shape[:-2])
    if not b_batched:
        # shared B: the rows of every batch entry of A stack into one M
        a_full = a.layout
        if len(a_full.shape) - 2 != len(out_batch) or tuple(a_full.shape[:-2]) != tuple(out_batch):
            return None
        dims = coalesce(list(range(len(a_full.shape) - 1)), a_full.shape, [a_full.strides])
        if len(dims) > 1:
            return None
        rs = dims[0][1][0] if dims else 0
        rows = math.prod(a_full.shape[:-1])
        return _Geometry(1, rows, N, K, (0, rs, a_st[-1]), (0, b_st[-2], b_st[-1]), 0, False)
    sa, sb = _broadcast_batch(a, out_batch), _broadcast_batch(b, out_batch)
    sc = list(contiguous_strides(tuple(out.shape)))[:-2]
    space = tuple(out_batch)
    dims = coalesce(list(range(len(space))), space, [tuple(sa), tuple(sb), tuple(sc)])
    if len(dims) > 1:
        return None
    batch = dims[0][0] if dims else 1
    bsa, bsb, bsc = dims[0][1] if dims else (0, 0, 0)
    return _Geometry(batch, M, N, K, (bsa, a_st[-2], a_st[-1]), (bsb, b_st[-2], b_st[-1]), bsc, True)


def _substitute(body: Graph, node: Node, repl: Value) -> Graph:
    """`body` without `node`, its output replaced by `repl`."""
    old = node.outputs[0]
    nodes = []
    for n in body.nodes:
        if n is node:
            continue
        if old in n.inputs:
            n = n.with_inputs([repl if v is old else v for v in n.inputs])
        nodes.append(n)
    return Graph(body.inputs, nodes, [repl if v is old else v for v in body.outputs])


def _sole_consumer(body: Graph, v: Value) -> Node | None:
    users = body.users(v)
    if len(users) != 1 or v in body.outputs:
        return None
    return users[0]


def _peel(epi: Graph, space: tuple[int, ...], bias_dtypes: tuple[torch.dtype, ...] = (torch.float32,)
          ) -> tuple[Graph, int | None, int, int]:
    """Move a leading column-bias add (a bias of one of `bias_dtypes`: bf16 too on the bf16 entries,
    `nf_epilogue.bias_bf16`) and activation into the library's register epilogue.
    Returns (remaining epilogue, bias body-input index (epilogue input - 1), bias offset, act code)."""
    anchor = epi.inputs[0].value
    bias_buf, bias_off, act = None, 0, 0
    n = _sole_consumer(epi, anchor)
    if n is not None and n.op == "add" and n.outputs[0].type == anchor.type:
        other = n.inputs[1] if n.inputs[0] is anchor else n.inputs[0]
        whole = next((i for i, gi in enumerate(epi.inputs) if gi.value is other), None)
        if (other is not anchor and other.type.dtype in bias_dtypes and whole is not None and whole > 0
                and len(space) >= 1 and all(d == 1 for d in other.type.shape[:-1])
                and tuple(other.type.shape[-1:]) == (space[-1],)):
            # a whole [N] (or [1, .., N]) input added by broadcasting (a bf16 graph's addmm bias)
            bias_buf, bias_off = whole - 1, 0
            epi = _substitute(epi, n, anchor)
        elif other is not anchor and other.type.dtype in bias_dtypes:
            try:
                info = analyze_body(Graph(epi.inputs, epi.nodes, [other]), space)
            except Unsupported:
                info = None
            lf = info.leaves.get(other) if info is not None else None
            want = tuple([0] * (len(space) - 1) + [1 if space[-1] != 1 else 0])
            if (lf is not None and lf.kind == "load" and lf.buf > 0 and lf.strides == want
                    and epi.inputs[lf.buf].value.type.dtype == other.type.dtype):
                bias_buf, bias_off = lf.buf - 1, lf.offset
                epi = _substitute(epi, n, anchor)
    n = _sole_consumer(epi, anchor)
    if n is not None and n.outputs[0].type == anchor.type:
        code = ACT_CODES.get((n.op, n.attrs.get("approximate") if n.op == "gelu" else None))
        if code is not None:
            act = code
            epi = _substitute(epi, n, anchor)
    return epi, bias_buf, bias_off, act


def _float_anchor(epi: Graph) -> Graph | None:
    """An int8 x int8 product's epilogue whose only use of the int32 result is a cast to float32, with
    that cast's output as the epilogue's input (the library writes float(acc), the same conversion);
    None otherwise."""
    n = _sole_consumer(epi, epi.inputs[0].value)
    if n is None or n.op != "cast" or n.outputs[0].type.dtype != torch.float32:
        return None
    inputs = [replace(epi.inputs[0], value=n.outputs[0])] + list(epi.inputs[1:])
    return Graph(inputs, [m for m in epi.nodes if m is not n], epi.outputs)


def _materialize(epi: Graph) -> Graph:
    """`epi` with the anchor passed through a same-dtype cast before its consumers: after peeling,
    a bf16 graph's epilogue can be just `out = reshape(anchor)` (a float32 C rounded on store), and a
    view of the anchor itself is no tile-epilogue leaf; the cast is the store's computation."""
    anchor = epi.inputs[0].value
    mid = Value(anchor.type, "c")
    cast = Node("cast", [anchor], Attrs(dtype=anchor.type.dtype), [mid])
    nodes = [cast] + [n.with_inputs([mid if v is anchor else v for v in n.inputs]) if anchor in n.inputs else n
                      for n in epi.nodes]
    return Graph(epi.inputs, nodes, [mid if v is anchor else v for v in epi.outputs])


def _is_anchor_store(epi: Graph) -> bool:
    """Is the epilogue just 'output = the matmul result' (possibly reshaped)?"""
    if len(epi.outputs) != 1:
        return False
    producer = {o: n for n in epi.nodes for o in n.outputs}
    v = epi.outputs[0]
    while v in producer and producer[v].op == "reshape":
        v = producer[v].inputs[0]
    return v is epi.inputs[0].value and not any(
        not OPS[n.op].has("view") and not OPS[n.op].has("generator") for n in epi.nodes)


def plan_gemm(kernel: Kernel, epi: Graph, target: CpuTarget, const_bufs: frozenset[int],
              written_outs: frozenset[int] = frozenset()) -> GemmPlan | None:
    body = kernel.body
    anchor = kernel.anchor_node
    assert anchor is not None and anchor.op == "matmul"
    a_t = anchor.outputs[0].type
    try:
        a, b = operand(body, anchor.inputs[0]), operand(body, anchor.inputs[1])
    except Unsupported:
        return None
    geo = _geometry(a, b, a_t)
    s8 = anchor.attrs.get("out_dtype") == torch.int32  # int8 x int8, exact int32 sums (nf_gemm_s8s8)
    c_int32 = False
    if s8:
        if geo is None or geo.batched:
            return None
        float_epi = _float_anchor(epi)
        if float_epi is not None:  # (the library writes float(acc): the epilogue's leading cast)
            epi = float_epi
        elif _is_anchor_store(epi):
            c_int32 = True  # the int32 result itself, stored directly
        else:
            return None
    elif geo is None or geo.K == 0 or a.dtype not in (torch.float32, torch.bfloat16):
        return None
    i8 = b.dtype == torch.int8 and a.dtype == torch.float32  # weight-only int8 (nf_gemm_i8w)
    if b.dtype not in (torch.float32, torch.bfloat16) and not i8 and not s8:
        return None
    if i8 and geo.batched:
        return None
    # (an int8 weight stays int8: weight-only, as is; int8 x int8, in int8 panels, the backend packs those always)
    packed = b.buf in const_bufs and not geo.batched and not i8
    mixed = torch.bfloat16 in (a.dtype, b.dtype)
    vnni = packed and a.dtype == b.dtype == torch.bfloat16 and target.has_bf16_dot
    if geo.batched and mixed:
        return None
    # B = W^T with W [N, K] contiguous along K: the dot-product kernel reads it in place
    nt = not packed and not geo.batched and geo.b[1] == 1 and geo.b[2] != 1 and not s8
    for o in body.outputs:
        check_dtype(o.type.dtype)
    # the bf16 entries (nf_gemm_mixed, nf_gemm_nt_mixed, nf_gemm_bf16_packed, nf_gemm_bf16_vnni_packed)
    # take a bf16 bias too
    bf16_entry = vnni or (a.dtype == torch.bfloat16 if packed else mixed)
    epi, bias_buf, bias_off, act = _peel(epi, a_t.shape,
                                         (torch.float32, torch.bfloat16) if bf16_entry else (torch.float32,))
    bias16 = bias_buf is not None and body.inputs[bias_buf].value.type.dtype == torch.bfloat16
    space = a_t.shape
    rank = len(space)
    if geo.batched:
        batch_dims, row_dims = list(range(rank - 2)), [rank - 2]
    else:
        batch_dims, row_dims = [], list(range(rank - 1))
    col_dim = rank - 1
    ins, outs = body_dtypes(epi)
    ins[0] = torch.float32  # C is float32 whatever the anchor's dtype
    tile: tuple[str, BodyInfo] | None = None
    direct = _is_anchor_store(epi) and epi.outputs[0].type.dtype == (torch.int32 if c_int32 else torch.float32)
    if not direct and (bias_buf is not None or act) and _is_anchor_store(epi):
        epi = _materialize(epi)
    inplace = None
    if not direct:
        info = analyze_body(epi, space)
        identity = tuple(0 if n == 1 else s for n, s in zip(space, contiguous_strides(space), strict=True))
        for lf in info.leaves.values():
            if lf.kind == "load" and lf.buf == 0 and (lf.strides != identity or lf.offset != 0):
                raise Unsupported("epilogue reads the matmul result at another element")
        leaves = [lf for lf in info.leaves.values() if lf.kind != "const"]
        tile_maps(info, batch_dims, row_dims, col_dim, [(lf.strides, lf.offset) for lf in leaves]
                  + [(s.strides, s.offset) for s in info.stores])
        tile = ("", info)
        for st in info.stores:
            o = epi.outputs[st.buf]
            if (o.type.dtype == torch.float32 and o.type.numel == a_t.numel and st.strides == identity
                    and st.buf not in written_outs):
                inplace = st.buf
                break
    # no output can hold C: the library keeps each block of C in a per-thread buffer for the tile
    # epilogue (not on the dot-product entry, which has no such mode)
    local = not direct and inplace is None and tile is not None and not nt and not i8
    dst = "direct" if direct else ("inplace" if inplace is not None else ("local" if local else "scratch"))
    desc = (f"gemm|{geo}|packed={packed}|vnni={vnni}|nt={nt}|i8={i8}|s8={s8},{int(c_int32)}"
            f"|bias={bias_buf},{bias_off},{int(bias16)}|act={act}|direct={direct}|inplace={inplace}|local={local}|{a.layout}|{b.layout}")
    flops = 2.0 * hint(geo.batch) * hint(geo.M) * hint(geo.N) * hint(geo.K)
    threads = max(1, min(target.threads, int(flops // GEMM_MIN_FLOPS_PER_THREAD)))
    sched = CpuSchedule("matmul", threads=threads, vector=target.vector_floats)
    key = kernel.structural_key + "|" + desc
    name = function_name(key, sched, "m")
    n_in, n_out = len(body.inputs), len(body.outputs)
    n_args = 1 + n_in + n_out + (1 if packed else 0)
    a_ctype = {torch.float32: "float", torch.bfloat16: "uint16_t", torch.int8: "int8_t"}[a.dtype]
    a_ptr = f"((const {a_ctype}*)p{1 + a.buf} + {a.layout.offset})"
    tile_name = name + "_tile"

    def render() -> str:
        code = Code()
        text = ""
        pf = None
        if tile is not None:
            text = render_tile_epilogue(tile_name, ins, outs, tile[1], batch_dims, row_dims, col_dim, n_args)
            if not nt and not i8 and not s8:  # (the nf_sgemm-family entries call it)
                pf = render_tile_prefetch(tile_name + "_pf", ins, outs, tile[1], batch_dims, row_dims, col_dim, n_args,
                                          c_output=inplace)
                text += pf or ""
        code.open(f"static int {name}({signature(n_args)})")
        if geo.M == 0 or geo.N == 0 or geo.batch == 0:
            code("return 0;")
            code.close()
            return text + code.text()
        empty = [f"{d} <= 0" for d in (geo.M, geo.N, geo.batch) if is_symbolic(d)]  # known at run time only
        if empty:
            code(f"if ({' || '.join(empty)}) return 0;")
        # the tile epilogue's context: the kernel's arguments, then the sizes
        code(f"void* ctx[{n_args + 1}] = {{{', '.join(f'p{i}' for i in range(n_args))}, (void*)nf_sym}};")
        bias = f"(const float*)p{1 + bias_buf} + {bias_off}" if bias_buf is not None and not bias16 else "nullptr"
        bias_bf16 = f"(const uint16_t*)p{1 + bias_buf} + {bias_off}" if bias16 else ""
        tfn = tile_name if tile is not None else "nullptr"
        pfn = tile_name + "_pf" if pf else "nullptr"
        tail = f", {bias_bf16}" if bias16 else ""  # (nf_epilogue.bias_bf16; zero when left out)
        code(f"nf_epilogue ep = {{{bias}, {act}, nullptr, 0, 0, {tfn if tile else 'nullptr'}, ctx, {pfn}{tail}}};")
        c_ptr = "(float*)nullptr" if local else "(float*)p0"
        if s8:
            c_arg = "(void*)nullptr" if local else "(void*)p0"
            tail = f"{c_arg}, {geo.N}, {int(c_int32)}, 0, {'nullptr' if c_int32 else '&ep'}, {threads});"
            if packed:
                code(f"nf_gemm_s8s8_packed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, "
                     f"(const int8_t*)p{n_args - 1}, {tail}")
            else:
                code(f"nf_gemm_s8s8({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, "
                     f"((const int8_t*)p{1 + b.buf} + {b.layout.offset}), {geo.b[1]}, {geo.b[2]}, {tail}")
        elif vnni:
            code(f"nf_gemm_bf16_vnni_packed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, "
                 f"(const uint16_t*)p{n_args - 1}, {c_ptr}, {geo.N}, 0, &ep, {threads});")
        elif packed:
            bp = f"(const float*)p{n_args - 1}"
            if a.dtype == torch.bfloat16:
                code(f"nf_gemm_bf16_packed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, {bp}, "
                     f"{c_ptr}, {geo.N}, 0, &ep, {threads});")
            else:
                code(f"nf_sgemm_packed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, {bp}, {c_ptr}, "
                     f"{geo.N}, 0, &ep, {threads});")
        elif i8:
            code(f"nf_gemm_i8w({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, "
                 f"((const int8_t*)p{1 + b.buf} + {b.layout.offset}), {geo.b[1]}, {geo.b[2]}, {c_ptr}, {geo.N}, 0, "
                 f"&ep, {threads});")
        else:
            b_ptr = f"((const {'float' if b.dtype == torch.float32 else 'uint16_t'}*)p{1 + b.buf} + {b.layout.offset})"
            a16, b16 = int(a.dtype == torch.bfloat16), int(b.dtype == torch.bfloat16)
            if nt:
                code(f"nf_gemm_nt_mixed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {a16}, {geo.a[1]}, {geo.a[2]}, {b_ptr}, "
                     f"{b16}, {geo.b[2]}, {c_ptr}, {geo.N}, 0, &ep, {threads});")
            elif mixed:
                code(f"nf_gemm_mixed({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {a16}, {geo.a[1]}, {geo.a[2]}, {b_ptr}, "
                     f"{b16}, {geo.b[1]}, {geo.b[2]}, {c_ptr}, {geo.N}, 0, &ep, {threads});")
            elif geo.batched:
                code(f"nf_sgemm_batched({geo.batch}, {geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[0]}, {geo.a[1]}, "
                     f"{geo.a[2]}, {b_ptr}, {geo.b[0]}, {geo.b[1]}, {geo.b[2]}, {c_ptr}, {geo.bs_c}, {geo.N}, 0, &ep, "
                     f"{threads});")
            else:
                code(f"nf_sgemm({geo.M}, {geo.N}, {geo.K}, {a_ptr}, {geo.a[1]}, {geo.a[2]}, {b_ptr}, {geo.b[1]}, "
                     f"{geo.b[2]}, {c_ptr}, {geo.N}, 0, &ep, {threads});")
        code("return 0;")
        code.close()
        return text + code.text()

    gen = GenKernel(name, n_args, render, sched, key)
    if s8:
        entry = ("nf_gemm_s8s8_packed" if packed else "nf_gemm_s8s8") + (" (int32 C)" if c_int32 else "")
    elif vnni:
        entry = "nf_gemm_bf16_vnni_packed"
    elif packed:
        entry = "nf_gemm_bf16_packed" if a.dtype == torch.bfloat16 else "nf_sgemm_packed"
    elif i8:
        entry = "nf_gemm_i8w (int8 weight: streamed at M <= 8, converted while packing above)"
    else:
        entry = "nf_gemm_nt_mixed" if nt else "nf_gemm_mixed" if mixed else "nf_sgemm_batched" if geo.batched \
            else "nf_sgemm"
    return GemmPlan(gen, dst, inplace, TensorType(tuple(a_t.shape), torch.float32), b if packed else None,
                    "s8" if s8 else "vnni" if vnni else "f32", entry)

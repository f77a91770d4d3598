"""torch-facing wrappers of the nf_gemm C library (for tests, benchmarks and the runtime).

Invariant: every wrapper checks dtype/device/shape before handing raw pointers to C, passes
element strides exactly as the tensors have them (no hidden copies except where documented),
keeps every tensor it passes alive for the duration of the call, and returns float32 results
equal (to fp32 rounding) to the torch expression in its docstring.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .build import ACTS, BF16_PATHS, ISAS, S8_PATHS, Epilogue, load

_override: list[ctypes.CDLL] = []


def lib() -> ctypes.CDLL:
    return _override[-1] if _override else load()


@contextlib.contextmanager
def using(library: ctypes.CDLL) -> Iterator[None]:
    """Route the wrappers to another build of the library (tests: generic ISA, other tile heights)."""
    _override.append(library)
    try:
        yield
    finally:
        _override.pop()


def isa() -> str:
    return ISAS[lib().nf_gemm_isa()]


def bf16_path() -> str:
    """The path bf16 x bf16 products take now: 'amx', 'avx512_bf16' or 'convert' (to float32)."""
    return BF16_PATHS[lib().nf_gemm_bf16_path()]


def bf16_hw_path() -> str:
    """The best bf16 path this CPU and OS allow (what `bf16_path` is unless forced lower)."""
    return BF16_PATHS[lib().nf_gemm_bf16_hw_path()]


def bf16_counts() -> dict[str, int]:
    """Calls per bf16 path since the library was loaded (the report of which path ran): the paths of
    `BF16_PATHS`, and 'stream' (decode-sized products with a bf16 operand read in place, nf_gemv.cpp)."""
    arr = (ctypes.c_long * 4)()
    lib().nf_gemm_bf16_counts(arr)
    return {**{name: int(arr[i]) for i, name in BF16_PATHS.items()}, "stream": int(arr[3])}


def i8_counts() -> dict[str, int]:
    """Weight-only int8 calls (`nf_gemm_i8w`) per path since the library was loaded: 'gemv' (W [N, K]
    int8 streamed, converted in registers) and 'packed' (converted while packing a block)."""
    arr = (ctypes.c_long * 2)()
    lib().nf_gemm_i8_counts(arr)
    return {"gemv": int(arr[0]), "packed": int(arr[1])}


def s8_path() -> str:
    """The path int8 x int8 products (`nf_gemm_s8s8`) take now: 'vnni', 'avx2' or 'portable'."""
    return S8_PATHS[lib().nf_gemm_s8_path()]


def s8_counts() -> dict[str, int]:
    """int8 x int8 calls per path since the library was loaded."""
    arr = (ctypes.c_long * len(S8_PATHS))()
    lib().nf_gemm_s8_counts(arr)
    return {name: int(arr[i]) for i, name in S8_PATHS.items()}


@contextlib.contextmanager
def forced_s8_path(name: str) -> Iterator[None]:
    """Run int8 x int8 products on `name` ('portable', 'avx2', 'vnni': or the best below it the CPU has)
    inside the block; process-wide, for tests and benchmarks."""
    code = {v: k for k, v in S8_PATHS.items()}[name]
    library = lib()
    library.nf_gemm_set_s8_path(code)
    try:
        yield
    finally:
        library.nf_gemm_set_s8_path(-1)


@contextlib.contextmanager
def forced_bf16_path(name: str) -> Iterator[None]:
    """Run bf16 products on the path `name` (or the best below it the CPU has) inside the block;
    process-wide, for tests and benchmarks."""
    code = {v: k for k, v in BF16_PATHS.items()}[name]
    library = lib()
    library.nf_gemm_set_bf16_path(code)
    try:
        yield
    finally:
        library.nf_gemm_set_bf16_path(-1)


@contextlib.contextmanager
def gemv_path(on: bool) -> Iterator[None]:
    """Turn the decode-sized streaming path (nf_gemv.cpp: float32, M <= 4; row-major B M <= 8 on
    AVX-512) on or off inside the block; process-wide, for tests and benchmarks (on by default)."""
    library = lib()
    before = library.nf_gemm_set_gemv(int(on))
    try:
        yield
    finally:
        library.nf_gemm_set_gemv(before)


def panel_width() -> int:
    return lib().nf_sgemm_nr()


def blocking() -> dict[str, int]:
    kc, mc, nc = ctypes.c_long(), ctypes.c_long(), ctypes.c_long()
    lib().nf_gemm_get_blocking(ctypes.byref(kc), ctypes.byref(mc), ctypes.byref(nc))
    return {"kc": kc.value, "mc": mc.value, "nc": nc.value, "mr": lib().nf_sgemm_mr(), "nr": panel_width()}


@dataclass(frozen=True)
class PackedB:
    """B[K, N] repacked into nf_gemm panels (`data` is a flat float32 tensor owning the storage)."""

    data: torch.Tensor
    K: int
    N: int
    layout: str = "f32"  # "f32": float32 panels (pack_b); "vnni": bf16 k-pair panels (pack_b_vnni); "s8": int8
    # k-pair panels (pack_b_s8)

    def ptr(self) -> int:
        return self.data.data_ptr()


def _check_cpu(t: torch.Tensor, name: str, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> None:
    if t.device.type != "cpu" or t.dtype not in dtypes:
        raise TypeError(f"{name}: expected a CPU tensor of dtype {dtypes}, got {t.dtype} on {t.device}")


def pack_b(b: torch.Tensor) -> PackedB:
    """Pack B[K, N] (any strides; float32 or bfloat16). For an nn.Linear weight W[N, K] pass W.t()."""
    _check_cpu(b, "b", (torch.float32, torch.bfloat16))
    if b.dim() != 2:
        raise ValueError(f"pack_b expects a 2-D [K, N] tensor, got shape {tuple(b.shape)}")
    K, N = b.shape
    out = torch.empty(max(int(lib().nf_sgemm_packed_size(K, N)), 1), dtype=torch.float32)
    if K > 0 and N > 0:
        fn = lib().nf_sgemm_pack_b_bf16 if b.dtype == torch.bfloat16 else lib().nf_sgemm_pack_b
        fn(K, N, b.data_ptr(), b.stride(0), b.stride(1), out.data_ptr())
    return PackedB(out, K, N)


def pack_b_vnni(b: torch.Tensor) -> PackedB:
    """Pack a bfloat16 B[K, N] (any strides) into nf_gemm's VNNI panels for the native bf16 path
    (`nf_gemm_pack_b_vnni`; the layout is the same on every CPU). For an nn.Linear weight pass W.t()."""
    _check_cpu(b, "b", (torch.bfloat16,))
    if b.dim() != 2:
        raise ValueError(f"pack_b_vnni expects a 2-D [K, N] tensor, got shape {tuple(b.shape)}")
    K, N = b.shape
    out = torch.empty(max(int(lib().nf_gemm_vnni_size(K, N)), 1), dtype=torch.int16)
    if K > 0 and N > 0:
        lib().nf_gemm_pack_b_vnni(K, N, b.data_ptr(), b.stride(0), b.stride(1), out.data_ptr())
    return PackedB(out, K, N, "vnni")


def pack_b_s8(b: torch.Tensor) -> PackedB:
    """Pack an int8 B[K, N] (any strides) into nf_gemm's int8 k-pair panels (`nf_gemm_pack_b_s8`, the same
    layout on every CPU) for `int_mm`. For an nn.Linear weight pass W.t()."""
    _check_cpu(b, "b", (torch.int8,))
    if b.dim() != 2:
        raise ValueError(f"pack_b_s8 expects a 2-D [K, N] tensor, got shape {tuple(b.shape)}")
    out = packed_buffer(b, "s8")
    pack_into(b, out, "s8")
    return PackedB(out, b.shape[0], b.shape[1], "s8")


def int_mm(a: torch.Tensor, b: torch.Tensor | PackedB, *, out_dtype: torch.dtype = torch.int32,
           bias: torch.Tensor | None = None, act: str = "none", residual: torch.Tensor | None = None,
           nthreads: int = 0) -> torch.Tensor:
    """int8 a[M, K] @ int8 b[K, N] (any strides, or `pack_b_s8`) summed exactly in int32: `torch._int_mm(a, b)`
    (out_dtype int32), or act(that.float() + bias) + residual (out_dtype float32)."""
    _check_cpu(a, "a", (torch.int8,))
    if a.dim() != 2:
        raise ValueError("int_mm expects a 2-D a")
    M, K = a.shape
    N = b.N if isinstance(b, PackedB) else b.shape[1]
    if (b.K if isinstance(b, PackedB) else b.shape[0]) != K:
        raise ValueError(f"inner dimensions differ: a {tuple(a.shape)}, b {b.K if isinstance(b, PackedB) else b.shape}")
    if out_dtype == torch.int32:
        if bias is not None or act != "none" or residual is not None:
            raise ValueError("an int32 result takes no epilogue")
        c, ep = torch.empty(M, N, dtype=torch.int32), None
    else:
        c, ep, keep = _output_and_epilogue((M, N), None, bias, act, residual)
    c_int32 = int(out_dtype == torch.int32)
    if isinstance(b, PackedB):
        if b.layout != "s8":
            raise ValueError(f"int_mm needs B packed by pack_b_s8, got layout {b.layout!r}")
        lib().nf_gemm_s8s8_packed(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.ptr(), c.data_ptr(), c.stride(0),
                                  c_int32, 0, _ep_ptr(ep), nthreads)
    else:
        _check_cpu(b, "b", (torch.int8,))
        lib().nf_gemm_s8s8(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1),
                           c.data_ptr(), c.stride(0), c_int32, 0, _ep_ptr(ep), nthreads)
    return c


def packed_buffer(b: torch.Tensor, layout: str = "f32") -> torch.Tensor:
    """An empty flat buffer for B[K, N] packed in `layout` ("f32": float32 panels, "vnni": bf16 VNNI
    panels, stored as int16, "s8": int8 k-pair panels); fill it with `pack_into`."""
    K, N = b.shape
    if layout == "s8":
        return torch.empty(max(int(lib().nf_gemm_s8_packed_size(K, N)), 1), dtype=torch.int8)
    if layout == "vnni":
        return torch.empty(max(int(lib().nf_gemm_vnni_size(K, N)), 1), dtype=torch.int16)
    return torch.empty(max(int(lib().nf_sgemm_packed_size(K, N)), 1), dtype=torch.float32)


def pack_into(b: torch.Tensor, out: torch.Tensor, layout: str = "f32") -> None:
    """Pack B[K, N] (any strides) into `out` from `packed_buffer(b, layout)` (releases the GIL)."""
    K, N = b.shape
    if not (K and N):
        return
    if layout == "s8":
        _check_cpu(b, "b", (torch.int8,))
        lib().nf_gemm_pack_b_s8(K, N, b.data_ptr(), b.stride(0), b.stride(1), out.data_ptr())
    elif layout == "vnni":
        _check_cpu(b, "b", (torch.bfloat16,))
        lib().nf_gemm_pack_b_vnni(K, N, b.data_ptr(), b.stride(0), b.stride(1), out.data_ptr())
    else:
        fn = lib().nf_sgemm_pack_b_bf16 if b.dtype == torch.bfloat16 else lib().nf_sgemm_pack_b
        fn(K, N, b.data_ptr(), b.stride(0), b.stride(1), out.data_ptr())


def _epilogue(
    N: int,
    rows_shape: tuple[int, ...],
    bias: torch.Tensor | None,
    act: str,
    residual: torch.Tensor | None,
    keep: list[torch.Tensor],
    bf16_bias_ok: bool = False,
) -> Epilogue | None:
    if bias is None and residual is None and act == "none":
        return None
    if act not in ACTS:
        raise ValueError(f"unknown activation {act!r}; known: {sorted(ACTS)}")
    ep = Epilogue()
    ep.act = ACTS[act]
    if bias is not None:
        _check_cpu(bias, "bias", (torch.float32, torch.bfloat16) if bf16_bias_ok else (torch.float32,))
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
        keep.append(bias)
        if bias.dtype == torch.bfloat16:
            ep.bias_bf16 = bias.data_ptr()
        else:
            ep.bias = bias.data_ptr()
    if residual is not None:
        _check_cpu(residual, "residual")
        if tuple(residual.shape) != (*rows_shape, N):
            raise ValueError(f"residual must have shape {(*rows_shape, N)}, got {tuple(residual.shape)}")
        if residual.stride(-1) != 1:
            residual = residual.contiguous()
        keep.append(residual)
        ep.residual = residual.data_ptr()
        ep.ld_residual = residual.stride(-2)
        ep.bs_residual = residual.stride(0) if residual.dim() == 3 else 0
    return ep


def _out(shape: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=torch.float32)
    _check_cpu(out, "out")
    if tuple(out.shape) != shape or out.stride(-1) != 1:
        raise ValueError(f"out must have shape {shape} and unit column stride")
    return out


def _output_and_epilogue(out_shape: tuple[int, ...], out: torch.Tensor | None, bias: torch.Tensor | None, act: str,
                         residual: torch.Tensor | None, bf16_bias_ok: bool = False,
                         ) -> tuple[torch.Tensor, Epilogue | None, list[torch.Tensor]]:
    """C (`out` checked, or a new tensor), the epilogue for it, and the tensors the epilogue points
    into (the caller holds them until the library call returns). A bf16 bias only where the entry
    called is a bf16 one (`bf16_bias_ok`: nf_epilogue.bias_bf16)."""
    c = _out(out_shape, out)
    keep: list[torch.Tensor] = []
    ep = _epilogue(out_shape[-1], out_shape[:-1], bias, act, residual, keep, bf16_bias_ok)
    return c, ep, keep


def _ep_ptr(ep: Epilogue | None):
    return ctypes.byref(ep) if ep is not None else None


def matmul(
    a: torch.Tensor,
    b: torch.Tensor | PackedB,
    *,
    bias: torch.Tensor | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    nthreads: int = 0,
) -> torch.Tensor:
    """act(a @ b [+ out if accumulate] + bias) + residual for 2-D a[M, K] (any strides); a and b float32 or
    bfloat16 (float32 accumulation and result). bf16 a and bf16 b (unpacked, or `pack_b_vnni`) run on the
    native bf16 path where the CPU has one (`bf16_path()`). An int8 b with a float32 a is a weight-only
    quantized product (`nf_gemm_i8w`: a @ b.float(), b converted in registers; scales are the caller's)."""
    _check_cpu(a, "a", (torch.float32, torch.bfloat16))
    if a.dim() != 2:
        raise ValueError("matmul expects a 2-D a; use bmm for batches")
    M, K = a.shape
    N = b.N if isinstance(b, PackedB) else b.shape[1]
    b_k = b.K if isinstance(b, PackedB) else b.shape[0]
    if b_k != K:
        raise ValueError(f"inner dimensions differ: a {tuple(a.shape)}, b has K={b_k}")
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out")
    bf16_entry = (b.layout == "vnni" or a.dtype == torch.bfloat16) if isinstance(b, PackedB) else (
        torch.bfloat16 in (a.dtype, b.dtype))
    c, ep, keep = _output_and_epilogue((M, N), out, bias, act, residual, bf16_entry)
    if not isinstance(b, PackedB) and b.dtype == torch.int8:
        _check_cpu(a, "a")
        lib().nf_gemm_i8w(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1),
                          c.data_ptr(), c.stride(0), int(accumulate), _ep_ptr(ep), nthreads)
    elif isinstance(b, PackedB) and b.layout == "vnni":
        _check_cpu(a, "a", (torch.bfloat16,))
        lib().nf_gemm_bf16_vnni_packed(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.ptr(), c.data_ptr(),
                                       c.stride(0), int(accumulate), _ep_ptr(ep), nthreads)
    elif not isinstance(b, PackedB) and torch.bfloat16 in (a.dtype, b.dtype):
        _check_cpu(b, "b", (torch.float32, torch.bfloat16))
        lib().nf_gemm_mixed(M, N, K, a.data_ptr(), int(a.dtype == torch.bfloat16), a.stride(0), a.stride(1),
                            b.data_ptr(), int(b.dtype == torch.bfloat16), b.stride(0), b.stride(1), c.data_ptr(),
                            c.stride(0), int(accumulate), _ep_ptr(ep), nthreads)
    elif a.dtype == torch.bfloat16:
        lib().nf_gemm_bf16_packed(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.ptr(), c.data_ptr(),
                                  c.stride(0), int(accumulate), _ep_ptr(ep), nthreads)
    elif isinstance(b, PackedB):
        lib().nf_sgemm_packed(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.ptr(), c.data_ptr(), c.stride(0),
                              int(accumulate), _ep_ptr(ep), nthreads)
    else:
        _check_cpu(b, "b")
        lib().nf_sgemm(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0), b.stride(1),
                       c.data_ptr(), c.stride(0), int(accumulate), _ep_ptr(ep), nthreads)
    return c


def matmul_block(
    a: torch.Tensor,
    b: torch.Tensor | PackedB,
    out: torch.Tensor,
    rows: tuple[int, int],
    cols: tuple[int, int],
    *,
    bias: torch.Tensor | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Single-threaded: out[r0:r1, c0:c1] = epilogue(a[r0:r1] @ b[:, c0:c1]); the rest of out is untouched."""
    _check_cpu(a, "a")
    M, K = a.shape
    N = b.N if isinstance(b, PackedB) else b.shape[1]
    c, ep, keep = _output_and_epilogue((M, N), out, bias, act, residual)
    (m0, m1), (n0, n1) = rows, cols
    if isinstance(b, PackedB):
        lib().nf_sgemm_packed_block(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.ptr(), c.data_ptr(),
                                    c.stride(0), m0, m1, n0, n1, int(accumulate), _ep_ptr(ep))
    else:
        lib().nf_sgemm_block(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0),
                             b.stride(1), c.data_ptr(), c.stride(0), m0, m1, n0, n1, int(accumulate), _ep_ptr(ep))
    return c


def _check_weight(w: torch.Tensor, K: int) -> None:
    _check_cpu(w, "w", (torch.float32, torch.bfloat16))
    if w.dim() != 2 or w.shape[1] != K:
        raise ValueError(f"w must be [N, {K}], got shape {tuple(w.shape)}")
    if w.stride(1) != 1 and w.shape[1] > 1:
        raise ValueError("w must be contiguous along K (an nn.Linear weight [N, K]); pass w.contiguous()")


def linear(
    a: torch.Tensor,
    w: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    nthreads: int = 0,
) -> torch.Tensor:
    """act(a @ w.T [+ out if accumulate] + bias) + residual, w [N, K] read in place (no packing).

    a[M, K] any strides; a and w float32 or bfloat16 (float32 accumulation and result)."""
    _check_cpu(a, "a", (torch.float32, torch.bfloat16))
    if a.dim() != 2:
        raise ValueError("linear expects a 2-D a")
    M, K = a.shape
    _check_weight(w, K)
    N = w.shape[0]
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out")
    c, ep, keep = _output_and_epilogue((M, N), out, bias, act, residual, True)
    lib().nf_gemm_nt_mixed(M, N, K, a.data_ptr(), int(a.dtype == torch.bfloat16), a.stride(0), a.stride(1),
                           w.data_ptr(), int(w.dtype == torch.bfloat16), w.stride(0), c.data_ptr(), c.stride(0),
                           int(accumulate), _ep_ptr(ep), nthreads)
    return c


def linear_block(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    rows: tuple[int, int],
    cols: tuple[int, int],
    *,
    bias: torch.Tensor | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Single-threaded, float32: out[r0:r1, c0:c1] = epilogue(a[r0:r1] @ w[c0:c1].T); the rest of out is untouched."""
    _check_cpu(a, "a")
    M, K = a.shape
    _check_weight(w, K)
    _check_cpu(w, "w")
    N = w.shape[0]
    c, ep, keep = _output_and_epilogue((M, N), out, bias, act, residual)
    (m0, m1), (n0, n1) = rows, cols
    lib().nf_sgemm_nt_block(M, N, K, a.data_ptr(), a.stride(0), a.stride(1), w.data_ptr(), w.stride(0),
                            c.data_ptr(), c.stride(0), m0, m1, n0, n1, int(accumulate), _ep_ptr(ep))
    return c


def bmm(
    a: torch.Tensor,
    b: torch.Tensor | PackedB,
    *,
    bias: torch.Tensor | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    nthreads: int = 0,
) -> torch.Tensor:
    """act(a[B, M, K] @ b[B, K, N] (or shared PackedB) [+ out] + bias) + residual[B, M, N]."""
    _check_cpu(a, "a")
    if a.dim() != 3:
        raise ValueError("bmm expects a 3-D a")
    batch, M, K = a.shape
    N = b.N if isinstance(b, PackedB) else b.shape[2]
    if accumulate and out is None:
        raise ValueError("accumulate=True needs out")
    c, ep, keep = _output_and_epilogue((batch, M, N), out, bias, act, residual)
    if isinstance(b, PackedB):
        lib().nf_sgemm_packed_batched(batch, M, N, K, a.data_ptr(), a.stride(0), a.stride(1), a.stride(2), b.ptr(),
                                      0, c.data_ptr(), c.stride(0), c.stride(1), int(accumulate), _ep_ptr(ep),
                                      nthreads)
    else:
        _check_cpu(b, "b")
        if b.shape[0] != batch or b.shape[1] != K:
            raise ValueError(f"b shape {tuple(b.shape)} does not match a {tuple(a.shape)}")
        lib().nf_sgemm_batched(batch, M, N, K, a.data_ptr(), a.stride(0), a.stride(1), a.stride(2), b.data_ptr(),
                               b.stride(0), b.stride(1), b.stride(2), c.data_ptr(), c.stride(0), c.stride(1),
                               int(accumulate), _ep_ptr(ep), nthreads)
    return c

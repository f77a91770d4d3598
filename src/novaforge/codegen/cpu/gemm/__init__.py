"""novaforge's CPU GEMM: a BLIS-style packed-B kernel library plus a dot-product kernel that reads
nn.Linear weights in place, native bf16 and exact int8 x int8 products (C API in nf_gemm.h).

Invariant: this package only builds/loads the C library and wraps it; generated code talks to
the same library through nf_gemm.h (include_dir(), link_args()), so Python and generated C++
always run the same compiled kernels. See docs/cpu-gemm.md.
"""

from __future__ import annotations

from .build import ACTS, cache_sizes, include_dir, library_path, link_args, load, source_files
from .ops import (
    PackedB,
    bf16_counts,
    bf16_hw_path,
    bf16_path,
    blocking,
    bmm,
    forced_bf16_path,
    forced_s8_path,
    i8_counts,
    int_mm,
    isa,
    linear,
    linear_block,
    matmul,
    matmul_block,
    pack_b,
    pack_b_s8,
    pack_b_vnni,
    panel_width,
    s8_counts,
    s8_path,
)

__all__ = [
    "ACTS",
    "PackedB",
    "bf16_counts",
    "i8_counts",
    "bf16_hw_path",
    "bf16_path",
    "blocking",
    "bmm",
    "cache_sizes",
    "forced_bf16_path",
    "forced_s8_path",
    "int_mm",
    "pack_b_s8",
    "s8_counts",
    "s8_path",
    "include_dir",
    "isa",
    "library_path",
    "linear",
    "linear_block",
    "link_args",
    "load",
    "matmul",
    "matmul_block",
    "pack_b",
    "pack_b_vnni",
    "panel_width",
    "source_files",
]

"""Cases for view, data-movement and indexing rules (lower_shape.py).

Views and data movement are compared exactly (they must not change a value)."""

from __future__ import annotations

import functools

import torch

from .harness import FLOAT, C, Case, b8, bf16, f32, i32, i64

aten = torch.ops.aten
CASES: list[Case] = []
add = CASES.extend
V = functools.partial(C, exact=True, dtypes=FLOAT + (i64, b8))  # a view or copy: exact, any dtype

# ----------------------------------------------------------------------------- views
for _t, _mk in (
    (aten.view.default, lambda m: (m.t(3, 4, 5), (12, -1))),
    (aten._unsafe_view.default, lambda m: (m.t(3, 4, 5), (4, 15))),
    (aten.reshape.default, lambda m: (m.t(3, 4, 5), (-1,))),
    (aten.flatten.using_ints, lambda m: (m.t(2, 3, 4, 5), 1, -2)),
    (aten.unflatten.int, lambda m: (m.t(2, 12), -1, (3, -1))),
    (aten.squeeze.default, lambda m: m.t(1, 3, 1, 4)),
    (aten.squeeze.dim, lambda m: (m.t(1, 3, 1, 4), -2)),
    (aten.squeeze.dims, lambda m: (m.t(1, 3, 1, 4), (0, 1, -2))),
    (aten.unsqueeze.default, lambda m: (m.t(3, 4), -1)),
    (aten.view_as.default, lambda m: (m.t(3, 4), m.t(2, 6))),
    (aten.reshape_as.default, lambda m: (m.t(3, 4), m.t(12, 1))),
):
    add([V(_t, _mk, "basic", strided=_t not in (aten.view.default, aten._unsafe_view.default, aten.view_as.default))])
add([V(aten.view.default, lambda m: (m.t(3, 0, 5), (0, 5, 3)), "zero-size"),
     V(aten.view.default, lambda m: (m.t(), (1, 1)), "0d"),
     V(aten.reshape.default, lambda m: (m.t(1, 1), ()), "to-0d"),
     V(aten.reshape.default, lambda m: (m.t(4, 6).t(), (8, 3)), "transposed"),
     V(aten.squeeze.dim, lambda m: (m.t(3, 4), 0), "noop"),
     V(aten.squeeze.default, lambda m: m.t(), "0d"),
     V(aten.unsqueeze.default, lambda m: (m.t(), 0), "0d"),
     V(aten.unsqueeze.default, lambda m: (m.t(0, 2), 1), "zero-size"),
     V(aten.flatten.using_ints, lambda m: m.t(), "0d")])
for _t in (aten.permute.default,):
    add([V(_t, lambda m: (m.t(2, 3, 4), (2, 0, 1)), "basic"),
         V(_t, lambda m: (m.t(2, 3, 4), (-1, 0, -2)), "negative"),
         V(_t, lambda m: (m.t(2, 0, 4), (1, 2, 0)), "zero-size"),
         V(_t, lambda m: (m.t(), ()), "0d")])
for _t in (aten.transpose.int, aten.swapaxes.default):
    add([V(_t, lambda m: (m.t(2, 3, 4), 0, 2), "basic"),
         V(_t, lambda m: (m.t(2, 3, 4), -1, -2), "negative"),
         V(_t, lambda m: (m.t(5), 0, -1), "1d"),
         V(_t, lambda m: (m.t(3, 0), 0, 1), "zero-size")])
for _t in (aten.t.default, aten.numpy_T.default):
    add([V(_t, lambda m: m.t(3, 4), "2d"), V(_t, lambda m: m.t(5), "1d"), V(_t, lambda m: m.t(), "0d")])
add([V(aten.numpy_T.default, lambda m: m.t(2, 3, 4), "3d")])
add([V(aten.movedim.int, lambda m: (m.t(2, 3, 4, 5), 0, -1), "to-end"),
     V(aten.movedim.int, lambda m: (m.t(2, 3, 4, 5), -1, 1), "from-end")])
add([V(aten.diagonal.default, lambda m: m.t(4, 4), "square"),
     V(aten.diagonal.default, lambda m: (m.t(3, 5), 1), "wide-offset"),
     V(aten.diagonal.default, lambda m: (m.t(5, 3), -2), "tall-negative-offset"),
     V(aten.diagonal.default, lambda m: (m.t(2, 3, 4), 0, -1, 0), "3d-dims"),
     V(aten.diagonal.default, lambda m: (m.t(3, 4), 5), "empty"),
     V(aten.diagonal.default, lambda m: (m.t(1, 1), 0), "one")])
add([V(aten.flip.default, lambda m: (m.t(3, 4), [0]), "dim0"),
     V(aten.flip.default, lambda m: (m.t(2, 3, 4), [-1, 0]), "two"),
     V(aten.flip.default, lambda m: (m.t(3, 0), [1]), "zero-size"),
     V(aten.flip.default, lambda m: (m.t(), []), "0d"),
     V(aten.flip.default, lambda m: (m.t(1, 5), [0, 1]), "unit-axis")])
add([V(aten.expand.default, lambda m: (m.t(3, 1), (2, 3, 4)), "basic"),
     V(aten.expand.default, lambda m: (m.t(3, 1), (-1, 5)), "minus-one"),
     V(aten.expand.default, lambda m: (m.t(), (2, 2)), "0d"),
     V(aten.expand.default, lambda m: (m.t(1, 4), (0, 4)), "zero-size"),
     V(aten.expand_as.default, lambda m: (m.t(4), m.t(3, 4)), "basic"),
     V(aten.broadcast_to.default, lambda m: (m.t(3, 1), (2, 3, 5)), "basic")])

# ---------------------------------------------------------------------------- slices
add([V(aten.slice.Tensor, lambda m: (m.t(5, 7), 1, 2, 6), "basic"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), -1, -5, -1, 2), "negative-step2"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), 0, 1, 9223372036854775807), "to-end"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), 0, None, None, 3), "none-step3"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), 1, 8, 20), "past-end"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), 1, 4, 2), "empty"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7), 0, -100, 100), "clamped"),
     V(aten.slice.Tensor, lambda m: (m.t(5, 7),), "defaults"),
     V(aten.slice.Tensor, lambda m: (m.t(0, 7), 1, 1, 3), "zero-size")])
add([V(aten.narrow.default, lambda m: (m.t(5, 7), 1, 2, 3), "basic"),
     V(aten.narrow.default, lambda m: (m.t(5, 7), -2, -3, 2), "negative"),
     V(aten.narrow.default, lambda m: (m.t(5, 7), 0, 5, 0), "empty")])
add([V(aten.select.int, lambda m: (m.t(5, 7), 1, 3), "basic"),
     V(aten.select.int, lambda m: (m.t(5, 7), -1, -1), "negative"),
     V(aten.select.int, lambda m: (m.t(5), 0, 4), "to-0d"),
     V(aten.select.int, lambda m: (m.t(2, 0), 0, 1), "zero-size")])
add([V(aten.split.Tensor, lambda m: (m.t(7, 4), 3), "uneven"),
     V(aten.split.Tensor, lambda m: (m.t(4, 6), 2, -1), "dim"),
     V(aten.split.Tensor, lambda m: (m.t(4, 6), 10), "one-piece"),
     V(aten.split.Tensor, lambda m: (m.t(0, 6), 2), "zero-size"),
     V(aten.split_with_sizes.default, lambda m: (m.t(4, 6), (1, 0, 5), 1), "sizes"),
     V(aten.unsafe_split.Tensor, lambda m: (m.t(7, 4), 2), "uneven"),
     V(aten.chunk.default, lambda m: (m.t(7, 4), 3), "uneven"),
     V(aten.chunk.default, lambda m: (m.t(2, 6), 3, -1), "dim"),
     V(aten.tensor_split.sections, lambda m: (m.t(7, 4), 3), "uneven"),
     V(aten.tensor_split.sections, lambda m: (m.t(2, 2), 3, 1), "more-than-size")])
add([V(aten.unbind.int, lambda m: m.t(3, 4), "basic"),
     V(aten.unbind.int, lambda m: (m.t(3, 4, 2), -2), "dim"),
     V(aten.unbind.int, lambda m: (m.t(3, 1), 1), "one")])

# ---------------------------------------------------------------------- concatenation
for _t in (aten.cat.default, aten.concat.default, aten.concatenate.default):
    add([V(_t, lambda m: ([m.t(2, 3), m.t(4, 3)],), "dim0"),
         V(_t, lambda m: ([m.t(2, 3), m.t(2, 1), m.t(2, 0)], -1), "dim-last-empty")])
add([V(aten.cat.default, lambda m: ([m.t(2, 3), m.t(0)],), "legacy-empty"),
     V(aten.cat.default, lambda m: ([m.t(0, 3), m.t(0, 3)],), "all-empty"),
     V(aten.cat.default, lambda m: ([m.t(2, 3)],), "single"),
     C(aten.cat.default, lambda m: ([m.t(2, 3), m.t(2, 3, dtype=i64), m.t(2, 3, dtype=bf16)], 1), "promote",
       dtypes=(f32,), exact=True)])
add([V(aten.stack.default, lambda m: ([m.t(2, 3), m.t(2, 3)],), "dim0"),
     V(aten.stack.default, lambda m: ([m.t(2, 3), m.t(2, 3), m.t(2, 3)], -1), "dim-last"),
     V(aten.stack.default, lambda m: ([m.t(2, 3)], 1), "single"),
     V(aten.stack.default, lambda m: ([m.t(), m.t()],), "0d"),
     C(aten.stack.default, lambda m: ([m.t(2, dtype=i32), m.t(2)],), "promote", exact=True)])
add([V(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (1, 2)), "last"),
     V(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (1, 0, 0, 2), 1), "two-dims"),
     V(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (-1, 1, 2, -2), 0), "crop"),
     V(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (0, 0)), "noop"),
     C(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (2, 0), -1.5), "float-value", exact=True),
     C(aten.constant_pad_nd.default, lambda m: (m.t(3, 4), (2, 0), 7), "int-value", dtypes=(i64, i32), exact=True),
     V(aten.constant_pad_nd.default, lambda m: (m.t(0, 4), (1, 1, 1, 1)), "zero-size")])
add([V(aten.pad.default, lambda m: (m.t(3, 4), (1, 2)), "constant"),
     C(aten.pad.default, lambda m: (m.t(3, 4), (1, 2), "constant", 2.5), "value", exact=True),
     C(aten.pad.default, lambda m: (m.t(1, 3, 4), (1, 2), "reflect"), "reflect", extern=True, exact=True),
     C(aten.pad.default, lambda m: (m.t(1, 3, 4), (1, 2), "replicate"), "replicate", extern=True, exact=True)])
add([V(aten.repeat.default, lambda m: (m.t(2, 3), (2, 1, 3)), "basic"),
     V(aten.repeat.default, lambda m: (m.t(2, 3), (1, 1)), "ones"),
     V(aten.repeat.default, lambda m: (m.t(2, 3), (0, 2)), "zero"),
     V(aten.repeat.default, lambda m: (m.t(), (3,)), "0d")])
for _t in (aten.tril.default, aten.triu.default):
    add([V(_t, lambda m: m.t(4, 5), "square-ish"),
         V(_t, lambda m: (m.t(2, 4, 3), 1), "batched-k1"),
         V(_t, lambda m: (m.t(3, 6), -2), "k-neg"),
         V(_t, lambda m: (m.t(0, 3), 0), "zero-size")])

# --------------------------------------------------------------------------- indexing
add([V(aten.embedding.default, lambda m: (m.t(10, 4), m.idx(10, 2, 3)), "basic"),
     V(aten.embedding.default, lambda m: (m.t(10, 4), m.idx(10, 5, dtype=i32), 0), "i32-padding"),
     V(aten.embedding.default, lambda m: (m.t(10, 4), m.idx(10, 0)), "no-indices"),
     V(aten.embedding.default, lambda m: (m.t(10, 4), m.idx(10)), "0d-index")])
add([V(aten.index_select.default, lambda m: (m.t(5, 6), 1, m.idx(6, 4)), "basic"),
     V(aten.index_select.default, lambda m: (m.t(5, 6), -2, m.idx(5, 0)), "empty"),
     V(aten.index_select.default, lambda m: (m.t(5, 6), 0, m.idx(5, 7, dtype=i32)), "i32"),
     V(aten.index_select.default, lambda m: (m.t(), 0, m.idx(1, 1)), "0d")])
add([V(aten.gather.default, lambda m: (m.t(4, 5), 1, m.idx(5, 4, 3)), "basic"),
     V(aten.gather.default, lambda m: (m.t(4, 5), 0, m.idx(4, 2, 5)), "dim0"),
     V(aten.gather.default, lambda m: (m.t(4, 5), -1, m.idx(5, 4, 0)), "empty")])
add([V(aten.index.Tensor, lambda m: (m.t(5, 6), [m.idx(5, 3)]), "first"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6), [None, m.idx(6, 2, 2)]), "second"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6), [m.idx(5, 3) - 5]), "negative"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6, 7), [m.idx(5, 3), m.idx(6, 3)]), "adjacent"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6, 7), [None, m.idx(6, 2, 1), m.idx(7, 3) - 7]), "adjacent-mid"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6, 7), [m.idx(5, 3, 1), m.idx(6, 4, dtype=i32) - 6]), "adjacent-bcast"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6, 7), [m.idx(5, 4), None, m.idx(7, 4)]), "separated"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6), [m.idx(5, 0)]), "empty"),
     V(aten.index.Tensor, lambda m: (m.t(5, 6), [m.idx(5, 3, dtype=i32)]), "i32")])
add([V(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(5, 2), 1, 2, 4), "basic"),
     V(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(2, 6), 0, -3, -1), "negative"),
     V(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(5, 3), 1, 0, None, 2), "step"),
     V(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(5, 6)), "all"),
     V(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(5, 0), 1, 4, 2), "empty"),
     C(aten.slice_scatter.default, lambda m: (m.t(5, 6), m.t(5, 2, dtype=bf16), 1, 2, 4), "cast",
       dtypes=(f32,), exact=True)])
add([V(aten.select_scatter.default, lambda m: (m.t(5, 6), m.t(6), 0, 2), "basic"),
     V(aten.select_scatter.default, lambda m: (m.t(5, 6), m.t(5), -1, -1), "negative"),
     V(aten.select_scatter.default, lambda m: (m.t(5), m.t(), 0, 3), "1d")])
add([C(aten.scatter_add.default, lambda m: (m.t(4, 5), 1, m.idx(5, 4, 3), m.t(4, 3)), "basic"),
     C(aten.scatter_add.default, lambda m: (m.t(4, 5), 0, m.idx(4, 6, 5), m.t(6, 5)), "dim0-collisions"),
     C(aten.scatter_add.default, lambda m: (m.t(4, 5), 1, m.idx(5, 2, 2), m.t(4, 3)), "smaller-index"),
     C(aten.scatter_add.default, lambda m: (m.t(4, 5), 1, m.idx(5, 4, 3), m.t(4, 3)), "int", dtypes=(i64,))])
add([C(aten.scatter.value, lambda m: (m.t(4, 5), 1, m.idx(5, 4, 1), -1.5), "one-hot"),
     C(aten.scatter.value, lambda m: (m.t(4, 5), 0, m.idx(4, 3, 5), 2.0), "duplicates"),
     C(aten.scatter.value, lambda m: (m.t(4, 5), 1, m.idx(5, 4, 2), 3), "int", dtypes=(i64,))])
# accumulating rows at one index tensor (the embedding gradient): repeated and negative ids
add([C(aten.index_put.default, lambda m: (m.t(6, 4), [m.idx(12, 3, 5) - 6], m.t(3, 5, 4), True), "rows"),
     C(aten.index_put.default, lambda m: (m.t(6, 4), [m.idx(6, 7)], m.t(4), True), "broadcast"),
     C(aten.index_put.default, lambda m: (m.t(6, 4), [m.idx(6, 3)], m.t(3, 4), True), "int", dtypes=(i64,)),
     C(aten.index_put.default, lambda m: (m.t(6, 4), [m.idx(6, 3)], m.t(3, 4), False), "overwrite-extern", extern=True),
     C(aten._unsafe_index_put.default, lambda m: (m.t(6, 4), [m.idx(6, 5)], m.t(5, 4), True), "rows"),
     C(aten._unsafe_masked_index_put_accumulate.default,
       lambda m: (m.t(6, 4), m.b(5, 1), [m.idx(6, 5)], m.t(5, 4)), "masked")])
add([C(aten.cumsum.default, lambda m: (m.t(4, 5), 1), "basic"),
     C(aten.cumsum.default, lambda m: (m.t(4, 5), -2), "negative"),
     C(aten.cumsum.default, lambda m: ((m.t(4, 5), 1), {"dtype": f32}), "dtype", dtypes=(bf16, i64)),
     C(aten.cumsum.default, lambda m: (m.t(4, 5), 0), "int", dtypes=(i64, i32, b8)),
     C(aten.cumsum.default, lambda m: (m.t(0, 5), 1), "zero-size"),
     C(aten.cumsum.default, lambda m: (m.t(), 0), "0d")])

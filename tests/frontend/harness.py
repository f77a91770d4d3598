"""Harness for lowering-rule tests: one ATen call, lowered to IR, run, compared with eager.

A `Case` names an ATen overload and builds its arguments from a `Maker` (random tensors of
the case's dtype). `run_case` builds a one-node FX graph for the call (placeholders carry the
real input tensors as their `val`, so the lowering sees exactly the shapes and dtypes eager
sees), lowers it with `lower_fx`, verifies the IR, interprets it, then runs the full pass
pipeline and interprets the result again; both must match the eager ATen call: exactly for
integer, bool and view results, within tight tolerances for floats. Every variant also runs
with non-contiguous inputs (a strided or transposed layout holding the same values).
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.fx

from novaforge.codegen.registry import get_backend
from novaforge.frontend.lower import InputSpec, lower_fx
from novaforge.ir import verify
from novaforge.ir.ops.random import random_mode
from novaforge.passes.pipeline import run_pipeline
from novaforge.runtime.interpret import interpret

f32, bf16, f16, f64 = torch.float32, torch.bfloat16, torch.float16, torch.float64
i64, i32, u8, b8 = torch.int64, torch.int32, torch.uint8, torch.bool
FLOAT = (f32, bf16)
INTS = (i64, i32)

# (rtol, atol) per result dtype: fp32 near torch's defaults, bf16 about one rounding.
TOL = {f32: (1.3e-6, 1e-5), f64: (1e-7, 1e-7), bf16: (1.6e-2, 1e-2), f16: (1e-3, 1e-3)}
# for compositions (reductions, normalizations, matmuls) that legitimately round differently
LOOSE = {f32: (1e-5, 1e-5), bf16: (2e-2, 2e-2)}


class Maker:
    """Random inputs of the case's dtype (reproducible per case)."""

    def __init__(self, dtype: torch.dtype, seed: int) -> None:
        self.dtype = dtype
        self.g = torch.Generator().manual_seed(seed)

    def _float(self, shape, lo: float, hi: float, dtype) -> torch.Tensor:
        return (torch.rand(shape, generator=self.g) * (hi - lo) + lo).to(dtype)

    def t(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Values of a typical range: normal*2 for floats, [-8, 8] for ints, fair coin for bool."""
        dt = dtype or self.dtype
        if dt == b8:
            return torch.rand(shape, generator=self.g) < 0.5
        if dt.is_floating_point:
            return (torch.randn(shape, generator=self.g) * 2).to(dt)
        lo = 0 if dt == u8 else -8
        return torch.randint(lo, 9, shape, generator=self.g).to(dt)

    def pos(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        dt = dtype or self.dtype
        if not dt.is_floating_point:
            return torch.randint(1, 9, shape, generator=self.g).to(dt)
        return self._float(shape, 0.1, 4.0, dt)

    def nz(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Nonzero values of either sign (divisors)."""
        dt = dtype or self.dtype
        sign = torch.where(torch.rand(shape, generator=self.g) < 0.5, -1, 1)
        return (self.pos(*shape, dtype=dt) * sign.to(dt)).to(dt) if dt != u8 else self.pos(*shape, dtype=dt)

    def unit(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._float(shape, -0.95, 0.95, dtype or self.dtype)

    def b(self, *shape: int) -> torch.Tensor:
        return self.t(*shape, dtype=b8)

    def idx(self, n: int, *shape: int, dtype: torch.dtype = i64) -> torch.Tensor:
        return torch.randint(0, n, shape, generator=self.g).to(dtype)

    def special(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """NaN, infinities, signed zeros, tiny and large values (shape [12])."""
        vals = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1.0, -1.0, 0.5]
        return torch.tensor(vals, dtype=dtype or self.dtype)


@dataclass
class Case:
    target: Any
    make: Callable[[Maker], Any]  # -> args tuple, or (args, kwargs)
    label: str = ""
    dtypes: tuple[torch.dtype, ...] = FLOAT
    tol: dict[torch.dtype, tuple[float, float]] = field(default_factory=dict)
    exact: bool = False  # compare floats exactly too (views, data movement, selections)
    extern: bool = False  # the rule is expected to keep this call as an extern
    values: bool = True  # False: results are uninitialized (empty*); compare types only
    seeded: bool = False  # random op: lowered as ATen's own draws (random="eager"), torch reseeded before each run
    strided: bool = True  # also run with non-contiguous inputs (False: eager rejects them, e.g. view)
    outputs: tuple[int, ...] | None = None  # which results of a multi-output op the graph uses (None: all)

    @property
    def id(self) -> str:
        name = str(self.target).removeprefix("aten.")
        return f"{name}[{self.label}]" if self.label else name


def eager_supports(target: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether eager ATen accepts this call (used to pick the dtype and scalar variants an
    op supports, so that a case never tests something eager itself rejects)."""
    try:
        target(*args, **kwargs)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def C(target: Any, make: Callable[[Maker], Any], label: str = "", dtypes=FLOAT, **kw: Any) -> Case:
    return Case(target, make, label, tuple(dtypes), **kw)


def _split_args(made: Any) -> tuple[tuple, dict]:
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], tuple) and isinstance(made[1], dict):
        return made
    return (made if isinstance(made, tuple) else (made,)), {}


def non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (transposed storage, or every other element)."""
    if t.dim() == 0 or t.numel() <= 1:
        return t
    if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
        out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        out = big[..., ::2]
        out.copy_(t)
    assert not out.is_contiguous()
    return out


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, list | tuple):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def build_fx(target: Any, args: tuple, kwargs: dict, result: Any,
             outputs: tuple[int, ...] | None = None) -> tuple[torch.fx.Graph, list[torch.Tensor]]:
    """A functional FX graph calling `target` once and returning its tensor results (those in
    `outputs`, default all); returns it and the tensors its placeholders bind."""
    g = torch.fx.Graph()
    tensors: list[torch.Tensor] = []

    def placeholder(t: torch.Tensor) -> torch.fx.Node:
        ph = g.placeholder(f"x{len(tensors)}")
        ph.meta["val"] = t
        tensors.append(t)
        return ph

    fx_args = _map_tensors(args, placeholder)
    fx_kwargs = _map_tensors(kwargs, placeholder)
    node = g.call_function(target, tuple(fx_args), fx_kwargs)
    node.meta["val"] = tuple(result) if isinstance(result, list) else result
    if result is None:
        outs = [n for n in g.nodes if n.op == "placeholder"][:1]
    elif isinstance(result, list | tuple):
        outs = []
        for i, r in enumerate(result):
            if isinstance(r, torch.Tensor) and (outputs is None or i in outputs):
                gi = g.call_function(operator.getitem, (node, i))
                gi.meta["val"] = r
                outs.append(gi)
    else:
        outs = [node]
    g.output(tuple(outs))
    return g, tensors


def _compare(got: torch.Tensor, want: torch.Tensor, case: Case, where: str) -> None:
    if not case.values:
        assert got.shape == want.shape and got.dtype == want.dtype, where
        return
    if want.dtype.is_floating_point and not case.exact:
        rtol, atol = case.tol.get(want.dtype) or TOL[want.dtype]
    else:
        rtol, atol = 0.0, 0.0
    if got.shape == want.shape and got.dtype == want.dtype and (
            torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True) if want.dtype.is_floating_point
            else torch.equal(got, want)):
        return  # the fast path; assert_close explains a failure
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{where}: {m}")


def _results(out: Any) -> list[torch.Tensor]:
    if out is None:
        return []
    if isinstance(out, list | tuple):
        return [r for r in out if isinstance(r, torch.Tensor)]
    return [out]


def _eager(case: Case, args: tuple, kwargs: dict, seed: int) -> Any:
    if case.seeded:
        torch.manual_seed(seed)
    return case.target(*args, **kwargs)


def lower_case(case: Case, dtype: torch.dtype):
    """Only lower the case's call (no pipeline, no execution): (IR graph, LowerCtx)."""
    seed = zlib.crc32(case.id.encode())
    args, kwargs = _split_args(case.make(Maker(dtype, seed)))
    want = _eager(case, args, kwargs, seed)
    fx_graph, inputs = build_fx(case.target, args, kwargs, want, case.outputs)
    with random_mode("eager" if case.seeded else "counter"):
        return lower_fx(SimpleNamespace(graph=fx_graph), [InputSpec("user", f"in{i}") for i in range(len(inputs))])


def run_case(case: Case, dtype: torch.dtype) -> dict[str, Any]:
    """Lower, verify, interpret (before and after the full pipeline) and compare with eager,
    with contiguous inputs and (unless the case says not) non-contiguous ones holding the same
    values. IR values have no layout, so one lowering serves both. Returns facts for extra
    assertions (the graphs, the externs)."""
    seed = zlib.crc32(case.id.encode())
    args, kwargs = _split_args(case.make(Maker(dtype, seed)))
    want = _eager(case, args, kwargs, seed)
    fx_graph, _ = build_fx(case.target, args, kwargs, want, case.outputs)
    # lower_fx reads only `.graph` (and get_attr targets, which this graph has none of)
    with random_mode("eager" if case.seeded else "counter"):  # (the counter draws: tests/test_random.py)
        graph, ctx = lower_fx(SimpleNamespace(graph=fx_graph), [InputSpec("user", f"in{i}") for i in range(
            sum(1 for n in fx_graph.nodes if n.op == "placeholder"))])
    verify(graph, "lowering")
    where = f"{case.id} {dtype}"
    if case.extern:
        assert ctx.externs, f"{where}: expected an extern, got none"
    else:
        assert not ctx.externs, f"{where}: unexpected externs {ctx.externs}"
    be = get_backend("interpret")
    optimized, _ = run_pipeline(graph, options={"backend": "interpret"}, target=be.target(), backend=be, check=True)
    layouts = ("contiguous", "strided") if case.strided else ("contiguous",)
    for layout in layouts:
        if layout == "strided":
            args, kwargs = _map_tensors(args, non_contiguous), _map_tensors(kwargs, non_contiguous)
            want = _eager(case, args, kwargs, seed)
        inputs: list[torch.Tensor] = []
        _map_tensors((args, kwargs), inputs.append)
        wants = _results(want)
        if case.outputs is not None:
            wants = [want[i] for i in case.outputs]
        for label, g in (("lowered", graph), ("optimized", optimized)):
            if case.seeded:
                torch.manual_seed(seed)
            got = interpret(g, inputs, check=True)[: len(g.outputs)]
            if want is None:
                continue
            assert len(got) == len(wants), f"{where} {layout} {label}: {len(got)} outputs, eager has {len(wants)}"
            for k, (a, b) in enumerate(zip(got, wants, strict=True)):
                _compare(a, b, case, f"{where} {layout} {label} output {k}")
    return {"graph": graph, "optimized": optimized, "externs": list(ctx.externs)}

"""Random fuzz programs from a seed: `generate(seed, backend) -> Program`.

The generator grows a program step by step. Each proposal (an op family drawn with fixed
weights, its operands drawn from the live values, preferring the newest so graphs get deep)
is appended and the whole program is re-analyzed from its text (`program.analyze`); a
proposal that eager rejects, that reads an inexact value where it needs an exact one, or that
produces a non-finite value is dropped. So every generated program runs eagerly, and the
result depends only on (seed, backend): `random.Random(seed)` drives every choice and the
data come from seeded generators in the program text.

Families: elementwise unary/binary (float, int64, bool; scalars; broadcasting), comparisons
and logical ops, reductions (sum/mean/amax/amin/prod/var/logsumexp/argmax/any/all/cumsum,
one or several axes, keepdim), normalizations (softmax, log_softmax, layer_norm), shape ops
(reshape/view/permute/transpose/unsqueeze/squeeze/expand/slice/select/narrow/flatten/flip/
roll/repeat/cat/stack/chunk/pad/tril/contiguous/clone), matmul/einsum/bmm/linear against
inputs or parameters, indexing (index_select, gather, scatter, index_put, advanced indexing, masked_fill,
index_add, embedding), casts, generators (ones, arange, full_like), in-place ops (on fresh
clones, on intermediates, on inputs and views of inputs: input mutation), and module layers
with parameters (Linear, LayerNorm, Embedding, RMSNorm, Conv1d), attention (written out with
masks, causal and GQA, or as scaled_dot_product_attention). Shapes use odd, size-1 and
zero-size dims; one CPU program in 12 uses large dims (33 ... 128: vector tails, GEMM
blocking); inputs may be transposed, strided or expanded (non-contiguous). The Triton backend
gets smaller programs (its CPU interpreter is slow).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from .program import Analysis, InputSpec, Program, Step, analyze

DIMS = (1, 1, 2, 3, 3, 4, 5, 7, 8, 9, 16, 17)
LARGE_DIMS = (1, 3, 8, 16, 33, 64, 100, 128)  # vector tails, GEMM blocking: 1 program in 12 (CPU)


class _Skip(Exception):
    pass


def _fmt_shape(shape) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


class _Gen:
    def __init__(self, seed: int, backend: str) -> None:
        self.rng = random.Random(seed)
        self.small = backend == "triton"
        self.large = not self.small and self.rng.random() < 1 / 12
        self.max_numel = 256 if self.small else 16384 if self.large else 2048
        self.dims = LARGE_DIMS if self.large else DIMS[:9] if self.small else DIMS
        self.fd = "BF16" if self.rng.random() < 0.25 else "F32"
        self.prog = Program(seed, [], [], [], freeze=self.rng.random() < 0.2,
                            note=f"{'bfloat16' if self.fd == 'BF16' else 'float32'}")
        self.analysis: Analysis = Analysis(True)
        self.counter = 0
        self.pending_inputs: list[InputSpec] = []

    # ------------------------------------------------------------------ helpers
    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rng = self.rng
        rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4)) if rank is None else rank
        for _ in range(20):
            s = [rng.choice(self.dims) for _ in range(rank)]
            if s and rng.random() < 0.06:
                s[rng.randrange(rank)] = 0
            n = 1
            for d in s:
                n *= d
            if n <= self.max_numel:
                return tuple(s)
        return tuple([2] * rank)

    def new_input(self, shape, dtype: str | None = None, high: int = 0, low: int = 0, layout: str | None = None) -> str:
        dtype = dtype or self.fd
        if layout is None:
            r = self.rng.random()
            layout = "t" if r < 0.12 and len(shape) >= 2 else "step" if r < 0.2 and shape else \
                "expand" if r < 0.24 and shape and shape[0] > 1 and dtype != "torch.int64" else ""
        name = f"x{len(self.prog.inputs) + len(self.pending_inputs)}"
        self.pending_inputs.append(InputSpec(name, tuple(shape), dtype, seed=self.rng.randrange(1, 10**6),
                                             high=high, low=low, layout=layout))
        return name

    def values(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exact: bool = False) -> list[str]:
        a = self.analysis
        return [k for k, t in a.values.items() if not k.startswith("self.") and pred(t)
                and (not exact or a.meta[k].exact)]

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True, exact: bool = False) -> str:
        names = self.values(pred, exact)
        if not names:
            raise _Skip
        if self.rng.random() < 0.55:
            return names[-1]
        return self.rng.choice(names)

    def t(self, name: str) -> torch.Tensor:
        return self.analysis.values[name]

    def other_like(self, a: str, dtype: str | None = None, exact: bool = False) -> str:
        """A value broadcasting against a: an existing one of the same shape or a new input."""
        ta = self.t(a)
        same = [n for n in self.values(lambda t: t.shape == ta.shape and _dkind(t) == _dkind(ta), exact) if n != a]
        if same and self.rng.random() < 0.45:
            return self.rng.choice(same)
        shape = tuple(1 if self.rng.random() < 0.35 else s for s in ta.shape)[self.rng.randint(0, ta.dim()):]
        if dtype is None:
            dtype = {"f": self.fd, "i": "torch.int64", "b": "torch.bool"}[_dkind(ta)]
        if dtype == "torch.int64":
            return self.new_input(shape, dtype, high=6, low=-5)
        return self.new_input(shape, dtype)

    # ------------------------------------------------------------------ families
    def unary(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.dtype != torch.bool)
        ta = self.t(a)
        if not ta.is_floating_point():
            name, rule, arg = rng.choice([
                ("-{a}", "keep", 0), ("{a}.abs()", "keep", 0), ("{a} * 3", "mul3", 3), ("{a} + 2", "add2", 2),
                ("{a} % 3", "int", 2), ("{a} // 2", "keep", 0), ("{a}.clamp(-2, 3)", "keep", 0),
                ("~{a}", "add1", 1), ("torch.sign({a})", "int", 1)])
            return self._simple(name.format(a=a), [a], rule, arg, pow2=False)
        exact_ops = [("-{a}", "keep", 0), ("{a}.abs()", "keep", 0), ("torch.relu({a})", "keep", 0),
                     ("{a} * 2", "scale", 2), ("{a} / 2", "scale", 0.5), ("{a} * 0.5", "scale", 0.5),
                     ("{a} + 1", "add1", 1), ("1 - {a}", "add1", 1), ("{a}.clamp(-1.5, 1.0)", "keep", 0),
                     ("torch.floor({a})", "round", 0), ("torch.ceil({a})", "round", 0),
                     ("torch.round({a})", "round", 0), ("torch.trunc({a})", "round", 0),
                     ("torch.sign({a})", "round", 0), ("{a} * {a}", "mul", 0), ("torch.square({a})", "mul", 0),
                     ("torch.pow({a}, 2)", "mul", 0), ("F.hardtanh({a})", "keep", 0),
                     ("{a} * 0", "keep", 0), ("{a} + 0", "keep", 0), ("{a} * 1", "keep", 0)]
        inexact_ops = ["torch.exp({a}.clamp(-4, 4))", "torch.tanh({a})", "torch.sigmoid({a})", "torch.sin({a})",
                       "torch.cos({a})", "torch.erf({a})", "F.gelu({a})", "F.gelu({a}, approximate='tanh')",
                       "F.silu({a})", "F.softplus({a})", "F.elu({a})", "torch.sqrt({a}.abs())",
                       "torch.rsqrt({a}.abs() + 1)", "torch.log({a}.abs() + 1)", "torch.log1p({a}.abs())",
                       "torch.expm1({a}.clamp(-3, 3))", "torch.reciprocal({a}.abs() + 1)", "{a}.abs() ** 1.5",
                       "{a} * 0.3", "{a} / 3", "torch.atan({a})", "F.leaky_relu({a}, 0.1)", "F.mish({a})",
                       "torch.pow({a}, 3)", "F.relu6({a} * 3)", "F.hardswish({a})", "torch.clamp_min({a}, 0.3)"]
        if rng.random() < 0.5:
            expr, rule, arg = rng.choice(exact_ops)
                # discontinuous ops (rounding, sign) only read exact values
            return self._simple(expr.format(a=a), [a], rule, arg, pow2=expr == "torch.pow({a}, 2)",
                                needs_exact=rule == "round")
        return self._simple(rng.choice(inexact_ops).format(a=a), [a], "inexact", 0)

    def _simple(self, expr: str, reads: list[str], rule: str, arg: float, pow2: bool = False, **kw) -> Step:
        if rule in ("add1", "add2", "mul3"):
            # x + c / x * c: bounds grow by c (add) or c times (mul); model as `keep` with a bigger bound
            rule, arg = ("const_add", arg) if rule.startswith("add") else ("const_mul", arg)
        if pow2:
            return Step(self.name("v"), expr, tuple(reads) * 2, "mul", **kw)
        if rule == "mul" and len(reads) == 1:
            return Step(self.name("v"), expr, (reads[0], reads[0]), "mul", **kw)
        return Step(self.name("v"), expr, tuple(reads), rule, arg=arg, **kw)

    def binary(self) -> Step:
        rng = self.rng
        a = self.pick()
        ta = self.t(a)
        k = _dkind(ta)
        if k == "b":
            b = self.other_like(a, "torch.bool")
            op = rng.choice(["{a} & {b}", "{a} | {b}", "{a} ^ {b}", "torch.logical_and({a}, {b})",
                             "torch.logical_or({a}, {b})", "{a} != {b}"])
            return Step(self.name("v"), op.format(a=a, b=b), (a, b), "pred")
        if rng.random() < 0.2:  # mixed dtypes: type promotion
            dt = rng.choice(["torch.int64", "F32", "BF16", "torch.bool"])
            b = self.other_like(a, dt)
        else:
            b = self.other_like(a)
        if rng.random() < 0.5:
            a, b = b, a
        tb_float = k == "f" or rng.random() < 0.5
        choices = [("{a} + {b}", "add"), ("{a} - {b}", "add"), ("{a} * {b}", "mul"),
                   ("torch.maximum({a}, {b})", "keep"), ("torch.minimum({a}, {b})", "keep")]
        if tb_float:
            choices += [("{a} / ({b}.abs() + 1)", "inexact"), ("torch.atan2({a}, {b}.abs() + 1)", "inexact"),
                        ("torch.hypot({a}, {b})", "inexact"), ("torch.lerp({a}, {b}, 0.25)", "inexact")]
        else:
            choices += [("{a} & {b}", "add"), ("{a} | {b}", "add")]
        op, rule = rng.choice(choices)
        if rule == "mul":
            return Step(self.name("v"), op.format(a=a, b=b), (a, b), "mul")
        return Step(self.name("v"), op.format(a=a, b=b), (a, b), rule)

    def compare(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.dtype != torch.bool, exact=True)
        b = self.other_like(a, exact=True) if rng.random() < 0.7 else None
        op = rng.choice(["<", "<=", ">", ">=", "==", "!="])
        if b is None:
            return Step(self.name("v"), f"{a} {op} {rng.choice(['0', '0.5', '-1', '1'])}", (a,), "pred",
                        needs_exact=True)
        return Step(self.name("v"), f"{a} {op} {b}", (a, b), "pred", needs_exact=True)

    def where(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.dtype != torch.bool)
        ta = self.t(a)
        conds = self.values(lambda t: t.dtype == torch.bool and _broadcastable(t.shape, ta.shape))
        c = rng.choice(conds) if conds and rng.random() < 0.6 else self.new_input(
            tuple(1 if rng.random() < 0.3 else s for s in ta.shape), "torch.bool")
        r = rng.random()
        if r < 0.15:
            return Step(self.name("v"), f"torch.where({c}, {a}, {a})", (c, a), "keep")
        if r < 0.4:
            return Step(self.name("v"), f"torch.where({c}, {a}, 1)", (c, a), "addc", arg=1)
        if r < 0.55:
            return Step(self.name("v"), f"{a}.masked_fill({c}, -1)", (a, c), "addc", arg=1)
        b = self.other_like(a)
        return Step(self.name("v"), f"torch.where({c}, {a}, {b})", (c, a, b), "keep")

    def reduce(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.dim() > 0)
        ta = self.t(a)
        r = ta.dim()
        dims = sorted(rng.sample(range(r), rng.randint(1, min(r, 2)))) if rng.random() < 0.4 else [rng.randrange(r)]
        dims = [d - r if rng.random() < 0.3 else d for d in dims]
        dim = dims[0] if len(dims) == 1 else tuple(dims)
        kd = rng.random() < 0.5
        K = 1
        for d in dims:
            K *= ta.shape[d]
        if ta.dtype == torch.bool:
            op = rng.choice(["any", "all", "sum"])
            d1 = dims[0]
            if op == "sum":
                return Step(self.name("v"), f"{a}.sum({dim!r}, keepdim={kd})", (a,), "int", arg=K)
            return Step(self.name("v"), f"{a}.{op}({d1}, keepdim={kd})", (a,), "pred")
        if not ta.is_floating_point():
            op = rng.choice(["sum", "amax", "amin", "prod"])
            if op == "prod":
                return Step(self.name("v"), f"{a}.clamp(-2, 2).prod({dims[0]}, keepdim={kd})", (a,), "prodk",
                            arg=ta.shape[dims[0]])
            return Step(self.name("v"), f"{a}.{op}({dim!r}, keepdim={kd})", (a,), "sum" if op == "sum" else "keep",
                        arg=K)
        op = rng.choice(["sum", "sum", "mean", "amax", "amin", "var", "logsumexp", "argmax", "argmin", "prod",
                         "std", "norm", "cumsum", "softmax", "log_softmax", "max_dim"])
        d1 = dims[0]
        n1 = ta.shape[d1]
        if op == "sum":
            return Step(self.name("v"), f"{a}.sum({dim!r}, keepdim={kd})", (a,), "sum", arg=K)
        if op == "mean":
            return Step(self.name("v"), f"{a}.mean({dim!r}, keepdim={kd})", (a,), "reduce", arg=K)
        if op in ("amax", "amin"):
            return Step(self.name("v"), f"{a}.{op}({dim!r}, keepdim={kd})", (a,), "keep")
        if op in ("var", "std"):
            return Step(self.name("v"), f"{a}.{op}({dim!r}, keepdim={kd}, correction=0)", (a,),
                        "std" if op == "std" else "reduce", arg=K)
        if op == "logsumexp":
            return Step(self.name("v"), f"{a}.logsumexp({dim!r}, keepdim={kd})", (a,), "reduce", arg=K)
        if op in ("argmax", "argmin"):
            return Step(self.name("v"), f"{a}.{op}({d1}, keepdim={kd})", (a,), "int", arg=n1, needs_exact=True)
        if op == "max_dim":
            return Step(self.name("v"), f"{a}.max({d1}, keepdim={kd}).values", (a,), "keep")
        if op == "prod":
            return Step(self.name("v"), f"{a}.clamp(-1.5, 1.5).prod({d1}, keepdim={kd})", (a,), "prodk", arg=n1)
        if op == "norm":
            return Step(self.name("v"), f"torch.linalg.vector_norm({a}, dim={dim!r}, keepdim={kd})", (a,), "reduce",
                        arg=K)
        if op == "cumsum":
            return Step(self.name("v"), f"{a}.cumsum({d1})", (a,), "sum", arg=n1)
        return Step(self.name("v"), f"torch.{op}({a}, {d1})", (a,), "reduce", arg=n1)

    def norm(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.is_floating_point() and t.dim() > 0)
        ta = self.t(a)
        n = ta.shape[-1]
        kind = rng.choice(["layer_norm", "layer_norm_mod", "rms", "ln_fn_noaffine"])
        dt = _dtype_code(ta.dtype)
        if kind == "layer_norm":
            w, b = self.new_input((n,), dt), self.new_input((n,), dt)
            return Step(self.name("v"), f"F.layer_norm({a}, ({n},), {w}, {b})", (a, w, b), "norm", arg=3 * n)
        if kind == "ln_fn_noaffine":
            return Step(self.name("v"), f"F.layer_norm({a}, ({n},))", (a,), "norm", arg=3 * n)
        m = self.name("ln" if kind == "layer_norm_mod" else "rms")
        cls = "LayerNorm" if kind == "layer_norm_mod" else "RMSNorm"
        init = f"self.{m} = grid_init(torch.nn.{cls}({n}, dtype={dt}), {rng.randrange(10**6)})"
        return Step(self.name("v"), f"self.{m}({a})", (a,), "norm", arg=3 * n, init=(init,))

    def shape_op(self) -> Step:
        rng = self.rng
        a = self.pick()
        ta = self.t(a)
        r, s = ta.dim(), tuple(ta.shape)
        opts = ["unsqueeze", "reshape", "flatten", "clone", "contiguous"]
        if r >= 1:
            opts += ["slice", "slice", "select", "narrow", "flip", "roll", "repeat", "cat", "stack", "chunk", "pad",
                     "view"]
        if r >= 2:
            opts += ["permute", "transpose", "transpose", "tril", "movedim", "t_contig"]
        if any(d == 1 for d in s):
            opts += ["expand", "squeeze"]
        op = rng.choice(opts)
        keep = (a,)
        if op == "unsqueeze":
            return Step(self.name("v"), f"{a}.unsqueeze({rng.randint(-r - 1, r)})", keep, "keep")
        if op in ("reshape", "view"):
            shape = list(s)
            if r >= 2 and rng.random() < 0.5:
                i = rng.randint(0, r - 2)
                shape[i:i + 2] = [shape[i] * shape[i + 1]]
            elif shape and shape[-1] % 2 == 0 and shape[-1] > 0:
                shape[-1:] = [2, shape[-1] // 2]
            elif rng.random() < 0.5 and 0 not in shape:
                shape = [-1]
            else:
                shape = shape + [1]
            return Step(self.name("v"), f"{a}.{op}({_fmt_shape(shape)})", keep, "keep")
        if op == "flatten":
            return Step(self.name("v"), f"{a}.flatten({rng.randint(0, max(r - 1, 0)) if r else 0})", keep, "keep")
        if op in ("clone", "contiguous"):
            return Step(self.name("v"), f"{a}.{op}()", keep, "keep")
        if op == "t_contig":
            return Step(self.name("v"), f"{a}.transpose(-1, -2).contiguous()", keep, "keep")
        if op == "permute":
            perm = list(range(r))
            rng.shuffle(perm)
            return Step(self.name("v"), f"{a}.permute{_fmt_shape(perm)}", keep, "keep")
        if op == "transpose":
            d0, d1 = rng.randrange(r), rng.randrange(r)
            return Step(self.name("v"), f"{a}.transpose({d0}, {d1})", keep, "keep")
        if op == "movedim":
            return Step(self.name("v"), f"{a}.movedim({rng.randrange(r)}, {rng.randrange(r)})", keep, "keep")
        if op == "tril":
            return Step(self.name("v"), f"{a}.{rng.choice(['tril', 'triu'])}({rng.randint(-2, 2)})", keep, "keep")
        if op == "expand":
            shape = [rng.choice((2, 3, 4)) if d == 1 and rng.random() < 0.7 else d for d in s]
            if rng.random() < 0.3:
                shape = [2] + shape
            return Step(self.name("v"), f"{a}.expand{_fmt_shape(shape)}", keep, "keep")
        if op == "squeeze":
            d = rng.choice([i for i, x in enumerate(s) if x == 1])
            return Step(self.name("v"), f"{a}.squeeze({d})", keep, "keep")
        d = rng.randrange(r)
        n = s[d]
        if op == "slice":
            st = rng.choice((1, 1, 2, 3))
            lo = rng.randint(-n - 1, n)
            hi = rng.choice([None, rng.randint(-n, n + 1)])
            idx = ", ".join([":"] * d + [f"{lo}:{'' if hi is None else hi}:{st}"])
            return Step(self.name("v"), f"{a}[{idx}]", keep, "keep")
        if op == "select":
            if n == 0:
                raise _Skip
            return Step(self.name("v"), f"{a}.select({d}, {rng.randint(-n, n - 1)})", keep, "keep")
        if op == "narrow":
            start = rng.randint(0, n)
            return Step(self.name("v"), f"{a}.narrow({d}, {start}, {rng.randint(0, n - start)})", keep, "keep")
        if op == "flip":
            return Step(self.name("v"), f"{a}.flip({d})", keep, "keep")
        if op == "roll":
            return Step(self.name("v"), f"{a}.roll({rng.randint(-3, 3)}, {d})", keep, "keep")
        if op == "repeat":
            reps = [rng.choice((1, 1, 2)) for _ in range(r + rng.randint(0, 1))]
            return Step(self.name("v"), f"{a}.repeat{_fmt_shape(reps)}", keep, "keep")
        if op in ("cat", "stack"):
            same = [x for x in self.values(lambda t: _cat_ok(t, ta, d, op == "stack"))]
            b = rng.choice(same) if same and rng.random() < 0.6 else a
            if rng.random() < 0.3:
                return Step(self.name("v"), f"torch.{op}([{a}, -{b}, {b} * 2], {d})", (a, b), "const_mul", arg=2)
            return Step(self.name("v"), f"torch.{op}([{a}, {b}], {d})", (a, b), "keep")
        if op == "chunk":
            k = rng.randint(1, 3)
            return Step(self.name("v"), f"{a}.chunk({k}, {d})[{rng.randint(-1, 0)}]", keep, "keep")
        pads = [rng.randint(-1, 2) for _ in range(2 * rng.randint(1, min(r, 2)))]
        return Step(self.name("v"), f"F.pad({a}, {tuple(pads)!r})", keep, "keep")

    def matmul(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.is_floating_point() and t.dim() >= 1)
        ta = self.t(a)
        k = ta.shape[-1]
        n = rng.choice((1, 3, 4, 5, 8, 16) + ((33, 64, 96) if self.large else ()))
        dt = _dtype_code(ta.dtype)
        kind = rng.choice(["param", "input", "linear", "linear_mod", "einsum", "bmm", "self"])
        if kind == "self" and ta.dim() >= 2:
            return Step(self.name("v"), f"{a} @ {a}.transpose(-1, -2)", (a, a), "matmul", arg=k)
        if kind == "param":
            p = self.name("w")
            init = f"self.{p} = torch.nn.Parameter(grid(({k}, {n}), {rng.randrange(10**6)}, {dt}, -8, 8))"
            return Step(self.name("v"), f"{a} @ self.{p}", (a,), "matmul1", arg=k, init=(init,))
        if kind == "linear":
            w, b = self.new_input((n, k), dt), self.new_input((n,), dt)
            return Step(self.name("v"), f"F.linear({a}, {w}, {b})", (a, w, b), "linear", arg=k)
        if kind == "linear_mod":
            m = self.name("lin")
            bias = rng.random() < 0.7
            init = f"self.{m} = grid_init(torch.nn.Linear({k}, {n}, bias={bias}, dtype={dt}), {rng.randrange(10**6)})"
            return Step(self.name("v"), f"self.{m}({a})", (a,), "matmul1", arg=k + 1, init=(init,))
        if kind == "einsum" and ta.dim() >= 2:
            w = self.new_input((ta.shape[-2], n), dt)
            return Step(self.name("v"), f"torch.einsum('...ij,ik->...jk', {a}, {w})", (a, w), "matmul",
                        arg=ta.shape[-2])
        if kind == "bmm" and ta.dim() == 3:
            w = self.new_input((ta.shape[0], k, n), dt)
            return Step(self.name("v"), f"torch.bmm({a}, {w})", (a, w), "matmul", arg=k)
        batch = () if rng.random() < 0.6 or ta.dim() < 3 else (ta.shape[-3] if rng.random() < 0.5 else 1,)
        w = self.new_input(batch + (k, n), dt)
        return Step(self.name("v"), f"torch.matmul({a}, {w})", (a, w), "matmul", arg=k)

    def index(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.dim() >= 1)
        ta = self.t(a)
        r = ta.dim()
        d = rng.randrange(r)
        n = ta.shape[d]
        if n == 0:
            raise _Skip
        kind = rng.choice(["index_select", "gather", "take", "take_neg", "index_add", "embedding", "embedding_mod",
                           "take_along"] * 4 + ["scatter_add", "scatter_value", "index_put_acc"] * 2
                          + ["mask_select"])
        if kind == "index_select":
            i = self.new_input((rng.randint(0, 5),), "torch.int64", high=n)
            return Step(self.name("v"), f"{a}.index_select({d}, {i})", (a, i), "keep")
        if kind == "gather":
            shape = tuple(rng.randint(1, s) if s else 0 for s in ta.shape)
            i = self.new_input(shape, "torch.int64", high=n)
            return Step(self.name("v"), f"torch.gather({a}, {d}, {i})", (a, i), "keep")
        if kind in ("take", "take_neg"):
            n0 = ta.shape[0]
            if n0 == 0:
                raise _Skip
            i = self.new_input((rng.randint(1, 3), rng.randint(1, 3)), "torch.int64", high=n0,
                               low=-n0 if kind == "take_neg" else 0)
            if r >= 2 and rng.random() < 0.4:
                j = self.new_input((rng.randint(1, 3),), "torch.int64", high=ta.shape[1] or 1)
                if ta.shape[1] == 0:
                    raise _Skip
                return Step(self.name("v"), f"{a}[:, {j}]", (a, j), "keep")
            return Step(self.name("v"), f"{a}[{i}]", (a, i), "keep")
        if kind == "take_along":
            i = self.new_input(tuple(s if k != d else rng.randint(1, 3) for k, s in enumerate(ta.shape)),
                               "torch.int64", high=n)
            return Step(self.name("v"), f"torch.take_along_dim({a}, {i}, {d})", (a, i), "keep")
        if kind == "index_add":
            i = self.new_input((rng.randint(1, 4),), "torch.int64", high=n)
            src_shape = tuple(self._len(i) if k == d else s for k, s in enumerate(ta.shape))
            src = self.new_input(src_shape, _dtype_code(ta.dtype) if ta.dtype != torch.bool else "torch.bool")
            reads = (a,) + (src,) * self._len(i) + (i,)  # each index may repeat: |result| <= |a| + L |src|
            return Step(self.name("v"), f"{a}.index_add({d}, {i}, {src})", reads, "add")
        if kind in ("scatter_add", "scatter_value"):
            along = rng.randint(1, 4)
            shape = tuple(along if k == d else rng.randint(1, s) if s else 0 for k, s in enumerate(ta.shape))
            i = self.new_input(shape, "torch.int64", high=n)
            if kind == "scatter_value":
                value = "True" if ta.dtype == torch.bool else rng.choice(("3", "-2")) if not ta.is_floating_point() \
                    else rng.choice(("0.5", "-2.0", "7.25"))
                return Step(self.name("v"), f"{a}.scatter({d}, {i}, {value})", (a, i), "keep")
            if ta.dtype == torch.bool:
                raise _Skip
            src = self.new_input(shape, _dtype_code(ta.dtype))
            return Step(self.name("v"), f"torch.scatter_add({a}, {d}, {i}, {src})", (a,) + (src,) * along + (i,),
                        "add")
        if kind == "index_put_acc":  # rows added at (possibly repeated, negative) ids: the embedding gradient
            n0 = ta.shape[0]
            if ta.dtype == torch.bool or n0 == 0:
                raise _Skip
            rows = rng.randint(1, 3)
            i = self.new_input((rows,), "torch.int64", high=n0, low=-n0)
            src = self.new_input((rows,) + tuple(ta.shape[1:]), _dtype_code(ta.dtype))
            return Step(self.name("v"), f"{a}.index_put(({i},), {src}, accumulate=True)",
                        (a,) + (src,) * rows + (i,), "add")
        if kind in ("embedding", "embedding_mod"):
            if not ta.is_floating_point() or r != 2:
                raise _Skip
            idx = self.new_input(self.shape(rng.randint(1, 2)), "torch.int64", high=ta.shape[0])
            if kind == "embedding":
                return Step(self.name("v"), f"F.embedding({idx}, {a})", (idx, a), "keep")
            m = self.name("emb")
            dim = rng.choice((3, 4, 8))
            rows = rng.choice((3, 5, 10))
            idx = self.new_input(self.shape(rng.randint(1, 2)), "torch.int64", high=rows)
            init = f"self.{m} = grid_init(torch.nn.Embedding({rows}, {dim}, dtype={self.fd}), {rng.randrange(10**6)})"
            return Step(self.name("v"), f"self.{m}({idx})", (idx,), "keep", init=(init,))
        # boolean mask: data-dependent shape (a refusal is the expected, clear answer)
        m = self.new_input(ta.shape, "torch.bool")
        return Step(self.name("v"), f"{a}[{m}]", (a, m), "keep")

    def _len(self, name: str) -> int:
        for spec in self.pending_inputs:
            if spec.name == name:
                return spec.shape[0]
        return self.t(name).shape[0]

    def cast(self) -> Step:
        rng = self.rng
        a = self.pick()
        ta = self.t(a)
        if ta.is_floating_point():
            to = rng.choice(["F32", "BF16", "torch.int64", "torch.bool"])
            if to in ("torch.int64", "torch.bool"):
                return Step(self.name("v"), f"{a}.to({to})", (a,), "round" if to == "torch.int64" else "pred",
                            needs_exact=True)
            return Step(self.name("v"), f"{a}.to({to})", (a,), "keep")
        to = rng.choice(["F32", "BF16", "torch.int64", "torch.bool"])
        return Step(self.name("v"), f"{a}.to({to})", (a,), "pred" if to == "torch.bool" else "keep")

    def generator(self) -> Step:
        rng = self.rng
        a = self.pick()
        ta = self.t(a)
        kind = rng.choice(["ones_like", "full_like", "arange", "zeros", "add_ones"])
        if kind == "ones_like":
            return Step(self.name("v"), f"torch.ones_like({a})", (a,), "const", arg=1)
        if kind == "full_like":
            return Step(self.name("v"), f"torch.full_like({a}, 1.5)", (a,), "const", arg=2)
        if kind == "arange":
            n = rng.choice((0, 1, 4, 7))
            return Step(self.name("v"), f"torch.arange({n}, dtype={rng.choice(['F32', 'torch.int64'])})", (), "const",
                        arg=n)
        if kind == "zeros":
            return Step(self.name("v"), f"torch.zeros({_fmt_shape(ta.shape)}, dtype={_dtype_code(ta.dtype)})", (),
                        "const", arg=0)
        return Step(self.name("v"), f"{a} + torch.ones({_fmt_shape(ta.shape[-1:])}, dtype={_dtype_code(ta.dtype)})",
                    (a,), "const_add", arg=1)

    def inplace(self) -> Step:
        rng = self.rng
        target = rng.random()
        if target < 0.35:  # on a fresh clone
            a = self.pick(lambda t: t.dtype != torch.bool)
            base = f"{a}.clone()"
            reads = [a]
        elif target < 0.65:  # on an intermediate value (later reads see the new value)
            names = [n for n in self.values(lambda t: t.dtype != torch.bool) if n.startswith("v")]
            if not names:
                raise _Skip
            a = rng.choice(names)
            base, reads = a, [a]
        else:  # on an input or a view of one: the caller's tensor is mutated
            names = [n for n in self.values(lambda t: t.dtype != torch.bool) if n.startswith("x")]
            if not names:
                raise _Skip
            a = rng.choice(names)
            ta = self.t(a)
            if ta.dim() >= 1 and ta.shape[-1] > 1 and rng.random() < 0.4:
                base = f"{a}[..., 1:]"
            else:
                base = a
            reads = [a]
        ta = self.t(reads[0])
        is_float = ta.is_floating_point()
        ops = [(".mul_(2)", "scale", 2), (".add_(1)", "const_add", 1), (".neg_()", "keep", 0),
               (".zero_()", "keep", 0), (".fill_(1)", "const_add", 1), (".clamp_(-1, 1)", "keep", 0)]
        if is_float:
            ops += [(".relu_()", "keep", 0), (".tanh_()", "inexact", 0), (".exp_()", "inexact", 0),
                    (".div_(4)", "scale", 0.25), (".sigmoid_()", "inexact", 0)]
        op, rule, arg = rng.choice(ops + [("binary", "", 0)])
        if op == "binary":
            b = self.other_like(reads[0])
            op, rule = rng.choice([(f".add_({b})", "add"), (f".mul_({b})", "mul"), (f".sub_({b})", "add"),
                                   (f".copy_({b})", "keep")])
            reads = reads + [b]
        return Step(self.name("v"), base + op, tuple(reads), rule, arg=arg, inplace=not base.endswith(".clone()"))

    def conv(self) -> Step:
        rng = self.rng
        a = self.pick(lambda t: t.is_floating_point() and t.dim() == 3 and t.shape[-1] >= 3 and t.shape[1] > 0)
        ta = self.t(a)
        cin, cout, k = ta.shape[1], rng.choice((1, 2, 4)), rng.choice((1, 3))
        m = self.name("conv")
        init = (f"self.{m} = grid_init(torch.nn.Conv1d({cin}, {cout}, {k}, padding={k // 2}, "
                f"dtype={_dtype_code(ta.dtype)}), {rng.randrange(10**6)})")
        return Step(self.name("v"), f"self.{m}({a})", (a,), "matmul1", arg=cin * k + 1, init=(init,))

    def attention(self) -> Step:
        """softmax(q k^T * s [+ mask]) v, written out or as F.scaled_dot_product_attention (the
        shapes fuse_attention rewrites: heads, GQA, causal, masks)."""
        rng = self.rng
        cands = self.values(lambda t: t.is_floating_point() and t.dim() == 4 and 0 < t.shape[-1] <= 64
                            and t.numel() > 0)
        dt = self.fd
        if cands and rng.random() < 0.5:
            q = rng.choice(cands)
            b, h, t, d = self.t(q).shape
            dt = _dtype_code(self.t(q).dtype)
        else:
            b, h = rng.choice((1, 2)), rng.choice((1, 2, 4))
            t, d = rng.choice((1, 3, 8, 16) + ((33, 64) if self.large else ())), rng.choice((4, 8, 16))
            q = self.new_input((b, h, t, d), dt)
        hk = rng.choice([x for x in (1, h) if h % x == 0])  # GQA: fewer key/value heads
        tk = rng.choice((t, max(t // 2, 1), t + 3))
        k, v = self.new_input((b, hk, tk, d), dt), self.new_input((b, hk, tk, d), dt)
        causal = tk == t and rng.random() < 0.4
        scale = 1 / d ** 0.5
        if rng.random() < 0.5:
            gqa = ", enable_gqa=True" if hk != h else ""
            return Step(self.name("v"), f"F.scaled_dot_product_attention({q}, {k}, {v}, is_causal={causal}{gqa})",
                        (q, k, v), "reduce", arg=2 * tk * d)
        rep = f".repeat_interleave({h // hk}, 1)" if hk != h else ""
        scores = f"({q} @ {k}{rep}.transpose(-1, -2)) * {scale!r}"
        if causal:
            scores = f"{scores}.masked_fill(torch.ones({t}, {tk}, dtype=torch.bool).triu(1), float('-inf'))"
        elif rng.random() < 0.3:
            m = self.new_input((1, 1, t, tk), dt)
            scores = f"({scores} + {m})"
            return Step(self.name("v"), f"torch.softmax({scores}, -1) @ {v}{rep}", (q, k, v, m), "reduce",
                        arg=2 * tk * d)
        return Step(self.name("v"), f"torch.softmax({scores}, -1) @ {v}{rep}", (q, k, v), "reduce", arg=2 * tk * d)

    FAMILIES = (("unary", 14), ("binary", 14), ("compare", 5), ("where", 5), ("reduce", 10), ("norm", 3),
                ("shape_op", 14), ("matmul", 6), ("index", 6), ("cast", 5), ("generator", 2), ("inplace", 6),
                ("conv", 1), ("attention", 2))

    # ------------------------------------------------------------------ driver
    def seed_inputs(self) -> None:
        rng = self.rng
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            r = rng.random()
            shape = self.shape()
            if r < 0.12:
                self.new_input(shape, "torch.int64", high=5, low=-4)
            elif r < 0.18:
                self.new_input(shape, "torch.bool")
            else:
                self.new_input(shape)
        self.prog.inputs = self.pending_inputs
        self.pending_inputs = []
        self.analysis = analyze(self.prog)
        assert self.analysis.ok, self.analysis.error

    def grow(self, n_steps: int) -> None:
        names = [f for f, _ in self.FAMILIES]
        weights = [w for _, w in self.FAMILIES]
        tries = 0
        while len(self.prog.steps) < n_steps and tries < n_steps * 8:
            tries += 1
            fam = self.rng.choices(names, weights)[0]
            self.pending_inputs = []
            try:
                step = getattr(self, fam)()
            except _Skip:
                continue
            step = _fix_rule(step)
            cand = Program(self.prog.seed, self.prog.inputs + self.pending_inputs, self.prog.steps + [step],
                           [step.out], self.prog.freeze, self.prog.note)
            a = analyze(cand)
            if not a.ok or not _small(a, self.max_numel):
                continue
            self.prog.inputs, self.prog.steps = cand.inputs, cand.steps
            self.analysis = a

    def choose_outputs(self) -> None:
        rng = self.rng
        read = {r for st in self.prog.steps for r in st.reads}
        sinks = [st.out for st in self.prog.steps if st.out not in read]
        outs = sinks or [self.prog.steps[-1].out] if self.prog.steps else [self.prog.inputs[0].name]
        extra = [st.out for st in self.prog.steps if st.out not in outs]
        if extra and rng.random() < 0.3:
            outs.append(rng.choice(extra))
        if rng.random() < 0.05:
            outs.append(self.prog.inputs[0].name)  # an input returned as is: eager's output aliases it
        if len(outs) > 1 and rng.random() < 0.05:
            outs.append(outs[0])  # the same value twice
        self.prog.outputs = outs


def _fix_rule(step: Step) -> Step:
    """Map the generator's shorthand rules onto `program._rule`'s."""
    from dataclasses import replace

    r = step.rule
    if r == "const_add":  # x + c (c small): exact with a bound grown by c
        return replace(step, rule="addc")
    if r == "const_mul":
        return replace(step, rule="mulc")
    if r == "matmul1":  # against a grid parameter of bound 1
        return replace(step, rule="matmulp")
    if r == "linear":
        return replace(step, rule="matmul")
    if r == "prodk":
        return replace(step, rule="prod")
    return step


def _dkind(t: torch.Tensor) -> str:
    return "b" if t.dtype == torch.bool else "f" if t.is_floating_point() else "i"


def _dtype_code(dt: torch.dtype) -> str:
    return {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "torch.int64", torch.bool: "torch.bool"}.get(
        dt, str(dt))


def _broadcastable(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


def _cat_ok(t: torch.Tensor, ta: torch.Tensor, d: int, stack: bool) -> bool:
    if t.dim() != ta.dim() or t.dtype != ta.dtype:
        return False
    return all(x == y or (k == d and not stack) for k, (x, y) in enumerate(zip(t.shape, ta.shape, strict=True)))


def _small(a: Analysis, limit: int) -> bool:
    return all(t.numel() <= limit * 4 for t in a.values.values())


def generate(seed: int, backend: str = "cpu") -> Program:
    """The program of `seed` for `backend` (deterministic)."""
    g = _Gen(seed, backend)
    g.seed_inputs()
    g.grow(g.rng.randint(2, 6 if g.small else 10))
    if not g.prog.steps:
        g.prog.steps = [Step("v0", f"{g.prog.inputs[0].name} * 2", (g.prog.inputs[0].name,), "scale", arg=2)]
    g.choose_outputs()
    return g.prog

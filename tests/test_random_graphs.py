"""Random-graph differential tests: random compositions of supported ops, compiled vs eager.

Hypothesis draws a small program (a list of steps over a pool of live tensors): elementwise
unary and binary ops with broadcasting, reductions with and without keepdim, views (reshape,
permute, transpose, slice, unsqueeze, expand, select), matmul against a fresh weight,
softmax / log-softmax / layer norm, concatenation, `where` on a comparison, and casts. The
program is generated while running it eagerly, so every step is valid and shapes are known.
It is then compiled with `backend="interpret"` (capture, lowering, the full pass pipeline
including fusion, then the reference interpreter) and the outputs are compared with eager.

Only continuous functions of the computed values are used (comparisons look at inputs only,
no argmax, no float->int casts of computed values), so tiny rounding differences between
eager and compiled code cannot flip a branch and make a correct compiler look wrong.
Derandomized, so CI sees the same examples every run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import novaforge
from novaforge.ir import verify

UNARY = {
    "exp": lambda x: torch.exp(x.clamp(-4, 4)),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "neg": torch.neg,
    "abs": torch.abs,
    "sin": torch.sin,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sqrt": lambda x: torch.sqrt(x.abs()),
    "log": lambda x: torch.log(x.abs() + 1),
    "square": lambda x: x * x,
    "affine": lambda x: x * 0.5 + 1,
    "rsub": lambda x: 1 - x,
    "clamp": lambda x: x.clamp(-1.5, 1.0),
    "pow": lambda x: x.abs() ** 1.5,
    "cast64": lambda x: x.double().to(x.dtype),
}
BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "hypot": lambda a, b: torch.sqrt(a * a + b * b + 1),
}
REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k, unbiased=False),
    "logsumexp": lambda x, d, k: x.logsumexp(d, keepdim=k),
}


@dataclass
class Program:
    """Steps in creation order over a pool of values: ("input", (), (k,)) appends the k-th
    input, any other (name, operand pool indices, static parameters) appends its result."""

    dtype: torch.dtype
    steps: list[tuple[str, tuple[int, ...], tuple[Any, ...]]] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def run(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pool: list[torch.Tensor] = []
        for name, ops, params in self.steps:
            pool.append(tensors[params[0]] if name == "input" else apply(name, [pool[i] for i in ops], params))
        return tuple(pool[i] for i in self.outputs)

    def __str__(self) -> str:
        lines = [f"%{k} = {name}({', '.join(f'%{i}' for i in ops)}{', ' if ops and params else ''}"
                 f"{', '.join(map(str, params))})" for k, (name, ops, params) in enumerate(self.steps)]
        return "\n".join(lines + [f"return {', '.join(f'%{i}' for i in self.outputs)}"])


def apply(name: str, xs: list[torch.Tensor], p: tuple) -> torch.Tensor:
    if name in UNARY:
        return UNARY[name](xs[0])
    if name in BINARY:
        return BINARY[name](xs[0], xs[1])
    if name in REDUCE:
        return REDUCE[name](xs[0], p[0], p[1])
    x = xs[0]
    if name == "where":
        return torch.where(xs[0] > 0, xs[1], xs[2])
    if name == "reshape":
        return x.reshape(p)
    if name == "permute":
        return x.permute(p)
    if name == "transpose":
        return x.transpose(-1, -2)
    if name == "slice":
        d, a, b, s = p
        return x[(slice(None),) * d + (slice(a, b, s),)]
    if name == "unsqueeze":
        return x.unsqueeze(p[0])
    if name == "expand":
        return x.expand(p)
    if name == "select":
        return x.select(p[0], p[1])
    if name == "matmul":
        return x @ xs[1]
    if name == "softmax":
        return torch.softmax(x, p[0])
    if name == "log_softmax":
        return torch.log_softmax(x, p[0])
    if name == "layer_norm":
        return F.layer_norm(x, x.shape[-1:], xs[1], xs[2])
    if name == "cat":
        return torch.cat([x, xs[1] * 2], p[0])
    if name == "pad":
        return F.pad(x, p)
    if name == "repeat":
        return x.repeat(p)
    if name == "flip":
        return x.flip(p)
    if name == "tril":
        return x.tril(p[0])
    if name == "cumsum":
        return x.cumsum(p[0])
    if name == "index_select":
        return x.index_select(p[0], xs[1])
    if name == "gather":
        return x.gather(p[0], xs[1])
    if name == "take":  # advanced indexing on the first axis
        return x[xs[1]]
    if name == "bf16_round":
        return x.to(torch.bfloat16).to(x.dtype)
    raise KeyError(name)


KINDS = ("unary", "unary", "binary", "binary", "reduce", "view", "view", "nn", "where", "cat", "movement", "index")


@st.composite
def programs(draw, dtype: torch.dtype) -> tuple[Program, list[torch.Tensor]]:
    """A random program and its inputs. Hypothesis draws the plan (the first input's shape and
    one seed per step); each step's kind and details (operands, op, parameters) come from a
    generator seeded by its seed, so every example is fully random, not just its first few
    choices. The program is run eagerly as it grows: steps eager rejects are skipped."""
    rank = draw(st.integers(1, 4), label="rank")
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank), label="shape"))
    if draw(st.integers(0, 9), label="zero-size") == 0:
        shape = (0,) + shape[1:]
    plan = draw(st.lists(st.integers(0, 2**31 - 1), min_size=4, max_size=12), label="plan")
    data_seed = draw(st.integers(0, 2**31 - 1), label="data-seed")
    gen = torch.Generator().manual_seed(data_seed)
    prog = Program(dtype)
    pool: list[torch.Tensor] = []
    is_input: list[bool] = []

    def new_input(shape: tuple[int, ...], scale: float = 1.0, high: int | None = None) -> int:
        """A fresh input: random values, or (with `high`) int64 indices in [0, high)."""
        prog.steps.append(("input", (), (sum(is_input),)))
        pool.append(torch.randint(0, high, shape, generator=gen) if high is not None
                    else (torch.randn(shape, generator=gen) * scale).to(dtype))
        is_input.append(True)
        return len(pool) - 1

    new_input(shape)
    for k, seed in enumerate(plan):
        rng = random.Random(f"{data_seed}/{k}/{seed}")  # distinct per step even when Hypothesis draws zeros
        kind = rng.choice(KINDS)
        i = len(pool) - 1 if rng.random() < 0.6 else rng.randrange(len(pool))  # mostly chain: deep graphs
        x = pool[i]
        n_before = len(prog.steps)
        try:
            name, ops, params = _step(kind, rng, i, x, pool, is_input, new_input, dtype)
            out = apply(name, [pool[o] for o in ops], params)
        except (RuntimeError, IndexError, ValueError, _Skip):
            del prog.steps[n_before:]  # eager rejects this step (e.g. amax over a zero-size axis): drop it
            k = sum(1 for st_ in prog.steps if st_[0] == "input")
            del pool[len(prog.steps):], is_input[len(prog.steps):]
            assert sum(is_input) == k
            continue
        prog.steps.append((name, ops, params))
        pool.append(out)
        is_input.append(False)
    used = {o for _, ops, _ in prog.steps for o in ops}
    sinks = [j for j in range(len(pool)) if not is_input[j] and j not in used]
    prog.outputs = sinks or [0]  # every computed value reaches an output, so no step is dead code
    return prog, [t for t, inp in zip(pool, is_input, strict=True) if inp]


class _Skip(Exception):
    pass


def _step(kind, rng: random.Random, i: int, x: torch.Tensor, pool, is_input, new_input, dtype):
    r = x.dim()
    if kind == "unary":
        names = sorted(UNARY) + (["bf16_round"] if is_input[i] and dtype == torch.float32 else [])
        return rng.choice(names), (i,), ()
    if kind == "binary":
        same = [j for j, t in enumerate(pool) if t.shape == x.shape and j != i]
        if same and rng.random() < 0.4:
            j = rng.choice(same)
        else:  # a fresh input broadcasting against x
            bshape = tuple(1 if rng.random() < 0.4 else s for s in x.shape)[rng.randint(0, r):]
            j = new_input(bshape)
        return rng.choice(sorted(BINARY)), ((j, i) if rng.random() < 0.5 else (i, j)), ()
    if r == 0:
        raise _Skip
    if kind == "reduce":
        return rng.choice(sorted(REDUCE)), (i,), (rng.randint(-r, r - 1), rng.random() < 0.5)
    if kind == "view":
        name, params = _view(rng, x)
        return name, (i,), params
    if kind == "nn":
        name = rng.choice(["matmul", "softmax", "log_softmax", "layer_norm"])
        if name == "matmul":
            k = x.shape[-1]
            return name, (i, new_input((k, rng.randint(1, 6)), scale=k ** -0.5 if k else 1.0)), ()
        if name == "layer_norm":
            return name, (i, new_input(x.shape[-1:]), new_input(x.shape[-1:])), ()
        return name, (i,), (rng.randint(-r, r - 1),)
    if kind == "where":  # the condition looks at an input only
        leaves = [j for j, t in enumerate(pool) if is_input[j] and t.shape == x.shape]
        c = rng.choice(leaves) if leaves and rng.random() < 0.5 else new_input(x.shape)
        return "where", (c, i, new_input(x.shape)), ()
    if kind == "cat":
        return "cat", (i, i), (rng.randint(-r, r - 1),)
    d = rng.randint(-r, r - 1)
    if kind == "movement":
        name = rng.choice(["pad", "repeat", "flip", "tril", "cumsum"])
        if name == "pad":
            return name, (i,), tuple(rng.randint(-1, 2) for _ in range(2 * rng.randint(1, r)))
        if name == "repeat":
            return name, (i,), tuple(rng.randint(1, 2) for _ in range(r + rng.randint(0, 1)))
        if name == "tril":
            if r < 2:
                raise _Skip
            return name, (i,), (rng.randint(-2, 2),)
        return name, (i,), ((d,) if name == "cumsum" else tuple({d, rng.randint(-r, r - 1)}))
    n = x.shape[d]  # index: integer index tensors are inputs of the program
    if n == 0:
        raise _Skip
    name = rng.choice(["index_select", "gather", "take"])
    if name == "index_select":
        return name, (i, new_input((rng.randint(0, 5),), high=n)), (d,)
    if name == "gather":
        shape = tuple(rng.randint(1, s) if s else 0 for s in x.shape)
        return name, (i, new_input(shape, high=n)), (d,)
    return name, (i, new_input((rng.randint(1, 3), rng.randint(1, 3)), high=x.shape[0] or 1)), ()


def _view(rng: random.Random, x: torch.Tensor) -> tuple[str, tuple]:
    r = x.dim()
    options = ["unsqueeze", "reshape", "slice", "select"]
    if any(s == 1 for s in x.shape):
        options.append("expand")
    if r >= 2:
        options += ["permute", "transpose"]
    name = rng.choice(options)
    if name == "unsqueeze":
        return name, (rng.randint(-r - 1, r),)
    if name == "reshape":
        shape = list(x.shape)
        if r >= 2 and rng.random() < 0.5:
            a = rng.randint(0, r - 2)
            shape[a:a + 2] = [shape[a] * shape[a + 1]]
        elif shape[-1] % 2 == 0 and shape[-1] > 0:
            shape[-1:] = [2, shape[-1] // 2]
        else:
            shape = [-1]
        return name, tuple(shape)
    if name == "permute":
        perm = list(range(r))
        rng.shuffle(perm)
        return name, tuple(perm)
    if name == "transpose":
        return name, ()
    if name == "slice":
        d = rng.randrange(r)
        n = x.shape[d]
        return name, (d, rng.randint(-n - 1, n), rng.randint(-n - 1, n + 1), rng.randint(1, 3))
    if name == "select":
        d = rng.randint(-r, r - 1)
        n = x.shape[d]
        if n == 0:
            raise _Skip
        return name, (d, rng.randint(-n, n - 1))
    k = rng.choice([k for k, s in enumerate(x.shape) if s == 1])
    shape = list(x.shape)
    shape[k] = rng.randint(2, 4)
    return name, tuple(shape)


def _check(prog: Program, inputs: list[torch.Tensor], mode: str, rtol: float, atol: float) -> None:
    want = prog.run(*inputs)
    compiled = novaforge.compile(prog.run, backend="interpret", capture=mode)
    got = compiled(*inputs)
    stats = compiled.stats()
    verify(stats.graph)
    assert not stats.captured.externs, f"{stats.captured.externs}\n{prog}"
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(w.abs().max())) if w.numel() and w.is_floating_point() else 1.0
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * scale, equal_nan=True,
                                   msg=lambda m: f"{m}\n{mode} capture of the program:\n{prog}")


# no shrinking: a failure prints its (small) program; shrinking would recompile hundreds of times
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(st.data())
def test_random_programs_float32(data: st.DataObject) -> None:
    prog, inputs = data.draw(programs(torch.float32), label="program")
    mode = data.draw(st.sampled_from(["fx", "fx", "export"]), label="capture")
    _check(prog, inputs, mode, rtol=1e-4, atol=1e-5)


@settings(SETTINGS, max_examples=20)
@given(st.data())
def test_random_programs_bfloat16(data: st.DataObject) -> None:
    prog, inputs = data.draw(programs(torch.bfloat16), label="program")
    _check(prog, inputs, "fx", rtol=4e-2, atol=4e-2)

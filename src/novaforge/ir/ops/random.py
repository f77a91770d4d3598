"""Counter-based random numbers: `counter_uniform(counter, seed)`, and the ATen random ops
(dropout, bernoulli, rand) built on it.

A counter-based generator computes each random number from (seed, position) alone, with no
state between elements, so a fused kernel draws its elements wherever it computes them, a
backward kernel could recompute a forward's mask instead of keeping it (the remat pass does
not yet), and CPU and GPU kernels need no generator object. The function is SplitMix64 (Steele, Lea and Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014): the n-th output of a
SplitMix64 stream started at `seed` is `mix(seed + (n + 1) * 0x9E3779B97F4A7C15)`, which is
exactly a hash of the counter n; the stream passes BigCrush. The float is the top 24 bits
times 2^-24: uniform on [0, 1) in steps of 2^-24, the resolution of float32 on [0.5, 1).

Seeds: each random ATen op draws one int64 seed per call from torch's default generator of
its device (one `aten.randint` extern, ordered with the program's other effects), so results
are deterministic per `torch.manual_seed` and differ between calls, as eager's do. The draws
are not eager's own numbers: with the option `random="eager"` the ATen ops stay ATen calls
(externs) and give eager's exact masks, as torch.compile's `fallback_random` does.

Invariant: `counter_uniform` is a pure function of its inputs; the interpreter (`_uniform_ref`,
torch int64 arithmetic), the C++ kernels (`nf_counter_uniform` in nf_cpu.h) and the Triton
kernels (`_nf_counter_uniform`) compute bit-identical floats for the same (counter, seed).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import torch

from ..extern import encode
from ..types import TensorType, is_float
from .core import define, device_of

aten = torch.ops.aten
FAMILY = "random"
MODES = ("counter", "eager")

GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB

_mode: contextvars.ContextVar[str] = contextvars.ContextVar("novaforge_random", default="counter")


class RngReplay:
    """Where each random op of a trace stood in the RNG stream (`positions`, in trace order),
    with torch.get_rng_state / set_rng_state followed: activation checkpointing saves the state
    before its forward and restores it for the recompute in the backward, so the recompute's
    random ops sit at the positions of the forward's and must draw the same numbers. Lowering
    gives the random ops at one position one seed (`position_of`). `restored`: the trace restored
    a saved state (a replay happened)."""

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.restored = False
        self.seeds: dict[int, object] = {}
        self._order: dict[object, int] | None = None

    def position_of(self, fx_node) -> int | None:
        """The stream position of this random FX node, or None when the trace's count of random
        ops does not match the graph's (then each op gets its own seed)."""
        if self._order is None:
            nodes = [n for n in fx_node.graph.nodes if is_random_target(n.target)]
            self._order = {n: i for i, n in enumerate(nodes)} if len(nodes) == len(self.positions) else {}
        i = self._order.get(fx_node)
        return None if i is None else self.positions[i]


_replay: contextvars.ContextVar[RngReplay | None] = contextvars.ContextVar("novaforge_rng_replay", default=None)


@contextlib.contextmanager
def rng_replay(replay: RngReplay | None):
    """Lower with the RNG positions a trace recorded (frontend/capture_fx.py)."""
    token = _replay.set(replay)
    try:
        yield
    finally:
        _replay.reset(token)


def is_random_target(target) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


@contextlib.contextmanager
def random_mode(mode: str):
    """Lower the random ATen ops of what is lowered inside as `mode` ("counter" or "eager")."""
    if mode not in MODES:
        raise ValueError(f"random={mode!r}; expected one of {', '.join(MODES)}")
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 lanes (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(counter: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """The 64-bit SplitMix64 output for each counter (int64 tensors; wrapping arithmetic)."""
    z = seed + (counter + 1) * _signed(GAMMA)
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def _uniform_ref(xs, a):
    counter, seed = xs
    z = splitmix64(counter.to(torch.int64), seed.to(torch.int64))
    return (_shr(z, 40).to(torch.float64) * 2.0**-24).to(a["dtype"])


def _uniform_infer(ts, a):
    counter, seed = ts
    if counter.dtype != torch.int64 or seed.dtype != torch.int64:
        raise TypeError(f"counter_uniform: needs int64 counter and seed, got {counter.dtype} and {seed.dtype}")
    if seed.shape != ():
        raise TypeError(f"counter_uniform: the seed is one 0-d value, got shape {seed.shape}")
    if not is_float(a["dtype"]):
        raise TypeError(f"counter_uniform: dtype {a['dtype']} is not a float")
    return [TensorType(counter.shape, a["dtype"], device_of("counter_uniform", ts))]


counter_uniform = define(
    "counter_uniform", 2, _uniform_infer, _uniform_ref, attrs={"dtype": torch.float32},
    flags={"elementwise"}, flops=12,
    doc="uniform [0, 1) from SplitMix64(seed, counter): a pure function of its int64 inputs", family=FAMILY)


# ------------------------------------------------------------------ lowering
def uniform(ctx, shape, device):
    """float32 IR values uniform on [0, 1) of `shape`: one seed drawn per call (shared by the
    random ops at one RNG position of a trace, see RngReplay), the element's row-major position
    as its counter."""
    replay = _replay.get()
    pos = replay.position_of(ctx.fx_node) if replay is not None and ctx.fx_node is not None else None
    if pos is None and replay is not None and replay.restored:
        raise ctx.unsupported("a random op in a trace that restores the RNG state (activation checkpointing's "
                              "recompute) whose stream position is unknown: its recompute would draw other numbers")
    seed = replay.seeds.get((pos, device)) if pos is not None else None
    if seed is None:
        seed_type = TensorType((), torch.int64, device)
        spec = encode(((0, 1 << 62, []), {"dtype": torch.int64, "device": torch.device(device)}), [],
                      lambda x: False)
        seed = ctx.emit_node("extern_effect", [], {"target": "aten.randint.low", "spec": spec,
                                                    "out_types": (seed_type,), "reason": "the seed of a random op",
                                                    "keep": None}, [seed_type]).out
        if pos is not None:
            replay.seeds[(pos, device)] = seed  # a recompute at this position draws these numbers again
    shape = tuple(shape)
    numel = math.prod(shape) if shape else 1
    counter = ctx.reshape(ctx.emit("iota", (), length=numel, dtype=torch.int64, device=device), shape)
    return ctx.emit("counter_uniform", [counter, seed], dtype=torch.float32)


def uniform_of(ctx, t: TensorType):
    """`uniform` in t's float dtype, still below 1: a 16-bit float keeps the draw's top bits (8 for
    bfloat16, 11 for float16), since rounding 1 - 2^-24 to nearest would give 1."""
    u = uniform(ctx, t.shape, t.device)
    bits = {torch.bfloat16: 8, torch.float16: 11}.get(t.dtype)
    if bits is not None:
        scaled = ctx.emit("mul", [u, ctx.scalar(float(2**bits), torch.float32, t.device)])
        u = ctx.emit("mul", [ctx.emit("floor", [scaled]), ctx.scalar(2.0**-bits, torch.float32, t.device)])
    return ctx.cast(u, t.dtype)


def counter_mode() -> bool:
    return _mode.get() == "counter"


def keep_mask(ctx, shape, device, keep_prob):
    """Bool values, each true with probability `keep_prob` (u < keep_prob)."""
    u = uniform(ctx, shape, device)
    return ctx.emit("lt", [u, ctx.scalar(float(keep_prob), torch.float32, device)])


def dropout(ctx, x, p):
    """(x * mask / (1 - p), mask): ATen's native_dropout in training (p < 1)."""
    v = ctx.val(x)
    t = v.type
    if p >= 1:
        zero = ctx.expand(ctx.scalar(0, t.dtype, t.device), t.shape)
        return zero, ctx.expand(ctx.scalar(False, torch.bool, t.device), t.shape)
    mask = keep_mask(ctx, t.shape, t.device, 1.0 - p)
    acc = ctx.opmath(v).type.dtype
    # x * mask * (1 / (1 - p)), as ATen (a dropped inf or nan stays nan)
    kept = ctx.emit("mul", [ctx.cast(v, acc), ctx.cast(mask, acc)])
    out = ctx.emit("mul", [kept, ctx.scalar(1.0 / (1.0 - p), acc, t.device)])
    return ctx.cast(out, t.dtype), mask


@counter_uniform.lowers(aten.bernoulli.p)
def _lower_bernoulli_p(ctx, x, p=0.5, *, generator=None):
    t = ctx.out_type
    if not counter_mode() or generator is not None or not isinstance(p, int | float):
        return ctx.extern("random")
    return ctx.cast(keep_mask(ctx, t.shape, t.device, p), t.dtype)


@counter_uniform.lowers(aten.bernoulli.default)
def _lower_bernoulli(ctx, x, *, generator=None):
    t = ctx.out_type
    if not counter_mode() or generator is not None:
        return ctx.extern("random")
    probs = ctx.cast(ctx.val(x), torch.float32)
    return ctx.cast(ctx.emit("lt", [uniform(ctx, t.shape, t.device), probs]), t.dtype)


@counter_uniform.lowers(aten.rand_like.default)
def _lower_rand_like(ctx, x, **kwargs):
    t = ctx.out_type
    if not counter_mode() or not is_float(t.dtype):
        return ctx.extern("random")
    return uniform_of(ctx, t)


@counter_uniform.lowers(aten.rand.default)
def _lower_rand(ctx, size, *, generator=None, **kwargs):
    t = ctx.out_type
    if not counter_mode() or generator is not None or not is_float(t.dtype):
        return ctx.extern("random")
    return uniform_of(ctx, t)

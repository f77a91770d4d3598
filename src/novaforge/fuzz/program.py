"""A fuzz program: inputs, module state and straight-line forward steps, as data and as Python.

A `Program` is a list of `Step`s, each one Python statement `out = expr` over earlier names
(inputs `x<i>`, values `v<i>`, module state `self.<name>`), with the module-init lines that
create the state it reads. It renders to a self-contained snippet (`source()`): the prelude
(`grid`, `grid_init`: deterministic data on a binary grid), `class Prog(nn.Module)` and
`make_inputs(variant)`. The same text is what runs (generation, the oracle and the shrinker
exec it), so a printed reproducer is exactly the program that failed.

Float dtypes are written `F32` / `BF16`; the float64 reference (`instantiate(..., f64=True)`)
runs the same text with both bound to float64.

`analyze` re-runs the steps eagerly, one at a time, and derives each value's `Meta`:
whether it is computed *exactly* (a value on a binary grid small enough that every rounding
is exact in its dtype, whatever the evaluation order, so a compiler must reproduce it bit for
bit), its rounding unit, depth, accumulated reduction length and the largest mean magnitude of
the values it was computed from (the error bound's inputs).
Invariant: a step flagged `needs_exact` (comparisons, float->int casts, argmax, ...) only reads
exact values in a valid program, so rounding differences can never flip a discontinuity.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

import torch

PRELUDE = '''import torch
import torch.nn.functional as F

F32, BF16 = torch.float32, torch.bfloat16


def grid(shape, seed, dtype=F32, lo=-24, hi=24):
    """Deterministic values k / 8, lo <= k <= hi (exact in float32 and bfloat16)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(lo, hi + 1, tuple(shape), generator=g) / 8).to(dtype)


def grid_init(m, seed):
    """Overwrite every floating parameter and buffer of m with grid values."""
    with torch.no_grad():
        for i, t in enumerate(list(m.parameters()) + list(m.buffers())):
            if t.is_floating_point():
                t.copy_(grid(t.shape, seed * 31 + i, t.dtype, -8, 8))
    return m
'''

EPS = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float64: 2.0 ** -52}
MANTISSA = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32" | "BF16" | "torch.int64" | "torch.bool"
    seed: int
    high: int = 0  # int64: values in [low, high)
    low: int = 0
    layout: str = ""  # "" contiguous | "t" (stored transposed) | "step" (every other element) | "expand"

    def code(self) -> str:
        s = f"{self.seed} + 1000 * variant"
        shape = list(self.shape)
        if self.layout == "t" and len(shape) >= 2:
            shape[-1], shape[-2] = shape[-2], shape[-1]
        elif self.layout == "step" and shape:
            shape[-1] = shape[-1] * 2
        elif self.layout == "expand" and shape:
            shape[0] = 1
        sh = f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"
        if self.dtype == "torch.int64":
            expr = f"torch.randint({self.low}, {max(self.high, self.low + 1)}, {sh}, generator=torch.Generator()" \
                   f".manual_seed({s}))"
        elif self.dtype == "torch.bool":
            expr = f"(grid({sh}, {s}) > 0)"
        else:
            expr = f"grid({sh}, {s}, {self.dtype})"
        if self.layout == "t" and len(shape) >= 2:
            expr += ".transpose(-1, -2)"
        elif self.layout == "step" and shape:
            expr += "[..., ::2]"
        elif self.layout == "expand" and shape:
            expr += f".expand({', '.join(map(str, self.shape))})"
        return f"    {self.name} = {expr}"


@dataclass(frozen=True)
class Step:
    out: str
    expr: str
    reads: tuple[str, ...]  # value names read (inputs and values; module state is in `init`)
    rule: str = "inexact"  # how Meta propagates (see `_rule`)
    needs_exact: bool = False
    init: tuple[str, ...] = ()  # module __init__ lines this step needs
    arg: float = 0.0  # the rule's parameter (reduction length, scale, bound)
    inplace: bool = False  # the statement mutates its first read (and everything sharing its storage)

    def rename(self, old: str, new: str) -> Step:
        pat = re.compile(rf"\b{re.escape(old)}\b")
        return replace(self, expr=pat.sub(new, self.expr), reads=tuple(new if r == old else r for r in self.reads))


@dataclass
class Program:
    seed: int
    inputs: list[InputSpec]
    steps: list[Step]
    outputs: list[str]
    freeze: bool = False
    note: str = ""  # what the generator chose (dtype, flavour), for the report

    def init_lines(self) -> list[str]:
        seen: list[str] = []
        for st in self.steps:
            for line in st.init:
                if line not in seen:
                    seen.append(line)
        return seen

    def source(self) -> str:
        init = self.init_lines()
        lines = ["class Prog(torch.nn.Module):", "    def __init__(self):", "        super().__init__()"]
        lines += [f"        {x}" for x in init]
        args = ", ".join(["self"] + [i.name for i in self.inputs])
        lines.append(f"    def forward({args}):")
        lines += [f"        {st.out} = {st.expr}" for st in self.steps]
        outs = ", ".join(self.outputs)
        lines.append(f"        return ({outs}{',' if len(self.outputs) == 1 else ''})")
        lines += ["", "", "def make_inputs(variant=0):"]
        lines += [i.code() for i in self.inputs]
        lines.append(f"    return [{', '.join(i.name for i in self.inputs)}]")
        return "\n".join(lines) + "\n"

    def snippet(self, backend: str, finding: str = "") -> str:
        """A runnable reproducer: the program, then eager vs compiled."""
        head = [f"# novaforge fuzz seed {self.seed} ({self.note}); backend={backend!r}"]
        head += [f"# {line}" for line in finding.splitlines()[:12]]
        tail = ["", "", "import novaforge", "", "with torch.no_grad():",
                "    want = Prog().eval()(*make_inputs())",
                f"    got = novaforge.compile(Prog().eval(), backend={backend!r}"
                + (", freeze=True" if self.freeze else "") + ")(*make_inputs())",
                "    for w, g in zip(want, got):",
                "        print(w.dtype, tuple(w.shape), (w.double() - g.double()).abs().max() if w.numel() else '')"]
        return "\n".join(head) + "\n" + PRELUDE + "\n\n" + self.source() + "\n".join(tail) + "\n"

    def size(self) -> int:
        return len(self.steps) * 1000 + len(self.inputs) * 10 + len(self.outputs)


def instantiate(prog: Program, f64: bool = False) -> tuple[type, Any]:
    """(Prog class, make_inputs) from the program's text; with f64 every float dtype is float64."""
    ns: dict[str, Any] = {}
    exec(compile(PRELUDE, "<nf-fuzz-prelude>", "exec"), ns)
    if f64:
        ns["F32"] = ns["BF16"] = torch.float64
    exec(compile(prog.source(), f"<nf-fuzz-{prog.seed}>", "exec"), ns)
    return ns["Prog"], ns["make_inputs"]


# ---------------------------------------------------------------------------------------- meta
@dataclass(frozen=True)
class Meta:
    exact: bool
    mag: float = math.inf  # bound on |value| (meaningful when exact)
    q: float = 1.0  # grid step: every element is an integer multiple of q (exact values)
    eps: float = 0.0  # largest rounding unit the value went through (0: exact)
    depth: int = 0
    red: int = 0  # accumulated reduction length along the way
    scale: float = 0.0  # largest mean |value| along the way (absolute rounding after cancellation)

    @staticmethod
    def of_input(t: torch.Tensor, spec: InputSpec | None = None) -> Meta:
        """Inputs and state: grid floats (|x| <= 3, step 1/8), ints bounded by their spec."""
        if t.dtype == torch.bool:
            return Meta(True, 1.0, 1.0)
        if not t.is_floating_point():
            if spec is not None:
                return Meta(True, float(max(abs(spec.low), abs(spec.high))), 1.0)
            return Meta(True, float(t.abs().max()) if t.numel() else 0.0, 1.0)
        return Meta(True, 3.0, 1 / 8)


def _fits(t: torch.Tensor, mag: float, q: float) -> bool:
    if t.dtype == torch.bool:
        return True
    if not t.is_floating_point():
        return mag <= 2.0 ** 62 and q >= 1
    p = MANTISSA.get(t.dtype, 24)
    return q > 0 and math.isfinite(mag) and mag / q <= 2.0 ** p and q >= 2.0 ** -60


def _rule(step: Step, ins: list[Meta], t: torch.Tensor) -> Meta:
    """The output Meta of `step` from its inputs' Metas and its eager result."""
    exact = all(m.exact for m in ins)
    mags = [m.mag for m in ins] or [0.0]
    qs = [m.q for m in ins] or [1.0]
    r, a = step.rule, step.arg
    mag, q = max(mags), min(qs)
    if r == "keep":
        pass
    elif r == "add":
        mag = sum(mags)
    elif r == "mul":
        mag, q = math.prod(mags), math.prod(qs)
    elif r == "scale":  # times a power of two `a`
        mag, q = mag * abs(a), q * abs(a)
    elif r == "sum":  # over `a` elements
        mag = mag * max(a, 1)
    elif r == "matmul":  # K = a
        mag, q = math.prod(mags) * max(a, 1), math.prod(qs)
    elif r == "matmulp":  # against a grid parameter (|w| <= 1, step 1/8), K = a
        mag, q = mag * max(a, 1), q / 8
    elif r == "addc":  # plus a constant of size <= a
        mag = mag + a
    elif r == "mulc":  # times a constant c, |c| <= a, c a multiple of q
        mag = mag * a
    elif r == "prod":  # product of a elements
        mag, q = (mag ** max(a, 1) if mag < 1e6 else math.inf), q ** max(a, 1)
    elif r == "round":
        mag, q = (math.ceil(mag) if math.isfinite(mag) else mag), max(q, 1.0)
    elif r == "int":  # an integer result bounded by `a` (argmax, counts)
        mag, q = max(a, 1.0), 1.0
    elif r == "pred":
        mag, q = 1.0, 1.0
    elif r == "const":  # an input-free constant bounded by `a` on a grid of 1/8
        exact, mag, q = True, a, 1 / 8
    else:
        exact = False
    if t.dtype == torch.bool:
        q = 1.0
    elif not t.is_floating_point():
        q = max(q, 1.0)
    if exact and not _fits(t, mag, q):
        exact = False
    depth = max((m.depth for m in ins), default=0) + 1
    red = max((m.red for m in ins), default=0) + (int(a) if r in ("sum", "matmul", "matmulp", "reduce", "norm",
                                                                  "std") else 0)
    if exact:
        return Meta(True, mag, q, 0.0, depth, red)
    eps = max([m.eps for m in ins] + [EPS.get(t.dtype, 0.0) if t.is_floating_point() else 0.0])
    if not t.is_floating_point() and t.dtype != torch.bool:
        eps = max(eps, EPS[torch.float32])
    return Meta(False, math.inf, q, eps, depth, red)


@dataclass
class Analysis:
    ok: bool
    values: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Meta] = field(default_factory=dict)
    error: str = ""


def storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return id(t)


def analyze(prog: Program) -> Analysis:
    """Run the steps eagerly (no grad) and derive every value's Meta. Not ok when eager raises,
    a step needing exact inputs reads an inexact value, or a value is not a tensor."""
    try:
        cls, make_inputs = instantiate(prog)
        with torch.no_grad():
            m = cls().eval()
            inputs = make_inputs()
    except Exception as e:  # noqa: BLE001 - the program is invalid
        return Analysis(False, error=f"init: {type(e).__name__}: {e}")
    return run_steps(prog, m, inputs)


def run_steps(prog: Program, module: Any, inputs: list[torch.Tensor],
              jitter: torch.Generator | None = None) -> Analysis:
    """Run the steps on `inputs`; with `jitter`, every inexact floating value is moved by one
    ulp up or down (or kept), at random per element, as it is produced: a Monte Carlo estimate
    of how far the rounding of its evaluation can move each result (values read by steps that
    need exact inputs are exact, so never moved, and no discontinuity flips)."""
    ns: dict[str, Any] = {"torch": torch, "F": torch.nn.functional, "self": module, "F32": torch.float32,
                          "BF16": torch.bfloat16}
    meta: dict[str, Meta] = {}
    for spec, t in zip(prog.inputs, inputs, strict=True):
        ns[spec.name] = t
        meta[spec.name] = replace(Meta.of_input(t, spec), scale=_mean_abs(t))
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        meta["self." + name] = Meta.of_input(t)
    with torch.no_grad():
        for st in prog.steps:
            reads = [meta.get(r, Meta(False)) for r in st.reads]
            if st.needs_exact and not all(x.exact for x in reads):
                return Analysis(False, error=f"{st.out}: needs exact inputs")
            try:
                exec(f"{st.out} = {st.expr}", ns)
            except Exception as e:  # noqa: BLE001 - eager rejects the step
                return Analysis(False, error=f"{st.out} = {st.expr}: {type(e).__name__}: {e}")
            t = ns[st.out]
            if not isinstance(t, torch.Tensor):
                return Analysis(False, error=f"{st.out}: not a tensor")
            if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
                return Analysis(False, error=f"{st.out}: not finite")
            new = replace(_rule(st, reads, t), scale=max([m.scale for m in reads] + [_mean_abs(t)])
                          * _amplification(st, ns, t))
            meta[st.out] = new
            if jitter is not None and not new.exact and t.is_floating_point() and t.numel():
                ns[st.out] = _moved_one_ulp(t, jitter)
            if st.inplace:
                # an in-place step changed every tensor sharing its storage: merge their Metas
                key = storage_key(t)
                for other in list(meta):
                    v = ns.get(other)
                    if isinstance(v, torch.Tensor) and other != st.out and storage_key(v) == key:
                        meta[other] = _worst(meta[other], new)
    values = {k: v for k, v in ns.items() if isinstance(v, torch.Tensor)}
    for o in prog.outputs:
        if o not in values:
            return Analysis(False, error=f"output {o} undefined")
    return Analysis(True, values, meta)


def _moved_one_ulp(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """t with each element moved one ulp up, down or not at all (in place when t's memory
    allows, so views and later in-place steps see the move)."""
    way = torch.randint(-1, 2, t.shape, generator=gen)
    inf = torch.full_like(t, math.inf)
    moved = torch.where(way > 0, t.nextafter(inf), torch.where(way < 0, t.nextafter(-inf), t))
    try:
        return t.copy_(moved)
    except RuntimeError:  # an expanded tensor: the move is a new value
        return moved


def _amplification(st: Step, ns: dict[str, Any], out: torch.Tensor) -> float:
    """How much a normalization magnifies the absolute rounding of its input: x - mean(x) over
    a (nearly) constant row is rounding noise, divided by sqrt(var + 1e-5) (layer norm; measured
    on this data, rows over the last axis, times 2); a standard deviation turns a variance's
    rounding e into sqrt(e), so its unit is sqrt(eps)."""
    if st.rule == "std" and out.is_floating_point():
        return EPS.get(out.dtype, 2.0 ** -23) ** -0.5
    if st.rule != "norm":
        return 1.0
    x = ns.get(st.reads[0])
    if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.dim() == 0:
        return 1.0
    rows = x.detach().double().reshape(-1, x.shape[-1])
    amp = rows.abs().mean(-1) / (rows.var(-1, correction=0) + 1e-5).sqrt()
    return max(1.0, 2 * float(amp.max()))


def _mean_abs(t: torch.Tensor) -> float:
    if t.numel() == 0 or t.dtype == torch.bool:
        return 0.0
    v = float(t.double().abs().mean())
    return v if math.isfinite(v) else 0.0


def _worst(a: Meta, b: Meta) -> Meta:
    scale = max(a.scale, b.scale)
    if a.exact and b.exact:
        return Meta(True, max(a.mag, b.mag), min(a.q, b.q), 0.0, max(a.depth, b.depth), max(a.red, b.red), scale)
    return Meta(False, math.inf, min(a.q, b.q), max(a.eps, b.eps, EPS[torch.float32]), max(a.depth, b.depth),
                max(a.red, b.red), scale)

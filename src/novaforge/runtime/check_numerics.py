"""The numerics checker (`NOVAFORGE_CHECK=numerics` or the option `check="numerics"`).

Every kernel of a compiled program is checked against the reference interpreter on the very
inputs it received, during a real call of the program:

* CPU (`CpuProgram`): the backend builds the program with one entry point per kernel (no
  segment spans two kernels) and installs a `CpuChecker` as the program's observer, which runs
  the program's own steps kernel by kernel. Before a kernel runs, its input buffers are copied;
  after, its outputs are compared with `interpret(kernel.body, those copies)`. The checker also
  keeps a copy of every buffer a later kernel still reads and verifies, after each kernel, that
  none changed: a kernel that writes over a live buffer (a memory-plan error) is named.
* Other backends (`CheckedProgram`): each kernel is built once as a one-kernel program (the
  kernel node alone, planned by place/order/plan_memory, built by the same backend) and run on
  the inputs the reference interpretation of the whole graph gives it; then the real program
  runs and its results are returned.

Tolerance, per element of a float output: |got - ref64| <= 8 |ref - ref64| + eps (4 + 2 ops +
red) (|ref64| + mean |ref64|) + eps (2 + ops) scale, where scale is the largest mean |input| (the
absolute rounding of a result that cancels to ~0), ref the interpreter in the IR's dtypes, ref64 the body
interpreted on float64 copies of the inputs (casts inside still round), eps the rounding unit
of the lowest-precision float dtype in the kernel, ops the number of body nodes and red the
summed reduction lengths (reduced elements, matmul K, attention keys). Integer and bool
outputs must equal ref except where ref and ref64 disagree. Non-finite values must match.

The first kernel outside its tolerance raises `NumericsMismatch`, whose message (and `.report`)
names the kernel (ordinal, name, kind), its ops, the user's source lines of its nodes, the
output, the worst element and its inputs' origins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import settings
from ..ir import OPS, Graph, GraphInput, Node, Value
from ..options import Options
from .interpret import interpret

_EPS = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float64: 2.0 ** -52}


def enabled(options: Options | dict[str, Any] | None) -> bool:
    """Is the numerics check on for a build with these options?"""
    opt = Options.of(options).check
    return opt == "numerics" or (opt is None and settings.check_mode() == "numerics")


@dataclass
class KernelReport:
    ordinal: int
    name: str
    kind: str
    ops: list[str]
    sources: list[str]
    problem: str  # what differs
    output: int = -1
    inputs: list[str] = field(default_factory=list)  # where each input comes from

    def __str__(self) -> str:
        lines = [f"novaforge numerics check: kernel {self.ordinal} ({self.name} [{self.kind}]) {self.problem}",
                 f"  ops: {' '.join(self.ops)}"]
        if self.inputs:
            lines.append("  inputs: " + ", ".join(self.inputs))
        if self.sources:
            lines.append("  source:")
            lines += [f"    {s}" for s in self.sources]
        return "\n".join(lines)


class NumericsMismatch(RuntimeError):
    def __init__(self, report: KernelReport) -> None:
        super().__init__(str(report))
        self.report = report


# ------------------------------------------------------------------------------ tolerance
def _reduction_length(n: Node) -> int:
    d = OPS[n.op]
    if n.op == "matmul":
        return int(n.inputs[0].type.shape[-1]) if n.inputs[0].type.rank else 1
    if n.op == "attention":
        return 2 * int(n.inputs[1].type.shape[-2])
    if d.has("reduction") or d.has("scan"):
        shape = n.inputs[0].type.shape
        axes = n.attrs.get("axes", (n.attrs.get("axis", 0),))
        k = 1
        for a in axes:
            k *= int(shape[a]) if shape else 1
        return k
    if n.op == "kernel":
        return sum(_reduction_length(m) for m in n.attrs["kernel"].body.nodes)
    return 0


@dataclass(frozen=True)
class KernelNumerics:
    eps: float
    ops: int
    red: int
    scale: float = 0.0  # largest mean |input|: absolute rounding of results that cancel to ~0

    def with_inputs(self, args: Sequence[torch.Tensor]) -> KernelNumerics:
        means = [float(a.double().abs().mean()) for a in args if a.numel() and a.dtype != torch.bool]
        finite = [m for m in means if math.isfinite(m)]
        return KernelNumerics(self.eps, self.ops, self.red, max(finite, default=0.0))

    @staticmethod
    def of(body: Graph) -> KernelNumerics:
        dts = [v.type.dtype for v in body.values() if v.type.dtype.is_floating_point]
        eps = max((_EPS.get(d, 2.0 ** -23) for d in dts), default=2.0 ** -23)
        return KernelNumerics(eps, len(body.nodes), sum(_reduction_length(n) for n in body.nodes))


def compare(got: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor, num: KernelNumerics) -> str:
    """'' when got is within tolerance of the reference, else the worst element described."""
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"is {got.dtype}{list(got.shape)}, the interpreter gives {ref.dtype}{list(ref.shape)}"
    if got.numel() == 0:
        return ""
    if not ref.is_floating_point():
        bad = (got != ref) & (ref64.to(ref.dtype) == ref)
        if bool(bad.any()):
            i = tuple(bad.nonzero()[0].tolist())
            return (f"has {int(bad.sum())} of {ref.numel()} elements different; at {list(i)}: {got[i].item()} vs "
                    f"reference {ref[i].item()}")
        return ""
    g, r, r64 = got.double(), ref.double(), ref64.double()
    fin = torch.isfinite(r)
    same = torch.where(fin, torch.isfinite(g), (torch.isnan(g) & torch.isnan(r)) | (g == r))
    if not bool(same.all()):
        i = tuple((~same).nonzero()[0].tolist())
        return f"has a non-finite mismatch at {list(i)}: {g[i].item()} vs reference {r[i].item()}"
    r64 = torch.where(torch.isfinite(r64), r64, r)
    scale = float(r64[fin].abs().mean()) if bool(fin.any()) else 0.0
    tol = (8 * (r - r64).abs() + num.eps * (4 + 2 * num.ops + num.red) * (r64.abs() + scale)
           + num.eps * (2 + num.ops) * num.scale + 1e-30)
    err = (g - r64).abs()
    bad = fin & (err > tol)
    if not bool(bad.any()):
        return ""
    ratio = torch.where(bad, err / tol, torch.zeros_like(err))
    i = tuple(int(x) for x in torch.unravel_index(ratio.argmax(), ratio.shape))
    return (f"has {int(bad.sum())} of {ref.numel()} elements beyond tolerance; worst at {list(i)}: "
            f"{g[i].item():.8g} vs reference {r[i].item():.8g} (float64 {r64[i].item():.8g}, error "
            f"{err[i].item():.3g}, tolerance {tol[i].item():.3g})")


def _upcast(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x.double() if x.is_floating_point() else x for x in xs]


def check_kernel(node: Node, args: Sequence[torch.Tensor], got: Sequence[torch.Tensor]) -> str:
    """'' when the kernel's outputs `got` match its body interpreted on `args`, else the problem
    (with the output index in front: 'output 1 (...) ...')."""
    body = node.attrs["kernel"].body
    ref = interpret(body, list(args), check=False)
    try:
        ref64 = interpret(body, _upcast(args), check=False)
    except Exception:  # noqa: BLE001 - an op without a float64 kernel: compare with ref alone
        ref64 = ref
    num = KernelNumerics.of(body).with_inputs(args)
    for j, (o, g, r, r64) in enumerate(zip(node.outputs, got, ref, ref64, strict=False)):
        msg = compare(g, r, r64, num)
        if msg:
            return f"output {j} ({o!r}) {msg}"
    return ""


def report_for(node: Node, ordinal: int, problem: str, origins: list[str] | None = None) -> KernelReport:
    k = node.attrs["kernel"]
    sources = []
    for n in [node] + list(k.body.nodes):
        s = n.meta.get("source", "")
        if s and s not in sources:
            sources.append(s)
    out = -1
    if problem.startswith("output "):
        out = int(problem.split()[1])
    return KernelReport(ordinal, k.name, k.kind, [n.op for n in k.body.nodes], sources, problem, out, origins or [])


def _origins(graph: Graph, node: Node, ordinal_of: dict[Node, int]) -> list[str]:
    out = []
    for v in node.inputs:
        gi = graph.input_of(v)
        p = graph.producer(v)
        if gi is not None:
            out.append(f"{v!r} ({gi.kind} {gi.name})")
        elif p is not None and p in ordinal_of:
            out.append(f"{v!r} (kernel {ordinal_of[p]})")
        else:
            out.append(repr(v))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().reshape(-1)
    return t.view(torch.uint8) if t.numel() else t


# ------------------------------------------------------------------------------------ CPU
class CpuChecker:
    """Observer of a CpuProgram built with one entry point per kernel (see the module doc)."""

    def __init__(self, graph: Graph, steps: Sequence[Any], kernel_slots: Sequence[tuple[list[int], list[int]]]) -> None:
        self.graph = graph
        self.kernels = [n for n in graph.nodes if n.op == "kernel"]
        self.ordinal_of = {n: i for i, n in enumerate(self.kernels)}
        self.slots = list(kernel_slots)
        self.groups: list[tuple[int, list[int]]] = []
        for i, st in enumerate(steps):
            if st.kernel < 0:
                raise ValueError("numerics check: a step spans several kernels (the program was not built per kernel)")
            if self.groups and self.groups[-1][0] == st.kernel:
                self.groups[-1][1].append(i)
            else:
                self.groups.append((st.kernel, [i]))
        self.last_reader: dict[Value, int] = {}
        for i, n in enumerate(self.kernels):
            for v in n.inputs:
                self.last_reader[v] = i
        self.checked = 0  # kernels checked so far (all calls)

    def __call__(self, runners: Sequence[Callable[[], None]], env: list) -> None:
        live: dict[int, tuple[int, Value, torch.Tensor]] = {}  # slot -> (producer ordinal, value, bytes)
        for k, idxs in self.groups:
            node = self.kernels[k]
            ins, outs = self.slots[k]
            args = [env[s].clone() for s in ins]
            for i in idxs:
                runners[i]()
            got = [env[s] for s in outs]
            problem = check_kernel(node, args, got)
            if problem:
                raise NumericsMismatch(report_for(node, k, problem, _origins(self.graph, node, self.ordinal_of)))
            self.checked += 1
            for s, o in zip(outs, node.outputs, strict=True):
                if self.last_reader.get(o, -1) > k:
                    live[s] = (k, o, _bits(env[s]).clone())
            for s, (p, v, saved) in list(live.items()):
                if self.last_reader.get(v, -1) <= k:
                    del live[s]
                elif p != k and not torch.equal(_bits(env[s]), saved):
                    reader = self.last_reader[v]
                    raise NumericsMismatch(report_for(
                        node, k, f"overwrote {v!r}, written by kernel {p} and still read by kernel {reader} "
                                 f"(its buffer overlaps one of this kernel's: a memory-plan error)",
                        _origins(self.graph, node, self.ordinal_of)))


def install_cpu(program: Any, graph: Graph) -> None:
    program.observer = CpuChecker(graph, program.steps, program.kernel_slots)


# ------------------------------------------------------------------------- other backends
class CheckedProgram:
    """Wraps a program of a backend without an observer hook (see the module doc)."""

    def __init__(self, program: Any, graph: Graph, backend: Any, options: dict[str, Any]) -> None:
        self.program = program
        self.graph = graph
        self.backend = backend
        self.options = Options.of(options).replace(check=None)
        self.kernels = [n for n in graph.nodes if n.op == "kernel"]
        self._single: dict[int, Any] = {}
        self.checked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["program"], name)

    def _one_kernel(self, k: int) -> tuple[Any, list[int]]:
        """The program of kernel k alone, and which of the kernel's inputs it takes (in order)."""
        if k not in self._single:
            from ..passes.pipeline import run_pipeline

            node = self.kernels[k]
            inputs, taken, seen = [], [], set()
            for i, v in enumerate(node.inputs):
                if v in seen:
                    continue
                seen.add(v)
                gi = self.graph.input_of(v)
                if gi is not None and gi.kind == "const":
                    inputs.append(gi)
                else:
                    inputs.append(GraphInput(v, "user", f"in{i}"))
                    taken.append(i)
            g = Graph(inputs, [node], list(node.outputs))
            from ..passes.pipeline import lowering_passes

            passes = [p for p in lowering_passes() if p[0] != "fuse"]
            g, _ = run_pipeline(g, passes=passes, options=self.options, target=self.backend.target(),
                                backend=self.backend, check=False)
            self._single[k] = (self.backend.build(g, self.options), taken)
        return self._single[k]

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env: dict[Value, torch.Tensor] = {}
        it = iter(inputs)
        for gi in self.graph.inputs:
            env[gi.value] = gi.tensor if gi.kind == "const" else next(it)
        ordinal_of = {n: i for i, n in enumerate(self.kernels)}
        for n in self.graph.nodes:
            args = [env[v] for v in n.inputs]
            if n.op != "kernel":
                out = OPS[n.op].impl(args, n.attrs)
                outs = out if isinstance(out, list | tuple) else (out,)
            else:
                k = ordinal_of[n]
                prog, taken = self._one_kernel(k)
                got = prog.run([args[i] for i in taken])[: len(n.outputs)]
                problem = check_kernel(n, args, got)
                if problem:
                    raise NumericsMismatch(report_for(n, k, problem, _origins(self.graph, n, ordinal_of)))
                self.checked += 1
                outs = interpret(n.attrs["kernel"].body, args, check=False)
            for v, t in zip(n.outputs, outs, strict=True):
                env[v] = t
        return self.program.run(inputs)


def maybe_wrap(program: Any, graph: Graph, backend: Any, options: dict[str, Any]) -> Any:
    """The program to run: with the numerics check on, checked kernel by kernel (a CPU program
    already carries its observer; the interpreter is the reference itself)."""
    if program is None or not enabled(options) or getattr(program, "observer", None) is not None:
        return program
    if getattr(backend, "name", "") == "interpret":
        return program
    return CheckedProgram(program, graph, backend, options)

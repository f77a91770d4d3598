"""The verifier: types, SSA and ordering.

Checks that every value is defined exactly once (as a graph input or a node output), that
nodes appear after the definitions of their inputs, that each node's attributes fit its op's
schema and its output types equal what the op table infers, that outputs and mutation targets
are defined, and (recursively) that fused kernel bodies are valid graphs. Runs after every pass
when NOVAFORGE_CHECK=1 and in the test suite.
"""

from __future__ import annotations

from .graph import Graph
from .ops import OPS


class VerifyError(Exception):
    pass


def verify(graph: Graph, where: str = "", _verified: set[str] | None = None) -> None:
    """Raise VerifyError naming the first violation. A kernel body is verified once per call for each
    structural key (kernels with one key have one body structure: an 80-layer model's kernels are
    a few dozen distinct bodies)."""
    verified = set() if _verified is None else _verified
    ctx = f" (after {where})" if where else ""
    defined: set = set()
    for gi in graph.inputs:
        if gi.value in defined:
            raise VerifyError(f"input {gi.name} defined twice{ctx}")
        if gi.kind == "const" and gi.tensor is None:
            raise VerifyError(f"const input {gi.name} has no tensor{ctx}")
        if gi.tensor is not None and tuple(gi.tensor.shape) != gi.value.type.shape:
            raise VerifyError(f"const input {gi.name}: tensor shape {tuple(gi.tensor.shape)} != {gi.value.type}{ctx}")
        defined.add(gi.value)
    for i, n in enumerate(graph.nodes):
        opdef = OPS.get(n.op)
        if opdef is None:
            raise VerifyError(f"node {i}: unknown op {n.op!r}{ctx}")
        lo, hi = opdef.arity
        if len(n.inputs) < lo or (hi is not None and len(n.inputs) > hi):
            raise VerifyError(f"node {i} {n.op}: {len(n.inputs)} inputs, arity {opdef.arity}{ctx}")
        for v in n.inputs:
            if v not in defined:
                raise VerifyError(f"node {i} {n.op}: input {v!r} used before definition{ctx}")
        if set(n.attrs) != set(opdef.attrs):
            raise VerifyError(f"node {i} {n.op}: attributes {sorted(n.attrs)} != schema {sorted(opdef.attrs)}{ctx}")
        try:
            expect = opdef.infer([v.type for v in n.inputs], n.attrs)
        except (TypeError, ValueError) as e:
            raise VerifyError(f"node {i} {n.op}: {e}{ctx}") from e
        got = [o.type for o in n.outputs]
        if got != list(expect):
            raise VerifyError(f"node {i} {n.op}: output types {[str(t) for t in got]} != inferred "
                              f"{[str(t) for t in expect]}{ctx}")
        for o in n.outputs:
            if o in defined:
                raise VerifyError(f"node {i} {n.op}: value {o!r} assigned twice (SSA){ctx}")
            defined.add(o)
        if n.op == "kernel":
            k = n.attrs["kernel"]
            if k.structural_key not in verified:
                verify(k.body, f"{where} / kernel {k.name}", verified)
                verified.add(k.structural_key)
    for v in graph.outputs:
        if v not in defined:
            raise VerifyError(f"output {v!r} is not defined{ctx}")
    inputs = {gi.value for gi in graph.inputs}
    for old, new in graph.mutations:
        if old not in inputs or new not in defined or old.type != new.type:
            raise VerifyError(f"bad mutation {old!r} <- {new!r}{ctx}")

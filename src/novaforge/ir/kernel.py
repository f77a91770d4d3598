"""Kernel: a fused group of IR nodes with one iteration space, produced by the fuse pass.

A kernel's `body` is a complete Graph whose inputs are the values the kernel reads and whose
outputs are the values it writes. Kinds:

* ``pointwise``  elementwise ops (and views folded into indexing) over one output shape;
* ``reduction``  row reductions over the trailing axes of one iteration space, with pointwise
                 prologue and epilogue (LayerNorm, softmax, RMSNorm are one reduction kernel);
* ``matmul``     a matmul anchor with a fused prologue (views as strides, casts) and epilogue
                 (bias, activation, residual add, cast);
* ``attention``  an attention anchor with its prologue and epilogue;
* ``single``     one node the backends run as is (an extern, an index op, a scan, ...).

Invariant: a Kernel is immutable; its `structural_key` depends only on the body's structure
(not on value names), so identical layers produce equal kernels that share compiled code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .graph import Graph, Node
from .structural import graph_key


class KernelKind(StrEnum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    ATTENTION = "attention"
    SINGLE = "single"


KERNEL_KINDS = tuple(KernelKind)


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    kind: KernelKind
    body: Graph
    anchor: int | None = None
    structural_key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", KernelKind(self.kind))  # a str naming a kind is accepted
        if not self.structural_key:
            object.__setattr__(self, "structural_key", graph_key(self.body) + "|" + self.kind)

    @property
    def anchor_node(self) -> Node | None:
        return None if self.anchor is None else self.body.nodes[self.anchor]

    def ops(self) -> list[str]:
        return [n.op for n in self.body.nodes]

    def __hash__(self) -> int:
        return hash(self.structural_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kernel) and other.structural_key == self.structural_key

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.kind}, {len(self.body.nodes)} ops)"

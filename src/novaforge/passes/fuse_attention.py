"""Attention fusion: softmax(Q K^T * scale + mask) V  ->  one `attention` node.

(In progress: this version recognizes nothing yet; see tests/passes/test_fuse_attention.py.)
"""

from __future__ import annotations

from ..ir import Graph
from .context import PassContext


def fuse_attention(graph: Graph, ctx: PassContext | None = None) -> Graph:
    return graph

"""novaforge IR: value-semantic SSA graphs of typed tensor ops (imports nothing else from the package)."""

from .attrs import EMPTY_ATTRS, Attrs
from .graph import Graph, GraphInput, Node, Rewriter, Value, make_node
from .kernel import Kernel
from .ops import OPS, OpDef
from .printer import format_graph
from .structural import graph_key, value_keys
from .types import TensorType
from .verify import VerifyError, verify

__all__ = [
    "EMPTY_ATTRS", "OPS", "Attrs", "Graph", "GraphInput", "Kernel", "Node", "OpDef", "Rewriter",
    "TensorType", "Value", "VerifyError", "format_graph", "graph_key", "make_node", "value_keys", "verify",
]

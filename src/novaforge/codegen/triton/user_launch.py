"""User Triton kernels launched by the Triton program itself (issue 48).

A `kernel` node whose body is one `user_triton` extern (ir/extern.py: a `triton_op`'s
`wrap_triton` launch, or a `@triton.jit` launch Dynamo captured) becomes a program step of kind
`user` instead of a torch step: the program launches the user's kernel over its own grid with
its own arguments and meta-parameters, as written, on the program's stream (so inside its CUDA
graph), and the kernel writes into the node's output slots, which are arena views like every
other intermediate (fresh tensors where they are graph outputs).

Invariant: the step computes what `run_user_triton` computes with fresh copies: each argument
the kernel may write (`clone`) is first copied into its output buffer, and the kernel is
launched once with those buffers in its arguments' places; every other argument is the node's
input (made contiguous, as the lowering required eager's to be). A copy nothing reads (an
argument the kernel may write but does not return; in the interpreter every tensor argument,
since torch's analysis of what a kernel writes needs a GPU) is a scratch buffer of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...ir import OPS, Graph, Kernel, Node, Value
from ...ir.extern import USER_TRITON, decode, resolve, run_user_triton


@dataclass(eq=False)
class UserLaunch:
    """A user kernel launch found in a kernel node's body: the kernel, its extern node, the
    body's nodes before it (the fills and views that make its arguments, such as the zeros of
    the `empty_like` its output started as), and where each extern output goes."""

    name: str  # the kernel's name (for listings)
    kernel: Any  # the @triton.jit kernel
    body: Graph  # the kernel node's body
    extern: Node  # the user_triton extern in it (its last node)
    outputs: tuple[int | None, ...]  # extern output k is node output outputs[k] (None: unused, scratch)

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(decode(self.extern.attrs["spec"], [None] * len(self.extern.inputs))[1]["grid"])

    def launcher(self) -> Callable[..., None]:
        """`launch(*node_inputs, *node_outputs)`, the program's calling convention for steps."""
        kernel, ext, spec, where = self.kernel, self.extern, self.extern.attrs["spec"], self.outputs
        inputs = [gi.value for gi in self.body.inputs]
        pre = list(self.body.nodes[:-1])
        n_in = len(inputs)

        def launch(*tensors: Any) -> None:
            env: dict[Value, Any] = dict(zip(inputs, tensors[:n_in], strict=True))
            for m in pre:  # (small: fills and views of the kernel's arguments)
                res = OPS[m.op].impl([env[v] for v in m.inputs], m.attrs)
                env.update(zip(m.outputs, res if isinstance(res, list | tuple) else (res,), strict=True))
            _, kw = decode(spec, [env[v] for v in ext.inputs])
            outs = [tensors[n_in + j] if j is not None else
                    torch.empty(o.type.shape, dtype=o.type.dtype, device=tensors[-1].device)
                    for j, o in zip(where, ext.outputs, strict=True)]
            run_user_triton(kernel, **kw, outs=outs)

        return launch


def user_launch(kernel: Kernel) -> UserLaunch | None:
    """The launch when `kernel`'s body ends in one user Triton kernel extern whose outputs hold
    every body output and whose other nodes are views or generators (no computation of their
    own worth generating); else None (the node then runs through torch, still correct)."""
    body = kernel.body
    if not body.nodes or not body.outputs:
        return None
    ext = body.nodes[-1]
    target = ext.attrs.get("target", "") if ext.op == "extern" else ""
    if not target.startswith(USER_TRITON + "("):
        return None
    if any(not (OPS[m.op].has("view") or OPS[m.op].family in ("generator", "shape")) for m in body.nodes[:-1]):
        return None
    position = {o: j for j, o in enumerate(body.outputs)}
    if len(position) != len(body.outputs) or any(o not in ext.outputs for o in body.outputs):
        return None
    user = resolve(target).args[0]  # (fails here, at build, if the kernel is not defined in this process)
    return UserLaunch(getattr(user.fn, "__name__", target), user, body, ext,
                      tuple(position.get(o) for o in ext.outputs))

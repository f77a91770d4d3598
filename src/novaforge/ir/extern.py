"""Extern calls: ATen ops kept as calls instead of being lowered to IR primitives.

An extern node's attributes hold the op's qualified name (`aten.cumsum.default`) and a
hashable `spec` of its arguments in which every tensor argument is replaced by a marker
`TensorArg(i)` for the node's i-th input. Invariant: `call_extern(target, spec, inputs)` calls
the op with exactly the arguments the captured program used, so an extern computes what eager
computed.

A user Triton kernel launch (a `torch.library.triton_op`'s kernels, or a `@triton.jit` kernel
Dynamo captured: torch's `triton_kernel_wrapper_functional`) is an extern whose target is
`user_triton(<key>)`: `<key>` names the kernel (module, name and a digest of its source) in
`USER_TRITON_KERNELS`, and its spec holds the launch as written: the grid (already evaluated
over the meta-parameters), every argument by name (tensors as `TensorArg`, constexprs and
scalars as they were), and `clone`, the arguments it returns copies of (those the kernel may
write).
Invariant: `run_user_triton` computes what torch's functional wrapper computes: it copies each
`clone` argument into a fresh buffer (or the caller's preallocated one), launches the kernel
once over the grid with those buffers in their places, and returns the buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorArg:
    index: int


def encode(obj: Any, tensors: list[Any], is_tensor) -> Any:
    """Replace tensor-like leaves (per `is_tensor`) by TensorArg markers, lists by tuples."""
    if is_tensor(obj):
        tensors.append(obj)
        return TensorArg(len(tensors) - 1)
    if isinstance(obj, list | tuple):
        return ("__list__",) + tuple(encode(x, tensors, is_tensor) for x in obj)
    if isinstance(obj, dict):
        return ("__dict__",) + tuple((k, encode(v, tensors, is_tensor)) for k, v in sorted(obj.items()))
    return obj


def decode(spec: Any, xs) -> Any:
    if isinstance(spec, TensorArg):
        return xs[spec.index]
    if isinstance(spec, tuple) and spec and spec[0] == "__list__":
        return [decode(x, xs) for x in spec[1:]]
    if isinstance(spec, tuple) and spec and spec[0] == "__dict__":
        return {k: decode(v, xs) for k, v in spec[1:]}
    return spec


_resolved: dict[str, Any] = {}


FUNCTIONALIZED = "auto_functionalized_v2"  # target prefix of a functionalized mutating (custom) op
USER_TRITON = "user_triton"  # target prefix of a user Triton kernel launch: user_triton(<USER_TRITON_KERNELS key>)
USER_TRITON_KERNELS: dict[str, Any] = {}  # user_triton_key(kernel) -> the @triton.jit kernel (a JITFunction)


def resolve(target: str):
    """The callable of an extern target: an op overload's qualified name (`aten.cumsum.default`),
    or `auto_functionalized_v2(ns.op.overload)`: torch's functional form of an op that mutates
    its arguments (it clones the bases the op writes, calls the op on the clones and returns the
    op's results followed by the clones; its keyword arguments are the HOP node's)."""
    op = _resolved.get(target)
    if op is None:
        if target.startswith(USER_TRITON + "("):
            from functools import partial

            op = partial(run_user_triton, user_triton_kernel(target[len(USER_TRITON) + 1:-1]))
        elif target.startswith(FUNCTIONALIZED + "("):
            from functools import partial

            op = partial(torch.ops.higher_order.auto_functionalized_v2, resolve(target[len(FUNCTIONALIZED) + 1:-1]))
        else:
            ns, name, overload = target.split(".")
            op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        _resolved[target] = op
    return op


COLLECTIVE = "_c10d_functional."  # torch.distributed's functional collectives (asynchronous)


def call_extern(target: str, spec: Any, xs) -> Any:
    args, kwargs = decode(spec, xs)
    out = resolve(target)(*args, **kwargs)
    if target.startswith(COLLECTIVE) and target != COLLECTIVE + "wait_tensor.default":
        # a functional collective returns before its result is written; the program may copy or
        # reuse it before the graph's wait_tensor, so it completes here (that wait is then a no-op)
        wait = torch.ops._c10d_functional.wait_tensor.default
        out = wait(out) if isinstance(out, torch.Tensor) else [wait(t) for t in out]
    if isinstance(out, list):
        out = tuple(out)
    return out


def user_triton_key(kernel: Any) -> str:
    """The name of a user Triton kernel in extern targets, `module.name:<sha256 of its source>[:16]`
    (an edited kernel is another kernel); registers the kernel in USER_TRITON_KERNELS under it."""
    import hashlib

    fn = kernel.fn
    key = f"{fn.__module__}.{fn.__qualname__}:{hashlib.sha256(kernel.src.encode()).hexdigest()[:16]}"
    USER_TRITON_KERNELS.setdefault(key, kernel)
    return key


def user_triton_kernel(key: str) -> Any:
    """The kernel registered under `key`; in a process that loaded its graph from the captured-graph
    cache instead of tracing it, found by its module and name, or among the kernels of the
    `triton_op`s defined so far (only a kernel with the same source)."""
    kernel = USER_TRITON_KERNELS.get(key)
    if kernel is not None:
        return kernel
    import sys

    from torch._library.triton import triton_ops_to_kernels

    module, _, name = key.partition(":")[0].rpartition(".")
    named = getattr(sys.modules.get(module), name, None)
    for k in [named] + [k for ks in triton_ops_to_kernels.values() for k in ks]:
        if hasattr(k, "fn") and hasattr(k, "src") and user_triton_key(k) == key:
            return k
    raise RuntimeError(f"user Triton kernel {key} is not defined in this process with that source (import the "
                       "module that defines it before calling the compiled model; if the kernel was edited since "
                       "this graph was captured and cached, compile with graph_cache=False)")


_interpreted: dict[int, tuple[Any, Any]] = {}  # id(kernel) -> (kernel, its InterpretedFunction)


def launch_user_triton(kernel: Any, grid: tuple[int, ...], kwargs: dict[str, Any]) -> None:
    """`kernel[grid](**kwargs)` on the current stream. On CPU tensors the kernel runs in Triton's
    interpreter (its Python function as an `InterpretedFunction`), which needs triton imported
    with TRITON_INTERPRET=1."""
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    if tensors and all(t.device.type == "cpu" for t in tensors):
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        if type(tl.zeros).__name__ != "InterpretedFunction":
            raise RuntimeError(f"user Triton kernel {kernel.fn.__name__} on CPU tensors runs in Triton's "
                               "interpreter: set TRITON_INTERPRET=1 before anything imports triton")
        pair = _interpreted.get(id(kernel))
        if pair is None or pair[0] is not kernel:
            pair = _interpreted[id(kernel)] = (kernel, InterpretedFunction(kernel.fn))
        pair[1][tuple(grid)](**kwargs)
        return
    kernel[tuple(grid)](**kwargs)


def run_user_triton(kernel: Any, *, grid: tuple[int, ...], kwargs: dict[str, Any], clone: tuple[str, ...],
                    outs: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """One launch as torch's `triton_kernel_wrapper_functional` runs it (see the module invariant);
    `outs`: preallocated buffers for the `clone` arguments (a program's arena), else fresh copies."""
    kwargs = dict(kwargs)
    copies = []
    for i, name in enumerate(clone):
        buf = kwargs[name].clone() if outs is None else outs[i].copy_(kwargs[name])
        kwargs[name] = buf
        copies.append(buf)
    launch_user_triton(kernel, grid, kwargs)
    return tuple(copies)

"""Activation checkpointing's RNG wrappers, unwrapped where the wrapped op draws no random numbers.

`torch.utils.checkpoint` (and transformers' `gradient_checkpointing_enable()`) saves the RNG
state before each op tagged `nondeterministic_seeded` in a checkpointed region and replays the
op under that state in the recompute, so that dropout masks match. In AOTAutograd's graphs that
is two higher-order ops:

    state, out = run_and_save_rng_state(op, *args)      (forward; `state` is saved for backward)
    out = run_with_rng_state(state, op, *args)           (backward's recompute)

They are not ATen operators, so a graph holding them ran uncompiled. The tagged op is often not
random at all with its arguments: scaled_dot_product_attention with `dropout_p=0.0` (every
transformers model's attention in training, as its attention dropout defaults to 0), dropout with
`p=0` or `train=False`. For those the wrappers are replaced by the op itself, and the forward's
saved state by zeros of the state's shape and dtype (nothing reads it: the backward's replay is
unwrapped too).

Invariant: a graph is changed only where the wrapped op's result does not depend on the RNG, so
the rewritten graph computes what the original computes; a truly random op (dropout with p > 0)
keeps its wrappers (the graph then runs as ATen, as before).
"""

from __future__ import annotations

import operator
from typing import Any

import torch

_HOPS = ("run_and_save_rng_state", "run_with_rng_state")


def _rng_free(op: Any, args: tuple, kwargs: dict) -> bool:
    """Does `op(*args, **kwargs)` draw no random numbers? (a dropout probability of 0, or dropout
    not in training mode)"""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    bound: dict[str, Any] = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    if "train" in bound and bound["train"] is False:
        return True
    for name in ("dropout_p", "p"):
        if name in bound:
            p = bound[name]
            return isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0
    return False


def _state_shape(state: torch.Tensor) -> list[int]:
    """The saved RNG state's shape, concrete (Dynamo may give its size a symbol): the device's
    generator state is what the wrapper saves."""
    if all(isinstance(d, int) for d in state.shape):
        return list(state.shape)
    if state.device.type == "cuda":
        return [torch.cuda.get_rng_state(state.device).numel()]
    return [torch.get_rng_state().numel()]


def unwrap_rng_free(gm: torch.fx.GraphModule) -> int:
    """Replace the RNG wrappers of ops that draw no random numbers (module docstring); returns how
    many were replaced. The graph module is changed in place and recompiled."""
    graph = gm.graph
    hops = {getattr(torch.ops.higher_order, h, None) for h in _HOPS} - {None}
    done = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target not in hops:
            continue
        saving = n.target is getattr(torch.ops.higher_order, "run_and_save_rng_state", None)
        op, args = (n.args[0], n.args[1:]) if saving else (n.args[1], n.args[2:])
        if not _rng_free(op, tuple(args), dict(n.kwargs)):
            continue
        with graph.inserting_before(n):
            call = graph.call_function(op, tuple(args), dict(n.kwargs))
            val = n.meta.get("val")
            call.meta = dict(n.meta)
            if not saving:
                n.replace_all_uses_with(call)
                graph.erase_node(n)
                done += 1
                continue
            if any(u.target is not operator.getitem for u in n.users):
                graph.erase_node(call)
                continue
            # (the partitioned forward may carry no value for the wrapper itself, only its items)
            items = {u.args[1]: u.meta.get("val") for u in n.users}
            state_val = val[0] if isinstance(val, (tuple, list)) else items.get(0)
            out_val = val[1] if isinstance(val, (tuple, list)) else items.get(1)
            if not isinstance(state_val, torch.Tensor):
                graph.erase_node(call)
                continue
            call.meta["val"] = out_val
            state = graph.call_function(torch.ops.aten.zeros.default, (_state_shape(state_val),),
                                        {"dtype": state_val.dtype, "device": state_val.device})
            state.meta = {**n.meta, "val": state_val}
        for u in list(n.users):
            u.replace_all_uses_with(state if u.args[1] == 0 else call)
            graph.erase_node(u)
        graph.erase_node(n)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done

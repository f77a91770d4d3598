"""Models trained with torch.distributed: which style a model uses, and how novaforge compiles it.

novaforge writes no communication layer. The three styles keep torch.distributed as the engine:

* DDP (`DistributedDataParallel`): its reducer all-reduces gradient buckets from autograd hooks;
* FSDP2 (`torch.distributed.fsdp.fully_shard`): module forward pre/post hooks all-gather the
  sharded parameters and the backward's hooks reduce-scatter their gradients;
* tensor parallel (`parallelize_module`): parameters are DTensors; the module hooks redistribute
  inputs and outputs, and DTensor's dispatch inserts the collectives.

A graph captured once by `make_fx(functional_call)` would run none of that Python (hooks, the
reducer) after its trace, so a distributed model is compiled through Dynamo:
`torch.compile(model, backend="novaforge")`. Dynamo runs the hooks at every call (FSDP2's hooks
stay eager: `torch._dynamo.config.skip_fsdp_hooks`), splits the graph at DDP's buckets, and
AOTAutograd unwraps DTensors into plain tensors and `_c10d_functional` collectives
(`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, `wait_tensor`), which
novaforge keeps as extern calls into torch (frontend/lower.py) in the program's order.

Invariant: every rank compiles the same graphs from the same module tree and runs the
collectives in the graph's order, so the ranks' collectives match as eager's do; a model that is
distributed is never captured as one `make_fx` graph (`distributed_style` is checked by
`novaforge.compile` and `compile_step` before any capture).
"""

from __future__ import annotations

import torch

STYLES = ("ddp", "fsdp", "tensor-parallel")


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # (a torch built without distributed)
        return False
    return isinstance(t, DTensor)


def distributed_style(model: object) -> str | None:
    """'ddp', 'fsdp' or 'tensor-parallel' for a model trained with torch.distributed (the model,
    a submodule managed by fully_shard, or a DTensor parameter), else None."""
    if not isinstance(model, torch.nn.Module) or not torch.distributed.is_available():
        return None
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        FSDPModule = ()  # noqa: N806 - (a torch without FSDP2)
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return "fsdp"
    if any(_is_dtensor(p) for p in model.parameters()) or any(_is_dtensor(b) for b in model.buffers()):
        return "tensor-parallel"
    return None

"""Shared pieces of the distributed tests: a tiny Llama-style model, the three ways of sharding
it (FSDP2, tensor parallel, DDP), training loops, and a runner that spawns 2 gloo processes on
the CPU and collects each rank's checks.

Each test module runs one process group (`run_group`) in which several checks run one after
another (a process group costs ~10 s to start: imports and compiles), and its test functions
assert on the checks by name, so each check fails on its own. A check is a dict of numbers
computed on every rank; the comparisons are relative: max |a - b| / max |b| over all tensors.

Invariant: the eager reference and the compiled model of a check start from the same weights
(`torch.manual_seed(0)` before building), see the same batches (per rank), and run the same
optimizer, so any difference is the compiler's.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

WORLD = 2
DIM, HEADS, HIDDEN, IN, OUT = 32, 4, 64, 16, 4


class Block(nn.Module):
    """A Llama layer: RMSNorm, causal attention (q/k/v/o), RMSNorm, SwiGLU MLP (gate/up/down)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.mlp_norm = nn.RMSNorm(DIM)
        self.gate, self.up = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        # -1 heads: a tensor-parallel shard holds HEADS / WORLD of them
        q, k, v = (m(h).view(b, t, -1, DIM // HEADS).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    """2 blocks, hidden 32; `forward(x, y)` returns the MSE loss (so compile_step needs no loss_fn)."""

    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(IN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.norm = nn.RMSNorm(DIM)
        self.head = nn.Linear(DIM, OUT)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return F.mse_loss(self.head(self.norm(h)).float(), y)


def build(style: str, *, reshard: bool = True, mixed: bool = False, sequence_parallel: bool = False) -> nn.Module:
    """A fresh TinyLlama (seed 0) sharded in `style`: 'fsdp' (fully_shard per block and on the
    root), 'tp' (parallelize_module: q/k/v, gate/up colwise, o/down rowwise), 'ddp', or 'none'."""
    torch.manual_seed(0)
    model = TinyLlama()
    if style == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed \
            else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=reshard, mp_policy=mp_policy)
        fully_shard(model, reshard_after_forward=reshard, mp_policy=mp_policy)
    elif style == "tp":
        parallelize_llama(model, sequence_parallel)
    elif style == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    return model


def parallelize_llama(model: TinyLlama, sequence_parallel: bool = False) -> None:
    """Megatron-style tensor parallelism on every block (q/k/v, gate/up colwise; o/down rowwise).
    With `sequence_parallel`, each block runs on sequence shards between its matmuls: its input
    is split along the sequence (Shard(1)), the norms run on the shards (SequenceParallel), the
    colwise layers all-gather their input, the rowwise ones reduce-scatter their output, and the
    block's output is gathered back to a plain replicated tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (WORLD,))
    for block in model.blocks:
        if not sequence_parallel:
            parallelize_module(block, mesh, {
                "q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
                "gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()})
            continue
        parallelize_module(block, mesh, PrepareModuleInputOutput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_input=False,
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))
        col = {name: ColwiseParallel(input_layouts=Shard(1)) for name in ("q", "k", "v", "gate", "up")}
        row = {name: RowwiseParallel(output_layouts=Shard(1), use_local_output=False) for name in ("o", "down")}
        parallelize_module(block, mesh, {**col, **row, "attn_norm": SequenceParallel(),
                                         "mlp_norm": SequenceParallel()})


def batches(rank: int, steps: int, t: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches: (x, y) of shape (2, t, IN), (2, t, OUT); the same for every check.
    (Tensor parallel ranks take the same batch: pass rank 0 for every rank.)"""
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(2, t, IN, generator=g), torch.randn(2, t, OUT, generator=g)) for _ in range(steps)]


def train(call: Callable[..., torch.Tensor] | None, model: nn.Module, data: list, *, step: Any = None,
          lr: float = 1e-2) -> tuple[list[float], torch.optim.Optimizer]:
    """AdamW over `data`: `call(x, y)` (the model, compiled or not) then backward and step, or a
    `step(opt) -> callable(x, y) -> loss` (compile_step). Returns the losses and the optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    if step is not None:
        fn = step(model, opt)
        for x, y in data:
            losses.append(float(fn(x, y).detach()))
        return losses, opt
    for x, y in data:
        loss = call(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, opt


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it in the same order)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def param_diff(a: nn.Module, b: nn.Module) -> dict[str, float]:
    """The models' parameters apart, whole tensors (all ranks call it): `norm`, ||a - b|| / ||b||
    over all parameters (what the tests bound), and `max`, max |a - b| / max |b| (reported).
    AdamW divides by sqrt(v) + eps, so a gradient element near eps (1e-8) turns float32
    rounding of its summation order into a visible update difference of that one element: after
    one step the gradients agree to ~1e-7 but single elements of the parameters to ~2e-5."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys(), (pa.keys() ^ pb.keys())
    fa = {k: full(pa[k]).float() for k in pa}
    fb = {k: full(pb[k]).float() for k in pa}
    dnorm = sum(float(((fa[k] - fb[k]) ** 2).sum()) for k in pa) ** 0.5
    bnorm = sum(float((fb[k] ** 2).sum()) for k in pa) ** 0.5
    dmax = max(float((fa[k] - fb[k]).abs().max()) for k in pa) / max(float(fb[k].abs().max()) for k in pa)
    return {"norm": dnorm / bnorm, "max": dmax}


@torch.no_grad()
def state_check(compiled: nn.Module, eager: nn.Module) -> dict[str, Any]:
    """The compiled model's state against eager's, as DCP reads it (`get_model_state_dict`) and
    as `state_dict()` gives it (torch.compile's wrapper prefixes `_orig_mod.`, stripped here):
    the same keys, the same DTensor placements and local shapes, and the local shards' relative
    difference ||a - b|| / ||b||. Local only: no collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.tensor import DTensor

    ref = get_model_state_dict(eager)
    out: dict[str, Any] = {}
    plain = {k.removeprefix("_orig_mod."): v for k, v in compiled.state_dict().items()}
    for name, sd in (("dcp", get_model_state_dict(compiled)), ("state_dict", plain)):
        same_keys = sd.keys() == ref.keys()
        layouts = same_keys and all(
            type(sd[k]) is type(ref[k]) and tuple(sd[k].shape) == tuple(ref[k].shape)
            and (not isinstance(ref[k], DTensor) or (sd[k].placements == ref[k].placements
                                                     and sd[k].to_local().shape == ref[k].to_local().shape))
            for k in ref)
        diff = float("inf")
        if layouts:
            local = {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in sd.items()}
            rlocal = {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in ref.items()}
            diff = sum(float(((local[k].float() - rlocal[k].float()) ** 2).sum()) for k in ref) ** 0.5 / \
                sum(float((rlocal[k].float() ** 2).sum()) for k in ref) ** 0.5
        out[name] = {"keys": same_keys, "layouts": layouts, "diff": diff,
                     "dtensors": sum(isinstance(v, DTensor) for v in sd.values())}
    return out


def loss_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


class Built:
    """Programs novaforge built and graphs it ran uncompiled, since `mark()`."""

    def __init__(self) -> None:
        from novaforge.dynamo import FALLBACKS, PROGRAMS_BUILT

        self._fallbacks, self._built = FALLBACKS, PROGRAMS_BUILT
        self.mark()

    def mark(self) -> None:
        self.f0, self.b0 = len(self._fallbacks), self._built[0]

    def since(self) -> dict[str, Any]:
        return {"programs": self._built[0] - self.b0,
                "fallbacks": [f"{f.graph}: {f.reason}" for f in self._fallbacks[self.f0:]]}


def _worker(rank: int, path: str, fn: Callable[..., dict], args: tuple, q: Any) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
        result = fn(rank, *args)
        q.put((rank, result, None))
    except BaseException as e:  # noqa: BLE001 - reported to the test process
        q.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_group(fn: Callable[..., dict], *args: Any, timeout: float = 240) -> list[dict]:
    """`fn(rank, *args) -> {check: value}` on WORLD gloo processes (spawned); each rank's dict.
    Raises with the first rank's error (and traceback) if any rank failed."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = os.path.join(tempfile.mkdtemp(prefix="nf-dist-"), "init")
    procs = [ctx.Process(target=_worker, args=(r, init, fn, args, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = sorted((q.get(timeout=timeout) for _ in procs), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [f"rank {r}: {err}" for r, _, err in results if err is not None]
    if errors:
        raise AssertionError("\n".join(errors))
    return [res for _, res, _ in results]

"""DistributedDataParallel with compiled models: the gradients equal eager DDP's.

Two processes on the CPU (gloo), each with its own batch, so the gradients are equal only if
DDP's all-reduce ran over the compiled backward's gradients, at every step. Both entry points:
`torch.compile(DDP(model), backend="novaforge")` (Dynamo splits the graph at DDP's buckets)
and `novaforge.compile(DDP(model))`, which compiles that way too; `fallback="raise"` makes
sure novaforge compiled each piece rather than running it uncompiled.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def _build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def _worker(rank: int, world: int, path: str, mode: str, q) -> None:
    try:
        import novaforge

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
        ref, m = DDP(_build()), _build()
        options = {"fallback": "raise", "backend": "cpu"}
        if mode == "novaforge_compile":
            model = novaforge.compile(DDP(m), backend="cpu", fallback="raise")
        else:
            model = torch.compile(DDP(m), backend="novaforge", options=options)
        g = torch.Generator().manual_seed(100 + rank)
        diffs = []
        for _ in range(3):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            for mod in (ref, model):
                mod.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(mod(x), y).backward()
            scale = max(p.grad.abs().max().item() for p in ref.module.parameters())
            diffs.append(max((a.grad - b.grad).abs().max().item() for a, b in
                             zip(ref.module.parameters(), m.parameters(), strict=True)) / scale)
            with torch.no_grad():  # a plain SGD step on both, so the next batch sees new weights
                for a, b in zip(ref.module.parameters(), m.parameters(), strict=True):
                    a -= 0.1 * a.grad
                    b -= 0.1 * b.grad
        from novaforge.dynamo import FALLBACKS

        trained = not FALLBACKS
        q.put((rank, diffs, trained, None))
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported to the test process
        q.put((rank, None, False, f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("mode", ["novaforge_compile", "torch_compile"])
def test_ddp_gradients_equal_eager_ddp(mode, tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, str(tmp_path / "init"), mode, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    for rank, diff, trained, err in results:
        assert err is None, f"rank {rank}: {err}"
        assert trained, f"rank {rank}: a graph ran uncompiled"
        assert max(diff) <= 1e-5, f"rank {rank}: gradients differ from eager DDP's by {diff} of the largest"

"""CPU programs in the shared arena (runtime/shared_arena.py): programs whose arena exceeds
cpu_program.SHARED_ARENA_OVER (set to 0 here, so small test programs use it) hold one buffer
between them, as large as the largest, and stay equal to eager through interleaved calls,
growths, calls from two threads, a call nested in another program's call, a training step
through torch.compile, and the sizes of a dynamic-shape program."""

from __future__ import annotations

import copy
import gc
import threading

import pytest
import torch

import novaforge
from novaforge.runtime import cpu_program
from novaforge.runtime.shared_arena import SharedArena


def _narrow(x, w):
    h = torch.tanh(x @ w)
    return torch.softmax(h * 2, -1) @ w.t() + x


def _wide(x, w):
    h = torch.tanh(torch.cat([x, x * 2, x - 1], -1) @ torch.cat([w, w, w], 0))
    h = torch.softmax(h.repeat(1, 4), -1)
    return h.sum(-1, keepdim=True) * x + h[:, :16]


def _program(c):
    return c.stats().program


@pytest.fixture
def shared_always(monkeypatch):
    monkeypatch.setattr(cpu_program, "SHARED_ARENA_OVER", 0)
    gc.collect()  # (programs of earlier tests let go of the process's arena)
    return SharedArena.of(cpu_program.CPU_ARENA_KEY)


def _compiled(fn, *args):
    c = novaforge.compile(fn, backend="cpu", freeze=False, tiered=False)
    with torch.no_grad():
        c(*args)
    return c


def test_small_programs_keep_their_own_arena():
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    prog = _program(_compiled(_narrow, x, w))
    assert not prog.arena_shared and prog.arena.numel() > 0


def test_two_programs_share_one_arena_as_large_as_the_larger(shared_always):
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    a, b = _compiled(_narrow, x, w), _compiled(_wide, x, w)
    pa, pb = _program(a), _program(b)
    assert pa.arena_shared and pb.arena_shared and "(shared)" in pa.describe()
    assert pa._shared is pb._shared is shared_always
    held = []
    with torch.no_grad():
        for _k in range(4):
            xk = torch.randn(6, 16)
            got_a, got_b = a(xk, w), b(xk, w)
            torch.testing.assert_close(got_a, _narrow(xk, w), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got_b, _wide(xk, w), atol=1e-5, rtol=1e-5)
            held.append((got_a, got_a.clone(), got_b, got_b.clone()))
    for got_a, snap_a, got_b, snap_b in held:  # a later call of the other program overwrote nothing
        assert torch.equal(got_a, snap_a) and torch.equal(got_b, snap_b)
    assert pa.arena is pb.arena
    assert shared_always.nbytes == max(pa._arena_bytes, pb._arena_bytes)


def test_a_growth_releases_the_old_buffer_and_every_program_rebinds(shared_always):
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    a = _compiled(_narrow, x, w)
    pa = _program(a)
    before = shared_always.grown
    with shared_always.lock:
        buf = shared_always.buffer(shared_always.nbytes + 4096)  # (what a larger program's call does)
    assert shared_always.grown == before + 1
    assert pa.arena.numel() == 0 and not pa._ready  # no reference to the old buffer is left
    with torch.no_grad():
        torch.testing.assert_close(a(x, w), _narrow(x, w), atol=1e-5, rtol=1e-5)
    assert pa.arena is buf


def test_calls_from_two_threads(shared_always):
    w = torch.randn(16, 16)
    a, b = _compiled(_narrow, torch.randn(6, 16), w), _compiled(_wide, torch.randn(6, 16), w)
    errors = []

    def work(c, fn) -> None:
        try:
            with torch.no_grad():
                for _ in range(25):
                    x = torch.randn(6, 16)
                    torch.testing.assert_close(c(x, w), fn(x, w), atol=1e-5, rtol=1e-5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=cw) for cw in ((a, _narrow), (b, _wide), (a, _narrow))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_call_nested_in_another_programs_call_runs_in_a_private_arena(shared_always):
    """The shared lock already held by this thread (a program called from inside another's
    call): the inner call neither waits for itself nor writes the outer call's arena."""
    x, w = torch.randn(6, 16), torch.randn(16, 16)
    a = _compiled(_narrow, x, w)
    result: dict = {}

    def nested() -> None:
        with shared_always.lock:
            shared_always.owner = threading.get_ident()
            outer = shared_always.buffer(shared_always.nbytes)
            outer.fill_(7)
            with torch.no_grad():
                result["out"] = a(x, w)
            result["outer_untouched"] = bool((outer == 7).all())
            shared_always.owner = None

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "a nested call waited for the lock its own thread holds"
    torch.testing.assert_close(result["out"], _narrow(x, w), atol=1e-5, rtol=1e-5)
    assert result["outer_untouched"]
    with torch.no_grad():  # and the next plain call is back in the shared arena
        torch.testing.assert_close(a(x, w), _narrow(x, w), atol=1e-5, rtol=1e-5)
    assert _program(a).arena is shared_always.buffer(0)


def test_training_through_torch_compile_forward_and_backward_share(shared_always, monkeypatch):
    from novaforge.codegen.cpu.backend import CpuBackend

    # (intermediates kept in the arena: placed in outputs' memory, this forward would need none)
    monkeypatch.setattr(CpuBackend, "intermediates_in_io", False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 64), torch.nn.Softmax(-1), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 4))
    eager = copy.deepcopy(model)
    torch._dynamo.reset()  # (after another test's Sequential, a recompile would run eagerly first: tiering)
    compiled = torch.compile(model, backend="novaforge", options={"tiered": False})
    progs_before = {id(p) for p in gc.get_objects() if type(p) is cpu_program.CpuProgram}
    for step in range(3):
        x = torch.randn(8, 16)
        compiled(x).square().mean().backward()
        eager(x).square().mean().backward()
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=f"step {step}")
    progs = [p for p in gc.get_objects() if type(p) is cpu_program.CpuProgram and id(p) not in progs_before
             and p.calls and p._arena_bytes > 64]  # (forward and backward, each with values in its arena)
    assert len(progs) >= 2 and all(p._shared is shared_always for p in progs), [p._arena_bytes for p in progs]
    assert shared_always.nbytes == max(p._arena_bytes for p in progs)


def test_the_sizes_of_a_dynamic_program_share_one_arena(shared_always):
    torch.manual_seed(0)
    w = torch.randn(32, 48)
    fn = lambda x: torch.softmax(torch.relu(x @ w), -1).sum(-1)  # noqa: E731
    c = novaforge.compile(fn, backend="cpu", dynamic={0: {0: (2, 4096)}}, tiered=False)
    with torch.no_grad():
        for n in (7, 300, 2000, 40, 2000, 7):
            x = torch.randn(n, 32)
            torch.testing.assert_close(c(x), fn(x), atol=1e-4, rtol=1e-5)
    assert c.compilations == 1
    live = [e.stats.program for e in c._instances.values()]  # (this compile's programs, one per size)
    assert len(live) >= 3 and all(p.sizes and p._shared is shared_always for p in live)
    assert {id(p.arena) for p in live if p._ready} == {id(shared_always.buffer(0))}

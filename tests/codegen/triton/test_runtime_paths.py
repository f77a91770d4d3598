"""The GPU-only runtime paths, exercised on the CPU with stand-ins: the CUDA-graph runner (a fake
torch.cuda that replays a captured step list), the GPU launcher's options, `_precompile`'s
compile-and-load check (Triton's AsyncCompileMode with fake compiled kernels, one of which
raises OutOfResources at load like Triton 3.6's `_init_handles`), and `target_from_device` on
fake device properties. gpu_check's first device part runs the real ones and prints which ran."""

from __future__ import annotations

import types
import warnings
from unittest import mock

import pytest
import torch
from nf_triton_testing import backend, compiled, step_like_eager_adamw

from novaforge.codegen.triton import backend as be
from novaforge.codegen.triton.program import _CudaGraphRunner
from novaforge.ir.symbolic import Sym, symbol
from novaforge.schedule import gpu as sched_gpu


class FakeCuda:
    """What the runner needs from torch.cuda. A 'graph' is the captured function; replaying it
    runs the same steps again on the same static buffers and writes the captured outputs in
    place, as a CUDA graph replay does."""

    def __init__(self, fail_capture: bool = False) -> None:
        self.fail_capture = fail_capture
        self.side_runs = 0

    def run_on_side_stream(self, fn):
        self.side_runs += 1
        fn()

    def capture(self, fn):
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        outs = fn()  # (a real capture runs nothing: the first replay below is this run)
        return [fn, outs, True], outs

    def replay(self, graph):
        fn, outs, captured_run = graph
        if captured_run:
            graph[2] = False
            return
        for o, new in zip(outs, fn(), strict=True):
            o.copy_(new)

    def synchronize(self):
        pass


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(12, 6)

    def forward(self, x):
        return torch.tanh(self.lin(x)) * 2


def _program_and_binding(m, x):
    c = compiled(m)  # not frozen: the weights are program inputs ("param"), read at every call
    with torch.no_grad():
        c(x)
    st = c.stats()
    refs = st.captured.param_refs

    def bind(x):
        out, r = [], 0
        for gi in st.graph.inputs:
            if gi.kind == "user":
                out.append(x)
            elif gi.kind in ("param", "buffer"):
                out.append(refs[r])
                r += 1
        return out

    return st.program, bind


def test_cuda_graph_runner_warms_captures_replays_and_recaptures():
    m = Net()
    x = torch.randn(5, 12)
    prog, bind = _program_and_binding(m, x)
    runner = _CudaGraphRunner(prog, cuda=FakeCuda())
    with torch.no_grad():
        xs = [torch.randn(5, 12) for _ in range(4)]
        outs = [runner.run(bind(xi))[0] for xi in xs[:3]]
        assert (runner.captures, runner.replays) == (1, 2)  # call 1 eager, 2 capture (+replay), 3 replay
        for o, xi in zip(outs, xs, strict=False):
            torch.testing.assert_close(o, m(xi), atol=1e-5, rtol=1e-5)
        assert outs[1].data_ptr() != runner.outputs[0].data_ptr()  # callers get clones of the static outputs
        # a parameter that moves (reassigned) invalidates the graph: recapture, and read the new value
        old = m.lin.weight
        m.lin.weight = torch.nn.Parameter(torch.randn(6, 12))
        moved = [m.lin.weight if t is old else t for t in bind(xs[3])]
        got = runner.run(moved)[0]
        torch.testing.assert_close(got, m(xs[3]), atol=1e-5, rtol=1e-5)
        assert runner.captures == 2


def test_cuda_graph_capture_failure_runs_eagerly():
    m = Net()
    x = torch.randn(5, 12)
    prog, bind = _program_and_binding(m, x)
    runner = _CudaGraphRunner(prog, cuda=FakeCuda(fail_capture=True))
    with torch.no_grad():
        runner.run(bind(x))
        with pytest.warns(UserWarning, match="capture failed"):
            got = runner.run(bind(x + 1))[0]
        torch.testing.assert_close(got, m(x + 1), atol=1e-5, rtol=1e-5)
        assert runner.failed and runner.captures == 0
        assert runner.static == {}  # the static input copies are released, not kept for nothing
        torch.testing.assert_close(runner.run(bind(x - 1))[0], m(x - 1), atol=1e-5, rtol=1e-5)


def test_programs_with_large_copies_per_replay_run_without_cuda_graphs(monkeypatch):
    """A replay copies moving user inputs into static buffers and clones outputs, keeping both:
    for a training program (inputs and outputs are the saved activations) that took ~3x their
    memory on the H200. When the bytes to copy exceed GRAPH_COPY_LIMIT at capture (the second
    call, where moving inputs are known), the program runs without a graph, says why, and moves
    a large arena to the shared one."""
    from novaforge.codegen.triton import program as tp

    m = Net()
    prog, bind = _program_and_binding(m, torch.randn(5, 12))
    monkeypatch.setattr(tp, "GRAPH_COPY_LIMIT", 5 * 12 * 4)  # the input alone fills it; the output tips it over
    monkeypatch.setattr(tp, "SHARED_ARENA_OVER", 0)
    runner = _CudaGraphRunner(prog, cuda=FakeCuda())
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5, 12)  # (a new batch each call: copied)
            torch.testing.assert_close(runner.run(bind(x))[0], m(x), atol=1e-5, rtol=1e-5)
    assert runner.failed and runner.captures == 0 and runner.static == {}
    assert not prog.use_graphs and "to copy per replay" in prog.notes["cuda_graphs_off"]
    assert prog.arena_shared and prog.arena is None
    assert not tp.TritonProgram(prog.graph, "cpu").use_graphs


def test_graphs_read_inputs_at_stable_addresses_in_place_and_return_in_place_updates_as_the_input():
    """A training step passes its parameters and optimizer state as arguments: the graph reads
    those at the same address on the first two calls without copies, and returns a mutated input
    updated in place as the input itself (the caller skips its write-back). An input that moves
    later is copied from then on (one recapture), and results stay eager's."""
    from nf_triton_testing import compiled as compile_fn

    p0, m0, g = torch.randn(64), torch.randn(64), torch.randn(64)
    c = compile_fn(AdamLike())
    p, m = p0.clone(), m0.clone()
    c(p, m, g)  # (builds the program)
    prog = c.stats().program
    runner = _CudaGraphRunner(prog, cuda=FakeCuda())
    pe, me = p.clone(), m.clone()
    for k in range(4):
        gk = g * (k + 1) if k < 3 else g.clone()  # new gradients each call: a moving input
        outs = runner.run([p, m, gk] if k < 3 else [p, m.clone(), gk])
        want = AdamLike()(pe, me, gk)
        if k == 3:
            m = outs[2]  # (the moved m: its new value comes back as a fresh tensor)
        torch.testing.assert_close(outs[0], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(p, pe, atol=1e-6, rtol=1e-6)
        if k == 1:
            assert set(runner.static) == {2} and runner.stable == {0, 1}  # only g copied
            assert outs[1] is p and outs[2] is m  # the in-place updates, not clones
    assert runner.captures == 2 and 1 in runner.moved and 1 in runner.static
    torch.testing.assert_close(m, me, atol=1e-6, rtol=1e-6)


def test_gpu_launcher_passes_launch_options_and_no_upcast():
    calls = []

    class FakeFn:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    src = types.SimpleNamespace(grid=(7, 2), num_warps=8, num_stages=3, symbols=())
    be._launcher(FakeFn(), src, interpret=False)(1, 2)
    be._launcher(FakeFn(), src, interpret=True)(3)
    assert calls == [((7, 2), (1, 2), {"UPCAST": False, "num_warps": 8, "num_stages": 3}),
                     ((7, 2), (3,), {"UPCAST": True})]
    # a kernel for a range of sizes: its grid evaluated at the call's sizes, the sizes its arguments
    s0, s1 = Sym(symbol(0)), Sym(symbol(1))
    sized = types.SimpleNamespace(grid=((s0 + 63) // 64, s1 * 2), num_warps=4, num_stages=1, symbols=("s1", "s0"))
    calls.clear()
    be._launcher(FakeFn(), sized, interpret=False, values={symbol(0): 100, symbol(1): 3})(5)
    assert calls == [((2, 6), (5, 3, 100), {"UPCAST": False, "num_warps": 4, "num_stages": 1})]


class FakeCompiled:
    """A Triton CompiledKernel as far as `_precompile` looks: metadata, and `_init_handles`, which
    loads the binary and sets n_regs / n_spills, or raises like Triton 3.6 does when the kernel
    needs more shared memory than the device has."""

    def __init__(self, shared: int, limit: int) -> None:
        self.metadata = types.SimpleNamespace(shared=shared)
        self.limit = limit

    def _init_handles(self):
        from triton.runtime.errors import OutOfResources

        if self.metadata.shared > self.limit:
            raise OutOfResources(self.metadata.shared, self.limit, "shared memory")
        self.n_regs, self.n_spills = 168, 0


class FakeJit:
    """`warmup` submits its compile to the active AsyncCompileMode, as JITFunction._do_compile does."""

    def __init__(self, name: str, outcome) -> None:
        self.name, self.outcome, self.warmed = name, outcome, []

    def warmup(self, *dtypes, grid, **kw):
        from triton.runtime import _async_compile

        self.warmed.append((dtypes, grid, kw))

        def compile_fn():
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

        return _async_compile.active_mode.get().submit(self.name, compile_fn, lambda k: None)


def test_precompile_loads_kernels_and_reports_resources_and_failures():
    limit = 232448
    fits, too_big = FakeCompiled(147456, limit), FakeCompiled(264192, limit)
    fns = {"fits": FakeJit("fits", fits), "big": FakeJit("big", too_big),
           "broken": FakeJit("broken", RuntimeError("PTXAS error: bad"))}
    srcs = {n: types.SimpleNamespace(title=n, grid=(4, 1), num_warps=8, num_stages=3) for n in fns}
    kernels = {id(f): (f, srcs[n], [torch.float32, torch.float32]) for n, f in fns.items()}
    failed, resources, note = be._precompile(kernels, {"compile_threads": 2})
    assert note["ran"] and note["kernels"] == 3 and note["failed"] == 2
    assert resources[id(fns["fits"])] == {"shared": 147456, "n_regs": 168, "n_spills": 0}
    assert "OutOfResources" in failed[id(fns["big"])] and "shared memory" in failed[id(fns["big"])]
    assert resources[id(fns["big"])]["shared"] == 264192 and resources[id(fns["big"])]["n_regs"] is None
    assert "PTXAS error" in failed[id(fns["broken"])] and id(fns["broken"]) not in resources
    assert fns["fits"].warmed == [((torch.float32, torch.float32), (4, 1),
                                   {"UPCAST": False, "num_warps": 8, "num_stages": 3})]
    _, _, serial = be._precompile({id(fns["fits"]): kernels[id(fns["fits"])]}, {"parallel_compile": False})
    assert serial["threads"] == 1 and serial["failed"] == 0


def test_kernels_that_fail_to_load_fall_back_with_their_reason():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.randn(3, 8)
    c = compiled(m, freeze=True)
    with torch.no_grad():
        c(x)
        prog = c.stats().program
        st = next(s for s in prog.steps if s.kind == "triton")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            backend()._fall_back(prog, {id(st.node): "mm: OutOfResources: out of resource: "
                                                      "shared memory, Required: 264192, Hardware limit: 232448"})
        fb = prog.info()["fallbacks"]
        assert len(fb) >= 1 and any("OutOfResources" in f["reason"] for f in fb)
        assert "OutOfResources" in prog.describe()
        torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)


H200_PROPS = dict(name="NVIDIA H200", multi_processor_count=132, shared_memory_per_block_optin=232448,
                  shared_memory_per_multiprocessor=233472, regs_per_multiprocessor=65536, L2_cache_size=60 * 2**20,
                  max_threads_per_multi_processor=2048, major=9, minor=0, total_memory=150 * 2**30)


def _fake_device(monkeypatch, **props):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(**props))


def test_target_from_device_on_fake_properties(monkeypatch):
    _fake_device(monkeypatch, **H200_PROPS)
    t = sched_gpu.target_from_device()
    h = sched_gpu.KNOWN_GPUS["H200"]
    assert t.name == "NVIDIA H200" and t.hopper and t.sm_count == 132 and not t.interpret
    assert t.smem_per_block == 232448 and t.l2_bytes == 60 * 2**20 and t.peak_flops == h.peak_flops
    assert t.source.startswith("device + measured")
    assert sched_gpu.default_target() == t
    # a cut-down chip of a known family: peaks scale with the SM count
    _fake_device(monkeypatch, **{**H200_PROPS, "name": "NVIDIA H100 PCIe", "multi_processor_count": 114})
    t = sched_gpu.target_from_device()
    assert t.peak("bf16") == pytest.approx(sched_gpu.KNOWN_GPUS["H100"].peak("bf16") * 114 / 132)
    # an unknown chip: the generic description scaled by SMs; missing properties fall back to it
    props = {k: v for k, v in H200_PROPS.items() if k not in ("shared_memory_per_block_optin", "L2_cache_size")}
    _fake_device(monkeypatch, **{**props, "name": "Some Future GPU", "multi_processor_count": 160, "major": 10})
    t = sched_gpu.target_from_device()
    g = sched_gpu.GENERIC
    assert t.source == "device + guess" and t.capability == (10, 0)
    assert t.smem_per_block == g.smem_per_block and t.l2_bytes == g.l2_bytes
    assert t.peak("tf32") == pytest.approx(g.peak("tf32") * 160 / g.sm_count)
    # the schedules follow the device it describes
    s = sched_gpu.matmul_schedule(1, 4096, 4096, 4096, torch.bfloat16, t)
    assert s.smem <= t.smem_per_block


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(12, 32), torch.nn.Linear(32, 6)

    def forward(self, x):
        return torch.sigmoid(self.b(torch.relu(self.a(x)) * 1.5)) - 0.25


def test_programs_without_graphs_over_the_limit_share_one_arena(monkeypatch):
    """Programs without a CUDA graph whose arenas pass SHARED_ARENA_OVER run in one arena per
    device and stream, grown to the largest (a training step's forward and backward then hold
    one arena between them, not one each): each keeps none of its own, results equal eager's
    call after call and across programs (a caller's earlier outputs are not overwritten), a
    growth drops the views of the old buffer, and the buffer goes with the last program."""
    import gc

    from novaforge.codegen.triton import program as tp

    m, wide = Mlp(), torch.nn.Sequential(torch.nn.Linear(12, 96), torch.nn.GELU(), torch.nn.Linear(96, 3))
    x = torch.randn(5, 12)
    held = compiled(m)
    with torch.no_grad():
        held(x)
    assert held.stats().program.graph.meta.memory_plan.offsets, "the test needs planned values"
    assert not held.stats().program.arena_shared  # (a small arena: its own, as before)
    monkeypatch.setattr(tp, "SHARED_ARENA_OVER", 0)
    a, b = compiled(m), compiled(wide)
    with torch.no_grad():
        got = [a(x), b(x), a(x * 2), b(x * 2)]
        want = [m(x), wide(x), m(x * 2), wide(x * 2)]
    pa, pb = a.stats().program, b.stats().program
    assert pa.arena_shared and pa.arena is None and pa.info()["arena"]["shared"]
    assert "(shared)" in pa.describe().splitlines()[0]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    (shared,) = set(pa._shared.values())
    assert set(pb._shared.values()) == {shared}  # one arena for both, as large as the larger
    assert shared.buffer(0).numel() == max(pa.arena_bytes, pb.arena_bytes)
    shared.buffer(shared.buffer(0).numel() + 8)  # a growth: no program keeps views of the old buffer
    assert len(shared.views) == 0
    with torch.no_grad():
        torch.testing.assert_close(a(x), m(x), atol=1e-5, rtol=1e-5)
    ref = __import__("weakref").ref(shared)
    del a, b, pa, pb, shared
    gc.collect()
    assert ref() is None


class Overwrite(torch.nn.Module):
    """One kernel writes p's new value (not read from p) and reads p's old value for its output."""

    def forward(self, p, m):
        before = p * 3
        p.copy_(m * 0.5)
        return before + 1


class AdamLike(torch.nn.Module):
    """A step that updates its inputs in place, as compile_step's optimizer update does."""

    def forward(self, p, m, g):
        before = p * 3  # the old p, read by the kernel that writes the new one, for another output
        m.mul_(0.9).add_(g, alpha=0.1)
        p.sub_(m * 0.5)
        return before + p


def test_mutated_inputs_are_updated_in_place_by_their_pointwise_kernels():
    """A pointwise kernel that computes a mutated input's new value, reading the old one only at
    its own element, writes the input's buffer (no fresh output, no write-back copy); its stores
    come after all its loads, so a kernel reading the old value for another output still sees
    it. Values equal eager's over several steps."""
    p0, m0, g = torch.randn(64), torch.randn(64), torch.randn(64)
    p, m = p0.clone(), m0.clone()
    c = compiled(AdamLike())
    losses = [c(p, m, g) for _ in range(3)]
    pe, me = p0.clone(), m0.clone()
    want = [AdamLike()(pe, me, g) for _ in range(3)]
    torch.testing.assert_close(torch.stack(losses), torch.stack(want), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(p, pe, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(m, me, atol=1e-6, rtol=1e-6)
    prog = c.stats().program
    assert len(prog.kernels) == 1 and prog.kernels[0].source.count("tl.load(") == 3
    g_ir = prog.graph
    ins = {gi.value: prog.slot_of[gi.value] for gi in g_ir.inputs if gi.kind != "const"}
    news = [prog.slot_of[new] for _, new in g_ir.mutations]
    assert news and all(s in ins.values() for s in news), "the new values live in their inputs' slots"
    assert not any(s in news for s, _, _ in prog.fresh)
    c, (p, m) = compiled(Overwrite()), (p0.clone(), m0.clone())
    torch.testing.assert_close(c(p, m), p0 * 3 + 1)  # (the old p, loaded before the new one is stored)
    torch.testing.assert_close(p, m0 * 0.5)
    for k in prog.kernels:  # every load of a kernel before its first store (render.store_all)
        lines = k.source.splitlines()
        loads = [i for i, ln in enumerate(lines) if "tl.load(" in ln]
        stores = [i for i, ln in enumerate(lines) if "tl.store(" in ln]
        assert max(loads) < min(stores), k.source


def test_precompiled_kernels_launch_through_their_binary_unless_a_pointer_is_unaligned():
    """`_direct_launcher` calls the precompiled binary's launcher over the 3-d grid with the
    kernel's arguments and UPCAST last (no JIT binding per launch); a tensor not 16-byte aligned
    (the warmup's specialization) goes through the JIT launch instead."""
    calls = []

    class FakeCompiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append(("binary", grid, args))

    src = types.SimpleNamespace(grid=(7, 2), num_warps=8, num_stages=3, symbols=())
    launch = be._direct_launcher(FakeCompiled(), lambda *args: calls.append(("jit", args)), src)
    buf = torch.zeros(64)
    a, b = buf[:16], buf[4:20]  # b starts 16 bytes in (aligned); c 4 bytes in (not)
    launch(a, b)
    c = buf[1:17]
    launch(a, c)
    assert calls == [("binary", (7, 2, 1), (a, b, False)), ("jit", (a, c))]


def test_compile_step_on_triton_updates_parameters_and_adam_state_in_place():
    """`compile_step` on the Triton backend: every parameter and AdamW moment is written by its
    kernel (the dW GEMM's epilogue for a weight) into its own buffer: no fresh output and no
    write-back copy for any of them; parameters equal eager AdamW's after three steps."""

    class Net2(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

        def forward(self, x, y):
            return self.net(x)

    torch.manual_seed(0)
    step = step_like_eager_adamw(Net2(), (8, 16, 4), steps=3)
    (fn,) = step._compiled.values()
    prog = fn.stats().program
    inputs = set(prog.input_slots)
    news = [prog.slot_of[new] for old, new in prog.graph.mutations if old.type.rank > 0]
    assert len(news) == 3 * 4  # (four parameters, each with two moments)
    assert all(s in inputs for s in news), "every parameter and moment is updated in its own buffer"
    assert not {s for s, _, _ in prog.fresh} & set(news)


class StrictCapture(FakeCuda):
    """A capture that refuses what a CUDA graph capture refuses: a tensor made from Python data
    (`torch.tensor` / `torch.as_tensor`: a host-to-device copy on a GPU) and a value read back to
    the host (`.item()`, `.tolist()`). Stop 37's first H200 capture of a training step failed on
    the `scalar` op's torch.tensor; this finds such a step on the CPU."""

    def capture(self, fn):
        refused = []

        def refuse(name):
            def call(*a, **k):
                refused.append(name)
                raise RuntimeError(f"{name} during CUDA graph capture")
            return call

        with mock.patch.object(torch, "tensor", refuse("torch.tensor")), \
                mock.patch.object(torch, "as_tensor", refuse("torch.as_tensor")), \
                mock.patch.object(torch.Tensor, "item", refuse("Tensor.item")), \
                mock.patch.object(torch.Tensor, "tolist", refuse("Tensor.tolist")):
            return super().capture(fn)


def test_a_training_step_captures_without_host_copies():
    """compile_step's whole program for a small GPT (embeddings, causal attention forward and
    backward, LayerNorm, GELU, cross-entropy, AdamW) goes through the graph runner's warm-up,
    capture and replays under StrictCapture (nothing refused), and trains as eager AdamW does."""
    import copy

    import novaforge
    from novaforge.bench.nanogpt import GPT, GPTConfig
    from novaforge.codegen.triton.program import TritonProgram

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, vocab_size=64, block_size=16))
    ref = copy.deepcopy(model)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(4)]
    want = []
    for x, y in batches:
        opt_ref.zero_grad()
        loss = ref(x, y)
        loss.backward()
        opt_ref.step()
        want.append(loss.item())

    step = novaforge.compile_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), backend="triton")
    seen = []
    real_run = TritonProgram.run
    with mock.patch.object(TritonProgram, "run", lambda self, ins: seen.append(list(ins)) or real_run(self, ins)):
        got = [float(step(*batches[0]))]  # (builds the program; records its inputs)
    (fn,) = step._compiled.values()
    prog = fn.stats().program
    cuda = StrictCapture()
    runner = _CudaGraphRunner(prog, cuda=cuda)
    user = [gi.value for gi in prog.graph.inputs if gi.kind != "const"]
    for x, y in batches[1:]:  # warm-up, capture, replay
        ins = seen[0][:-2] + [x, y]
        with torch.no_grad():  # (as the compiled step runs)
            outs = runner.run(ins)
            for (old, _), new in zip(prog.graph.mutations, outs[len(prog.graph.outputs):], strict=True):
                target = ins[user.index(old)]
                if new is not target:  # (a value not written in place: the caller's write-back)
                    target.copy_(new)
        got.append(float(outs[0]))
    assert runner.captures == 1, prog.notes
    assert got == pytest.approx(want, rel=1e-4)


def test_forward_and_backward_programs_capture_without_host_copies():
    """`torch.compile(model, backend="novaforge")` on Triton: its forward and backward programs
    (AOTAutograd's two graphs of a small GPT) each capture under StrictCapture (nothing refused)
    and replay to the results of their runs without a graph."""
    from novaforge.bench.nanogpt import GPT, GPTConfig
    from novaforge.codegen.triton.program import TritonProgram

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, vocab_size=64, block_size=16))
    compiled = torch.compile(model, backend="novaforge", options={"backend": "triton"})
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    seen = {}
    real_run = TritonProgram.run
    with mock.patch.object(TritonProgram, "run",
                           lambda self, ins: seen.setdefault(id(self), (self, list(ins))) and real_run(self, ins)):
        compiled(x, y).backward()
    torch._dynamo.reset()
    assert len(seen) == 2, len(seen)
    for prog, ins in seen.values():
        with torch.no_grad():
            want = prog.run_eager(ins)
            runner = _CudaGraphRunner(prog, cuda=StrictCapture())
            for _ in range(3):  # warm-up, capture, replay
                got = runner.run(ins)
        assert runner.captures == 1, prog.notes
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)

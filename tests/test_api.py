"""novaforge.compile: guards and recompilation, freezing, gradients, mutations, pytrees."""

from __future__ import annotations

import pytest
import torch

import novaforge


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.ln = torch.nn.LayerNorm(8)

    def forward(self, x, scale: float = 1.0):
        return self.ln(torch.relu(self.lin(x)) * scale)


BACKEND = "interpret"


def test_shape_and_dtype_changes_recompile():
    m = Small().eval()
    c = novaforge.compile(m, backend=BACKEND)
    with torch.no_grad():
        for shape in [(2, 8), (5, 8), (2, 8), (3, 4, 8)]:
            x = torch.randn(shape)
            torch.testing.assert_close(c(x), m(x))
        assert c.compilations == 3
        c(torch.randn(2, 8, dtype=torch.float64).float())
        assert c.compilations == 3
        xt = torch.randn(8, 2).t()  # non-contiguous: a new guard (strides)
        torch.testing.assert_close(c(xt), m(xt))
        assert c.compilations == 4
        torch.testing.assert_close(c(torch.ones(2, 8), scale=2.0), m(torch.ones(2, 8), scale=2.0))
        assert c.compilations == 5


def test_parameters_are_read_at_each_call_unless_frozen():
    m = Small().eval()
    live = novaforge.compile(m, backend=BACKEND)
    frozen = novaforge.compile(m, backend=BACKEND, freeze=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        a0, f0 = live(x), frozen(x)
        m.lin.weight.mul_(2)
        torch.testing.assert_close(live(x), m(x))
        assert not torch.allclose(live(x), a0)
        n = frozen.compilations
        torch.testing.assert_close(frozen(x), m(x))  # frozen constants went stale: recompiled
        assert frozen.compilations == n + 1 and not torch.allclose(frozen(x), f0)


def test_gradients_flow_and_are_not_detached():
    m = Small()
    c = novaforge.compile(m, backend=BACKEND)
    x = torch.randn(4, 8, requires_grad=True)
    c(x).pow(2).sum().backward()
    gx, gw = x.grad.clone(), m.lin.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    m(x).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(gw, m.lin.weight.grad, atol=1e-5, rtol=1e-4)


def test_closure_tensors_that_require_grad_get_their_gradients():
    """A plain function reading a weight (or a module) from its closure: its program holds them as
    constants, so a call in grad mode runs eagerly and the weights get eager's gradients (before,
    the output came back detached); under no_grad the program runs."""
    w = torch.randn(8, 8, requires_grad=True)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    c = novaforge.compile(lambda x: lin(x @ w).pow(2).sum(), backend=BACKEND)
    c(x).backward()
    gw, gl = w.grad.clone(), lin.weight.grad.clone()
    w.grad, lin.weight.grad = None, None
    lin(x @ w).pow(2).sum().backward()
    torch.testing.assert_close(gw, w.grad)
    torch.testing.assert_close(gl, lin.weight.grad)
    with torch.no_grad():
        out = c(x)
    assert not out.requires_grad  # (grad mode is part of the signature: a program of its own)
    torch.testing.assert_close(out, lin(x @ w).pow(2).sum().detach(), atol=1e-4, rtol=1e-5)


def test_buffer_mutation_is_written_back():
    bn = torch.nn.BatchNorm1d(6).train()
    ref = torch.nn.BatchNorm1d(6).train()
    ref.load_state_dict(bn.state_dict())
    c = novaforge.compile(bn, backend=BACKEND)
    x = torch.randn(5, 6)
    with torch.no_grad():
        torch.testing.assert_close(c(x), ref(x))
        torch.testing.assert_close(c(x * 2), ref(x * 2))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == int(ref.num_batches_tracked) == 2


def test_freeze_with_buffer_updates_is_refused():
    with pytest.raises(novaforge.CaptureError, match="buffer"):
        novaforge.compile(torch.nn.BatchNorm1d(4).train(), backend=BACKEND, freeze=True)(torch.randn(3, 4))


def test_user_input_mutation_and_pytree_outputs():
    def fn(d, y):
        d["a"].add_(1)
        return {"sum": d["a"] + y, "pair": (y * 2, d["b"].sum())}

    d = {"a": torch.zeros(3), "b": torch.ones(2, 2)}
    c = novaforge.compile(fn, backend=BACKEND)
    out = c(d, torch.ones(3))
    assert set(out) == {"sum", "pair"}
    torch.testing.assert_close(out["sum"], torch.full((3,), 2.0))
    torch.testing.assert_close(out["pair"][1], torch.tensor(4.0))
    torch.testing.assert_close(d["a"], torch.ones(3))  # mutation written back to the user's tensor


def test_outputs_are_fresh_tensors():
    c = novaforge.compile(lambda x: x * 2 + 1, backend=BACKEND)
    x = torch.randn(4)
    a = c(x)
    b = c(x + 1)
    torch.testing.assert_close(a, x * 2 + 1)
    assert a.data_ptr() != b.data_ptr()


def test_decorator_and_module_attribute_passthrough():
    @novaforge.compile(backend=BACKEND)
    def f(x):
        return torch.tanh(x) * 3

    torch.testing.assert_close(f(torch.ones(2)), torch.tanh(torch.ones(2)) * 3)
    m = Small()
    assert novaforge.compile(m).lin is m.lin


def test_chained_module_methods_keep_the_compiled_module():
    # `model = novaforge.compile(m).to(device).eval()` returned the uncompiled module: every
    # later call ran eagerly, silently
    m = Small()
    c = novaforge.compile(m, backend=BACKEND)
    for chained in (c.eval(), c.train(), c.to("cpu"), c.float(), c.requires_grad_(True), c.cpu()):
        assert chained is c
    model = novaforge.compile(Small(), backend=BACKEND).to("cpu").eval()
    assert isinstance(model, novaforge.api.CompiledModule) and not model.training
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.fn(x))
    assert model.compilations == 1
    import inspect
    assert list(inspect.signature(c.to).parameters) == list(inspect.signature(m.to).parameters)
    assert c.state_dict().keys() == m.state_dict().keys()  # other methods: the module's own


def test_explain_report_lists_passes_kernels_and_metrics():
    m = Small().eval()
    rep = novaforge.explain(m, torch.randn(2, 8), backend=BACKEND)
    text = str(rep)
    for section in ("-- passes --", "-- kernels:", "-- memory plan --", "fusion gain ratio", "fuse", "layernorm"):
        assert section in text, section
    assert rep.metrics["kernels"] == 2  # matmul+bias+relu (+scale), layernorm
    assert rep.metrics["fusion_gain_ratio"] >= 2


def test_capture_leaves_the_users_module_alone():
    """Tracing runs on a shadow of the module tree: hooks a library installs lazily during the
    traced call (transformers' output capturing) are not installed on the user's module too."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=16, use_cache=False,
                                  attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 50, (1, 8))

    def hooks(m):
        return sum(len(sub._forward_hooks) for sub in m.modules())

    before = hooks(model)
    compiled = novaforge.compile(model, freeze=True)
    with torch.no_grad():
        got = compiled(ids, output_attentions=True)
        assert hooks(model) == before
        want = model(ids, output_attentions=True)
    assert len(want.attentions) == 2 and not torch.equal(want.attentions[0], want.attentions[1])
    for a, b in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("patch", ["rebound", "closure", "partial", "child_rebound"])
def test_forward_set_on_the_instance_trains_like_eager(patch):
    """A forward assigned on an instance: the bound method itself (`m.forward = m.forward`, what
    wrapping and unwrapping leaves behind), a closure or functools.partial around the original
    forward (as patching libraries install), or a child's. Outputs and gradients match eager's,
    through novaforge.compile and compile_step, and the user's module is left as it was."""
    import copy
    import functools

    torch.manual_seed(0)

    def build():
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))

    def patched(model):
        target = model[2] if patch == "child_rebound" else model
        inner = target.forward
        if patch in ("rebound", "child_rebound"):
            target.forward = inner
        elif patch == "closure":
            target.forward = lambda x: inner(x) * 2.0
        else:
            target.forward = functools.partial(lambda m, x: type(m).forward(m, x) * 3.0, target)
        return model

    m = build()
    ref = patched(copy.deepcopy(m))
    m = patched(m)
    fwd_attr = m.__dict__.get("forward")
    x = torch.randn(5, 4)
    compiled = novaforge.compile(m)
    out = compiled(x)
    want = ref(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    assert m.__dict__.get("forward") is fwd_attr
    assert all(type(p) is torch.nn.Parameter for p in m.parameters())

    # the whole step: forward, loss, backward and SGD, against eager's
    m2 = build()
    ref2 = patched(copy.deepcopy(m2))
    m2 = patched(m2)
    step = novaforge.compile_step(m2, torch.optim.SGD(m2.parameters(), lr=0.1), lambda y, x: y.square().mean())
    opt = torch.optim.SGD(ref2.parameters(), lr=0.1)
    for _ in range(3):
        loss = step(x)
        want = ref2(x).square().mean()
        want.backward()
        opt.step()
        opt.zero_grad()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)


def test_the_garbage_collector_is_paused_while_compiling(monkeypatch):
    """Compiles run with Python's cyclic collector paused (novaforge.gc_pause), through
    novaforge.compile and torch.compile, and it is enabled again afterwards; nested and
    concurrent pauses are counted, and a collector the user disabled stays disabled."""
    import gc
    import threading

    from novaforge import api, dynamo
    from novaforge.gc_pause import paused_gc

    seen: list[bool] = []
    for owner, name in ((api, "_compile_graph"), (dynamo._AtenGraphProgram, "_build")):
        orig = getattr(owner, name)

        def spy(*a, _orig=orig, **k):
            seen.append(gc.isenabled())
            return _orig(*a, **k)

        monkeypatch.setattr(owner, name, spy)
    assert gc.isenabled()
    x = torch.randn(4, 3)
    novaforge.compile(torch.nn.Linear(3, 2))(x)
    torch.compile(torch.nn.Linear(3, 5), backend="novaforge")(x)
    assert seen and not any(seen)
    assert gc.isenabled()

    # counting: two threads inside at once, nested pauses, an exception inside
    inside, release = threading.Barrier(2), threading.Event()

    def worker():
        with paused_gc():
            inside.wait()
            release.wait()

    t = threading.Thread(target=worker)
    t.start()
    with paused_gc():
        inside.wait()
        with pytest.raises(RuntimeError), paused_gc():
            raise RuntimeError
        assert not gc.isenabled()
    assert not gc.isenabled()  # the worker is still inside
    release.set()
    t.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_compiled_block_goes_where_a_module_goes():
    """novaforge.compile(module) is an nn.Module standing in for the module (compiled_module.py):
    a compiled block assigned into its parent or a ModuleList (raised TypeError before) keeps the
    parent's parameter names, state_dict keys both ways, train/eval, .to(), hooks and deepcopy,
    and the parent trains as eager does."""
    import copy
    import inspect

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Small() for _ in range(2)])
            self.head = torch.nn.Linear(8, 1)
            self.bn = torch.nn.BatchNorm1d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(self.bn(x))

    net = Net()
    ref = copy.deepcopy(net)
    names = [n for n, _ in net.named_parameters()]
    for i, b in enumerate(net.blocks):
        net.blocks[i] = novaforge.compile(b, backend="cpu")
    net.bn = novaforge.compile(net.bn, backend="cpu")
    assert isinstance(net.blocks[0], torch.nn.Module) and isinstance(net.blocks[0], novaforge.api.CompiledModule)
    assert [n for n, _ in net.named_parameters()] == names
    assert list(net.state_dict()) == list(ref.state_dict())
    assert list(inspect.signature(net.blocks[0].forward).parameters) == ["x", "scale"]
    opt, opt_ref = torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    for _ in range(3):
        for model, o in ((net, opt), (ref, opt_ref)):
            o.zero_grad()
            model(x).pow(2).mean().backward()
            o.step()
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(net.bn.running_mean, ref.bn.running_mean)
    net.eval()
    ref.eval()
    assert not net.blocks[0].training and not net.blocks[0].fn.training and not net.bn.fn.training
    with torch.no_grad():
        torch.testing.assert_close(net(x), ref(x), atol=1e-5, rtol=1e-5)
    ref.load_state_dict(net.state_dict())  # checkpoints load into the uncompiled model and back
    net.load_state_dict(ref.state_dict())
    net.to(torch.float64)
    assert net.blocks[1].fn.lin.weight.dtype == torch.float64
    net.to(torch.float32)
    seen = []
    handle = net.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        out = net.blocks[0](x)
        net.blocks[0](x * 2)
    assert len(seen) == 2 and torch.equal(seen[0], out)
    handle.remove()
    twin = copy.deepcopy(net)
    assert type(twin.blocks[0]) is type(net.blocks[0]) and twin.blocks[0].fn is not net.blocks[0].fn
    with torch.no_grad():
        torch.testing.assert_close(twin(x), net(x))
    # the whole model compiled too, over its compiled blocks: the outer trace takes the blocks' ops
    for whole in (novaforge.compile(net, backend="cpu"), torch.compile(net, backend="novaforge")):
        with torch.no_grad():
            torch.testing.assert_close(whole(x), ref(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_hooks_run_their_side_effects_at_every_call():
    """A forward hook that collects features (Python side effects) ran only at the first call's
    trace: later calls left the collected features stale, silently. A module tree with hooks
    goes through Dynamo, which runs them at every call; fallback="raise" refuses it."""
    m = Small()
    feats = []
    m.lin.register_forward_hook(lambda mod, i, o: feats.append(o.detach().clone()))
    c = novaforge.compile(m, backend=BACKEND)
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(2, 8)
            c(x)
            assert len(feats) == k + 1
            torch.testing.assert_close(feats[-1], torch.nn.functional.linear(x, m.lin.weight, m.lin.bias))
    strict = novaforge.compile(m, backend=BACKEND, fallback="raise")
    from novaforge.frontend.capture import HookedModuleError
    with pytest.raises(HookedModuleError):
        strict(torch.randn(2, 8))

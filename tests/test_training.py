"""Training compiled: `novaforge.compile(model)` calls that need gradients (AOTAutograd forward
and backward graphs through novaforge) and `novaforge.compile_step` (forward, loss, backward and
the optimizer update as one program), against eager on the tiny nanoGPT."""

from __future__ import annotations

import copy

import pytest
import torch

import novaforge
from novaforge.bench.workloads import build_training_model, training_batches


def _pair(name="gpt-tiny"):
    a, b = build_training_model(name), build_training_model(name)
    b.load_state_dict(a.state_dict())
    return a, b


def _batches(count=4):
    return training_batches(512, 2, 32, count=count)


def _eager_step(model, opt, x, y, clip=None):
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def _compiled_step(compiled, model, opt, x, y):
    """One optimizer step through a compiled call of `model`: (loss, each parameter's gradient)."""
    opt.zero_grad(set_to_none=True)
    loss = compiled(x, y)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return loss.item(), grads


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-3, weight_decay=0.1),
    # Adam's L2 weight decay adds wd * p to the gradient: where the two cancel, m / sqrt(v) turns
    # rounding into lr-sized steps, eager against eager too; the decoupled decay is tested above
    "adam": lambda ps: torch.optim.Adam(ps, lr=3e-3),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    # maximize negates the gradient (a model whose output is a reward); a few steps keep the loss finite
    "adamw_maximize": lambda ps: torch.optim.AdamW(ps, lr=1e-3, maximize=True),
    "sgd_maximize": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.5, maximize=True),
}


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compile_step_losses_equal_eager(opt_name):
    a, b = _pair()
    oa, ob = OPTIMIZERS[opt_name](a.parameters()), OPTIMIZERS[opt_name](b.parameters())
    step = novaforge.compile_step(a, oa)
    batches = _batches()
    for i in range(50 if opt_name == "adamw" else 12):  # 50 steps for AdamW (the target), fewer for the rest
        x, y = batches[i % len(batches)]
        got, want = step(x, y).item(), _eager_step(b, ob, x, y)
        assert abs(got - want) <= 1e-4 * abs(want), (i, got, want)
    assert step.compilations == 1
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("opt_name", ["adamw", "sgd_momentum"])
def test_compile_step_updates_parameters_and_state_in_place(opt_name):
    # the update kernels write into the parameters' and moments' own buffers: no fresh result
    # per parameter and no copy at the write-back; the same values as with inplace=False
    a, b = _pair()
    oa, ob = OPTIMIZERS[opt_name](a.parameters()), OPTIMIZERS[opt_name](b.parameters())
    step = novaforge.compile_step(a, oa, backend="cpu")
    ref = novaforge.compile_step(b, ob, backend="cpu", inplace=False)
    ptrs = [p.data_ptr() for p in a.parameters()]
    for x, y in _batches()[:3]:
        assert step(x, y).item() == ref(x, y).item()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert [p.data_ptr() for p in a.parameters()] == ptrs
    stats = next(iter(step._compiled.values())).stats()
    prog, graph = stats.program, stats.graph
    written = sum(1 for s in prog.slots if s.kind == "input" and s.written)
    # every parameter, moment and step count (the order pass puts each update after the
    # backward matmuls that read the old weight); the loss is the one fresh result
    assert written == len(graph.mutations) == len(list(a.parameters())) * (4 if opt_name == "adamw" else 2)
    assert sum(1 for s in prog.slots if s.kind == "fresh") == 1


def test_compile_step_sees_parameters_changed_between_steps():
    # the step binds every parameter and state tensor at each call (one positional call, no pytree
    # work): a parameter edited in place, one given new storage (`p.data = t`) and a moment reset by
    # hand are all seen, as eager sees them; keyword arguments take the general binding path
    a, b = _pair()
    oa, ob = OPTIMIZERS["adamw"](a.parameters()), OPTIMIZERS["adamw"](b.parameters())
    step = novaforge.compile_step(a, oa, backend="cpu")
    batches = _batches()
    for i in range(6):
        x, y = batches[i % len(batches)]
        if i == 2:
            for m in (a, b):
                with torch.no_grad():
                    m.lm_head.weight.mul_(0.5)
                    first = next(m.parameters())
                    first.data = first.data.clone() + 0.01  # new storage (and same layout)
        if i == 4:
            for o in (oa, ob):
                for st in o.state.values():
                    st["exp_avg"].zero_()
        got = (step(x, y) if i % 2 else step(x, targets=y)).item()
        want = _eager_step(b, ob, x, y)
        assert abs(got - want) <= 1e-4 * abs(want), (i, got, want)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-3, rtol=1e-3)


def test_compile_step_accumulation_clipping_and_lr_schedule():
    a, b = _pair()
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    sa, sb = torch.optim.lr_scheduler.StepLR(oa, 2, 0.5), torch.optim.lr_scheduler.StepLR(ob, 2, 0.5)
    step = novaforge.compile_step(a, oa, accumulate=2, clip_grad_norm=0.5)
    batches = _batches()
    for i in range(6):
        pair = [batches[(2 * i + j) % len(batches)] for j in range(2)]
        for x, y in pair:
            step(x, y)
        ob.zero_grad(set_to_none=True)
        for x, y in pair:
            (b(x, y) / 2).backward()
        torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
        ob.step()
        sa.step()
        sb.step()
    assert step.compilations == 2  # accumulate-only and accumulate-and-update; lr changes recompile nothing
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-3, rtol=1e-3)  # lr 1e-2: an Adam step is ~lr per element
    x, y = batches[0]
    with torch.no_grad():
        assert abs(a(x, y).item() - b(x, y).item()) <= 1e-4 * b(x, y).item()


def test_compile_step_state_dict_round_trips():
    a, b = _pair()
    oa, ob = torch.optim.AdamW(a.parameters(), lr=3e-3), torch.optim.AdamW(b.parameters(), lr=3e-3)
    step = novaforge.compile_step(a, oa)
    batches = _batches()
    for i in range(3):
        step(*batches[i])
        _eager_step(b, ob, *batches[i])
    sd = copy.deepcopy(oa.state_dict())  # compiled state, in torch's format, into a fresh eager optimizer
    c = build_training_model("gpt-tiny")
    c.load_state_dict(a.state_dict())
    oc = torch.optim.AdamW(c.parameters(), lr=3e-3)
    oc.load_state_dict(sd)
    for i in range(3, 6):
        x, y = batches[i % len(batches)]
        want = _eager_step(b, ob, x, y)
        assert abs(_eager_step(c, oc, x, y) - want) <= 1e-4 * abs(want)
        assert abs(step(x, y).item() - want) <= 1e-4 * abs(want)


def test_compiled_module_trains_with_gradients_like_eager():
    a, b = _pair()
    c = novaforge.compile(a)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=3e-3), torch.optim.AdamW(b.parameters(), lr=3e-3)
    batches = _batches()
    for i in range(5):
        x, y = batches[i % len(batches)]
        loss, grads = _compiled_step(c, a, oa, x, y)
        want = _eager_step(b, ob, x, y)
        assert abs(loss - want) <= 1e-4 * abs(want)
        if i == 0:  # the same parameters: the gradients differ by float rounding only
            for g, p in zip(grads, b.parameters(), strict=True):
                torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-3)
    # after 5 AdamW steps the two runs' parameters differ by rounding that Adam amplifies (a gradient
    # element near zero gets an lr-sized step either way): the criterion, relative to the
    # largest gradient (7.3e-4 measured on an AVX2 Zen 3, where elementwise 1e-5 / 1e-3 failed)
    for g, p in zip(grads, b.parameters(), strict=True):
        assert (g - p.grad).abs().max() <= 1e-3 * p.grad.abs().max()
    assert c.compilations == 1
    with torch.no_grad():  # inference calls of the same module use the frozen-free inference program
        torch.testing.assert_close(c(batches[0][0]), b(batches[0][0]), atol=1e-4, rtol=1e-4)


@pytest.fixture
def programs(monkeypatch) -> list:
    """Every _AtenGraphProgram built during the test, in order (a forward before its backward)."""
    import novaforge.dynamo as nd

    built: list = []
    init = nd._AtenGraphProgram.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(nd._AtenGraphProgram, "__init__", recording_init)
    return built


@pytest.mark.parametrize("entry", ["novaforge", "torch"])
def test_backward_reuses_donated_activations_and_retain_graph_still_works(entry, programs):
    """The backward program computes the logits' gradient in the memory of the saved log_softmax
    (an AOTAutograd donated buffer: nothing else holds it), so its arena holds no vocabulary-sized
    buffer; the forward computes the logits in the memory of the log_softmax it returns. A
    backward that keeps the graph (`retain_graph=True`, then a second backward) gets copies of the
    saved tensors and eager's gradients both times (AOTAutograd's own check used to refuse the
    second call, after a first plain backward had compiled the program)."""
    torch._dynamo.reset()
    a, b = _pair()
    c = novaforge.compile(a, backend="cpu") if entry == "novaforge" else torch.compile(a, backend="novaforge")
    x, y = _batches(1)[0]
    logits_shape = (x.numel(), 512)  # tokens x vocabulary

    def grads(model, fn, retain):
        model.zero_grad(set_to_none=True)
        loss = fn(x, y)
        out = []
        if retain:
            loss.backward(retain_graph=True)
            out.append([p.grad.clone() for p in model.parameters()])
            model.zero_grad(set_to_none=True)
        loss.backward()
        out.append([p.grad.clone() for p in model.parameters()])
        return out

    grads(a, c, retain=False)  # the programs are built by a plain backward
    forward, backward = programs
    assert backward.donated and not forward.donated
    fplan = forward.stats[-1].graph.meta.memory_plan
    bplan = backward.stats[-1].graph.meta.memory_plan
    assert fplan.into_output and bplan.into_input, (fplan.summary(), bplan.summary())
    for plan in (fplan, bplan):  # no [tokens, vocab] buffer in either arena
        assert all(tuple(v.type.shape) != logits_shape for v in plan.offsets), plan.summary()
    want = grads(b, b, retain=True)
    got = grads(a, c, retain=True)
    for w, g in zip(want, got, strict=True):
        for gw, gg in zip(w, g, strict=True):
            torch.testing.assert_close(gg, gw, atol=1e-5, rtol=1e-3)


def _saved_bytes(forward_gm: torch.fx.GraphModule, n_user_outputs: int) -> int:
    """Bytes of the forward graph's outputs beyond the user's: what it saves for the backward."""
    (out,) = [n for n in forward_gm.graph.nodes if n.op == "output"]
    vals = [a.meta.get("val") for a in out.args[0][n_user_outputs:] if isinstance(a, torch.fx.Node)]
    return sum(v.numel() * v.element_size() for v in vals if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("entry", ["novaforge", "torch"])
def test_memory_budget_through_both_entry_points(entry, programs):
    """memory_budget below 1 gives AOTAutograd's min-cut partitioner that activation budget: the
    forward saves fewer bytes for the backward (the backward recomputes the rest), and the
    gradients stay eager's."""
    saved = {}
    for budget in (1.0, 0.0):
        programs.clear()
        a, b = _pair()
        torch._dynamo.reset()
        if entry == "novaforge":
            c = novaforge.compile(a, memory_budget=budget)
        else:
            c = torch.compile(a, backend="novaforge", options={"memory_budget": budget})
        oa, ob = torch.optim.AdamW(a.parameters(), lr=3e-3), torch.optim.AdamW(b.parameters(), lr=3e-3)
        for i, (x, y) in enumerate(_batches(3)):
            loss, grads = _compiled_step(c, a, oa, x, y)
            want = _eager_step(b, ob, x, y)
            assert abs(loss - want) <= 1e-4 * abs(want), (budget, loss, want)
            if i == 0:  # the same parameters: eager's gradients (later steps differ by AdamW's rounding)
                for g, p in zip(grads, b.parameters(), strict=True):
                    torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-3)
        saved[budget] = _saved_bytes(programs[0].gm, 1)  # the forward is compiled first
    assert saved[0.0] < 0.7 * saved[1.0], saved


def test_training_mode_batchnorm_buffers_are_updated():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.LazyLinear(2))
    x = torch.randn(4, 3, 8, 8)
    m(x)  # materializes the lazy layer
    ref = copy.deepcopy(m)
    c = novaforge.compile(m)
    c(x).sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(m[1].running_var, ref[1].running_var)
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, atol=1e-5, rtol=1e-4)


def test_train_and_eval_modes_switched_after_the_compile():
    """`model.eval()` after training steps (evaluation with gradients, or a step in eval mode)
    and `model.train()` again: both entry points follow the mode as eager does (BatchNorm's
    running statistics used, not updated, in eval mode), one program per mode."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(144, 2))
    ref = copy.deepcopy(m)
    c = novaforge.compile(m)
    x = torch.randn(4, 3, 8, 8)
    for mode in ("train", "eval", "train"):
        for mod in (m, ref):
            mod.train(mode == "train")
            mod.zero_grad()
        c(x).sum().backward()
        ref(x).sum().backward()
        torch.testing.assert_close(m[1].running_mean, ref[1].running_mean, msg=mode)
        torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, atol=1e-5, rtol=1e-4, msg=mode)
    s, sref = copy.deepcopy(ref), copy.deepcopy(ref)
    opt, opt_ref = torch.optim.SGD(s.parameters(), lr=0.1), torch.optim.SGD(sref.parameters(), lr=0.1)
    step = novaforge.compile_step(s, opt, lambda out, x: out.square().mean())
    for mode in ("train", "eval", "train"):
        for mod in (s, sref):
            mod.train(mode == "train")
        got = step(x)
        opt_ref.zero_grad()
        want = sref(x).square().mean()
        want.backward()
        opt_ref.step()
        torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5, msg=mode)
        torch.testing.assert_close(s[1].running_mean, sref[1].running_mean, msg=mode)
    assert len(step._compiled) == 2


def test_concurrent_first_calls_with_gradients():
    # two threads, two signatures: each traces its forward/backward (AOTAutograd tracing is not
    # thread-safe, so traces take turns); results and gradients as eager's
    import threading

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    compiled = novaforge.compile(model)
    errors, ok = [], {}

    def run(n: int) -> None:
        try:
            x = torch.randn(n, 8)
            out = compiled(x)
            ok[n] = torch.allclose(out, model(x), atol=1e-5)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in (3, 5, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert ok == {3: True, 5: True, 7: True}


def test_compile_step_memory_of_cross_entropy_and_updates():
    """The step's arena (CPU backend): cross-entropy over the vocabulary keeps one [tokens, vocab]
    buffer (the logits; log_softmax and its gradient are computed in place of them, NLL's
    gradient is a pointwise one-hot, not a scattered buffer); each weight's gradient GEMM and
    update runs right after its layer's backward, not after the whole backward; and no GEMM
    needs a scratch matrix (the updates fused into the weight-gradient GEMMs read C from the
    library's per-block buffer). Losses still equal eager's."""
    a, b = _pair()
    oa, ob = torch.optim.AdamW(a.parameters(), lr=3e-3), torch.optim.AdamW(b.parameters(), lr=3e-3)
    step = novaforge.compile_step(a, oa, backend="cpu")
    batches = _batches()
    for x, y in batches[:3]:
        got, want = step(x, y).item(), _eager_step(b, ob, x, y)
        assert abs(got - want) <= 1e-5 * abs(want)
    stats = next(iter(step._compiled.values())).stats()
    graph, prog = stats.graph, stats.program
    plan = graph.meta.memory_plan
    tokens, vocab = batches[0][0].numel(), a.lm_head.weight.shape[0]
    (lsm,) = [n for n in graph.nodes if n.op == "kernel" and any(m.op == "log" for m in n.attrs["kernel"].body.nodes)]
    (logp,) = lsm.outputs  # one [tokens, vocab] output: exp(log_softmax) is computed by the backward
    (dlogits,) = [o for o, i in plan.inplace.items() if i is logp]
    chain = [lsm.inputs[0], logp, dlogits]  # logits, log_softmax, its gradient
    assert all(tuple(v.type.shape) == (tokens, vocab) for v in chain)
    assert len({plan.offsets[v] for v in chain}) == 1
    bodies = [n.attrs["kernel"].body for n in graph.nodes if n.op == "kernel"]
    assert not any(m.op == "scatter_add" and tuple(m.outputs[0].type.shape) == (tokens, vocab)
                   for body in bodies for m in body.nodes)
    # the weight-gradient GEMMs with their fused updates run before the embedding's backward
    # (the last gradient of the backward), all but the tied embedding / LM head's
    pos = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
    emb_grad = max(i for i, n in enumerate(graph.nodes) if n.op == "kernel" and any(
        m.op == "scatter_add" for m in n.attrs["kernel"].body.nodes))
    updates = {pos[new] for _, new in graph.mutations if graph.nodes[pos[new]].attrs["kernel"].kind == "matmul"}
    assert len(updates) == 4 * len(a.h) + 1
    assert sum(1 for i in updates if i < emb_grad) == len(updates) - 1
    assert not any(s.kind == "scratch" for s in prog.slots)


def test_compile_step_memory_budget_trades_recompute_for_memory():
    """memory_budget=0 recomputes the forward's matmul outputs (bias adds with their GEMMs) for
    the backward instead of keeping them: a smaller arena, more GEMM launches, eager's losses."""
    arenas, gemms = {}, {}
    for budget in (1.0, 0.0):
        a, b = _pair()
        oa, ob = torch.optim.AdamW(a.parameters(), lr=3e-3), torch.optim.AdamW(b.parameters(), lr=3e-3)
        step = novaforge.compile_step(a, oa, backend="cpu", memory_budget=budget)
        batches = _batches()
        for i in range(6):
            x, y = batches[i % len(batches)]
            got, want = step(x, y).item(), _eager_step(b, ob, x, y)
            assert abs(got - want) <= 1e-5 * abs(want), (budget, i, got, want)
        stats = next(iter(step._compiled.values())).stats()
        arenas[budget] = stats.graph.meta.memory_plan.arena_bytes
        gemms[budget] = sum(1 for n in stats.graph.nodes if n.op == "kernel" and n.attrs["kernel"].kind == "matmul")
        counters = {r.name: r.counters for r in stats.records}["remat"]
        assert ("budget_recomputed" in counters) == (budget < 1)
    assert arenas[0.0] < 0.85 * arenas[1.0], arenas
    assert gemms[0.0] > gemms[1.0], gemms


def test_compile_step_trains_a_default_gpt2_with_dropout_like_eager(monkeypatch):
    """A transformers GPT-2 in its default config trains in train mode: dropout on (its CPU
    kernel writes in place into fresh tensors, which a traced autograd.grad cannot functionalize:
    the traced graph is functionalized instead), labels passed as the input ids themselves (two
    inputs sharing memory, neither mutated: the program runs, not eager), lengths that change.
    With random="eager" and the same seed before each step the compiled step draws eager's
    dropout masks (random ops keep their order through the passes), so the losses equal eager's
    (the default counter-based draws: tests/test_random.py)."""
    transformers = pytest.importorskip("transformers")
    import novaforge.api

    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    step = novaforge.compile_step(a, oa, loss_fn=lambda out, *args, **kwargs: out.loss, random="eager")
    monkeypatch.setattr(novaforge.api.CompiledModule, "_eager",
                        lambda *args, **kwargs: pytest.fail("the step ran eagerly"))
    g = torch.Generator().manual_seed(1)
    for i, n in enumerate((24, 16, 24)):
        ids = torch.randint(0, 128, (2, n), generator=g)
        torch.manual_seed(100 + i)
        got = step(ids, labels=ids).item()
        torch.manual_seed(100 + i)
        ob.zero_grad(set_to_none=True)
        loss = b(ids, labels=ids).loss
        loss.backward()
        ob.step()
        assert abs(got - loss.item()) <= 1e-5 * abs(loss.item()), (n, got, loss.item())


def test_dropout_training_draws_eagers_masks():
    """Through torch.compile (AOTAutograd's graphs, as novaforge.compile's), a default-config
    GPT-2 in train mode (dropout on) gives eager's losses when each step starts from the same
    seed with random="eager": dropout runs as ATen's random calls, in eager's order."""
    transformers = pytest.importorskip("transformers")

    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    torch._dynamo.reset()
    c = torch.compile(a, backend="novaforge", options={"random": "eager"})
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for i, n in enumerate((24, 16)):
        ids = torch.randint(0, 128, (2, n), generator=g)
        losses = []
        for model, opt in ((c, oa), (b, ob)):
            torch.manual_seed(100 + i)
            opt.zero_grad(set_to_none=True)
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1]), (n, losses)


def test_compile_step_adamw_param_groups_with_their_own_betas_and_steps():
    """Adam(W)'s step-dependent scalars come from each parameter's own step and its group's betas:
    groups with other betas and weight decay, and a parameter whose step is float64, each get
    their own, as in eager."""
    a, b = _pair()

    def groups(m):
        ps = list(m.parameters())
        return [{"params": ps[:3], "betas": (0.8, 0.99), "weight_decay": 0.0},
                {"params": ps[3:], "betas": (0.9, 0.999), "weight_decay": 0.1}]

    oa, ob = torch.optim.AdamW(groups(a), lr=3e-3), torch.optim.AdamW(groups(b), lr=3e-3)
    batches = _batches()
    for opt, model in ((oa, a), (ob, b)):  # one eager step each: state exists, then one step goes float64
        _eager_step(model, opt, *batches[0])
        first = next(iter(model.parameters()))
        opt.state[first]["step"] = opt.state[first]["step"].to(torch.float64)
    step = novaforge.compile_step(a, oa)
    for i in range(6):
        x, y = batches[i % len(batches)]
        got, want = step(x, y).item(), _eager_step(b, ob, x, y)
        assert abs(got - want) <= 1e-4 * abs(want), (i, got, want)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-4, rtol=1e-4)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert float(oa.state[p]["step"]) == float(ob.state[q]["step"]) == 7.0


def test_compile_step_groups_with_their_own_learning_rates_a_scheduler_and_step_hooks():
    """Parameter groups with different learning rates (fine-tuning's usual head / backbone split),
    each decayed by a scheduler: the rates are one run-time input (no recompile); an updating call
    runs the optimizer's step post-hooks and sets the flag LR schedulers check (no "scheduler
    before optimizer" warning), as `optimizer.step()` does; a pre-hook is refused."""
    import warnings

    a, b = _pair()

    def groups(m):
        ps = list(m.parameters())
        return [{"params": ps[:4], "lr": 1e-2}, {"params": ps[4:], "lr": 1e-3, "weight_decay": 0.0}]

    oa, ob = torch.optim.AdamW(groups(a), lr=5e-3), torch.optim.AdamW(groups(b), lr=5e-3)
    sa, sb = (torch.optim.lr_scheduler.LambdaLR(o, [lambda i: 0.5 ** i, lambda i: 1.0 + i]) for o in (oa, ob))
    seen = []
    oa.register_step_post_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    step = novaforge.compile_step(a, oa)
    batches = _batches()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lr_scheduler.step.*")
        for i in range(5):
            x, y = batches[i % len(batches)]
            got, want = step(x, y).item(), _eager_step(b, ob, x, y)
            sa.step()
            sb.step()
            assert abs(got - want) <= 1e-4 * abs(want), (i, got, want)
    assert step.compilations == 1
    assert seen == [1e-2 * 0.5 ** i for i in range(5)]
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-4, rtol=1e-4)
    oa.register_step_pre_hook(lambda opt, args, kwargs: None)
    with pytest.raises(NotImplementedError, match="pre-hooks"):
        step(*batches[0])


@pytest.mark.parametrize("variant", ["use_cache=False", "gradient checkpointing"])
def test_compiled_transformers_model_trains_without_a_cache(variant):
    """novaforge.compile(model) on a transformers GPT-2 that trains without a KV cache (its config's
    use_cache=False, or gradient checkpointing, which turns the cache off): transformers then checks
    position_ids for packed sequences, a data-dependent branch it skips only when told a compiler
    traces. The first call's AOTAutograd trace says so; gradients and losses match eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=variant != "use_cache=False")
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    if variant == "gradient checkpointing":
        a.gradient_checkpointing_enable()
        b.gradient_checkpointing_enable()
    compiled = novaforge.compile(a)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (2, 16))
    for _ in range(2):
        got, grads = _compiled_step(lambda ids, labels: compiled(input_ids=ids, labels=labels).loss, a, oa, x, x)
        want = _eager_step(lambda ids, labels: b(input_ids=ids, labels=labels).loss, ob, x, x)
        assert abs(got - want) <= 1e-5 * abs(want)
        for g, q in zip(grads, b.parameters(), strict=True):
            torch.testing.assert_close(g, q.grad, atol=1e-5, rtol=1e-4)


def test_compiled_module_trains_at_varying_lengths_without_a_build_per_length():
    """Training with dynamic padding (a new length every batch) through novaforge.compile: two
    sizes of one input structure get their own forward and backward programs, a third goes to
    Dynamo with dynamic shapes (`CompiledModule._dynamic_trainer`), which serves every later
    length; no build per length, and every step's loss and gradients equal eager's."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    compiled = novaforge.compile(a)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    for length in (9, 14, 20, 27, 33, 14):
        x = torch.randint(0, 128, (2, length))
        got, grads = _compiled_step(lambda ids, labels: compiled(input_ids=ids, labels=labels).loss, a, oa, x, x)
        want = _eager_step(lambda ids, labels: b(input_ids=ids, labels=labels).loss, ob, x, x)
        assert abs(got - want) <= 1e-5 * abs(want), length
        for g, q in zip(grads, b.parameters(), strict=True):
            torch.testing.assert_close(g, q.grad, atol=1e-5, rtol=1e-4)
    assert len(compiled._train_entries) == 2 and compiled._trainer is not None
    assert compiled.compilations == 3


def test_compile_step_over_a_causal_lm_at_varying_lengths_traces_the_sizes_once(monkeypatch):
    """transformers' ForCausalLMLoss pads the labels (`F.pad(labels, (0, 1), value=-100)`), whose
    fake kernel read the concrete length: the symbolic trace specialized, and from the third
    length on every step ran eagerly (5x slower here) without ever compiling. The pad is now
    decomposed in symbolic traces: the third length builds one program for all lengths, and each
    step's loss equals eager's."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("NOVAFORGE_TIERED", "1")  # (the suite builds every size; users get automatic dynamic)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    a = transformers.GPT2LMHeadModel(cfg).train()
    b = copy.deepcopy(a)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    step = novaforge.compile_step(a, oa)
    for length in (9, 14, 20, 27, 33):
        x = torch.randint(0, 128, (2, length))
        got = float(step(input_ids=x, labels=x))
        ob.zero_grad()
        loss = b(input_ids=x, labels=x).loss
        loss.backward()
        ob.step()
        assert abs(got - float(loss)) <= 1e-5 * abs(float(loss)), length
    (fn,) = step._compiled.values()
    assert fn.dynamic is not None and fn.dynamic.traces == 1 and fn.dynamic.specializations >= 2
    for p, q in zip(a.parameters(), b.parameters(), strict=True):  # (an AdamW step moves an element by up to lr
        torch.testing.assert_close(p, q, atol=2e-5, rtol=1e-4)       # = 1e-3 whatever its gradient's size: 2%)


@pytest.mark.parametrize("pad", [(0, 1), (2, 0, 1, 3), (-1, 2), (1, -2, 0, 0, 2, 1), (0, 0)])
def test_pad_decomposition_of_symbolic_traces_matches_f_pad(pad):
    from novaforge.frontend.capture_fx import _pad_by_cat

    x = torch.randn(3, 5, 6)
    want = torch.nn.functional.pad(x, pad, value=-2.5)
    got = _pad_by_cat(x, list(pad), -2.5)
    assert got.shape == want.shape and torch.equal(got, want)
    assert got.data_ptr() != x.data_ptr()
    labels = torch.randint(0, 9, (2, 7))
    assert torch.equal(_pad_by_cat(labels, [0, 1], -100), torch.nn.functional.pad(labels, (0, 1), value=-100))


def test_checkpointed_attention_compiles_and_dropout_keeps_its_rng_wrappers():
    """Activation checkpointing wraps every op tagged as random (scaled_dot_product_attention
    among them) in run_and_save_rng_state / run_with_rng_state, which are not ATen ops: a
    transformers Llama with gradient checkpointing ran its graphs uncompiled under
    torch.compile(backend="novaforge"). With dropout_p=0 the wrappers are dropped
    (frontend/rng_hops.py) and the graphs compile; a real dropout keeps them (ATen, eager's masks)."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    from novaforge import dynamo as nf_dynamo

    class Block(torch.nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.lin, self.p = torch.nn.Linear(16, 48), p

        def attend(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.transpose(1, 2) for t in self.lin(x).view(2, 5, 3, 2, 8).unbind(2))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)
            return F.dropout(y.transpose(1, 2).reshape(2, 5, 16), self.p, self.training)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.attend, x, use_reentrant=False).pow(2).sum()

    for p, compiles in ((0.0, True), (0.3, False)):
        torch.manual_seed(0)
        a = Block(p)
        b = copy.deepcopy(a)
        fallbacks = len(nf_dynamo.FALLBACKS)
        x = torch.randn(2, 5, 16, requires_grad=True)
        torch.manual_seed(5)
        got = torch.compile(a, backend="novaforge")(x)
        got.backward()
        torch.manual_seed(5)
        want = b(x)
        want.backward()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for g, q in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(g.grad, q.grad, atol=1e-5, rtol=1e-4)
        assert (len(nf_dynamo.FALLBACKS) == fallbacks) == compiles, p
    torch._dynamo.reset()


def test_gradient_checkpointed_llama_trains_compiled_through_torch_compile():
    transformers = pytest.importorskip("transformers")
    from novaforge import dynamo as nf_dynamo

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128)
    a = transformers.LlamaForCausalLM(cfg).train()
    a.gradient_checkpointing_enable()
    b = copy.deepcopy(a)
    compiled = torch.compile(a, backend="novaforge")
    fallbacks = len(nf_dynamo.FALLBACKS)
    oa, ob = torch.optim.AdamW(a.parameters(), lr=1e-3), torch.optim.AdamW(b.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (2, 12))
    for _ in range(2):
        got, grads = _compiled_step(lambda ids, labels: compiled(input_ids=ids, labels=labels).loss, a, oa, x, x)
        want = _eager_step(lambda ids, labels: b(input_ids=ids, labels=labels).loss, ob, x, x)
        assert abs(got - want) <= 1e-5 * abs(want)
        for g, q in zip(grads, b.parameters(), strict=True):
            torch.testing.assert_close(g, q.grad, atol=1e-5, rtol=1e-4)
    assert len(nf_dynamo.FALLBACKS) == fallbacks  # every graph compiled
    torch._dynamo.reset()

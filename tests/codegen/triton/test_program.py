"""The Triton backend's program and caches (interpreter): arena use, fresh outputs, kernel
sharing across identical layers, source dumps, gradients, buffer mutations, torch fallbacks,
and whole transformers models against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nf_triton_testing import backend, check, compiled, rel_err, steps

import novaforge


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x + F.gelu(self.lin(x)))


def test_intermediates_live_in_one_arena_and_outputs_are_fresh():
    m = torch.nn.Sequential(Block(16), Block(16)).eval()
    x = torch.randn(5, 16)
    c = compiled(m, freeze=True)
    with torch.no_grad():
        y1 = c(x)
        torch.testing.assert_close(y1, m(x), atol=1e-5, rtol=1e-5)
        prog = c.stats().program
        plan = c.stats().graph.meta["memory_plan"]
        assert prog.arena.numel() >= plan.arena_bytes > 0
        base = prog.arena.untyped_storage().data_ptr()
        inside = [t for t in prog.template if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == base]
        assert len(inside) == len(plan.offsets)
        y1_copy = y1.clone()
        y2 = c(x + 1)
        assert y1.data_ptr() != y2.data_ptr() and y1.untyped_storage().data_ptr() != base
        torch.testing.assert_close(y1, y1_copy)  # the second call did not overwrite the first result


def test_identical_layers_share_compiled_kernels():
    m = torch.nn.Sequential(*[Block(24) for _ in range(4)]).eval()
    x = torch.randn(3, 7, 24)
    before = backend().compiled
    c = compiled(m, freeze=True)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)
    launches = steps(c)["triton"]
    new = backend().compiled - before
    assert launches >= 8 and new <= launches // 4 + 1, (launches, new)


def test_sources_are_dumped(tmp_path):
    c = compiled(lambda x: torch.softmax(x, -1) * 2, dump_dir=str(tmp_path))
    c(torch.randn(3, 5))
    files = sorted(p.name for p in (tmp_path / "triton").iterdir())
    assert "program.txt" in files
    src = [p for p in (tmp_path / "triton").glob("softmax*.py")]
    assert src and "@triton.jit" in src[0].read_text()


def test_gradients_are_correct_not_detached():
    m = Block(8)
    x = torch.randn(4, 8, requires_grad=True)
    c = compiled(m)
    y = c(x)
    assert y.requires_grad
    y.square().sum().backward()
    gx, gw = x.grad.clone(), m.lin.weight.grad.clone()
    x.grad = None
    m.zero_grad()
    m(x).square().sum().backward()
    torch.testing.assert_close(gx, x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, m.lin.weight.grad, atol=1e-5, rtol=1e-5)


def test_buffer_mutation_is_written_back():
    bn = torch.nn.BatchNorm1d(6).train()
    ref = torch.nn.BatchNorm1d(6).train()
    ref.load_state_dict(bn.state_dict())
    c = compiled(bn)
    x = torch.randn(9, 6)
    with torch.no_grad():
        torch.testing.assert_close(c(x), ref(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    torch.testing.assert_close(bn.running_var, ref.running_var)


def test_unsupported_kernels_fall_back_to_torch_with_a_reason():
    c = check(lambda x: torch.cumsum(x, -1) * 2, torch.randn(4, 9), all_triton=False)
    assert steps(c)["torch"] >= 1
    assert any("cumsum" in r for r in backend().reasons.values())


def test_programs_on_cpu_never_use_cuda_graphs():
    c = compiled(lambda x: x + 1, cuda_graphs=True)
    c(torch.randn(3))
    assert c.stats().program.use_graphs is False


def _tiny_models():
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2Config(use_cache=False, n_layer=2, n_embd=64, n_head=4, vocab_size=101, n_positions=64)
    llama = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=96, vocab_size=101, use_cache=False)
    return {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_transformers_models_match_eager(name):
    transformers = pytest.importorskip("transformers")
    cfg = _tiny_models()[name]
    torch.manual_seed(0)
    m = transformers.AutoModel.from_config(cfg).eval()
    ids = torch.randint(0, 101, (2, 9))
    c = novaforge.compile(m, backend="triton", freeze=True, tf32=False, capture="export")
    with torch.no_grad():
        got = c(ids).last_hidden_state
        want = m(ids).last_hidden_state
    assert rel_err(got, want) < 1e-5
    assert steps(c).get("torch", 0) == 0, backend().reasons


@pytest.mark.slow
def test_llama_bf16_matches_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    m = transformers.AutoModel.from_config(_tiny_models()["llama"]).eval().to(torch.bfloat16)
    ids = torch.randint(0, 101, (2, 9))
    c = novaforge.compile(m, backend="triton", freeze=True, capture="export")
    with torch.no_grad():
        got = c(ids).last_hidden_state
        want = m(ids).last_hidden_state
    assert rel_err(got, want) < 2e-2


def test_kernels_that_fail_to_compile_run_through_torch():
    m = torch.nn.Sequential(Block(8)).eval()
    x = torch.randn(3, 8)
    c = compiled(m, freeze=True)
    with torch.no_grad():
        c(x)
        prog = c.stats().program
        first = next(st for st in prog.steps if st.kind == "triton")
        n_triton = steps(c)["triton"]
        with pytest.warns(UserWarning, match="failed to compile"):
            backend()._fall_back(prog, {id(first.node): "boom"})
        assert steps(c)["triton"] == n_triton - 1 and len(prog.kernels) == n_triton - 1
        torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-5)

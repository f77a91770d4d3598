"""`novaforge.register_kernel` (docs/user-kernels.md): a user kernel for an ATen op or an IR
pattern replaces the matches whose cost it wins, and only those.

The docs' rotary-embedding example is run as written (its python block), on a Llama-style
attention layer, through `novaforge.compile` and `torch.compile(backend="novaforge")`, against
eager. Every test unregisters what it registers (the `registered` fixture).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import novaforge
from novaforge.passes.user_kernels import REGISTRY
from novaforge.report.explain import explain
from novaforge.report.ops_table import summary
from novaforge.user_kernels import UserKernelError, registered_kernels

DOC = Path(__file__).resolve().parents[1] / "docs" / "user-kernels.md"


def _doc_example() -> dict:
    """The docs' example, executed: its names (rope, rotate_half, ROPE_CPP, rope_kernel, ...)."""
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/user-kernels.md lost its python example"
    names: dict = {}
    exec(compile(block.group(1), str(DOC), "exec"), names)
    return names


@pytest.fixture
def registered():
    """Unregister, after the test, whatever it registered."""
    before = {k.name for k in registered_kernels()}
    yield
    for k in registered_kernels():
        if k.name not in before:
            k.unregister()


@pytest.fixture
def example(registered):
    return _doc_example()


class Rotary(torch.nn.Module):  # transformers' LlamaRotaryEmbedding, default rope
    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / base ** (torch.arange(0, dim, 2).float() / dim), persistent=False)

    def forward(self, position_ids):
        freqs = (self.inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class LlamaAttention(torch.nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(hidden, hidden, bias=False)
                                                              for _ in range(4))
        self.rotary = Rotary(self.dim)

    def forward(self, x, position_ids):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = self.rotary(position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # transformers' apply_rotary_pos_emb
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


def _inputs(b: int = 2, t: int = 8, hidden: int = 32):
    return torch.randn(b, t, hidden), torch.arange(t).expand(b, t)


def _counters(compiled) -> dict:
    return {r.name: r.counters for r in compiled.stats().records}["user_kernels"]


def test_docs_rope_example_replaces_q_and_k_rotary_and_matches_eager(example):
    rope_kernel = example["rope_kernel"]
    model = LlamaAttention().eval()
    x, pos = _inputs()  # (other sizes than the registration's examples: the pattern is traced again)
    fast = novaforge.compile(model)
    with torch.no_grad():
        out = fast(x, pos)
        ref = model(x, pos)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert _counters(fast).get("user_kernel_used") == 2  # q and k
    assert rope_kernel.calls == 2
    with torch.no_grad():
        fast(x, pos)
    assert rope_kernel.calls == 4
    text = str(explain(fast, x, pos))
    assert "user:rope" in text and "user kernel rope (C++)" in text


def test_a_registration_whose_cost_loses_is_not_used(example, registered):
    example["rope_kernel"].unregister()
    loses = novaforge.register_kernel(example["rope"], example_inputs=example["examples"], cpp=example["ROPE_CPP"],
                                      cost=lambda x, c, s: dict(flops=3 * x.numel(), bytes=40 * x.numel()))
    model = LlamaAttention().eval()
    x, pos = _inputs()
    fast = novaforge.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x, pos), model(x, pos), rtol=1e-5, atol=1e-5)
    assert loses.calls == 0
    assert _counters(fast).get("user_kernel_loses") == 2 and "user_kernel_used" not in _counters(fast)
    # declared in ns: a cheap one wins
    loses.unregister()
    wins = novaforge.register_kernel(example["rope"], example_inputs=example["examples"], cpp=example["ROPE_CPP"],
                                     cost=dict(ns=1.0))
    fast = novaforge.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x, pos), model(x, pos), rtol=1e-5, atol=1e-5)
    assert wins.calls == 2


def test_through_torch_compile(example):
    torch._dynamo.reset()
    model = LlamaAttention().eval()
    x, pos = _inputs(1, 6)
    fast = torch.compile(model, backend="novaforge")
    with torch.no_grad():
        torch.testing.assert_close(fast(x, pos), model(x, pos), rtol=1e-5, atol=1e-5)
    assert example["rope_kernel"].calls == 2
    torch._dynamo.reset()


def test_rotary_whose_intermediate_is_read_elsewhere_is_not_replaced(example):
    def f(q, cos, sin):  # rotate_half(q) is also returned: replacing would compute it twice
        r = _rotate_half(q)
        return q * cos + r * sin, r * 2

    q, cos, sin = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    fast = novaforge.compile(f)
    for a, b in zip(fast(q, cos, sin), f(q, cos, sin), strict=True):
        torch.testing.assert_close(a, b)
    assert example["rope_kernel"].calls == 0
    fast = novaforge.compile(lambda q, cos, sin: f(q, cos, sin)[0])  # (not read elsewhere: replaced)
    torch.testing.assert_close(fast(q, cos, sin), f(q, cos, sin)[0])
    assert example["rope_kernel"].calls == 1


GELU_CPP = r"""
extern "C" void gelu(const float* x, float* out, const int64_t* sizes) {
    int64_t n = 1;
    for (int i = 0; i < 2; ++i) n *= sizes[i];
    for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}
"""


def test_aten_op_registration_and_unregister(registered):
    def f(x):
        return F.gelu(x * 2.0) + 1.0

    x = torch.randn(16, 24)
    k = novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=(torch.randn(3, 5),), cpp=GELU_CPP,
                                  cost=lambda s: dict(flops=s.numel(), bytes=8 * s.numel()))
    assert k.name == "gelu" and "gelu" in REGISTRY
    text = summary()
    assert "user:gelu" in text and "C++" in text and "aten.gelu.default" in text
    fast = novaforge.compile(f)
    torch.testing.assert_close(fast(x), f(x))
    assert k.calls == 1
    k.unregister()
    assert "gelu" not in REGISTRY and "user:gelu" not in summary()
    torch.testing.assert_close(fast(x), f(x))  # (a program compiled with it keeps calling it)
    assert k.calls == 2
    fast = novaforge.compile(f)
    torch.testing.assert_close(fast(x), f(x))
    assert k.calls == 2  # a compile after unregistering generates its own kernel
    with pytest.raises(TypeError, match="takes"):
        k(x.double())
    with novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=(torch.randn(3, 5),), cpp=GELU_CPP,
                                   cost=dict(flops=0, bytes=0)) as k2:
        fast = novaforge.compile(f)
        torch.testing.assert_close(fast(x), f(x))
        assert k2.calls == 1
    assert "gelu" not in REGISTRY


def test_gradients_flow_through_the_pattern(example):
    def f(q, cos, sin):
        return example["rope"](q, cos, sin)

    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    cos, sin = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    fast = novaforge.compile(f, backend="interpret")
    out = fast(q, cos, sin)
    out.sum().backward()
    q2 = q.detach().requires_grad_()
    f(q2, cos, sin).sum().backward()
    torch.testing.assert_close(out, f(q, cos, sin))
    torch.testing.assert_close(q.grad, q2.grad)
    assert example["rope_kernel"].calls == 1  # (its backward: the pattern's, through autograd)


def _two(x, y):
    return x + y, x * y


def test_registration_errors(example, registered):
    ex = (torch.randn(2, 3),)
    with pytest.raises(UserKernelError, match="returns 2 tensors"):
        novaforge.register_kernel(_two, example_inputs=ex * 2, cpp="", cost=dict(bytes=1))
    glob = torch.randn(2, 3)
    with pytest.raises(UserKernelError, match="not one of its arguments"):
        novaforge.register_kernel(lambda x: x + glob, example_inputs=ex, cpp="", cost=dict(bytes=1), name="g")
    with pytest.raises(UserKernelError, match="exactly one implementation"):
        novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=ex, cost=dict(bytes=1))
    with pytest.raises(UserKernelError, match="cost must be"):
        novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=ex, cpp=GELU_CPP, cost=dict(x=1))
    with pytest.raises(UserKernelError, match="op packet"):
        novaforge.register_kernel(torch.ops.aten.gelu, example_inputs=ex, cpp=GELU_CPP, cost=dict(bytes=1))
    with pytest.raises(UserKernelError, match="takes 2 arguments"):
        novaforge.register_kernel(lambda a, b: a + b, example_inputs=ex, cpp="", cost=dict(bytes=1), name="ab")
    with pytest.raises(UserKernelError, match="cannot trace"):
        novaforge.register_kernel(lambda x: x if x.sum() > 0 else -x, example_inputs=ex, cpp="", cost=dict(bytes=1),
                                  name="branchy")
    with pytest.raises(UserKernelError, match="is registered already"):
        novaforge.register_kernel(example["rope"], example_inputs=example["examples"], cpp=example["ROPE_CPP"],
                                  cost=dict(bytes=1))
    with pytest.raises(UserKernelError, match="defines no extern"):
        novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=ex, cpp=GELU_CPP.replace("gelu(", "g2("),
                                  cost=dict(bytes=1))
    with pytest.raises(UserKernelError, match="does not compile"):
        novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=ex, cpp="this is not C++",
                                  cost=dict(bytes=1))
    wrong = GELU_CPP.replace("0.5f *", "0.25f *")
    with pytest.raises(novaforge.user_kernels.UserKernelMismatch, match="differs from its pattern"):
        novaforge.register_kernel(torch.ops.aten.gelu.default, example_inputs=ex, cpp=wrong, cost=dict(bytes=1))
    assert "gelu" not in REGISTRY


def test_triton_kernel_for_a_pattern(registered, monkeypatch):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # (read when @triton.jit decorates: runs on the CPU)

    @triton.jit
    def scale_add(x_ptr, y_ptr, out_ptr, x0, x1, y0, y1, o0, o1, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < o0 * o1
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x * 2.0 + y, mask=mask)

    def scaled_sum(x, y):
        return x * 2.0 + y

    k = novaforge.register_kernel(scaled_sum, example_inputs=(torch.randn(3, 4), torch.randn(3, 4)),
                                  triton=scale_add, grid=lambda x, y, out: (triton.cdiv(out.numel(), 64),),
                                  meta=dict(BLOCK=64), cost=dict(ns=0))
    assert k.language == "Triton"

    def f(a, b):
        return torch.relu(b + a * 2.0)  # (the add's operands in the other order: add is commutative)

    a, b = torch.randn(5, 7), torch.randn(5, 7)
    fast = novaforge.compile(f)
    torch.testing.assert_close(fast(a, b), f(a, b))
    assert k.calls == 1
    with pytest.raises(UserKernelError, match="needs grid="):
        novaforge.register_kernel(scaled_sum, example_inputs=(a, b), triton=scale_add, cost=dict(ns=0), name="t2")

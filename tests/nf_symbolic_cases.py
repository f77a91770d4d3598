"""Cases for programs for a range of sizes (issue 16): every kernel kind with a symbolic size,
shared by the CPU and the Triton backend's tests.

CASES: (name, fn, make(n) -> args, dynamic spec for novaforge.compile, sizes to run).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import novaforge


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _ln(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


W32x48, B48, R16 = torch.randn(32, 48), torch.randn(48), torch.randn(16)
LNW, LNB, EMB = torch.randn(64), torch.randn(64), torch.randn(50, 16)


def _attn_mask(q, k, v):
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _rotate_half(x):
    a, b = x[..., :8], x[..., 8:]
    return torch.cat([-b, a], dim=-1) * 2 + x


# (name, fn, make(n) -> args, dynamic spec, sizes)
CASES = [
    ("pointwise-broadcast", lambda x, z: F.gelu(x * R16 + z), lambda n: (_rand(n, 16), _rand(n, 1)),
     {0: {0: (2, 4096)}, 1: {0: (2, 4096)}}, (3, 17, 200)),
    ("pointwise-long-1d", lambda x: torch.sigmoid(x) * 2 - 1, lambda n: (_rand(n),), {0: {0: (2, 1 << 20)}},
     (5, 1000, 70001)),
    ("softmax-rows", lambda x: torch.softmax(x, -1), lambda n: (_rand(4, n),), {0: {1: (2, 20000)}},
     (3, 65, 9000)),
    ("softmax-rows-bounded", lambda x: torch.softmax(x, -1), lambda n: (_rand(6, n),), {0: {1: (2, 1000)}},
     (3, 65, 999)),
    ("sum-columns", lambda x: x.sum(0, keepdim=True) + x.amax(0), lambda n: (_rand(n, 24),), {0: {0: (2, 4096)}},
     (2, 33, 500)),
    ("layernorm", lambda x: _ln(x, LNW, LNB), lambda n: (_rand(2, n, 64),), {0: {1: (2, 4096)}}, (3, 40, 300)),
    ("linear-epilogue", lambda x, r: torch.relu(x @ W32x48 + B48) + r, lambda n: (_rand(n, 32), _rand(n, 48)),
     {0: {0: (2, 4096)}, 1: {0: (2, 4096)}}, (3, 31, 257)),
    ("bmm-both-symbolic", lambda a, b: torch.softmax(a @ b, -1), lambda n: (_rand(2, n, 16), _rand(2, 16, n)),
     {0: {1: (2, 1024)}, 1: {2: (2, 1024)}}, (3, 20, 130)),
    ("sdpa-causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda n: (_rand(1, 2, n, 16), _rand(1, 2, n, 16), _rand(1, 2, n, 16)),
     {i: {2: (2, 2048)} for i in range(3)}, (3, 17, 100)),
    ("sdpa-gqa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
     lambda n: (_rand(1, 4, n, 16), _rand(1, 2, n, 16), _rand(1, 2, n, 16)),
     {i: {2: (2, 2048)} for i in range(3)}, (2, 19, 70)),
    ("sdpa-mask", _attn_mask, lambda n: (_rand(1, 2, n, 16), _rand(1, 2, n, 16), _rand(1, 2, n, 16)),
     {i: {2: (2, 2048)} for i in range(3)}, (3, 33)),
    ("cat-rows", lambda x, y: torch.cat([x, y * 2], 0) + 1, lambda n: (_rand(n, 8), _rand(5, 8)),
     {0: {0: (2, 4096)}}, (2, 9, 100)),
    ("cat-rotate-half", _rotate_half, lambda n: (_rand(n, 16),), {0: {0: (2, 4096)}}, (3, 25, 300)),
    ("embedding", lambda ids: F.embedding(ids, EMB) * 2, lambda n: (torch.randint(0, 50, (n,)),),
     {0: {0: (2, 4096)}}, (2, 30, 400)),
    ("embedding-batch", lambda ids: F.embedding(ids, EMB), lambda n: (torch.randint(0, 50, (2, n)),),
     {0: {1: (2, 4096)}}, (3, 30)),
    ("positions", lambda x: x + EMB[torch.arange(x.shape[0])], lambda n: (_rand(n, 16),), {0: {0: (2, 50)}},
     (2, 17, 50)),
    ("slices", lambda x: x[1:, 2:] * x[:-1, :-2], lambda n: (_rand(n, 16),), {0: {0: (2, 4096)}}, (3, 9, 300)),
    ("gather", lambda x, i: torch.gather(x, 1, i), lambda n: (_rand(n, 10), torch.randint(0, 10, (n, 4))),
     {0: {0: (2, 4096)}, 1: {0: (2, 4096)}}, (2, 21, 333)),
    ("size-as-number", lambda x: x / x.shape[0] + x.mean(0), lambda n: (_rand(n, 12),), {0: {0: (2, 4096)}},
     (3, 50)),
]


def run_case(name: str, backend: str):
    """Compile case `name` once on `backend` with its dynamic spec, run it at every size (and
    the first again) against eager, check that one build served them all; the compiled callable."""
    _, fn, make, spec, sizes = next(c for c in CASES if c[0] == name)
    torch.manual_seed(0)
    c = novaforge.compile(fn, backend=backend, freeze=True, dynamic=spec, tiered=False)
    with torch.no_grad():
        for n in list(sizes) + [sizes[0]]:
            args = make(n)
            want, got = fn(*args), c(*args)
            assert got.shape == want.shape and got.dtype == want.dtype, (n, got.shape, want.shape)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert c.compilations == 1, "one build serves every size"
    return c

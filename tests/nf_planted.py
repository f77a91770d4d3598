"""Planted miscompilations for the numerics-checker and bisector tests (test-only switches:
each is a monkeypatch that the test undoes)."""

from __future__ import annotations

import torch

from novaforge.passes import plan_memory as plan_memory_mod
from novaforge.passes import simplify as simplify_mod


class _Always:
    """Equal to everything: makes the in-place rule believe every input dies at its reader."""

    def __eq__(self, other):
        return True

    __hash__ = None


def _no_caches(monkeypatch):
    """A planted pass bug must neither be served from nor written to the graph caches (the
    optimized-graph cache keys on the passes' source files, not on functions patched in memory)."""
    monkeypatch.setenv("NOVAFORGE_GRAPH_CACHE", "0")


def plant_inplace_bug(monkeypatch):
    """A miscompilation in plan_memory: a pointwise kernel may write into a buffer that a later
    kernel still reads (the liveness test of the in-place rule is skipped)."""
    _no_caches(monkeypatch)
    orig = plan_memory_mod._inplace_candidates

    class LastUse(dict):
        def get(self, k, d=None):
            return _Always()

    monkeypatch.setattr(plan_memory_mod, "_inplace_candidates",
                        lambda graph, last, buffers, ctx=None, outputs=None: orig(graph, LastUse(last), buffers, ctx,
                                                                                  outputs))


def clobber_model(x, w):
    v = x.cumsum(-1) * 1  # a scan kernel: v lives in the arena
    o = torch.tanh(v)  # a pointwise kernel reading v: the planted bug writes o over v ...
    return v.t() @ o.sum(0) + w.sum()  # ... which this matmul kernel still reads


def plant_pow_bug(monkeypatch):
    """A wrong rewrite rule in simplify: pow(x, 2) -> x * x * x."""
    _no_caches(monkeypatch)
    orig = simplify_mod._pow

    def bad(rw, n, x, e, same_as):
        if e == 2.0:
            return rw.emit("mul", [rw.emit("mul", [x, x]).out, x]).out
        return orig(rw, n, x, e, same_as)

    monkeypatch.setattr(simplify_mod, "_pow", bad)

"""`generate()` on a compiled transformers model: the model's own generation loop, with every
forward call going through the compiled program.

`CompiledModule.generate(*args, **kwargs)` runs `model.generate` while the model's `forward`
is replaced by the compiled callable (an instance attribute, removed again afterwards; it keeps
the original's signature, which `generate` inspects). Capture, which traces the module's own
forward, sees the original: a thread-local depth counter (`capturing()`) tells the replacement
to step aside while a compile is tracing.

Bounded programs: unless the caller chose a cache (`past_key_values=` or
`cache_implementation=`), generation uses transformers' `StaticCache`: a preallocated cache of
the generation's maximum length rounded up to a multiple of `CACHE_BUCKET` positions, written
in place at `cache_position` (the CPU backend updates the caller's cache tensors in place: one
row per step, no copies); the attention mask does the rest. Every decoding step then has the
same shapes, so one generation builds two programs (the prefill and one decode step) whatever
the number of new tokens, and generations whose lengths round to the same bucket share them. With the default
`DynamicCache` the cache grows every step and each length is a new program (symbolic shapes
will lift that). transformers' own automatic `torch.compile` of the forward is switched off
(`disable_compile=True`): novaforge already compiles it.

Invariant: greedy generation produces exactly eager's tokens whenever the compiled forward
agrees with eager's logits to rounding (the tests check token equality).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

_state = threading.local()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Mark this thread as tracing a module: a replaced forward calls the original."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _is_capturing() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def forward_replaced(model: Any, compiled: Any) -> Iterator[None]:
    """Within the block, `model.forward(...)` (and so `model(...)`) runs `compiled(...)`."""
    own = model.__dict__.get("forward")  # an instance-level forward (hooks, wrappers), if any
    base = own if own is not None else type(model).forward.__get__(model)

    @functools.wraps(base)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if _is_capturing():
            return base(*args, **kwargs)
        return compiled(*args, **kwargs)

    forward._novaforge_replaced = True  # capture traces the shadow module without it
    forward._novaforge_own = own
    model.forward = forward
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def static_cache_supported(model: Any) -> bool:
    return bool(getattr(model, "_can_compile_fullgraph", False) or getattr(model, "_supports_static_cache", False))


CACHE_BUCKET = 128  # static caches are sized in multiples of this many positions


def _bucketed_static_cache(model: Any, args: tuple, kwargs: dict, gen_config: Any) -> Any:
    """A StaticCache for prompt + new tokens, rounded up to a multiple of CACHE_BUCKET, so that
    generations of similar lengths share their programs (the mask hides the unused positions).
    None when the lengths cannot be read from the call (transformers then sizes the cache)."""
    import torch

    ids = args[0] if args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    new = kwargs.get("max_new_tokens") or getattr(gen_config, "max_new_tokens", None)
    total = ids.shape[1] + new if new else (kwargs.get("max_length") or getattr(gen_config, "max_length", None))
    if not total:
        return None
    try:
        from transformers import StaticCache
    except ImportError:
        return None
    length = -(-int(total) // CACHE_BUCKET) * CACHE_BUCKET
    return StaticCache(config=model.config, max_cache_len=length)


def generate(compiled: Any, *args: Any, **kwargs: Any) -> Any:
    """`compiled.fn.generate(*args, **kwargs)` with the compiled forward (see the module docstring)."""
    model = compiled.fn
    gen_config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    chose_cache = ("past_key_values" in kwargs or "cache_implementation" in kwargs
                   or getattr(gen_config, "cache_implementation", None) is not None)
    static = compiled.options.generate_cache == "static"
    if not chose_cache and static and static_cache_supported(model):
        cache = _bucketed_static_cache(model, args, kwargs, gen_config)
        if cache is not None:
            kwargs["past_key_values"] = cache
        else:
            kwargs["cache_implementation"] = "static"
    kwargs.setdefault("disable_compile", True)
    with forward_replaced(model, compiled):
        return model.generate(*args, **kwargs)

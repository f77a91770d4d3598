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
the number of new tokens, and generations whose lengths round to the same bucket share them. An
encoder-decoder model (T5) gets transformers' own static cache (`cache_implementation="static"`,
`max_cache_len` bucketed the same way): an EncoderDecoderCache whose cross-attention half holds
the encoder's output, so programs are shared per encoder length. With the default
`DynamicCache` the cache grows every step and each length is a new program (symbolic shapes
will lift that). transformers' own automatic `torch.compile` of the forward is switched off
(`disable_compile=True`): novaforge already compiles it. With the static cache, the decoding
loop itself is novaforge's (decode_loop.py: one compiled call a token, processors included)
wherever it covers the call, and transformers' otherwise (option `decode_loop=False`: always).

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


def _bucketed_length(args: tuple, kwargs: dict, gen_config: Any, encoder_decoder: bool) -> int | None:
    """The cache length for prompt + new tokens (new tokens alone for an encoder-decoder model,
    whose decoder starts from one token), rounded up to a multiple of CACHE_BUCKET; None when
    the lengths cannot be read from the call."""
    import torch

    ids = args[0] if args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    new = kwargs.get("max_new_tokens") or getattr(gen_config, "max_new_tokens", None)
    prompt = 1 if encoder_decoder else ids.shape[1]
    total = prompt + new if new else (kwargs.get("max_length") or getattr(gen_config, "max_length", None))
    return -(-int(total) // CACHE_BUCKET) * CACHE_BUCKET if total else None


def _bucketed_static_cache(model: Any, args: tuple, kwargs: dict, gen_config: Any) -> Any:
    """A StaticCache for prompt + new tokens, rounded up to a multiple of CACHE_BUCKET, so that
    generations of similar lengths share their programs (the mask hides the unused positions).
    None when the lengths cannot be read from the call (transformers then sizes the cache)."""
    length = _bucketed_length(args, kwargs, gen_config, False)
    if length is None:
        return None
    try:
        from transformers import StaticCache
    except ImportError:
        return None
    cache = StaticCache(config=model.config, max_cache_len=length)
    _unslide(cache, length)
    return cache


def _unslide(cache: Any, length: int) -> None:
    """Replace each sliding-window layer whose window is no shorter than the cache (Mistral's
    4096) by a plain static layer: the window never slides within `length` positions, so the
    two attend alike, and the sliding layer's Python position counter (`cumulative_length_int`,
    a different constant at every step) would make every decode step a new program."""
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:
        return
    layers = getattr(cache, "layers", None)
    for i, layer in enumerate(layers or ()):
        # (a sliding layer holds min(window, length) positions: `length` when the window is no shorter)
        if getattr(layer, "is_sliding", False) and getattr(layer, "max_cache_len", None) == length:
            layers[i] = StaticLayer(max_cache_len=length)


def generate(compiled: Any, args: tuple, kwargs: dict, loop: Any = None) -> Any:
    """`compiled.fn.generate(*args, **kwargs)` with the compiled forward (see the module docstring);
    `loop(model, compiled)`, a context manager, installs a decoding loop for the call (the entry
    layer passes decode_loop.loop_installed)."""
    model = compiled.fn
    gen_config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    chose_cache = ("past_key_values" in kwargs or "cache_implementation" in kwargs
                   or getattr(gen_config, "cache_implementation", None) is not None)
    static = compiled.options.generate_cache == "static"
    if not chose_cache and static and static_cache_supported(model):
        if getattr(model.config, "is_encoder_decoder", False):
            # the cache is an EncoderDecoderCache (static self-attention, cross-attention filled
            # once from the encoder's output): transformers builds it, sized by max_cache_len
            kwargs["cache_implementation"] = "static"
            length = _bucketed_length(args, kwargs, gen_config, True)
            if length is not None and hasattr(gen_config, "max_cache_len"):
                kwargs.setdefault("max_cache_len", length)
        else:
            cache = _bucketed_static_cache(model, args, kwargs, gen_config)
            if cache is not None:
                kwargs["past_key_values"] = cache
            else:
                kwargs["cache_implementation"] = "static"
    kwargs.setdefault("disable_compile", True)
    with forward_replaced(model, compiled), (loop(model, compiled) if loop is not None else contextlib.nullcontext()):
        return model.generate(*args, **kwargs)

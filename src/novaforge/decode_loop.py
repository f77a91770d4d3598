"""The decode loop of `CompiledModule.generate()`: one compiled call a token, with the logits
processors, the token choice and the stopping rule inside the program.

transformers' `_sample` spends per token, besides the forward: `prepare_inputs_for_generation`
(the 4-d mask built again), `_update_model_kwargs_for_generation`, the logits processors and
stopping criteria as Python over small tensor ops, and our call binding (flattening the
StaticCache's tensors). On GPT-2 124M at batch 1 that was ~4.7 ms a token beside a 17 ms program.
Here, while `generate()` runs on a compiled model, the model's class is a subclass whose `_sample`
(generate() looks it up on the class) is `sample`, which:

1. decides from the call alone whether it can take the loop (`unsupported`: a StaticCache from
   generation.py, only the processors and stopping criteria in `PROCESSORS` / `CRITERIA`, no
   streamer, no dict output, ...); if not, the original `_sample` runs, logged with the reason;
2. runs the prefill and the first token exactly as `_sample` does (transformers' own `_prefill`,
   processors and stopping criteria, on the compiled forward);
3. compiles `DecodeStep`, a module around the model whose forward is one decode step: the model
   on the new token (attention mask as one 2-d tensor of the cache's full length, ones past the
   prompt: causality hides the positions not yet written, so the 4-d mask the model builds from it
   equals the one `prepare_inputs_for_generation` builds from the growing mask), then the
   processors, argmax or `torch.multinomial` (ATen's, so the global generator is drawn from as in
   eager), finished rows padded, and the state for the next step written in place: the token,
   the positions, the ids so far (repetition penalty), the length, the unfinished rows;
4. calls its program once a token on the same input tensors (`CompiledModule.bind`: no
   flattening, no signature) until the maximum length or every row has finished.

Invariant: the tokens equal `_sample`'s on the same compiled forward, for greedy and seeded
sampling alike (each processor below is transformers' computation on the same values: a
repetition penalty reads a fixed-length ids buffer whose ignored prompt positions and unwritten
tail hold an id past the vocabulary, which lands in the padded score column that transformers
drops too). Tests compare with eager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import logs
from .generation import capturing

_log = logs.get_logger("runtime")

# the decode-step inputs that prepare_inputs_for_generation may pass and this loop provides itself
_STEP_INPUTS = {"input_ids", "position_ids", "attention_mask", "past_key_values", "use_cache", "logits_to_keep",
                "return_dict", "cache_position"}


@dataclass(frozen=True)
class Processor:
    """One logits processor as data: `kind`, its constants, and its run-time value: `value`
    (temperature, 1 - top_p, penalty) and `below` (min-length: EOS is masked while the length is
    below it) reach the program as tensor inputs, so another temperature or prompt length runs
    the same program. (`x / t` with a Python float t computes in float32 with t rounded to
    float32, as with a float32 tensor t: the arithmetic is eager's.)"""

    kind: str  # "temperature", "top_k", "top_p", "repetition", "min_length"
    value: float = 0.0
    keep: int = 1  # top-k / top-p: min_tokens_to_keep
    filter_value: float = -math.inf
    eos: tuple[int, ...] = ()
    below: int = 0

    def structure(self) -> Processor:
        """This processor without its run-time values (what a program depends on)."""
        return dataclasses.replace(self, value=0.0, below=0)


def _processor(p: Any) -> Processor | str:
    """The Processor for one transformers processor, or why the loop cannot take it."""
    from transformers.generation import logits_process as lp

    name = type(p).__name__
    if type(p) is lp.TemperatureLogitsWarper:
        return Processor("temperature", float(p.temperature))
    if type(p) is lp.TopKLogitsWarper:
        return Processor("top_k", keep=int(p.top_k), filter_value=float(p.filter_value))
    if type(p) is lp.TopPLogitsWarper:
        return Processor("top_p", 1 - float(p.top_p), int(p.min_tokens_to_keep), float(p.filter_value))
    if type(p) is lp.RepetitionPenaltyLogitsProcessor:
        ignore = getattr(p, "prompt_ignore_length", None)
        if getattr(p, "logits_indices", None) is not None or not (
                ignore is None or isinstance(ignore, int) or (isinstance(ignore, torch.Tensor) and ignore.dim() == 1)):
            return f"{name} with packed sequences"
        return Processor("repetition", float(p.penalty))
    if type(p) in (lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor):
        eos = p.eos_token_id
        eos = tuple(int(e) for e in (eos.flatten().tolist() if isinstance(eos, torch.Tensor) else [eos]))
        if type(p) is lp.MinLengthLogitsProcessor:
            below = int(p.min_length)
        else:
            below = int(p.prompt_length_to_skip) + int(p.min_new_tokens)
        return Processor("min_length", eos=eos, below=below)
    return name


@dataclass(frozen=True)
class Plan:
    """What one decode step computes besides the forward (hashable: compiled steps are cached
    per plan)."""

    processors: tuple[Processor, ...]
    do_sample: bool
    eos: tuple[int, ...]  # EOS ids of the stopping criteria (empty: no EOS stopping)
    pad: int
    static_kwargs: tuple[tuple[str, Any], ...]  # logits_to_keep, use_cache, ... as the step is called with
    positions: bool  # the model takes position_ids
    ids_buffer: bool  # a processor reads the ids so far

    def kwargs(self) -> dict[str, Any]:
        return dict(self.static_kwargs)


def processor_inputs(processors: list[Processor], device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The run-time values of `processors` as the step's inputs: (float32 values, int64 limits)."""
    return (torch.tensor([p.value for p in processors], dtype=torch.float32, device=device),
            torch.tensor([p.below for p in processors], dtype=torch.long, device=device))


def apply_processors(plan: Plan, scores: torch.Tensor, ids: torch.Tensor | None, length: torch.Tensor,
                     values: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """The processors of `plan` on float32 scores [B, V], in transformers' order and arithmetic
    (`values`, `limits`: `processor_inputs`)."""
    for i, p in enumerate(plan.processors):
        if p.kind == "temperature":
            scores = scores / values[i]
        elif p.kind == "top_k":
            k = min(p.keep, scores.size(-1))
            scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], p.filter_value)
        elif p.kind == "top_p":
            sorted_logits, sorted_indices = torch.sort(scores, descending=False)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= values[i]  # (1 - top_p, rounded to float32 as eager's comparison does)
            remove[..., -p.keep:] = 0
            scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), p.filter_value)
        elif p.kind == "repetition":  # ids: prompt positions it ignores and the unwritten tail are V
            assert ids is not None
            vocab = scores.shape[-1]
            padded = torch.nn.functional.pad(scores, (0, 1))
            index = ids.clamp(max=vocab)
            score = torch.gather(padded, 1, index)
            score = torch.where(score < 0, score * values[i], score / values[i])
            scores = padded.scatter(1, index, score)[..., :vocab]
        elif p.kind == "min_length":
            eos_mask = _is_any(torch.arange(scores.shape[-1], device=scores.device), p.eos)
            scores = torch.where(eos_mask & (length < limits[i]), -math.inf, scores)
    return scores


def _is_any(x: torch.Tensor, values: tuple[int, ...]) -> torch.Tensor:
    """torch.isin(x, values) as comparisons (elementwise: fused, and constant over a constant x)."""
    hit = torch.zeros_like(x, dtype=torch.bool)
    for v in values:
        hit = hit | (x == v)
    return hit


class DecodeStep(torch.nn.Module):
    """One decode step of `model` under `plan` (see the module docstring); returns the tokens
    [B] and updates `token`, `positions`, `ids`, `length` and `unfinished` in place."""

    def __init__(self, model: torch.nn.Module, plan: Plan) -> None:
        super().__init__()
        self.model = model
        self.plan = plan

    def forward(self, token: torch.Tensor, positions: torch.Tensor | None, mask: torch.Tensor, cache: Any,
                ids: torch.Tensor | None, length: torch.Tensor, unfinished: torch.Tensor, values: torch.Tensor,
                limits: torch.Tensor) -> torch.Tensor:
        plan = self.plan
        kw = plan.kwargs()
        if positions is not None:
            kw["position_ids"] = positions
        with capturing():  # a forward that generate() replaced runs the model's own
            out = self.model(input_ids=token, attention_mask=mask, past_key_values=cache, **kw)
        logits = out.logits if hasattr(out, "logits") else out[0]
        scores = apply_processors(plan, logits[:, -1].to(dtype=torch.float32), ids, length, values, limits)
        if plan.do_sample:
            nxt = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            nxt = torch.argmax(scores, dim=-1)
        if plan.eos:
            nxt = nxt * unfinished + plan.pad * (1 - unfinished)
            done = _is_any(nxt, plan.eos)
            unfinished.copy_(unfinished & ~done)
        token.copy_(nxt[:, None])
        if positions is not None:
            positions.add_(1)
        if ids is not None:
            ids.index_copy_(1, length, nxt[:, None])
        length.add_(1)
        return nxt


# ---------------------------------------------------------------------------------- the loop
def unsupported(model: Any, logits_processor: Any, stopping_criteria: Any, generation_config: Any,
                synced_gpus: bool, streamer: Any, model_kwargs: dict) -> str | tuple[list[Processor], tuple, int]:
    """Why this `_sample` call must run transformers' loop, or (processors, EOS ids, max_length)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer
    from transformers.generation import stopping_criteria as sc

    gc = generation_config
    if synced_gpus or streamer is not None:
        return "a streamer or synced GPUs"
    if gc.return_dict_in_generate or gc.output_scores or gc.output_logits:
        return "return_dict_in_generate / output_scores / output_logits"
    if getattr(gc, "is_assistant", False) or model.config.is_encoder_decoder:
        return "an assistant or an encoder-decoder model"
    cache = model_kwargs.get("past_key_values")
    if type(cache) is not StaticCache or not all(type(layer) is StaticLayer for layer in cache.layers):
        return f"a {type(cache).__name__} cache (the loop takes novaforge's StaticCache)"
    if not model_kwargs.get("use_cache", True) or "inputs_embeds" in model_kwargs:
        return "use_cache=False or inputs_embeds"
    processors = []
    for p in logits_processor:
        got = _processor(p)
        if isinstance(got, str):
            return f"logits processor {got}"
        processors.append(got)
    eos: tuple[int, ...] = ()
    max_length = None
    for c in stopping_criteria:
        if type(c) is sc.MaxLengthCriteria:
            max_length = int(c.max_length) if max_length is None else min(max_length, int(c.max_length))
        elif type(c) is sc.EosTokenCriteria:
            eos += tuple(int(e) for e in c.eos_token_id.flatten().tolist())
        else:
            return f"stopping criterion {type(c).__name__}"
    if max_length is None or max_length > min(layer.max_cache_len for layer in cache.layers):
        return "no maximum length within the cache"
    if eos and gc._pad_token_tensor is None:
        return "EOS stopping without a pad token"
    return processors, eos, max_length


def _select(next_token_scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    if do_sample:  # (transformers' _sample)
        probs = torch.nn.functional.softmax(next_token_scores, dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    return torch.argmax(next_token_scores, dim=-1)


def sample(compiled: Any, model: Any, original: Any, input_ids: torch.Tensor, logits_processor: Any,
           stopping_criteria: Any, generation_config: Any, synced_gpus: bool = False, streamer: Any = None,
           **model_kwargs: Any) -> Any:
    """`model._sample` with the decode loop above (the module docstring); `original` is the bound
    `_sample` it replaces, run where the loop does not apply."""
    why = unsupported(model, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
                      model_kwargs)
    if isinstance(why, str):
        _log.info("novaforge: generate() runs transformers' decoding loop on the compiled forward: %s", why)
        return original(input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=synced_gpus,
                        streamer=streamer, **model_kwargs)
    processors, eos, max_length = why
    gc = generation_config
    pad = int(gc._pad_token_tensor) if gc._pad_token_tensor is not None else 0
    batch = input_ids.shape[0]
    unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)

    # prefill and the first token: transformers' own code on the compiled forward
    outputs = model._prefill(input_ids, gc, model_kwargs, is_first_iteration=not getattr(gc, "is_assistant", False))
    model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
    scores = logits_processor(input_ids, outputs.logits[:, -1].to(copy=True, dtype=torch.float32))
    del outputs
    nxt = _select(scores, gc.do_sample)
    if eos:
        nxt = nxt * unfinished + pad * (1 - unfinished)
    input_ids = torch.cat([input_ids, nxt[:, None]], dim=-1)
    unfinished = unfinished & ~stopping_criteria(input_ids, None)
    if unfinished.max() == 0:
        return input_ids

    # the first decode step's inputs as transformers prepares them: the loop's starting state
    step_inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, **model_kwargs)
    extra = set(step_inputs) - _STEP_INPUTS
    if extra or step_inputs.get("cache_position") is not None:
        _log.info("novaforge: generate() runs transformers' decoding loop from here: the step takes %s",
                  sorted(extra) or "cache_position")
        return _transformers_steps(model, compiled, input_ids, logits_processor, stopping_criteria, gc, unfinished,
                                   model_kwargs)
    cache = step_inputs["past_key_values"]
    length_now = input_ids.shape[1]
    mask2d = model_kwargs.get("attention_mask")
    if mask2d is None:
        mask2d = torch.ones_like(input_ids)
    full = min(layer.max_cache_len for layer in cache.layers)
    mask = torch.cat([mask2d, mask2d.new_ones(batch, full - mask2d.shape[1])], dim=1)
    positions = step_inputs.get("position_ids")
    static = tuple(sorted((k, v) for k, v in step_inputs.items()
                          if k in ("use_cache", "logits_to_keep", "return_dict")))
    plan = Plan(tuple(p.structure() for p in processors), bool(gc.do_sample), eos, pad, static,
                positions is not None, any(p.kind == "repetition" for p in processors))
    values, limits = processor_inputs(processors, input_ids.device)
    token = step_inputs["input_ids"].clone()
    positions = positions.clone() if positions is not None else None
    ids = None
    if plan.ids_buffer:
        ids = _ids_buffer(input_ids, logits_processor, full)
    length = torch.tensor([length_now], dtype=torch.long, device=input_ids.device)
    step = decode_step(compiled, plan)
    built = step.compilations
    tokens = []
    run = None
    while length_now < max_length:
        if run is None:
            # (parameters are read as the loop starts: nothing changes them during one generate())
            run, nxt = step.bind((token, positions, mask, cache, ids, length, unfinished, values, limits),
                                 state_each_call=False)
        else:
            nxt = run()
        tokens.append(nxt)
        length_now += 1
        if eos and not bool(unfinished.any()):
            break
    compiled.compilations += step.compilations - built  # (the model's programs: its decode steps' too)
    return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)


def _ids_buffer(input_ids: torch.Tensor, logits_processor: Any, full: int) -> torch.Tensor:
    """The ids so far as the repetition penalty reads them, in a buffer of the cache's length: a
    prompt position it ignores (`prompt_ignore_length`: the left padding) and the positions not
    yet written hold the vocabulary size, whose padded score column the penalty drops."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    vocab_marker = torch.iinfo(torch.long).max  # clamped to V inside the step
    batch, length = input_ids.shape
    ids = input_ids.new_full((batch, full), vocab_marker)
    ids[:, :length] = input_ids
    rep = next(p for p in logits_processor if type(p) is RepetitionPenaltyLogitsProcessor)
    ignore = rep.prompt_ignore_length
    if ignore is not None:
        positions = torch.arange(length, device=input_ids.device)
        bound = ignore.to(input_ids.device)[:, None] if isinstance(ignore, torch.Tensor) else ignore
        ids[:, :length] = ids[:, :length].masked_fill(positions[None, :] < bound, vocab_marker)
    return ids


def _transformers_steps(model: Any, compiled: Any, input_ids: torch.Tensor, logits_processor: Any,
                        stopping_criteria: Any, gc: Any, unfinished: torch.Tensor, model_kwargs: dict) -> Any:
    """The rest of `_sample`'s loop as transformers runs it (a step input this loop does not
    provide): prepare the inputs, call the compiled forward, process, choose, stop."""
    pad = gc._pad_token_tensor
    has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    while unfinished.max() != 0:
        inputs = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, **model_kwargs)
        outputs = compiled(**inputs, return_dict=True)
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)
        scores = logits_processor(input_ids, outputs.logits[:, -1].to(copy=True, dtype=torch.float32))
        nxt = _select(scores, gc.do_sample)
        if has_eos:
            nxt = nxt * unfinished + pad * (1 - unfinished)
        input_ids = torch.cat([input_ids, nxt[:, None]], dim=-1)
        unfinished = unfinished & ~stopping_criteria(input_ids, None)
    return input_ids


_steps_lock = threading.Lock()


def decode_step(compiled: Any, plan: Plan) -> Any:
    """The compiled DecodeStep of `compiled`'s model for `plan`, made once per plan (a
    CompiledModule of the same class and options: this module cannot import api, which imports it)."""
    with _steps_lock:
        steps = compiled.__dict__.setdefault("_decode_steps", {})
        step = steps.get(plan)
        if step is None:
            step = steps[plan] = type(compiled)(DecodeStep(compiled.fn, plan), freeze=compiled.freeze,
                                                backend=compiled.backend, options=dict(compiled.options))
    return step


_loop_classes: dict[type, type] = {}


def _loop_class(cls: type) -> type:
    """A subclass of the model's class whose `_sample` is `sample` (generate() looks the decoding
    method up on the class), made once per class."""
    with _steps_lock:
        sub = _loop_classes.get(cls)
        if sub is None:
            def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
                original = functools.partial(cls._sample, self)
                compiled = self.__dict__.get("_novaforge_decode_loop")
                if compiled is None:
                    return original(*args, **kwargs)
                return sample(compiled, self, original, *args, **kwargs)

            sub = _loop_classes[cls] = type(cls.__name__, (cls,), {
                "_sample": _sample, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__})
    return sub


@contextlib.contextmanager
def loop_installed(model: Any, compiled: Any) -> Iterator[None]:
    """Within the block, `model`'s class is a subclass whose `_sample` runs `sample` with
    `compiled` (as torch's parametrizations do, the instance's class is swapped and restored; a
    model whose class is already swapped by another generate() keeps it)."""
    cls = type(model)
    if cls in _loop_classes.values() or not hasattr(cls, "_sample"):
        # swapped by another thread's generate() on this model (which restores it: a call that
        # looks the method up after that runs transformers' loop), or no transformers model
        yield
        return
    model.__dict__["_novaforge_decode_loop"] = compiled
    model.__class__ = _loop_class(cls)
    try:
        yield
    finally:
        model.__class__ = cls
        model.__dict__.pop("_novaforge_decode_loop", None)

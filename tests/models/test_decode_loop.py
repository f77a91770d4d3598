"""novaforge's decode loop (novaforge/decode_loop.py): `novaforge.compile(model).generate()` runs
one compiled call a token, with the logits processors, the token choice and the stopping rule
inside the program. The oracle is eager `generate()`: tokens equal per row, greedy and seeded
sampling alike; calls the loop does not cover run transformers' loop, logged; `bind` sees what a
call would see."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
import transformers as tf

import novaforge
from novaforge import decode_loop

from .test_generate import _left_padded, _tiny_lm

CASES = {
    "greedy": {"do_sample": False},
    "greedy-penalty-min-new": {"do_sample": False, "repetition_penalty": 1.3, "min_new_tokens": 6},
    "sample-temp-topk-topp": {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.9},
    "sample-topp-penalty": {"do_sample": True, "top_k": 0, "top_p": 0.7, "repetition_penalty": 1.2},
    "sample-min-length": {"do_sample": True, "temperature": 1.5, "min_length": 20},
}


def _both(model, compiled, ids, seed=5, **kw):
    with torch.no_grad():
        torch.manual_seed(seed)
        want = model.generate(ids, **kw)
        torch.manual_seed(seed)
        got = compiled.generate(ids, **kw)
    return want, got


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_loop_equals_eager_per_row_on_a_left_padded_batch(name, case):
    """Batch 3, left-padded, each processor set: eager's tokens in every row, through the loop
    (a DecodeStep built), two programs in all (the prefill and the step)."""
    model = _tiny_lm(name)
    ids, mask = _left_padded(3)
    compiled = novaforge.compile(model)
    want, got = _both(model, compiled, ids, attention_mask=mask, max_new_tokens=14, pad_token_id=0, **CASES[case])
    assert [torch.equal(got[i], want[i]) for i in range(3)] == [True] * 3
    assert len(compiled._decode_steps) == 1 and compiled.compilations == 2


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_rows_that_reach_eos_are_padded_and_the_loop_stops(name):
    """An EOS id the model produces in one row mid-way (chosen from eager's own output): that row
    is padded from there as in eager; when every row has ended, the loop stops early."""
    model = _tiny_lm(name)
    ids, mask = _left_padded(2)
    kw = dict(attention_mask=mask, max_new_tokens=20, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        free = model.generate(ids, eos_token_id=None, **kw)
    eos = int(free[0, 12 + 4])  # row 0's fifth new token
    compiled = novaforge.compile(model)
    want, got = _both(model, compiled, ids, eos_token_id=eos, **kw)
    assert torch.equal(got, want)
    assert (want[0, 12 + 5:] == 0).all() or want.shape[1] < free.shape[1]
    assert len(compiled._decode_steps) == 1
    # both rows end: generation stops at the last row's EOS, as eager's does
    eos_both = [eos, int(free[1, 12 + 2])]
    want, got = _both(model, compiled, ids, eos_token_id=eos_both, **kw)
    assert torch.equal(got, want) and want.shape[1] < free.shape[1]


def test_what_the_loop_does_not_cover_runs_transformers_loop_logged(caplog):
    """A processor outside the loop's table (no_repeat_ngram_size) and a dict output: transformers'
    loop on the compiled forward, eager's tokens, and an INFO record naming the reason; the
    option decode_loop=False always takes transformers' loop."""
    model = _tiny_lm("gpt2")
    ids, mask = _left_padded(2)
    kw = dict(attention_mask=mask, max_new_tokens=10, pad_token_id=0, do_sample=False)
    compiled = novaforge.compile(model)
    with caplog.at_level(logging.INFO, logger="novaforge.runtime"):
        want, got = _both(model, compiled, ids, no_repeat_ngram_size=2, **kw)
    assert torch.equal(got, want)
    assert any("NoRepeatNGramLogitsProcessor" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        out = compiled.generate(ids, return_dict_in_generate=True, output_scores=True, **kw)
    assert len(out.scores) == 10
    assert not compiled.__dict__.get("_decode_steps")
    plain = novaforge.compile(model, decode_loop=False)
    want, got = _both(model, plain, ids, **kw)
    assert torch.equal(got, want) and not plain.__dict__.get("_decode_steps")


def test_other_processor_values_and_prompt_lengths_share_the_decode_step():
    """Temperature, top-p, penalty and min-new-tokens values are inputs of the step, not
    constants: other values and another prompt length run the same decode program (one DecodeStep
    built), with eager's tokens each time."""
    model = _tiny_lm("llama")
    compiled = novaforge.compile(model)
    for length, temperature, top_p, penalty in ((12, 0.7, 0.9, 1.2), (9, 1.3, 0.6, 1.5)):
        ids, mask = _left_padded(2, length)
        kw = dict(attention_mask=mask, max_new_tokens=10, min_new_tokens=6, pad_token_id=0, do_sample=True,
                  temperature=temperature, top_k=0, top_p=top_p, repetition_penalty=penalty)
        want, got = _both(model, compiled, ids, seed=length, **kw)
        assert torch.equal(got, want)
    assert len(compiled._decode_steps) == 1
    step = next(iter(compiled._decode_steps.values()))
    assert step.compilations == 1


def test_the_model_keeps_its_class_and_generate_works_after_an_error():
    """The class swap that installs the loop is undone after generate(), also when it raised."""
    model = _tiny_lm("llama")
    cls = type(model)
    compiled = novaforge.compile(model)
    ids, mask = _left_padded(1)
    with pytest.raises(Exception), torch.no_grad():  # noqa: B017 - transformers' own validation error
        compiled.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, top_k="bad")
    assert type(model) is cls and "_novaforge_decode_loop" not in model.__dict__
    want, got = _both(model, compiled, ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want) and type(model) is cls


def test_two_threads_generate_on_one_compiled_model():
    """Two threads generating different prompts at once on one compiled model: each gets eager's
    tokens (whichever loop each thread took)."""
    model = _tiny_lm("gpt2")
    compiled = novaforge.compile(model)
    prompts = [_left_padded(2)[0], _left_padded(3)[0][1:]]
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = [model.generate(p, attention_mask=(p != 0).long(), **kw) for p in prompts]
    got: list = [None, None]

    def run(i: int) -> None:
        with torch.no_grad():
            got[i] = compiled.generate(prompts[i], attention_mask=(prompts[i] != 0).long(), **kw)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert type(model) is tf.GPT2LMHeadModel


def test_the_processors_as_data_equal_transformers_processors():
    """apply_processors on random scores equals transformers' processor list on the same ids."""
    from transformers.generation import logits_process as lp

    torch.manual_seed(0)
    scores = torch.randn(3, 50) * 3
    ids = torch.randint(0, 50, (3, 9))
    pad_lengths = torch.tensor([0, 2, 4])
    procs = [lp.RepetitionPenaltyLogitsProcessor(1.4, prompt_ignore_length=pad_lengths),
             lp.MinLengthLogitsProcessor(12, eos_token_id=[3, 7]), lp.TemperatureLogitsWarper(0.7),
             lp.TopKLogitsWarper(10), lp.TopPLogitsWarper(0.8)]
    data = [decode_loop._processor(p) for p in procs]
    plan = decode_loop.Plan(tuple(p.structure() for p in data), True, (), 0, (), False, True)
    buffer = decode_loop._ids_buffer(ids, procs, 16)
    got = decode_loop.apply_processors(plan, scores.clone(), buffer, torch.tensor([ids.shape[1]]),
                                       *decode_loop.processor_inputs(data))
    want = lp.LogitsProcessorList(procs)(ids, scores.clone())
    assert torch.equal(got, want)


def test_bind_sees_reassigned_parameters_and_inputs_updated_in_place():
    """`CompiledModule.bind`: `again()` reads the same input tensors (updated in place by the
    caller) and sees a reassigned parameter (the full call recompiles), equal to eager each time."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = novaforge.compile(model)
    x = torch.randn(2, 8)
    with torch.no_grad():
        again, first = compiled.bind((x,))
        assert torch.allclose(first, model(x), atol=1e-6)
        x.add_(1.0)
        assert torch.allclose(again(), model(x), atol=1e-6)
        model[0].weight = torch.nn.Parameter(torch.randn(8, 8))
        assert torch.allclose(again(), model(x), atol=1e-6)
        out = again()
        assert out is not again()  # fresh outputs each call
        once, _ = compiled.bind((x,), state_each_call=False)  # parameters read at the bind only
        torch.testing.assert_close(once(), model(x))


def test_bind_once_checks_and_binds_at_the_bind():
    """`bind(..., state_each_call=False)` binds the program's inputs and computes the memory a
    result must not share once (`Entry.bind_call`); calls after it still see the inputs updated
    in place, and each result is its own tensor."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = novaforge.compile(model)
    x = torch.randn(2, 8)
    with torch.no_grad():
        once, first = compiled.bind((x,), state_each_call=False)
        (entry,) = compiled._programs.values()
        bound = entry.bind_call([x])
        assert bound is not None and any(t is x for t in bound.inputs)
        assert x.untyped_storage().data_ptr() in bound.taken
        outs = []
        for _ in range(3):
            x.mul_(0.5).add_(0.25)
            outs.append(once())
            torch.testing.assert_close(outs[-1], model(x))
        assert len({o.data_ptr() for o in outs}) == 3 and all(o.data_ptr() != x.data_ptr() for o in outs)


def test_bind_inputs_declines_inputs_each_call_must_copy():
    """`CpuProgram.bind_inputs` binds nothing where a call binds a copy: a strided input, or one
    that shares memory with an input the program writes in place; the plain call still runs."""
    def f(a, b):
        a.add_(b)
        return a * 2

    compiled = novaforge.compile(f)
    a, b = torch.randn(4), torch.randn(4)
    want_a = a + b
    torch.testing.assert_close(compiled(a, b), want_a * 2)
    torch.testing.assert_close(a, want_a)
    (entry,) = compiled._programs.values()
    program = entry.stats.program
    assert program.bind_inputs([a, b]) is not None
    assert program.bind_inputs([a, a]) is None  # b would read what the kernel already overwrote
    assert program.bind_inputs([a, torch.randn(8)[::2]]) is None
    assert program.bind_inputs([a]) is None
    c = torch.randn(4)
    before = a.clone()
    again, first = compiled.bind((a, c), state_each_call=False)
    torch.testing.assert_close(first, (before + c) * 2)
    torch.testing.assert_close(again(), (before + 2 * c) * 2)
    torch.testing.assert_close(a, before + 2 * c)  # the bind's call and this one

"""The module tree's part of a program's key (frontend/module_state.py), as a user meets it:
a transformers config flag changed after the compile, `generate()` not changing the state,
compile_step seeing an attribute change, many states warning once."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import novaforge
from novaforge.frontend.module_state import STATE_WARNING, ModuleModes

transformers = pytest.importorskip("transformers")


def _tiny_gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def test_a_config_flag_changed_after_the_compile_changes_the_outputs_as_in_eager():
    m = _tiny_gpt2()
    eager = copy.deepcopy(m)  # (transformers installs its output-capturing hooks at an eager call: a new hook
    # count is a new state of its own, so the reference runs on a copy)
    c = novaforge.compile(m)
    ids = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        assert c(ids).hidden_states is None
        m.config.output_hidden_states = eager.config.output_hidden_states = True
        got, ref = c(ids), eager(ids)
    assert got.hidden_states is not None and len(got.hidden_states) == len(ref.hidden_states) == 3
    for a, b in zip(got.hidden_states, ref.hidden_states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    m.config.output_hidden_states = False
    with torch.no_grad():
        assert c(ids).hidden_states is None
    assert c.compilations == 2


def test_generate_does_not_change_the_attribute_state():
    m = _tiny_gpt2()
    c = novaforge.compile(m)
    ids = torch.randint(0, 64, (1, 5))
    ref = m.generate(ids, max_new_tokens=5, do_sample=False)
    for _ in range(2):
        assert torch.equal(c.generate(ids, max_new_tokens=5, do_sample=False), ref)
    assert len(c._modes._states) == 1


def test_compile_step_sees_an_attribute_changed_between_steps():
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)
            self.temperature = 1.0

        def forward(self, x):
            return (self.fc(x) / self.temperature).square().mean()

    torch.manual_seed(0)
    m, ref = Net(), Net()
    ref.load_state_dict(m.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    step = novaforge.compile_step(m, opt, lambda out, *_: out)
    x = torch.randn(4, 6)
    for t in (1.0, 2.0, 2.0, 1.0):
        m.temperature = ref.temperature = t
        loss = step(x)
        ref_loss = ref(x)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.fc.weight, ref.fc.weight, atol=1e-6, rtol=1e-5)
    assert step.compilations == 2


def test_a_deleted_attribute_and_a_removed_submodule_relist_the_tree():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    m.extra = 3
    modes = ModuleModes(m)
    first = modes.key()
    del m.extra
    assert modes.key() != first
    del m[1]
    assert modes.key() not in (first,)
    assert len(modes.dicts) == 2  # the Sequential and its Linear


def test_many_states_warn_once(caplog):
    m = torch.nn.Linear(3, 3)
    m.step_count = 0
    modes = ModuleModes(m)
    with caplog.at_level(logging.WARNING, logger="novaforge.runtime"):
        for i in range(STATE_WARNING + 3):
            m.step_count = i
            modes.key()
    warnings = [r for r in caplog.records if "different attribute states" in r.getMessage()]
    assert len(warnings) == 1 and "step_count" in warnings[0].getMessage()

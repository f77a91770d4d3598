"""`novaforge.compile(module)` as an nn.Module: a transparent stand-in for the module it compiles.

`novaforge.compile` of an `nn.Module` returns a `CompiledNNModule` (api.CompiledModule's `__new__`
picks it; this module names the class there, as api cannot import this one): a CompiledModule that
is also an `nn.Module`, so it goes where a module goes. A user compiles one block and puts it
back (`model.layers[i] = novaforge.compile(model.layers[i])`, `model.encoder =
novaforge.compile(model.encoder)`: both raised TypeError), wraps it in a container or passes it
to code that checks `isinstance(m, nn.Module)`.

It is transparent: it shares the compiled module's parameter, buffer, submodule and hook
dictionaries (the same dict objects) and proxies `training`, so

* a parent's `state_dict()` / `load_state_dict()` / `parameters()` see the block's own names (no
  `_orig_mod.` level: checkpoints load into the uncompiled model and back);
* `.to()`, `.train()` / `.eval()` (the parent's too), `apply()`, hooks registered on either
  object act on the compiled module itself, which is what the compiled call reads
  (`ModuleModes` keys programs by its training flags and hooks);
* `forward` runs the compiled call and has the module's forward's signature (transformers and
  Trainer inspect it).

Invariant: the stand-in holds no parameter, buffer, submodule or hook of its own; every one of
them is the compiled module's. Attributes that are not nn.Module's own state are read from the
compiled module (api.CompiledModule.__getattr__) and set on the stand-in (plain attributes, as
on a CompiledModule of a function).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .api import CompiledModule

# the state nn.Module.__init__ creates, besides `training` (a property here): shared with the module
_SHARED = tuple(sorted(k for k in torch.nn.Module().__dict__ if k not in ("training", "_is_full_backward_hook")))


class CompiledNNModule(CompiledModule, torch.nn.Module):
    """See the module docstring."""

    _nf_stand_in = True  # (frontend/module_state.py reads the compiled module's state, not this one's)

    # plain attribute assignment (CompiledModule's fields; not nn.Module's registration of
    # parameters and submodules, which would make the compiled module a child of itself)
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__

    def __init__(self, fn: torch.nn.Module, **kwargs: Any) -> None:
        for name in _SHARED:
            object.__setattr__(self, name, getattr(fn, name))
        CompiledModule.__init__(self, fn, **kwargs)

    # nn.Module's scalar state, the compiled module's own
    @property
    def training(self) -> bool:  # type: ignore[override]
        return self.__dict__["fn"].training

    @training.setter
    def training(self, mode: bool) -> None:
        self.__dict__["fn"].training = mode

    @property
    def _is_full_backward_hook(self) -> Any:  # type: ignore[override]
        return self.__dict__["fn"]._is_full_backward_hook

    @_is_full_backward_hook.setter
    def _is_full_backward_hook(self, value: Any) -> None:
        self.__dict__["fn"]._is_full_backward_hook = value

    @property
    def forward(self) -> Any:  # type: ignore[override]
        """The compiled call, with the module's forward's name, docstring and signature."""
        compiled = self

        @functools.wraps(self.__dict__["fn"].forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return compiled(*args, **kwargs)

        return forward

    __call__ = CompiledModule.__call__  # (not nn.Module's: hooks are the module's, run by its call)

    # what a module class may override (BatchNorm's state-dict versions, an RNN's _apply, a
    # model's train()): the compiled module's own methods, also when a parent recurses into this one
    def train(self, mode: bool = True) -> CompiledNNModule:
        self.__dict__["fn"].train(mode)
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> CompiledNNModule:
        self.__dict__["fn"]._apply(fn, recurse)
        return self

    def _save_to_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["fn"]._save_to_state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["fn"]._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return self.__dict__["fn"].extra_repr()

    def __getattr__(self, name: str) -> Any:
        return CompiledModule.__getattr__(self, name)

    def __repr__(self) -> str:
        return f"novaforge.compile({self.__dict__['fn']!r})"

    def __dir__(self) -> list[str]:
        return sorted(set(object.__dir__(self)) | set(dir(self.__dict__["fn"])))


CompiledModule._nf_module_class = CompiledNNModule  # (api's CompiledModule(module) builds one of these)

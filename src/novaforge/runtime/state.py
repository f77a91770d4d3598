"""Where a program's parameters and buffers come from, checked at every call; fresh outputs.

A compiled program reads the module's parameters and buffers as inputs (or, frozen, as
constants baked in at compile time). Eager reads `module.weight` at every call, so:

* a parameter or buffer *reassigned* on its module (`m.weight = nn.Parameter(...)`,
  `m.register_buffer(...)`) is seen by the next call: an unfrozen program rebinds the new tensor
  when its layout (shape, strides, dtype, device) is the one the program was built for, and
  otherwise the call recompiles; a frozen program always recompiles;
* a frozen tensor changed in place (its `_version` moves) or given new storage (`p.data = t`)
  recompiles (module tensors made under `torch.inference_mode()` keep no version counter, so
  capture leaves them unfrozen: `frontend.module_state.freezable`; a program-made inference
  constant is checked for identity and storage only);
* unfrozen tensors changed in place need nothing: their memory is read at every call, but
  their layout is checked, since `p.data = t` can change it.

`fresh_outputs` keeps the other half of eager's contract: a result is a tensor of its own,
never the caller's input, a parameter, a program-owned constant or another result, unless
eager's result aliases the same way (those aliases are rebuilt from the call's own tensors by
`frontend.pytrees.unflatten` and never pass through here). `share_memory`,
`mutated_shares_memory` and `unshared_from` tell where a call's tensors share storage, for the
caller's mutations to land as eager's do.

Invariant: `StateBinding.refresh()` returns True only if every bound tensor is the module's
current one with the program's layout (rebinding where needed), so a program never reads a
stale or mis-shaped tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..frontend.subclass_state import resolve_inner, split_name


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


def _owner(module: torch.nn.Module, name: str) -> tuple[dict[str, Any], str, list[str]] | None:
    """The dict (`_parameters` or `_buffers` of the owning submodule) holding `name`, its key there,
    and the inner-tensor path of a subclass weight's part (`w#qdata`: frontend/subclass_state.py)."""
    outer, path = split_name(name)
    prefix, _, leaf = outer.rpartition(".")
    try:
        sub = module.get_submodule(prefix) if prefix else module
    except AttributeError:
        return None
    for d in (sub._parameters, sub._buffers):
        if leaf in d:
            return d, leaf, path
    return None


def _current(d: dict[str, Any], leaf: str, path: list[str]) -> Any:
    """The module's tensor now at (d, leaf, path)."""
    return resolve_inner(d.get(leaf), path) if path else d.get(leaf)


class StateBinding:
    """The tensors bound to one program's parameter/buffer inputs and frozen constants."""

    def __init__(self, module: Any, ref_names: Sequence[str], refs: Sequence[torch.Tensor],
                 frozen: Sequence[tuple[str, torch.Tensor]]) -> None:
        """`ref_names`/`refs`: the state names and tensors of the param/buffer inputs, in order;
        `frozen`: (state name, tensor) of every frozen constant ('' for a tensor that is not
        module state, e.g. one a function closed over)."""
        self.refs = list(refs)
        self._sites: list[tuple[dict[str, Any], str, list[str], int, tuple]] = []  # (dict, leaf, path, ref, layout)
        self._frozen: list[tuple[dict[str, Any] | None, str, list[str], torch.Tensor, int, int]] = []
        is_module = isinstance(module, torch.nn.Module)
        for i, (name, t) in enumerate(zip(ref_names, self.refs, strict=True)):
            site = _owner(module, name) if is_module else None
            if site is not None:
                self._sites.append((site[0], site[1], site[2], i, _layout(t)))
        for name, t in frozen:
            site = _owner(module, name) if is_module and name else None
            d, leaf, path = site if site is not None else (None, "", [])
            self._frozen.append((d, leaf, path, t, version_of(t), _data_ptr(t)))

    def refresh(self) -> bool:
        for d, leaf, path, t, version, ptr in self._frozen:
            if (d is not None and _current(d, leaf, path) is not t) or version_of(t) != version \
                    or _data_ptr(t) != ptr:
                return False
        refs = self.refs
        for d, leaf, path, i, layout in self._sites:
            cur = _current(d, leaf, path)
            if cur is not refs[i]:
                if cur is None or _layout(cur) != layout:
                    return False
                refs[i] = cur
            elif refs[i].shape != layout[0] or refs[i].stride() != layout[1] or refs[i].dtype != layout[2]:
                return False
        return True


def version_of(t: torch.Tensor) -> int:
    """t's in-place version counter; -1 for an inference tensor, which has none (reading
    `_version` raises there)."""
    return -1 if t.is_inference() else t._version


def _data_ptr(t: torch.Tensor) -> int:
    return t.data_ptr() if not t.is_meta else 0


def input_storages(*groups: Sequence[torch.Tensor]) -> frozenset[int]:
    """The storage addresses of the tensors in `groups` (inputs, parameters, ...), 0 left out."""
    return frozenset(p for g in groups for t in g if (p := storage_ptr(t)))


def fresh_outputs(results: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                  refs: Sequence[torch.Tensor], owned: Sequence[torch.Tensor] = (),
                  taken: frozenset[int] | None = None) -> list[torch.Tensor]:
    """`results` with every one that shares memory with an input, a parameter/buffer, a
    program-owned tensor (`owned`) or an earlier result replaced by a contiguous copy.
    `taken`: `input_storages(inputs, refs, owned)`, computed before (the same tensors, unchanged)."""
    if taken is None:
        taken = input_storages(inputs, refs, owned)
    seen: set[int] = set()  # earlier results
    out = []
    for r in results:
        p = storage_ptr(r)
        if p and (p in taken or p in seen):
            r = r.clone(memory_format=torch.contiguous_format)
            p = storage_ptr(r)
        if p:
            seen.add(p)
        out.append(r)
    return out


def storage_ptr(t: torch.Tensor) -> int:
    """The address of t's storage (0 for a non-tensor, a meta tensor or an empty one)."""
    if not isinstance(t, torch.Tensor) or t.is_meta or t.numel() == 0:  # (is_meta: 5x cheaper than .device)
        return 0
    return t.untyped_storage().data_ptr()


def write_back(dst: torch.Tensor, val: torch.Tensor) -> None:
    """Store a mutated input's new value `val` into the caller's tensor `dst`, as eager's in-place
    op left it. An expanded `dst` (stride 0 over a dimension of size > 1) holds one element for
    all positions of that dimension: where `val` gives them one value (`fill_`, `zero_` of the
    whole input) storing it there is exact, where a plain `copy_` refuses to write overlapping
    memory; where it gives them different values (a partial write), eager's result depends on
    its order of writes, and this raises UnsupportedError rather than guess."""
    if any(st == 0 and sz > 1 for sz, st in zip(dst.shape, dst.stride(), strict=True)):
        val = val.expand(dst.shape)
        for d, (sz, st) in enumerate(zip(dst.shape, dst.stride(), strict=True)):
            if st == 0 and sz > 1:
                first = val.narrow(d, 0, 1)
                if not torch.equal(val, first.expand_as(val)):
                    from ..frontend.lower import UnsupportedError

                    raise UnsupportedError(
                        "an in-place op wrote different values to positions of an expanded (stride-0) input that "
                        "share one memory element (for example x.expand(n)[1:].zero_()); eager's result depends "
                        "on its order of writes, which novaforge does not reproduce: clone the input first")
                dst, val = dst.narrow(d, 0, 1), first
    dst.copy_(val)


def unshared_from(vals: list[torch.Tensor], dsts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The new values of mutated inputs, each cloned where it shares memory with another mutated
    input (`x0.copy_(x1); x1.relu_()`: x0's new value is x1's old one, which the write-back of
    x1 would overwrite first); a value in its own input's buffer is written back as it is."""
    ptr = storage_ptr
    dst_ptrs = [ptr(d) for d in dsts]
    count: dict[int, int] = {}
    for q in dst_ptrs:
        count[q] = count.get(q, 0) + 1
    out = []
    for k, v in enumerate(vals):
        p = ptr(v)
        if p and p in count and (p != dst_ptrs[k] or count[p] > 1):  # another input's memory
            v = v.clone()
        out.append(v)
    return out


def share_memory(tensors: list[torch.Tensor], refs: list[torch.Tensor]) -> bool:
    """Whether two of the call's tensors (inputs, parameters, buffers) share storage."""
    seen: set[int] = set()
    for t in (*tensors, *refs):
        p = storage_ptr(t)
        if p:
            if p in seen:
                return True
            seen.add(p)
    return False


def mutated_shares_memory(tensors: list[torch.Tensor], refs: list[torch.Tensor],
                           mutated: list[tuple[str, int]]) -> bool:
    """Whether a tensor the program mutates shares storage with another of the call's tensors
    (inputs, parameters, buffers). Inputs that share storage but are only read are no hazard:
    `labels=input_ids` in a compiled training step, with its parameters updated in place."""
    targets = set(mutated)
    written: set[int] = set()
    for kind, i in targets:
        p = storage_ptr(tensors[i] if kind == "user" else refs[i])
        if p:
            if p in written:
                return True
            written.add(p)
    others = [t for i, t in enumerate(tensors) if ("user", i) not in targets]
    others += [t for i, t in enumerate(refs) if ("ref", i) not in targets]
    return any(storage_ptr(t) in written for t in others)

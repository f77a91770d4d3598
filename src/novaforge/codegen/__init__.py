"""Code generation: one Backend per target (registry.py; cpu/: C++/OpenMP, triton/: Triton),
turning planned IR graphs into Programs.

Importing this package gives the IR's attention records their CUDA flash kernels: novaforge's
Triton kernels (triton/attention_train.py) go into `ir.ops.attention_cuda_impl.FLASH`, loaded at
their first call (so triton is imported only where they run). The IR knows no backend, so it
is given them from here; novaforge/__init__ imports this package, so they are in place before
anything runs.

Invariant: importing this package imports no backend and no triton.
"""

from __future__ import annotations

from typing import Any

from ..ir.ops import attention_cuda_impl


def _flash_forward(*args: Any, **kwargs: Any) -> Any:
    from .triton.attention_train import flash_attention_forward

    return flash_attention_forward(*args, **kwargs)


def _flash_backward(*args: Any, **kwargs: Any) -> Any:
    from .triton.attention_train import flash_attention_backward

    return flash_attention_backward(*args, **kwargs)


attention_cuda_impl.FLASH.update(forward=_flash_forward, backward=_flash_backward)

"""`novaforge.quantize(model, "int8-weight" | "int8-dynamic")`: torchao's int8 quantization in one line.

torchao (the `quant` extra, pinned) does the quantization; this is a thin front:

* "int8-weight": `Int8WeightOnlyConfig` — every nn.Linear weight becomes int8 with one float32
  scale per output channel (symmetric). Activations stay float32. Compiled, the weight stays int8
  in memory and is converted in registers inside nf_gemm (passes/recognize_int8_weights.py): the
  decode path, bound by weight bytes.
* "int8-dynamic": `Int8DynamicActivationInt8WeightConfig` — int8 weights as above, and each row of
  the activations quantized at run time; the product is `aten._int_mm` (int8 x int8 -> int32),
  which novaforge computes exactly on nf_gemm's int8 x int8 kernel (AVX512-VNNI `vpdpwssd` where
  the CPU has it, else AVX2 `vpmaddwd`: 1.6-1.7x the float32 GEMM's rate on a Zen 3; docs/cpu-gemm.md
  "int8 x int8").

transformers' `Conv1D` (GPT-2's attention and MLP projections: y = x @ W + b, W [in, out]) is not
an nn.Linear, so torchao would skip it; it is replaced by the equivalent nn.Linear first (same
values, weight transposed once). The model is changed in place and returned.

Accuracy is not assumed: `benchmarks/quant_accuracy.py` reports logits error, top-1 agreement and
perplexity change against the float32 model (docs/cpu-backend.md, "int8"); `novaforge bench --dtype
int8-weight|int8-dynamic` measures the speed beside the error against float32 eager.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MODES = {"int8-weight": "Int8WeightOnlyConfig", "int8-dynamic": "Int8DynamicActivationInt8WeightConfig"}


def _is_conv1d(m: torch.nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D (checked by shape, without importing transformers)."""
    w = getattr(m, "weight", None)
    return (type(m).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2
            and getattr(m, "nf", None) == w.shape[1])


def conv1d_to_linear(model: torch.nn.Module) -> int:
    """Replace every transformers Conv1D in `model` by the nn.Linear computing the same; returns how many."""
    swaps = [(name, m) for name, m in model.named_modules() if _is_conv1d(m)]
    for name, m in swaps:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        k, n = m.weight.shape
        lin = torch.nn.Linear(k, n, bias=m.bias is not None, device=m.weight.device, dtype=m.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(m.weight.t())
            if m.bias is not None:
                lin.bias.copy_(m.bias)
        lin.weight.requires_grad_(m.weight.requires_grad)
        setattr(parent, leaf, lin)
    return len(swaps)


def quantize(model: torch.nn.Module, mode: str = "int8-weight",
             filter_fn: Callable[[torch.nn.Module, str], bool] | None = None) -> torch.nn.Module:
    """Quantize `model`'s linear layers in place with torchao (`mode`: "int8-weight" or
    "int8-dynamic"); `filter_fn(module, name)` picks the layers (default: every nn.Linear)."""
    if mode not in MODES:
        raise ValueError(f"novaforge.quantize: mode {mode!r}; expected one of {sorted(MODES)}")
    try:
        from torchao.quantization import quant_api, quantize_
    except ImportError as e:
        raise ImportError("novaforge.quantize needs torchao: pip install 'novaforge[quant]' (torchao==0.18.0)") from e
    conv1d_to_linear(model)
    config = getattr(quant_api, MODES[mode])()
    if filter_fn is None:
        quantize_(model, config)
    else:
        quantize_(model, config, filter_fn=filter_fn)
    return model

"""The runner registry: what each runner is, which package it needs, where it applies.

This module imports nothing heavy (no torch, no peer package), so the parent process of a
benchmark can plan, and report missing packages as skipped, without loading any runner.
A runner's implementation is a class in one module per runner family, loaded by name inside
the fresh worker process that measures it (`load_runner`).

The `dtype` of a run is a float type (float32, bfloat16) or an int8 quantization
(`INT8_MODES`: int8-weight, int8-dynamic; `novaforge.quantize` names them). The int8 modes are
measured on the CPU inference and generate workloads only; a runner that lists one in `dtypes` runs the
torchao-quantized model (or, for ONNX Runtime, quantizes its own export); one that does not is
skipped with the reason in `dtype_notes` when it has one.

Invariant: every name in `RUNNERS` resolves to a class with `inference`, `training` and/or
`matmul` methods matching the kinds it declares; `not_applicable` returns a reason string
exactly when the runner cannot run that (kind, device, dtype), never raising.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class RunnerSpec:
    name: str
    module: str  # novaforge.bench.runners.<module>
    cls: str
    requires: tuple[str, ...]  # importable top-level modules the runner needs
    kinds: frozenset[str]  # inference / training / matmul / generate
    devices: frozenset[str]  # cpu / cuda
    dtypes: frozenset[str]  # float32 / bfloat16 / int8-weight / int8-dynamic
    in_all_devices: frozenset[str]  # devices on which `--runner all` includes it
    description: str
    install: str = "pip install -e .[bench]"
    dtype_notes: tuple[tuple[str, str], ...] = ()  # (dtype, why this runner does not run it)
    int8_requires: tuple[str, ...] = ("torchao",)  # what the int8 modes need besides `requires`

    def not_applicable(self, kind: str, device: str, dtype: str) -> str | None:
        if kind not in self.kinds:
            return f"{self.name} has no {kind} runner"
        if device not in self.devices:
            return f"{self.name} runs on {'/'.join(sorted(self.devices))} only"
        if dtype in INT8_MODES and (kind not in ("inference", "generate") or device != "cpu"):
            return f"{dtype} is measured on CPU inference and generate workloads only"
        if dtype not in self.dtypes:
            return dict(self.dtype_notes).get(dtype, f"{self.name} does not run {dtype} here")
        return None

    def missing_package(self, dtype: str | None = None) -> str | None:
        extra = self.int8_requires if dtype in INT8_MODES else ()
        for mod in (*self.requires, *extra):
            if importlib.util.find_spec(mod) is None:
                install = "pip install -e .[quant]" if mod == "torchao" else self.install
                return f"package '{mod}' is not installed ({install})"
        return None


# the quantizations `--dtype` accepts besides the float types (the modes of novaforge.quantize)
INT8_MODES = frozenset({"int8-weight", "int8-dynamic"})
DTYPES = ("float32", "bfloat16", "int8-weight", "int8-dynamic")  # `--dtype` choices, in this order

_ALL = frozenset({"cpu", "cuda"})
_CPU = frozenset({"cpu"})
_BOTH_DT = frozenset({"float32", "bfloat16"})
_WITH_INT8 = _BOTH_DT | INT8_MODES  # int8: the torchao-quantized model, run by this runner
_ORT_NO_INT8_WEIGHT = ("ONNX Runtime has no per-channel int8 weight-only path here: MatMulNBits (8-bit, "
                       "block-wise) rewrites MatMul nodes only, not the Gemm nodes the exporter emits for the "
                       "GPT-2/BERT linears, and channel-wise needs the QDQ format; int8-dynamic is measured")
_OV_NO_INT8 = "OpenVINO's int8 needs NNCF (nncf.compress_weights / nncf.quantize), which is not installed"

RUNNERS: dict[str, RunnerSpec] = {s.name: s for s in [
    RunnerSpec("novaforge", "novaforge_runner", "NovaforgeRunner", ("torch",),
               frozenset({"inference", "training", "matmul", "generate"}), _ALL, _WITH_INT8, _ALL,
               "novaforge.compile (freeze=True for inference)"),
    RunnerSpec("novaforge-step", "novaforge_runner", "NovaforgeStepRunner", ("torch",),
               frozenset({"training"}), _ALL, _BOTH_DT, _ALL,
               "novaforge.compile_step(model, AdamW): forward, loss, backward and update as one program"),
    RunnerSpec("novaforge-dynamic-cache", "novaforge_runner", "NovaforgeDynamicCacheRunner", ("torch",),
               frozenset({"generate"}), _ALL, _BOTH_DT, _ALL,
               "novaforge.compile(dynamic=True); generate with the default DynamicCache (one program per phase)"),
    RunnerSpec("novaforge-packed", "novaforge_runner", "NovaforgePackedRunner", ("torch",),
               frozenset({"inference"}), _CPU, _WITH_INT8, _CPU,
               "novaforge.compile(freeze=True, pack_weights=True): packed weight copies (CPU backend)"),
    RunnerSpec("novaforge-refine", "novaforge_runner", "NovaforgeRefineRunner", ("torch",),
               frozenset({"inference"}), _CPU, _WITH_INT8, frozenset(),
               "novaforge.compile(freeze=True, refine=True, refine_sample_every=2): 300 untimed calls refine first"),
    RunnerSpec("eager", "torch_runners", "EagerRunner", ("torch",),
               frozenset({"inference", "training", "matmul", "generate"}), _ALL, _WITH_INT8, _ALL,
               "PyTorch eager (torch.matmul for the matmul sweep)"),
    RunnerSpec("torch-compile", "torch_runners", "TorchCompileRunner", ("torch",),
               frozenset({"inference", "training", "generate"}), _ALL, _WITH_INT8, _ALL,
               "torch.compile, default mode (generate: model.forward compiled)"),
    RunnerSpec("torch-compile-static", "torch_runners", "TorchCompileStaticRunner", ("torch",),
               frozenset({"generate"}), _ALL, _BOTH_DT, _ALL,
               "generate with model.forward = torch.compile(model.forward) and a static KV cache"),
    RunnerSpec("torch-compile-novaforge", "torch_runners", "TorchCompileNovaforgeRunner", ("torch",),
               frozenset({"inference", "generate"}), _ALL, _WITH_INT8, frozenset(),
               "torch.compile(backend='novaforge'); generate: model.forward compiled, the default DynamicCache"),
    RunnerSpec("torch-compile-freeze", "torch_runners", "TorchCompileFreezeRunner", ("torch",),
               frozenset({"inference"}), _ALL, _WITH_INT8, _ALL,
               "torch.compile with inductor freezing, inside torch.inference_mode()"),
    RunnerSpec("onnxruntime", "onnxruntime_runner", "OnnxRuntimeRunner", ("onnxruntime", "onnxscript", "onnx"),
               frozenset({"inference"}), _CPU, frozenset({"float32", "int8-dynamic"}), _CPU,
               "torch.onnx.export(dynamo=True) + ONNX Runtime CPU, ORT_ENABLE_ALL (int8-dynamic: quantize_dynamic)",
               dtype_notes=(("int8-weight", _ORT_NO_INT8_WEIGHT),), int8_requires=()),
    RunnerSpec("openvino", "openvino_runner", "OpenVinoRunner", ("openvino",),
               frozenset({"inference"}), _CPU, _BOTH_DT, _CPU,
               "ov.convert_model(dynamo=True) + OpenVINO CPU, LATENCY, precision hint = --dtype",
               dtype_notes=tuple((m, _OV_NO_INT8) for m in sorted(INT8_MODES))),
    RunnerSpec("jax", "jax_runner", "JaxRunner", ("jax",),
               frozenset({"training"}), _ALL, _BOTH_DT, frozenset({"cuda"}),
               "the same GPT written in JAX, jit-compiled by XLA, AdamW written out", install="pip install jax"),
]}

# the runner every other one is compared against, per workload kind
BASELINE = "eager"


def expand(names: list[str], kind: str, device: str) -> list[str]:
    """`all` -> every runner applicable on this device that `all` includes there; keeps order, no repeats."""
    out: list[str] = []
    for n in names:
        if n == "all":
            cand = [s.name for s in RUNNERS.values() if device in s.in_all_devices and kind in s.kinds]
        else:
            if n not in RUNNERS:
                raise ValueError(f"unknown runner {n!r}; known: {', '.join(RUNNERS)} or all")
            cand = [n]
        out.extend(c for c in cand if c not in out)
    return out


def load_runner(name: str):
    spec = RUNNERS[name]
    module = importlib.import_module(f"{__name__}.{spec.module}")
    return getattr(module, spec.cls)()

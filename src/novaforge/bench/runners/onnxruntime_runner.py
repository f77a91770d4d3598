"""ONNX Runtime runner (CPU), run the way shared/ANCHORS.md fixes it.

Setup: `torch.onnx.export(model, inputs, path, dynamo=True)`, then an `InferenceSession` with
`intra_op_num_threads = threads`, `inter_op_num_threads = 1`, `ORT_ENABLE_ALL`, the CPU
provider. A call is `session.run(None, feed)` with the inputs prepared as numpy once.

`--dtype int8-dynamic`: the float32 export is quantized by ONNX Runtime's own tool,
`onnxruntime.quantization.quantize_dynamic(model.onnx, model_int8.onnx, weight_type=QInt8)`
(int8 weights, activations quantized at run time: MatMulInteger / DynamicQuantizeLinear), inside
the timed setup; the session runs the int8 file. The harness gives this runner the float32
model (`quantizes_model = False`), not torchao's, which ONNX cannot export as int8 ops.

Invariant: float32 or int8-dynamic only (the harness skips bf16 and int8-weight for this runner,
with the reason); the first ONNX output is the model's first output (`last_hidden_state` for
the transformers models).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .base import Prepared, RunContext


def quantize_dynamic_int8(src: Path, dst: Path) -> Path:
    """ORT's dynamic quantization of an exported float32 model: int8 weights (per tensor,
    symmetric), activations quantized at run time. Returns `dst`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst


class OnnxRuntimeRunner:
    quantizes_model = False  # int8-dynamic quantizes the ONNX export (quantize_dynamic), not the torch model

    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import onnxruntime as ort

        path = ctx.workdir / "model.onnx"
        t0 = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(model, inputs, str(path), dynamo=True)
        t1 = time.perf_counter()
        info = {"export_s": t1 - t0}
        if ctx.quantization == "int8-dynamic":
            path = quantize_dynamic_int8(path, ctx.workdir / "model_int8.onnx")
            info["ort_quantize_s"] = time.perf_counter() - t1
            t1 = time.perf_counter()
        elif ctx.quantization is not None:
            raise ValueError(f"onnxruntime runs float32 or int8-dynamic, not {ctx.dtype}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = ctx.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        t2 = time.perf_counter()
        feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)}
        return Prepared(lambda: session.run(None, feed), to_tensor=lambda out: torch.from_numpy(out[0]),
                        info={**info, "session_s": t2 - t1, "ort_version": ort.__version__})

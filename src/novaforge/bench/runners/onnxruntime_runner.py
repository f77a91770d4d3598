"""ONNX Runtime runner (CPU), run the way shared/ANCHORS.md fixes it.

Setup: `torch.onnx.export(model, inputs, path, dynamo=True)`, then an `InferenceSession` with
`intra_op_num_threads = threads`, `inter_op_num_threads = 1`, `ORT_ENABLE_ALL`, the CPU
provider. A call is `session.run(None, feed)` with the inputs prepared as numpy once.

Invariant: float32 only (the harness skips bf16 for this runner); the first ONNX output is
the model's first output (`last_hidden_state` for the transformers models).
"""

from __future__ import annotations

import time

import torch

from .base import Prepared, RunContext


class OnnxRuntimeRunner:
    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import onnxruntime as ort

        path = ctx.workdir / "model.onnx"
        t0 = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(model, inputs, str(path), dynamo=True)
        t1 = time.perf_counter()
        so = ort.SessionOptions()
        so.intra_op_num_threads = ctx.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        t2 = time.perf_counter()
        feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)}
        return Prepared(lambda: session.run(None, feed), to_tensor=lambda out: torch.from_numpy(out[0]),
                        info={"export_s": t1 - t0, "session_s": t2 - t1, "ort_version": ort.__version__})

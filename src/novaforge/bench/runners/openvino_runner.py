"""OpenVINO runner (CPU), run the way shared/ANCHORS.md fixes it.

Setup: `ov.convert_model(model, example_input=inputs, dynamo=True)` (the TorchScript path fails
on transformers 5 attention masks), static input shapes, then `compile_model(..., "CPU",
{INFERENCE_NUM_THREADS: threads, NUM_STREAMS: 1, PERFORMANCE_HINT: LATENCY,
INFERENCE_PRECISION_HINT: f32 or bf16})`. The precision hint follows `--dtype`: OpenVINO
would otherwise pick bf16 on CPUs that have it, and like must be compared with like.
A call is one synchronous `infer` on one infer request.

Invariant: the model passed in stays float32; precision is only ever chosen by the hint.
"""

from __future__ import annotations

import time

import torch

from .base import Prepared, RunContext


class OpenVinoRunner:
    def inference(self, model: torch.nn.Module, inputs: tuple, ctx: RunContext) -> Prepared:
        import openvino as ov

        t0 = time.perf_counter()
        with torch.no_grad():
            ov_model = ov.convert_model(model, example_input=inputs, dynamo=True)
        ov_model.reshape({i: ov.PartialShape(list(x.shape)) for i, x in enumerate(inputs)})
        t1 = time.perf_counter()
        precision = "bf16" if ctx.dtype == "bfloat16" else "f32"
        config = {"INFERENCE_NUM_THREADS": ctx.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": precision}
        compiled = ov.Core().compile_model(ov_model, "CPU", config)
        request = compiled.create_infer_request()
        t2 = time.perf_counter()
        arrays = [x.numpy() for x in inputs]

        def call():
            request.infer(arrays)
            return request

        def to_tensor(req) -> torch.Tensor:
            return torch.from_numpy(req.get_output_tensor(0).data.copy())

        actual = compiled.get_property("INFERENCE_PRECISION_HINT")
        return Prepared(call, to_tensor=to_tensor,
                        info={"convert_s": t1 - t0, "compile_s": t2 - t1, "precision_hint": precision,
                              "precision_effective": str(actual), "ov_version": ov.get_version()})

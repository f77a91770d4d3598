"""novaforge: a deep-learning compiler for PyTorch.

    compiled = novaforge.compile(model)            # or torch.compile(model, backend="novaforge")
    print(novaforge.explain(model, *inputs))        # what the compiler did, pass by pass
    novaforge.report(model, *inputs, path="r.html")  # the same as one HTML page with plots
    step = novaforge.compile_step(model, optimizer)  # forward, loss, backward, update: one program
"""

from __future__ import annotations

# codegen gives the IR its CUDA attention kernels; compiled_module names CompiledNNModule (the
# compiled nn.Module) in api.CompiledModule; report is callable: novaforge.report(model, *inputs, path=...)
from . import codegen, compiled_module, report  # noqa: F401
from .api import CompiledModule, compile
from .bisect import bisect  # novaforge.bisect(model, *inputs): the guilty pass and decision
from .frontend.capture import CaptureError
from .frontend.lower import UnsupportedError
from .quantize import quantize  # novaforge.quantize(model, "int8-weight" | "int8-dynamic"): torchao, one line
from .training import compile_step
from .user_kernels import register_kernel, unregister_kernel  # a kernel of the user's for a pattern
from .version import __version__

__all__ = ["CaptureError", "CompiledModule", "UnsupportedError", "__version__", "bisect", "compile", "compile_step",
           "explain", "quantize", "register_kernel", "report", "unregister_kernel"]


def _register_dynamo_backend() -> None:
    """`torch.compile(backend="novaforge")` finds us by the package's entry point; a source tree on
    PYTHONPATH (no installed metadata) has none, so importing novaforge registers the backend."""
    from importlib.metadata import entry_points

    if any(e.name == "novaforge" for e in entry_points(group="torch_dynamo_backends")):
        return
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "novaforge" not in _BACKENDS:
        from .dynamo import novaforge_backend

        register_backend(name="novaforge")(novaforge_backend)


_register_dynamo_backend()


def explain(model, *args, **kwargs):
    """Compile `model` for these inputs and return a printable report (see report/explain.py)."""
    from .report.explain import explain as _explain

    return _explain(model, *args, **kwargs)

"""Stage 5, compile: ``torch.compile(model, backend="onnx_custom")``.

Modules: `options` (validated `CompileOptions`), `torch_adapter` (the one door to torch's private
exporter API), `translate` (FX graph -> ONNX), `partition` (ORT vs eager), `session` (LRU session
cache and the zero-copy hand-off), `backend` (aot_autograd wiring), `explain` (what ran where).
"""

from __future__ import annotations

from onnx_custom.compile.backend import OnnxCustomBackend, compile_backend, onnx_custom_backend
from onnx_custom.compile.explain import CompileExplanation, explain_compile
from onnx_custom.compile.options import CompileOptions

__all__ = [
    "CompileExplanation",
    "CompileOptions",
    "OnnxCustomBackend",
    "compile_backend",
    "explain_compile",
    "onnx_custom_backend",
]

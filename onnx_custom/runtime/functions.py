"""Function bodies: ship ONNX ``FunctionProto`` fallbacks for custom nodes inside the model.

A runtime without our kernels inlines the body; ONNX Runtime with our kernels registered runs
the kernel instead (a registered kernel wins over a model-local function).
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from onnx_custom.errors import KernelError
from onnx_custom.runtime.registry import KernelRegistry, KernelSpec, default_kernel_registry
from onnx_custom.runtime.session import ModelSource, custom_nodes, load_model

__all__ = ["embed_functions", "function_proto"]

_MIN_IR_FOR_FUNCTIONS = 8


def _to_proto(obj: Any) -> onnx.FunctionProto | None:
    if obj is None or isinstance(obj, onnx.FunctionProto):
        return obj
    if hasattr(obj, "to_function_proto"):  # onnxscript OnnxFunction
        return _to_proto(obj.to_function_proto())
    if callable(obj):
        return _to_proto(obj())
    raise KernelError(
        f"function= must be an onnx.FunctionProto, an onnxscript function or a zero-argument "
        f"callable returning one; received {type(obj).__name__}."
    )


def function_proto(spec: KernelSpec) -> onnx.FunctionProto | None:
    """``spec``'s function body renamed to its ``domain``/``op_type`` (None if it has none)."""
    proto = _to_proto(spec.function)
    if proto is None:
        return None
    out = onnx.FunctionProto()
    out.CopyFrom(proto)
    out.domain, out.name = spec.domain, spec.op_type
    return out


def embed_functions(model: ModelSource, kernels: KernelRegistry | None = None) -> onnx.ModelProto:
    """Copy of ``model`` with a ``FunctionProto`` for each custom op whose kernel has a body."""
    proto, _ = load_model(model)
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    reg = default_kernel_registry() if kernels is None else kernels
    present = {(f.domain, f.name) for f in out.functions}
    imports = {o.domain: o.version for o in out.opset_import}
    for node in custom_nodes(out):
        key = (node.domain, node.op_type)
        spec = reg.lookup(*key)
        if key in present or spec is None:
            continue
        body = function_proto(spec)
        if body is None:
            continue
        for op in body.opset_import:
            # ORT inlines bodies against the model's opsets: keep them consistent
            if op.domain in imports and op.domain != spec.domain:
                op.version = imports[op.domain]
            elif op.domain not in imports:
                out.opset_import.append(helper.make_opsetid(op.domain, op.version))
                imports[op.domain] = op.version
        out.functions.append(body)
        present.add(key)
    if out.functions and out.ir_version < _MIN_IR_FOR_FUNCTIONS:
        out.ir_version = _MIN_IR_FOR_FUNCTIONS
    return out

"""Loading ONNX models and running them with ONNX Runtime or onnx's reference evaluator.

Sits just above `compare` and below `verify`, `localize` and `inspect_model`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom._onnx_utils import iter_nodes
from onnx_custom.compare import flatten_outputs, to_numpy
from onnx_custom.errors import ExtensionBuildError, VerificationError

__all__ = ["custom_node_types", "load_model", "make_reference", "make_session", "run_onnx", "tensor_inputs"]


def load_model(onnx_model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> onnx.ModelProto:
    """A ModelProto from a proto, bytes or path; clear errors for missing or corrupt files."""
    from onnx_custom.runtime.session import load_model as load

    return load(onnx_model)[0]


def tensor_inputs(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [leaf for _, leaf in flatten_outputs(args, "input") if isinstance(leaf, torch.Tensor)]


def input_names(proto: onnx.ModelProto, args: tuple[Any, ...]) -> list[str]:
    tensors = tensor_inputs(args)
    initializers = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    if len(names) != len(tensors):
        raise VerificationError(
            f"The ONNX model takes {len(names)} input(s) {names} but the example arguments hold "
            f"{len(tensors)} tensor(s). Pass the same example inputs used for export."
        )
    return names


def run_onnx(session: Any, proto: onnx.ModelProto, args: tuple[Any, ...]) -> list[np.ndarray]:
    names = input_names(proto, args)
    tensors = tensor_inputs(args)
    return list(session.run(None, {n: to_numpy(t) for n, t in zip(names, tensors, strict=True)}))


def _plain_session(proto: onnx.ModelProto) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def make_session(proto: onnx.ModelProto, kernels: Any = None) -> Any:
    """An ORT session with our custom kernels loaded (plain ORT when the kernel host is unavailable)."""
    try:
        from onnx_custom.runtime import InferenceSession
    except ImportError:  # the kernel host is optional for models without custom nodes
        return _plain_session(proto)
    try:
        return InferenceSession(proto, kernels=kernels)
    except ExtensionBuildError:
        # The native shim could not be built: only models with custom nodes need it.
        if custom_node_types(proto):
            raise
        return _plain_session(proto)


def custom_node_types(proto: onnx.ModelProto) -> list[str]:
    found = {f"{n.domain}::{n.op_type}": None for n in iter_nodes(proto, functions=False) if n.domain not in ("", "ai.onnx", "ai.onnx.ml")}
    return list(found)


def make_reference(proto: onnx.ModelProto, kernels: Any = None) -> Any:
    """onnx's ``ReferenceEvaluator``; custom nodes run our kernels adapted as ``OpRun`` classes."""
    from onnx.reference import ReferenceEvaluator

    custom = custom_node_types(proto)
    if not custom:
        return ReferenceEvaluator(proto)
    try:
        from onnx_custom.runtime import reference_evaluator
    except ImportError as exc:
        raise VerificationError(
            f"The model has custom nodes {custom}; the reference backend needs their kernels as "
            f"OpRun classes (onnx_custom.runtime.reference_evaluator), which is unavailable: {exc}. "
            "Fix: install/build the kernel host or verify with backends=('onnxruntime',)."
        ) from exc
    return reference_evaluator(proto, kernels=kernels)

"""Which standard ONNX nodes ONNX Runtime's CPU provider can run, asked of ONNX Runtime itself.

No hand-kept table: `cpu_runs(node, opset, input_types)` builds a one-node model from the node
(its attributes, inputs of the given element types and no declared shape), creates a CPU session
(where ONNX Runtime looks up kernels) and runs it once on zeros of the known sizes. A refusal that
names a type (the schema rejecting the type, "Could not find an implementation", a kernel saying the
data type "is not supported" at run time, as ScatterND's ``reduction='add'`` does for float16; a
type parameter "bound to different types" by mixed float inputs) means "no"; any other failure
(the zero inputs not fitting the node, say) means "not known to be refused" and counts as yes.
Each answer is cached per process by (op, domain, opset, input types, output count, attributes),
so an export asks at most once per distinct node kind.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

__all__ = ["PROVIDER", "TypedInput", "cpu_runs", "probe_key"]

PROVIDER = "CPUExecutionProvider"
_ERROR_SEVERITY = 4  # FATAL only: the probe's refusals are expected, never shown to the user
_MAX_PROBE_ELEMENTS = 1 << 16  # static sizes above this are probed at size 1 instead
_REFUSED = re.compile(
    r"Could not find an implementation|Type Error: Type '[^']*' of (?:input|output) parameter"
    r"|data type is not supported|type is not supported|not supported for type|Unsupported data"
    r" type|bound to different types",
    re.IGNORECASE,
)

TypedInput = tuple[int, tuple[int | None, ...] | None]
"""(element type, shape) of one node input; a dim is None when unknown, the shape None when
the rank is unknown. An absent optional input is ``(0, None)``."""


def probe_key(node: onnx.NodeProto, opset: int, inputs: Sequence[TypedInput]) -> tuple[object, ...]:
    """What the answer depends on: sizes only matter through the probe's inputs, so they are left
    out (one probe per op kind and types); attributes are compared by their serialized bytes."""
    attrs = tuple(sorted((a.name, a.SerializeToString()) for a in node.attribute))
    return (node.domain, node.op_type, opset, tuple(t for t, _ in inputs), len(node.output), attrs)


def cpu_runs(node: onnx.NodeProto, opset: int, inputs: Sequence[TypedInput]) -> bool:
    """Whether ONNX Runtime's CPU provider runs ``node`` (default domain at ``opset``) on inputs
    of these element types; see the module doc for how it is decided."""
    key = probe_key(node, opset, inputs)
    return _probe(key, node.SerializeToString(), tuple((t, s) for t, s in inputs))


@functools.cache
def _probe(key: tuple[object, ...], node_bytes: bytes, inputs: tuple[TypedInput, ...]) -> bool:
    import onnxruntime as ort

    node = onnx.NodeProto()
    node.ParseFromString(node_bytes)
    model = _one_node_model(node, int(key[2]), inputs)  # type: ignore[call-overload]
    options = ort.SessionOptions()
    options.log_severity_level = _ERROR_SEVERITY
    try:
        # Kernel lookup happens here; the inputs have no declared shape, so no shape check can
        # fail first and hide a missing kernel.
        session = ort.InferenceSession(model.SerializeToString(), options, providers=[PROVIDER])
    except Exception as exc:
        return not _REFUSED.search(str(exc))
    try:  # some kernels check their type only when they run (ScatterND's reduction at float16)
        session.run_with_ort_values(None, _feeds(inputs))
    except Exception as exc:
        return not _REFUSED.search(str(exc))
    return True


def _one_node_model(
    node: onnx.NodeProto, opset: int, inputs: tuple[TypedInput, ...]
) -> onnx.ModelProto:
    probe = onnx.NodeProto()
    probe.CopyFrom(node)
    probe.name = "probe"
    del probe.input[:]
    del probe.output[:]
    graph_inputs = []
    for index, (elem_type, _) in enumerate(inputs):
        name = f"in{index}" if elem_type else ""
        probe.input.append(name)
        if name:
            graph_inputs.append(helper.make_tensor_value_info(name, elem_type, None))
    outputs = []
    for index, name in enumerate(node.output):
        probe.output.append(f"out{index}" if name else "")
        if name:
            outputs.append(helper.make_empty_tensor_value_info(f"out{index}"))
    graph = helper.make_graph([probe], "cpu_support_probe", graph_inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _feeds(inputs: tuple[TypedInput, ...]) -> dict[str, object]:
    """Zeros at the known sizes (1 where unknown), as OrtValues: NumPy has no bfloat16 that ONNX
    Runtime's Python binding takes, so every type goes in as raw bytes of the right width."""
    import onnxruntime as ort

    feeds: dict[str, object] = {}
    for index, (elem_type, shape) in enumerate(inputs):
        if not elem_type:
            continue
        np_type = helper.tensor_dtype_to_np_dtype(elem_type)
        zeros = np.zeros(
            _probe_shape(shape),
            dtype=np.uint16 if elem_type == onnx.TensorProto.BFLOAT16 else np_type,
        )
        feeds[f"in{index}"] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(zeros, elem_type)
    return feeds


def _probe_shape(shape: tuple[int | None, ...] | None) -> list[int]:
    if shape is None:
        return [1]
    dims = [1 if d is None or d < 0 else d for d in shape]
    if int(np.prod(dims, dtype=np.int64)) > _MAX_PROBE_ELEMENTS:
        dims = [min(d, 1) for d in dims]  # keeps zero-size dims zero, others 1
    return dims

"""ORT's refusals of a ``run`` call's inputs, retold against the model's declared inputs; and
half-precision feeds ORT's ``run`` cannot take from NumPy.

Refusals are checked only after ONNX Runtime refused the call, so a good call pays nothing.
ORT's Python ``run`` has no NumPy type for bfloat16 (``ml_dtypes.bfloat16`` arrays fail with
"Numpy_type 256 can't be converted to MLDataType", bfloat16 outputs with "No corresponding Numpy
type"): models with bfloat16/float16 inputs or outputs run through OrtValues instead, the
2-byte arrays wrapped without a copy.
"""

from __future__ import annotations

import ctypes
import difflib
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnx_custom.errors import InvalidArgumentError

__all__ = ["HALF_TYPES", "explain_feed_error", "from_ort_value", "half_feeds", "to_ort_value"]

# ORT's declared type -> ONNX element type, for the types whose NumPy flavours vary.
HALF_TYPES = {
    "tensor(bfloat16)": onnx.TensorProto.BFLOAT16,
    "tensor(float16)": onnx.TensorProto.FLOAT16,
}
# NumPy dtypes that carry each half type's bits: the type itself (ml_dtypes for bfloat16) or a
# uint16 view of it (what torch's ``t.view(torch.int16).numpy()``-style code and older
# ml_dtypes-less code pass).
_HALF_FLAVOURS = {
    onnx.TensorProto.BFLOAT16: ("bfloat16", "uint16"),
    onnx.TensorProto.FLOAT16: ("float16", "uint16"),
}


def to_ort_value(value: Any, declared: str) -> Any:
    """``value`` as an OrtValue of the declared type; 2-byte arrays of a half type's flavours
    are wrapped without a copy when C-contiguous. Other values go through ``ortvalue_from_numpy``.
    """
    if isinstance(value, ort.OrtValue):
        return value
    array = np.asarray(value)
    element = HALF_TYPES.get(declared)
    if element is not None and array.dtype.name in _HALF_FLAVOURS[element]:
        bits = _c_contiguous(array).view(np.uint16)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, element)
    return ort.OrtValue.ortvalue_from_numpy(_c_contiguous(array))


def _c_contiguous(array: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return array if array.flags.c_contiguous else array.copy(order="C")


def from_ort_value(value: Any) -> Any:
    """A NumPy copy of an output OrtValue (bfloat16 as ``ml_dtypes.bfloat16``);
    non-tensors as ORT gives them."""
    if not value.is_tensor() or value.element_type() != onnx.TensorProto.BFLOAT16:
        return value.numpy()
    import ml_dtypes

    size = value.tensor_size_in_bytes()
    raw = bytes((ctypes.c_char * size).from_address(value.data_ptr())) if size else b""
    return (
        np.frombuffer(raw, dtype=np.uint16)
        .view(ml_dtypes.bfloat16)
        .reshape(tuple(value.shape()))
        .copy()
    )


def half_feeds(session: Any, input_feed: Any) -> dict[str, Any] | None:
    """The feed as OrtValues when the model has half-precision inputs or outputs and every fed
    value is an array; None otherwise (ORT's own ``run`` handles it, or refuses and is explained).
    """
    declared = {a.name: a.type for a in session.get_inputs()}
    if not isinstance(input_feed, Mapping) or any(n not in declared for n in input_feed):
        return None
    if not all(isinstance(v, (np.ndarray, np.generic, ort.OrtValue)) for v in input_feed.values()):
        return None
    return {name: to_ort_value(value, declared[name]) for name, value in input_feed.items()}


_ORT_TO_NUMPY = {
    "float": "float32",
    "double": "float64",
    "float16": "float16",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
}


def _declared(arg: Any) -> str:
    return f"{arg.name!r} ({arg.type}, shape {list(arg.shape)})"


def _problems(session: Any, output_names: Any, input_feed: Any) -> list[str]:
    inputs = {a.name: a for a in session.get_inputs()}
    if not isinstance(input_feed, Mapping):
        return [
            f"input_feed must be a dict {{input name: array}}; received {type(input_feed).__name__}"
        ]
    problems = []
    missing = [n for n in inputs if n not in input_feed]
    for name in input_feed:
        if name not in inputs:
            close = difflib.get_close_matches(str(name), [*missing, *inputs], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{name!r} is not an input of the model{hint}")
    problems += [f"input {_declared(inputs[n])} is missing" for n in missing]
    for name, value in input_feed.items():
        arg = inputs.get(name)
        if arg is not None and not isinstance(value, (np.ndarray, np.generic)):
            fix = (
                "x.detach().cpu().numpy()"
                if type(value).__module__.startswith("torch")
                else "np.asarray(x)"
            )
            problems.append(
                f"input {name!r} is a {type(value).__module__}.{type(value).__name__}; expected "
                f"a numpy array: pass {fix}"
            )
            continue
        dtype = getattr(value, "dtype", None)
        if arg is None or dtype is None or not isinstance(getattr(value, "shape", None), tuple):
            continue
        wanted = _ORT_TO_NUMPY.get(arg.type.removeprefix("tensor(").removesuffix(")"))
        element = HALF_TYPES.get(arg.type)
        if element is not None and np.dtype(dtype).name in _HALF_FLAVOURS[element]:
            wanted = None  # fed as an OrtValue of the declared type
        elif arg.type == "tensor(bfloat16)":
            problems.append(
                f"input {name!r} is {np.dtype(dtype)} but the model declares {arg.type}: pass an "
                "ml_dtypes.bfloat16 array (x.astype(ml_dtypes.bfloat16)) or its uint16 view"
            )
        if wanted is not None and np.dtype(dtype) != np.dtype(wanted):
            problems.append(
                f"input {name!r} is {np.dtype(dtype)} but the model declares {arg.type} "
                f"(numpy {wanted}): cast it with .astype(np.{wanted})"
            )
        if isinstance(arg.shape, list) and len(value.shape) != len(arg.shape):
            problems.append(
                f"input {name!r} has {len(value.shape)} dim(s) {list(value.shape)} but the model "
                f"declares {len(arg.shape)}: {list(arg.shape)}"
            )
    known_outputs = [o.name for o in session.get_outputs()]
    for name in output_names or ():
        if name not in known_outputs:
            problems.append(f"output {name!r} is not an output of the model")
    return problems


def explain_feed_error(
    session: Any, output_names: Any, input_feed: Any, exc: BaseException
) -> None:
    """Raise `InvalidArgumentError` (from ``exc``) when the call's inputs or output names do not fit
    the model; return when they do (the failure is something else)."""
    problems = _problems(session, output_names, input_feed)
    if not problems:
        return
    inputs = ", ".join(_declared(a) for a in session.get_inputs())
    outputs = ", ".join(repr(o.name) for o in session.get_outputs())
    raise InvalidArgumentError(
        f"run(): {'; '.join(problems)}. Expected inputs: {inputs}; outputs: {outputs}. Fix: pass "
        "run(None or [output names], {input name: numpy array of the declared dtype and rank})."
    ) from exc

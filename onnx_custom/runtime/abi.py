"""Constants shared by the Python side and the C shim (ONNX element types, attribute kinds)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import AttributeProto, TensorProto

__all__ = [
    "ATTR_KINDS",
    "ATTR_PROTO_TYPES",
    "CHAR_OPTIONAL",
    "CHAR_REQUIRED",
    "CHAR_VARIADIC",
    "DTYPE_NAMES",
    "ELEM_TO_NAME",
    "NAME_TO_ELEM",
    "RULE_BROADCAST",
    "RULE_LIKE",
    "RULE_PY",
    "RULE_UNKNOWN",
    "elem_to_numpy",
    "numpy_to_elem",
]

# OrtCustomOpInputOutputCharacteristic
CHAR_REQUIRED, CHAR_OPTIONAL, CHAR_VARIADIC = 0, 1, 2
# output shape rules: like one input / broadcast (evaluated in the shim without calling Python),
# a Python shape_fn, or unknown (no shape_fn: the kernel claims no shape)
RULE_LIKE, RULE_BROADCAST, RULE_PY, RULE_UNKNOWN = 0, 1, 2, 3

# attribute type name -> OrtOpAttrType value (the shim reads attributes by this kind)
ATTR_KINDS: dict[str, int] = {
    "int": 1,
    "ints": 2,
    "float": 3,
    "floats": 4,
    "string": 5,
    "strings": 6,
    "tensor": 8,
}
ATTR_PROTO_TYPES: dict[str, int] = {
    "int": AttributeProto.INT,
    "ints": AttributeProto.INTS,
    "float": AttributeProto.FLOAT,
    "floats": AttributeProto.FLOATS,
    "string": AttributeProto.STRING,
    "strings": AttributeProto.STRINGS,
    "tensor": AttributeProto.TENSOR,
}

NAME_TO_ELEM: dict[str, int] = {
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL,
}
ELEM_TO_NAME: dict[int, str] = {v: k for k, v in NAME_TO_ELEM.items()}
DTYPE_NAMES: tuple[str, ...] = tuple(NAME_TO_ELEM)

_NUMPY: dict[int, np.dtype] = {
    e: np.dtype(ml_dtypes.bfloat16) if n == "bfloat16" else np.dtype(n)
    for n, e in NAME_TO_ELEM.items()
}


def elem_to_numpy(elem: int) -> np.dtype:
    """numpy dtype of an ONNX element type (bfloat16 via ml_dtypes)."""
    return _NUMPY[elem]


def numpy_to_elem(dtype: object) -> int:
    """ONNX element type of a numpy dtype (or dtype name)."""
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    for elem, known in _NUMPY.items():
        if known == dt:
            return elem
    raise KeyError(str(dt))


def numpy_table() -> dict[int, np.dtype]:
    """Element type -> numpy dtype, as handed to the shim."""
    return dict(_NUMPY)

"""``torch.dtype`` arguments of an op (schema type ``ScalarType``) as translations receive them.

torch hands a dtype argument over in three spellings: TorchScript records its ScalarType index
(7 for float64), a schema default is that index too, and torch's dynamo dispatcher passes an
``onnx_ir.DataType`` (ONNX's numbering: 11 for float64). A translation that maps one of them
to an ONNX type would silently pick the wrong one under the other exporter, so both adapters
give it the ``torch.dtype`` the user wrote.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from onnx_custom.common.torch_onnx import torchscript_exporter

_type_utils = torchscript_exporter("_type_utils")

__all__ = ["SCALAR_TYPES", "dtype_argument", "real_type", "scalar_type_index"]

SCALAR_TYPES = ("ScalarType", "Optional[ScalarType]")


def real_type(argument: Any) -> str:
    """A schema argument's type as declared: ``ScalarType`` where ``argument.type`` says ``int``."""
    return str(getattr(argument, "real_type", argument.type))


def dtype_argument(value: Any, argument: Any) -> Any:
    """``value`` as a ``torch.dtype`` when the schema ``argument`` is a ScalarType and it is
    torch's ScalarType index; any other value unchanged (``None``, a ``torch.dtype``, other types).
    """
    if (
        real_type(argument) not in SCALAR_TYPES
        or isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
    ):
        return value
    return _type_utils.JitScalarType(int(value)).dtype()


def scalar_type_index(value: Any) -> Any:
    """A ``torch.dtype`` as torch's ScalarType index, what a torch-style symbolic written for
    ``torch.onnx`` receives for a dtype argument (``@parse_args('i')``, ``_get_const(v, 'i')``)."""
    if isinstance(value, torch.dtype):
        return int(_type_utils.JitScalarType.from_dtype(value))
    return value

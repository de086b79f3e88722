from __future__ import annotations

import numpy as np
import pytest
import torch

from onnx_custom import attr
from onnx_custom.errors import SymbolicError
from onnx_custom.translate.attributes import AttrKind, convert_attribute


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (3, AttrKind.INT),
        (True, AttrKind.INT),
        (np.int64(2), AttrKind.INT),
        (2.5, AttrKind.FLOAT),
        (np.float32(1.5), AttrKind.FLOAT),
        ("bilinear", AttrKind.STRING),
        ([1, 2], AttrKind.INTS),
        ((1, 2.5), AttrKind.FLOATS),
        (["a", "b"], AttrKind.STRINGS),
        (np.zeros(3), AttrKind.TENSOR),
        (torch.ones(2), AttrKind.TENSOR),
        (attr.ints([]), AttrKind.INTS),
        (attr.floats([]), AttrKind.FLOATS),
        (attr.strings([]), AttrKind.STRINGS),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_kind_from_python_value(value: object, kind: AttrKind) -> None:
    assert convert_attribute("a", value).kind is kind


def test_empty_list_needs_helper() -> None:
    with pytest.raises(SymbolicError, match=r"empty list.*onnx_custom.attr.ints"):
        convert_attribute("pads", [])


@pytest.mark.parametrize(
    "value",
    [{"a": 1}, None.__class__, object(), [1, "a"], [[1, 2]]],
    ids=["dict", "type", "object", "mixed", "nested"],
)
def test_unsupported_values(value: object) -> None:
    with pytest.raises(SymbolicError, match="Attribute 'a'"):
        convert_attribute("a", value)

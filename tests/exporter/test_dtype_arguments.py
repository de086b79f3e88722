"""A ``torch.dtype`` argument of a custom op (schema type ``ScalarType``, as torch.library's
custom-op tutorial writes ``dtype: torch.dtype``) reaches the translation as that ``torch.dtype``
under BOTH exporters, and a torch-style symbolic gets torch's ScalarType index as it does in
torch.onnx.

torch hands the value over as a ScalarType index under TorchScript (7 for float64), as the same
index for a schema default, and as an ``onnx_ir.DataType`` (ONNX numbering: 11 for float64) under
dynamo: a translation mapping one spelling to an ONNX type picked the wrong one (or failed) under
the other. Each file is verified in ONNX Runtime against the eager op (``x.to(dtype)``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from torch.onnx import symbolic_helper
from torch.onnx._internal.torchscript_exporter import _type_utils

import onnx_custom

registry = onnx_custom.default_registry().copy()

# What each translation received for the dtype arguments, per call (the last call is the test's).
received: list[dict[str, Any]] = []

_ONNX_TYPE = {
    torch.float16: onnx.TensorProto.FLOAT16,
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.int64: onnx.TensorProto.INT64,
}


@torch.library.custom_op("octdtype::cast_scale", mutates_args=())
def cast_scale(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    *,
    scale: float = 2.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    y = (x * scale).to(dtype)
    return y if out_dtype is None else y.to(out_dtype)


@cast_scale.register_fake
def _(
    x: torch.Tensor,
    dtype: torch.dtype = torch.float64,
    *,
    scale: float = 2.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype if out_dtype is None else out_dtype)


@onnx_custom.symbolic("octdtype::cast_scale", opset=13, registry=registry)
def cast_scale_onnx(g: Any, x: Any, *, dtype: Any, scale: float, out_dtype: Any) -> Any:
    received.append({"dtype": dtype, "out_dtype": out_dtype})
    y = g.op("Cast", g.op("Mul", x, g.constant(scale, like=x)), to=_ONNX_TYPE[dtype])
    return y if out_dtype is None else g.op("Cast", y, to=_ONNX_TYPE[out_dtype])


# The torch.onnx style: @parse_args("v", "i") and torch's own JitScalarType(...).onnx_type() enum.
@torch.library.custom_op("octdtype::cast_torch_style", mutates_args=())
def cast_torch_style(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


@cast_torch_style.register_fake
def _(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype)


@symbolic_helper.parse_args("v", "i")
def cast_torch_style_symbolic(g: Any, x: Any, dtype: int) -> Any:
    received.append({"dtype": dtype})
    return g.op("Cast", x, to_i=_type_utils.JitScalarType(dtype).onnx_type())


onnx_custom.register_custom_op_symbolic(
    "octdtype::cast_torch_style", cast_torch_style_symbolic, 13, registry=registry
)


class Explicit(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.octdtype.cast_scale.default(x, torch.float16, scale=3.0)


class Default(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast_scale(x)  # the schema default (ScalarType index 7) and out_dtype=None


class Optional(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast_scale(x, torch.float32, out_dtype=torch.float64)


class TorchStyle(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast_torch_style(x, torch.float16)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: type[torch.nn.Module]
    expected: dict[str, Any]  # what the translation must receive
    out_dtype: torch.dtype


CASES = [
    Case("explicit-float16", Explicit, {"dtype": torch.float16, "out_dtype": None}, torch.float16),
    Case(
        "schema-default-float64",
        Default,
        {"dtype": torch.float64, "out_dtype": None},
        torch.float64,
    ),
    Case(
        "optional-float64",
        Optional,
        {"dtype": torch.float32, "out_dtype": torch.float64},
        torch.float64,
    ),
    # ScalarType index of float16 (5), as torch.onnx passes it; ONNX's numbering would be 10
    Case("torch-style-parse-args-i", TorchStyle, {"dtype": 5}, torch.float16),
]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_dtype_argument_reaches_the_translation_as_written(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    x = torch.randn(3, 4)
    path = tmp_path / "m.onnx"
    received.clear()
    onnx_custom.export(
        case.model(),
        (x,),
        path,
        exporter=exporter,
        opset=18,
        registry=registry,
        dynamic_shapes={"x": {0: "batch"}},
    )
    assert received, "the translation did not run"
    assert received[-1] == case.expected
    assert all(
        type(v) is type(case.expected[k]) for k, v in received[-1].items()
    )  # 5 is not a DataType enum
    proto = onnx.load(path)
    assert proto.graph.output[0].type.tensor_type.elem_type == _ONNX_TYPE[case.out_dtype]
    onnx_custom.verify(
        case.model(), (x,), path, trials=2
    )  # ORT vs eager at batch 3 and other sizes

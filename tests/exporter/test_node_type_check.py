"""The nodes a translation adds are type-checked at export, the same way under both exporters:
standard ops against their ``onnx.defs`` type constraints, custom nodes against a registered
schema. ``Concat(float, double)``, which dynamo would write as an invalid file, is a
`SymbolicError` naming the op, the node, the input types and the fix — and nothing is written.
``Mul(float, int64 constant)`` is promoted the way torch promotes it
(tests/translate/test_implicit_casts.py has the rule), here checked end to end beside the fixes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx_custom
from onnx_custom import Registry, SymbolicError
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.schemas import register_schema


@torch.library.custom_op("tcheck::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tcheck.scale(x)


def _int_constant(g, x):  # type: ignore[no-untyped-def]
    return g.op("Mul", x, g.constant(2))  # int64: TorchScript may cast it, dynamo writes it as is


def _int_constant_torch_style(g, self):  # type: ignore[no-untyped-def]
    return g.op("Mul", self, g.op("Constant", value_t=torch.tensor(2)))


def _constant_first(g, x):  # type: ignore[no-untyped-def]
    return g.op("Add", g.constant(np.array(1.0)), x)  # a float64 constant


def _sin_of_int(g, x):  # type: ignore[no-untyped-def]
    return g.op("Cast", g.op("Sin", g.op("Cast", x, to=7)), to=1)


def _concat_mixed(g, x):  # type: ignore[no-untyped-def]
    both = g.op("Concat", x, g.op("Cast", x, to=11), axis=0)
    return g.op("Slice", both, g.constant([0]), g.op("Shape", x, start=0, end=1))


def _float_shape(g, x):  # type: ignore[no-untyped-def]
    return g.op("Reshape", x, g.op("Cast", g.op("Shape", x), to=1))


def _custom_node_int(g, x):  # type: ignore[no-untyped-def]
    return g.op(
        "Cast", g.op("tcheck::Twice", g.op("Cast", x, to=7), output_types=[torch.int64]), to=1
    )


MISTAKES = [
    pytest.param(
        _sin_of_int,
        "symbolic",
        r"Sin \(opset \d+\): input 0 \(input: int64\) has type int64, which Sin does not accept for"
        r" T; expected one of \[.*'float'.*\]. Fix: insert `g.op\('Cast'",
        id="Sin-of-int64",
    ),
    pytest.param(
        _concat_mixed,
        "symbolic",
        r"Concat.*input 0 \(inputs: float\) and input 1 \(inputs: double\).*same element type",
        id="Concat-float-double",
    ),
    pytest.param(
        _float_shape,
        "symbolic",
        r"Reshape.*input 1 \(shape: float\) must be int64; received float.*Fix: insert"
        r" `g.op\('Cast', value, to=onnx.TensorProto.INT64\)`",
        id="Reshape-float-shape",
    ),
    pytest.param(
        _custom_node_int,
        "symbolic",
        r"tcheck::Twice \(opset \d+\): input 0 \(x: int64\) has type int64, which Twice does not"
        r" accept for T0; expected one of \['float'\]",
        id="custom-node-schema",
    ),
]

twice_kernels = KernelRegistry()


@twice_kernels.kernel(
    "tcheck::Twice", inputs=["x"], outputs=["y"], dtypes=["float32"], shape_fn="like:x"
)
def twice(x):  # type: ignore[no-untyped-def]
    return 2 * x


@pytest.fixture(scope="module", autouse=True)
def _twice_schema() -> None:
    spec = twice_kernels.get("tcheck::Twice")
    assert spec is not None and register_schema(spec)


def _registry(fn: Callable[..., Any], style: str) -> Registry:
    registry = Registry()
    if style == "torch":
        onnx_custom.register_custom_op_symbolic("tcheck::scale", fn, 9, registry=registry)
    else:
        onnx_custom.symbolic("tcheck::scale", opset=9, registry=registry)(fn)
    return registry


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(("fn", "style", "pattern"), MISTAKES)
def test_ill_typed_nodes_are_refused_before_the_file_is_written(
    fn: Any, style: str, pattern: str, exporter: str, tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous")
    with pytest.raises(SymbolicError, match=pattern) as info:
        onnx_custom.export(
            Scale(),
            (torch.randn(2, 3),),
            path,
            exporter=exporter,
            opset=17 if exporter == "torchscript" else 18,
            registry=_registry(fn, style),
            dynamic_shapes={"x": {0: "batch"}},
        )
    assert "tcheck::scale" in str(info.value)
    assert path.read_bytes() == b"previous"


def _typed_constant(g, x):  # type: ignore[no-untyped-def]
    return g.op("Mul", x, g.constant(2, like=x))


def _python_scalar_torch_style(g, self):  # type: ignore[no-untyped-def]
    return g.op("Add", g.op("Mul", self, 2), 0.0)  # torch's scalar typing: like the tensor


FIXED = [
    pytest.param(_typed_constant, "symbolic", lambda v: v * 2, id="g.constant-like"),
    pytest.param(
        _python_scalar_torch_style, "torch", lambda v: v * 2, id="torch-style-python-scalars"
    ),
    # promoted like torch (a 0-d constant counts as a scalar): no cast needed in the symbolic
    pytest.param(_int_constant, "symbolic", lambda v: v * 2, id="Mul-int64-constant"),
    pytest.param(
        _int_constant_torch_style, "torch", lambda v: v * 2, id="Mul-torch-style-int64-value_t"
    ),
    pytest.param(_constant_first, "symbolic", lambda v: 1 + v, id="Add-double-constant-first"),
]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize(("fn", "style", "expected"), FIXED)
def test_the_fixes_export_and_run(
    fn: Any,
    style: str,
    expected: Callable[[torch.Tensor], torch.Tensor],
    dtype: torch.dtype,
    exporter: str,
    tmp_path: Path,
) -> None:
    x = torch.randn(3, 4, dtype=dtype)
    path = tmp_path / "m.onnx"
    onnx_custom.export(
        Scale(),
        (x,),
        path,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        registry=_registry(fn, style),
        dynamic_shapes={"x": {0: "batch"}},
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rows in (3, 5):  # another batch size too
        value = torch.randn(rows, 4, dtype=dtype)
        (out,) = session.run(None, {"x": value.numpy()})
        assert out.dtype == value.numpy().dtype
        np.testing.assert_array_equal(out, expected(value).numpy())

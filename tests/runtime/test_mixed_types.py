"""Nodes mixing float element types that ONNX Runtime's CPU provider refuses are repaired with
Casts at export (or refused with the fix); checked against PyTorch and ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.errors import MixedFloatTypesError
from onnx_custom.runtime.half_precision import value_types
from onnx_custom.runtime.mixed_types import repair_mixed_floats


class LinspaceGrid(torch.nn.Module):
    """A sampling grid from ``torch.linspace`` (as Deformable DETR's reference points): the
    TorchScript exporter traces it in float64, so GridSample gets a float64 grid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ys, xs = torch.meshgrid(
            torch.linspace(0.5, h - 0.5, h, dtype=x.dtype),
            torch.linspace(0.5, w - 0.5, w, dtype=x.dtype),
            indexing="ij",
        )
        grid = torch.stack((xs / w, ys / h), -1)[None].expand(x.shape[0], -1, -1, -1) * 2 - 1
        return F.grid_sample(x, grid, align_corners=False)


def _grid_sample_inputs(model: onnx.ModelProto) -> list[tuple[int, ...]]:
    types = value_types(model)
    return [
        tuple(types[i][0] for i in node.input)
        for node in model.graph.node
        if node.op_type == "GridSample"
    ]


def _loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_float64_grid_is_cast_and_the_file_matches_torch(exporter: str) -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 3, 4, 5)
    model = LinspaceGrid().eval()
    proto = onnx_custom.export(model, (x,), exporter=exporter)
    assert _grid_sample_inputs(proto) == [(TensorProto.FLOAT, TensorProto.FLOAT)]
    report = onnx_custom.verify(model, (x,), proto, raise_on_mismatch=False)
    assert report.passed, str(report)


def test_torchscript_writes_the_float64_grid_without_the_pass() -> None:
    """The pattern is real: with the pass off the file is one ONNX Runtime refuses."""
    x = torch.rand(1, 2, 4, 5)
    proto = onnx_custom.export(LinspaceGrid(), (x,), exporter="torchscript", half_precision="off")
    assert _grid_sample_inputs(proto) == [(TensorProto.FLOAT, TensorProto.DOUBLE)]
    assert not _loads(proto)


def test_strict_refuses_with_the_fix() -> None:
    x = torch.rand(1, 2, 4, 5)
    with pytest.raises(MixedFloatTypesError, match=r"GridSample .* \(float32, float64\)") as info:
        onnx_custom.export(LinspaceGrid(), (x,), exporter="torchscript", half_precision="strict")
    assert "half_precision='float32-compute'" in str(info.value)


def _mixed_add(declared_output: int | None) -> onnx.ModelProto:
    """Add(float32 tensor, float64 scalar constant): a Python float folded into float64."""
    scalar = helper.make_tensor("half", TensorProto.DOUBLE, [], [0.5])
    node = helper.make_node("Add", ["x", "half"], ["y"], name="add")
    output = (
        helper.make_tensor_value_info("y", declared_output, [2, 3])
        if declared_output
        else helper.make_empty_tensor_value_info("y")
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [output],
        initializer=[scalar],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize(
    "declared", [None, TensorProto.FLOAT], ids=["output-unknown", "output-f32"]
)
def test_mixed_arithmetic_computes_in_the_tensor_dtype(declared: int | None) -> None:
    model = _mixed_add(declared)
    assert not _loads(model)
    repaired = repair_mixed_floats(model)
    x = np.random.default_rng(0).random((2, 3), dtype=np.float32)
    session = ort.InferenceSession(repaired.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    assert y.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(y), torch.from_numpy(x) + 0.5)
    assert [n.op_type for n in repaired.graph.node] == ["Cast", "Add"]


def test_one_float_type_is_left_alone() -> None:
    x = torch.rand(2, 3)
    proto = onnx_custom.export(torch.nn.Linear(3, 4), (x,), exporter="torchscript")
    before = [n.op_type for n in proto.graph.node]
    assert [n.op_type for n in repair_mixed_floats(proto).graph.node] == before

"""Lowering dynamo exports below opset 18: relabel only what provably keeps its meaning."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
import torch.nn.functional as F

import onnx_custom
from onnx_custom.errors import OnnxCustomError
from onnx_custom.exporter.opset_compat import lower_default_opset


class ConstantPad(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (1, 2, 0, 1), value=0.5) * 2


class ReflectPad(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (1, 2, 1, 1), mode="reflect") + 1


@pytest.mark.parametrize("opset", [13, 16, 17])
@pytest.mark.parametrize("model", [ConstantPad(), ReflectPad()], ids=["constant", "reflect"])
def test_dynamo_pad_lowers_and_verifies(model: torch.nn.Module, opset: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    proto = onnx_custom.export(model, (x,), exporter="dynamo", opset=opset)
    assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {opset}
    assert any(n.op_type == "Pad" for n in proto.graph.node)
    assert onnx_custom.verify(model, (x,), proto).passed


def _pad_model(opset: int, *, axes: bool = False, mode: str = "constant") -> onnx.ModelProto:
    inputs = ["x", "pads", "", "axes"] if axes else ["x", "pads"]
    inits = [
        onnx.numpy_helper.from_array(np.array([1, 1] if axes else [0, 1, 0, 1], np.int64), "pads")
    ]
    if axes:
        inits.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"))
    graph = oh.make_graph(
        [oh.make_node("Pad", inputs, ["y"], mode=mode)],
        "pad",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.parametrize(
    ("kwargs", "built", "target", "changed"),
    [
        ({"axes": True}, 18, 13, "Pad (changed at opset 18)"),  # axes input did not exist before 18
        (
            {"mode": "wrap"},
            19,
            18,
            "Pad (changed at opset 19)",
        ),  # mode 'wrap' did not exist before 19
    ],
    ids=["axes-input", "wrap-mode"],
)
def test_pad_with_new_meaning_is_refused(
    kwargs: dict[str, object], built: int, target: int, changed: str
) -> None:
    with pytest.raises(OnnxCustomError, match="cannot be lowered") as info:
        lower_default_opset(_pad_model(built, **kwargs), target)  # type: ignore[arg-type]
    assert changed in str(info.value)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    ("built", "target"), [(18, 13), (19, 18), (21, 11)], ids=["18to13", "19to18", "21to11"]
)
def test_plain_pad_is_relabelled(built: int, target: int) -> None:
    lowered = lower_default_opset(_pad_model(built), target)
    assert lowered.opset_import[0].version == target
    onnx.checker.check_model(lowered, full_check=True)

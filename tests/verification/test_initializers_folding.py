"""The weight check and BatchNorm folded into Conv/Linear by the TorchScript exporter: silent
when the file holds the model's weights folded, still a warning when they differ."""

from __future__ import annotations

import pytest
import torch

import onnx_custom
from onnx_custom.verification.initializers import compare_initializers


def _randomize(norm: torch.nn.modules.batchnorm._BatchNorm) -> None:
    assert norm.running_mean is not None and norm.running_var is not None
    norm.running_mean.uniform_(-1, 1)
    norm.running_var.uniform_(0.5, 2)
    norm.weight.data.uniform_(0.5, 2)
    norm.bias.data.uniform_(-1, 1)


def conv_bn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 1, bias=False),
        torch.nn.BatchNorm2d(4),
    )
    with torch.no_grad():
        _randomize(model[1])
        _randomize(model[4])
    return model.eval()


def linear_bn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6))
    with torch.no_grad():
        _randomize(model[1])
    return model.eval()


CASES = [
    pytest.param(conv_bn, torch.rand(1, 3, 8, 8), id="conv2d+bn-1x3x8x8"),
    pytest.param(linear_bn, torch.rand(4, 5), id="linear+bn1d-4x5"),
]


@pytest.mark.parametrize(("make", "x"), CASES)
def test_folded_batch_norm_is_not_reported(make, x) -> None:  # type: ignore[no-untyped-def]
    model = make(0)
    proto = onnx_custom.export(model, (x,), exporter="torchscript")
    names = {i.name for i in proto.graph.initializer}
    folded = not any(n.endswith("running_var") for n in names)
    assert compare_initializers(model, proto, warn=False) == []
    report = onnx_custom.verify(model, (x,), proto)
    assert report.passed
    if make is conv_bn:
        assert folded  # the pattern under test: TorchScript folded the BatchNorms


@pytest.mark.parametrize(("make", "x"), CASES)
def test_other_weights_are_still_reported(make, x) -> None:  # type: ignore[no-untyped-def]
    proto = onnx_custom.export(make(0), (x,), exporter="torchscript")
    mismatches = compare_initializers(make(1), proto, warn=False)
    assert mismatches
    assert all("exported from other weights" in m.describe() for m in mismatches)


def test_dynamo_keeps_the_modules_apart_and_is_matched_by_name() -> None:
    model, x = conv_bn(0), torch.rand(1, 3, 8, 8)
    proto = onnx_custom.export(model, (x,), exporter="dynamo")
    assert compare_initializers(model, proto, warn=False) == []
    assert compare_initializers(conv_bn(1), proto, warn=False)


class FoldedBias(torch.nn.Module):
    """``bias * 2`` is a constant expression: the dynamo exporter's optimizer folds it into a new
    initializer, leaving ``bias`` without a same-named one (as D-FINE's box head)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.bias = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.bias * 2


def test_a_constant_folded_parameter_is_not_reported() -> None:
    torch.manual_seed(0)
    model, x = FoldedBias().eval(), torch.rand(3, 4)
    proto = onnx_custom.export(model, (x,), exporter="dynamo")
    assert "bias" not in {i.name for i in proto.graph.initializer}  # the pattern under test
    assert compare_initializers(model, proto, warn=False) == []
    torch.manual_seed(1)
    assert compare_initializers(FoldedBias().eval(), proto, warn=False)

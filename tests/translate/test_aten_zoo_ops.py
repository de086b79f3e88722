"""ATen ops the transformers detectors reach that torch's exporters have no translation for,
checked against torch under the exporters that see them."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import onnx_custom


class AllAny(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.aten._is_all_true(x > 0), torch.ops.aten._is_any_true(x > 0.5)


class Cumulative(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = torch.cummax(x, self.dim)
        low, where = torch.cummin(x, self.dim)
        return values, indices, low, where


@pytest.mark.parametrize(
    "x",
    [
        pytest.param(torch.rand(3, 4), id="3x4-all-true"),
        pytest.param(torch.tensor([[0.2, -1.0], [0.7, 0.1]]), id="2x2-mixed"),
        pytest.param(torch.empty(0, 2), id="0x2-empty"),
    ],
)
def test_is_all_true_and_is_any_true_match_torch(x: torch.Tensor) -> None:
    proto = onnx_custom.export(AllAny(), (x,), exporter="dynamo")
    session = (
        onnx_custom.testing_session(proto) if hasattr(onnx_custom, "testing_session") else None
    )
    del session

    run = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = run.run(None, {run.get_inputs()[0].name: x.numpy()})
    for value, expected in zip(got, AllAny()(x), strict=True):
        assert bool(value) == bool(expected)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize(
    ("x", "dim"),
    [
        pytest.param(torch.randn(2, 5, 3), 1, id="2x5x3-f32-dim1"),
        pytest.param(torch.randn(3, 4), -1, id="3x4-f32-dim-1"),
        pytest.param(torch.randint(0, 3, (2, 6)), 1, id="2x6-i64-ties"),
        pytest.param(torch.randint(0, 3, (7,)), 0, id="7-i64-dim0"),
    ],
)
def test_cummax_cummin_match_torch(exporter: str, x: torch.Tensor, dim: int) -> None:
    torch.manual_seed(0)
    model = Cumulative(dim)
    proto = onnx_custom.export(model, (x,), exporter=exporter)
    report = onnx_custom.verify(model, (x,), proto, trials=3, raise_on_mismatch=False)
    assert report.passed, str(report)

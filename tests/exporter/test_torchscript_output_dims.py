"""TorchScript files declare no output dim name that the traced outputs contradict.

torch's shape inference names both leading dims of ``squeeze(1)`` of a ``[batch, 1, h, w]``
output alike (``[Squeeze_dim_0, Squeeze_dim_0, Squeeze_dim_2]``: batch equal to the height), so
its file declares an output shape no run has; transformers' DPT depth head ends this way.
"""

from __future__ import annotations

import io
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_custom


class DepthHead(torch.nn.Module):
    """A DPT-style head: conv, 2x upsample, 1-channel conv, squeeze the channel."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1),
            torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
            torch.nn.Conv2d(4, 1, 1),
            torch.nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(x).squeeze(dim=1), x * 2


AXES = {0: "batch", 2: "h", 3: "w"}


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_param"):
        return d.dim_param
    return d.dim_value if d.HasField("dim_value") else None


def _declared(proto: onnx.ModelProto) -> list[list[int | str | None]]:
    return [[_dim(d) for d in o.type.tensor_type.shape.dim] for o in proto.graph.output]


def _raw_torch(model: torch.nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), buffer, dynamo=False, input_names=["x"], dynamic_axes={"x": AXES}
        )
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (3, 3, 8, 12)], ids=["2x3x8x8", "3x3x8x12"])
def test_squeezed_output_declares_no_contradicted_dim(shape: tuple[int, ...]) -> None:
    model, x = DepthHead().eval(), torch.rand(shape)
    raw = _declared(_raw_torch(model, x))[0]
    assert raw[0] == raw[1] and isinstance(raw[0], str)  # torch's own declaration: batch == h
    proto = onnx_custom.export(model, (x,), exporter="torchscript", dynamic_shapes=(AXES,))
    head, doubled = _declared(proto)
    assert head[0] is None and head[1] is None  # unknown: no name the example contradicts
    assert doubled == ["batch", 3, "h", "w"]  # names the example agrees with are kept
    assert not model._forward_hooks  # the export's hook is gone
    # the file's claims at other sizes, against ONNX Runtime and eager
    report = onnx_custom.verify(model, (x,), proto)
    assert report.passed and not report.type_mismatches, str(report)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    other = torch.rand(1, 3, 5, 7)
    got = session.run(None, {"x": other.numpy()})
    with torch.no_grad():
        expected = model(other)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), e)


def test_static_export_keeps_its_sizes() -> None:
    model, x = DepthHead().eval(), torch.rand(2, 3, 8, 8)
    proto = onnx_custom.export(model, (x,), exporter="torchscript")
    assert _declared(proto) == [[2, 16, 16], [2, 3, 8, 8]]

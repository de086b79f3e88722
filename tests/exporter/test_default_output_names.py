"""Without ``output_names``, outputs get predictable names with both exporters item
4): the fields of ``forward``'s NamedTuple return annotation, else ``output_0..n`` — not the
exporter's value numbering ('3', 'add_3'). Each file is run by ONNX Runtime and verified.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom.runtime import InferenceSession


class Parts(NamedTuple):
    total: torch.Tensor
    shifted: torch.Tensor


class One(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x, y)


class Annotated(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Parts:
        scaled, shifted = torch.ops.onnx_custom.multi_out(x)
        return Parts(torch.ops.onnx_custom.my_add(scaled, y), shifted)


class Several(torch.nn.Module):
    """A tuple (no annotation), with an input returned as is, twice."""

    def forward(self, x: torch.Tensor, y: torch.Tensor):  # type: ignore[no-untyped-def]
        return torch.ops.onnx_custom.my_add(x, y), x * 2, x, x


CASES = [
    ("one", One, ["output_0"]),
    ("namedtuple", Annotated, ["total", "shifted"]),
    ("tuple-with-input-twice", Several, ["output_0", "output_1", "output_2", "output_3"]),
]
ARGS = (
    torch.randn(2, 3, generator=torch.Generator().manual_seed(0)),
    torch.randn(2, 3, generator=torch.Generator().manual_seed(1)),
)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(("model_type", "names"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_default_output_names(
    model_type: type[torch.nn.Module], names: list[str], exporter: str
) -> None:
    model = model_type()
    proto = onnx_custom.export(model, ARGS, exporter=exporter, opset=18)
    assert [o.name for o in proto.graph.output] == names
    assert onnx_custom.verify(model, ARGS, proto).passed
    session = InferenceSession(proto)
    got = session.run([names[-1]], {"x": ARGS[0].numpy(), "y": ARGS[1].numpy()})[0]
    expected = model(*ARGS)
    last = expected if isinstance(expected, torch.Tensor) else expected[-1]
    np.testing.assert_allclose(got, last.numpy(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_given_output_names_are_kept(exporter: str) -> None:
    proto = onnx_custom.export(
        Annotated(), ARGS, exporter=exporter, opset=18, output_names=["a", "b"]
    )
    assert [o.name for o in proto.graph.output] == ["a", "b"]


class Renamed(NamedTuple):
    first: torch.Tensor
    second: torch.Tensor


class Late(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> LateParts:  # type: ignore[name-defined]  # noqa: F821  # defined by the test
        scaled, shifted = torch.ops.onnx_custom.multi_out(x)
        return (torch.ops.onnx_custom.my_add(scaled, y), shifted)  # type: ignore[return-value]


def test_names_follow_a_changed_annotation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolved annotation is remembered per forward: replacing it, or defining
    the class a string annotation names after a first export, must show in the next export."""
    assert [
        o.name for o in onnx_custom.export(Annotated(), ARGS, exporter="torchscript").graph.output
    ] == ["total", "shifted"]
    monkeypatch.setitem(Annotated.forward.__annotations__, "return", Renamed)
    assert [
        o.name for o in onnx_custom.export(Annotated(), ARGS, exporter="torchscript").graph.output
    ] == ["first", "second"]
    assert [
        o.name for o in onnx_custom.export(Late(), ARGS, exporter="torchscript").graph.output
    ] == ["output_0", "output_1"]
    monkeypatch.setitem(globals(), "LateParts", Renamed)
    assert [
        o.name for o in onnx_custom.export(Late(), ARGS, exporter="torchscript").graph.output
    ] == ["first", "second"]

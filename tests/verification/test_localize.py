"""Localization: a deliberately broken translation planted mid-model is named,
earlier nodes are not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add and onnx_custom::multi_out
from onnx_custom.cli import main
from onnx_custom.errors import VerificationError
from onnx_custom.verification.localize import Localization, localize

EXPORTERS = ("dynamo", "torchscript")


class Chain(torch.nn.Module):
    """relu -> my_add -> multi_out -> mul -> sum: the planted node sits in the middle."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = torch.relu(a)
        y = torch.ops.onnx_custom.my_add(x, b)
        doubled, shifted = torch.ops.onnx_custom.multi_out(y)
        return (doubled * shifted).sum(dim=-1)


def _args() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)


def planted_my_add(g: Any, a: Any, b: Any) -> Any:
    """Wrong on purpose: 3a + b instead of 2a + b."""
    return g.op("Add", g.op("Mul", a, g.constant(3.0, like=a)), b)


def planted_multi_out(g: Any, x: Any) -> Any:
    """Wrong on purpose in the second output: x + 4 instead of x + 3."""
    return g.op("Mul", x, g.constant(2.0, like=x)), g.op("Add", x, g.constant(4.0, like=x))


@pytest.fixture(scope="module")
def broken_add() -> onnx_custom.Registry:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(planted_my_add)
    return registry


@pytest.fixture(scope="module")
def broken_multi() -> onnx_custom.Registry:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::multi_out", opset=1, replace=True)(planted_multi_out)
    return registry


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_planted_my_add_is_named_in_the_error(
    exporter: str, broken_add: onnx_custom.Registry
) -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter=exporter, registry=broken_add)
    with pytest.raises(VerificationError) as info:
        onnx_custom.verify(model, args, proto, localize=True, registry=broken_add)
    message = str(info.value)
    assert "First diverging node: #1 my_add = onnx_custom::my_add" in message
    assert "planted_my_add" in message  # the translation that produced it
    loc = info.value.report.localization
    assert isinstance(loc, Localization)
    assert loc.method == ("names" if exporter == "dynamo" else "probe")
    assert loc.first is not None and loc.first.fx_name == "my_add"
    assert [n.fx_name for n in loc.origins] == ["my_add"]
    relu = loc.nodes[0]
    assert relu.torch_op == "aten::relu" and relu.observed and not relu.diverges
    first = loc.first
    assert first.torch_op == "onnx_custom::my_add"
    assert all(i.passed for i in first.inputs)
    assert first.outputs[0].max_abs_diff > 0.1
    assert any(n.startswith("Mul") for n in first.onnx_nodes) and any(
        n.startswith("Add") for n in first.onnx_nodes
    )
    assert "opset>=1" in first.translation and "planted_my_add" in first.translation
    # Everything downstream diverges too, but is not an origin.
    assert [n.fx_name for n in loc.diverging] == ["my_add", "multi_out", "mul", "sum_1"]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_planted_multi_out_second_output(exporter: str, broken_multi: onnx_custom.Registry) -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter=exporter, registry=broken_multi)
    loc = localize(model, args, proto, registry=broken_multi)
    assert loc.first is not None and loc.first.fx_name == "multi_out"
    assert [n.fx_name for n in loc.origins] == ["multi_out"]
    first_out, second_out = loc.first.outputs
    assert first_out.passed and not second_out.passed
    assert second_out.max_abs_diff == pytest.approx(1.0, abs=1e-5)
    assert not any(n.diverges for n in loc.nodes[:2])  # relu and my_add agree


def test_correct_export_localizes_nothing() -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="dynamo")
    loc = localize(model, args, proto)
    assert loc.first is None and not loc.diverging
    assert "agree" in loc.summary()
    assert loc.to_dict()["first"] is None


def test_localize_without_a_file_reexports(broken_add: onnx_custom.Registry) -> None:
    loc = localize(Chain().eval(), _args(), exporter="dynamo", registry=broken_add)
    assert loc.method == "probe" and loc.first is not None and loc.first.fx_name == "my_add"


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_model_torch_export_refuses_is_localized_from_the_file() -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x  # python branch on data: torch.export refuses

    model, args = DataDependent().eval(), (torch.ones(3),)
    proto = onnx_custom.export(model, args, exporter="torchscript")
    report = onnx_custom.verify(
        model, (-torch.ones(3),), proto, localize=True, raise_on_mismatch=False
    )
    assert not report.passed
    # torch.export refuses the model, but the file itself can be paired with eager by code line
    localization = report.localization
    assert not isinstance(localization, str), localization
    assert localization.method == "source"
    text = str(localization)
    line = f"test_localize.py:{DataDependent.forward.__code__.co_firstlineno + 1}"
    assert f"first: (top) @ {line}" in text  # the file's x * 2, which eager did not compute
    assert f"TracerWarnings: {line}: Converting a tensor to a Python boolean" in text


def test_cli_verify_localize_and_report(
    tmp_path: Any, broken_add: onnx_custom.Registry, capsys: Any
) -> None:
    model_file = tmp_path / "chain.py"
    model_file.write_text(
        "import torch\nimport onnx_custom.ops.seed\n\nclass Model(torch.nn.Module):\n    def"
        " forward(self, a, b):\n        d, s ="
        " torch.ops.onnx_custom.multi_out(torch.ops.onnx_custom.my_add(torch.relu(a), b))\n       "
        " return (d * s).sum(dim=-1)\n\ndef example_inputs():\n    g ="
        " torch.Generator().manual_seed(1)\n    return torch.randn(2, 3, 4, generator=g),"
        " torch.randn(2, 3, 4, generator=g)\n"
    )
    onnx_file = tmp_path / "chain.onnx"
    onnx_custom.export(Chain().eval(), _args(), onnx_file, exporter="dynamo", registry=broken_add)
    report_file = tmp_path / "out" / "verify.md"
    rc = main(
        [
            "verify",
            f"{model_file}:Model",
            str(onnx_file),
            "--localize",
            "--report",
            str(report_file),
        ]
    )
    out = capsys.readouterr()
    assert rc == 1
    assert "First diverging node: #1 my_add = onnx_custom::my_add" in out.out
    text = report_file.read_text()
    assert "## Localization" in text and "my_add" in text and "## Environment" in text


def test_probe_warns_when_the_file_is_not_the_reexport(broken_add: onnx_custom.Registry) -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="torchscript", registry=broken_add)
    same = localize(model, args, proto, registry=broken_add)
    assert "the given file's outputs equal the re-export's" in same.note
    # Localizing with the default (correct) registry re-exports a correct model: say so loudly.
    other = localize(model, args, proto)
    assert (
        other.first is None and "WARNING: the given file's output for sum_1 differs" in other.note
    )
    assert "not made by this exporter/opset/registry" in other.summary()


@pytest.mark.parametrize(("exporter", "opset"), [("dynamo", 19), ("torchscript", 19)])
def test_planted_dcn_attribute_names_the_deform_node(exporter: str, opset: int) -> None:
    """The mask dropped: wrong for the first (modulated) DCN block,
    right for the unmodulated second."""
    from symbolics_deform_conv_planted import planted_registry  # type: ignore[import-not-found]

    from onnx_custom.models import deform_conv

    model, args = deform_conv.Model().eval(), deform_conv.example_inputs()
    registry = planted_registry()
    proto = onnx_custom.export(model, args, exporter=exporter, opset=opset, registry=registry)
    result = localize(model, args, proto, exporter=exporter, opset=opset, registry=registry)
    first = result.first
    assert first is not None and first.torch_op.startswith("onnx_custom::deform_conv2d")
    deform_nodes = [n for n in result.nodes if n.torch_op.startswith("onnx_custom::deform_conv2d")]
    assert len(deform_nodes) == 2
    assert first.fx_name == deform_nodes[0].fx_name  # the planted node, not the stem before it
    assert not any(n.diverges for n in result.nodes if n.index < first.index)
    assert "planted_deform_conv2d" in first.translation


def test_runtime_refusal_is_a_verification_error() -> None:
    """ORT rejecting a planted node (offset_group that does not match the offsets) is typed."""
    from onnx_custom.models import deform_conv
    from onnx_custom.symbolics import deform_conv as deform_conv_symbolics

    def wrong_offset_group(
        g: Any, input: Any, weight: Any, offset: Any, mask: Any, bias: Any, **attrs: Any
    ) -> Any:
        return deform_conv_symbolics.deform_conv2d(
            g, input, weight, offset, mask, bias, **{**attrs, "offset_groups": 3}
        )

    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::deform_conv2d", opset=19, replace=True)(wrong_offset_group)
    model, args = deform_conv.Model().eval(), deform_conv.example_inputs()
    proto = onnx_custom.export(model, args, exporter="dynamo", opset=19, registry=registry)
    with pytest.raises(
        VerificationError, match="failed to run the ONNX model.*Offset channel count"
    ):
        onnx_custom.verify(model, args, proto)

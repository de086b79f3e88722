"""Pre-flight coverage: every missing translation and kernel at once, without writing a file."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add and onnx_custom::multi_out
from onnx_custom.cli import main
from onnx_custom.errors import UnsupportedOpError
from onnx_custom.verification.preflight import CoverageReport, check


@torch.library.custom_op("onnx_custom_test_check::untranslated", mutates_args=())
def untranslated(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@untranslated.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Uncovered(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.ops.onnx_custom.my_add(torch.relu(a), b)
        return untranslated(y) + untranslated(a)


class Covered(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.onnx_custom.multi_out(torch.ops.onnx_custom.my_add(a, b))


ARGS = (torch.ones(2, 3), torch.ones(2, 3))


@pytest.mark.parametrize(("exporter", "opset"), [("dynamo", 18), ("torchscript", 17)])
def test_lists_every_untranslated_op(exporter: str, opset: int) -> None:
    report = check(Uncovered(), ARGS, exporter=exporter, opset=opset)
    assert isinstance(report, CoverageReport) and not report.ok
    (missing,) = report.missing
    assert missing.name.startswith("onnx_custom_test_check::untranslated") and missing.count == 2
    text = str(report)
    assert "1 op(s) without a translation" in text and "untranslated" in text and "(x2)" in text
    assert any("onnx_custom::my_add" in t for t in report.translations)
    with pytest.raises(UnsupportedOpError) as info:
        check(Uncovered(), ARGS, exporter=exporter, opset=opset, raise_if_missing=True)
    assert str(info.value) == text and info.value.missing == report.missing_names


def test_reports_the_opsets_where_a_translation_exists() -> None:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom_test_check::untranslated", opset=20)(
        lambda g, x: g.op("Identity", x)
    )
    report = check(Uncovered(), ARGS, exporter="dynamo", opset=18, registry=registry)
    assert "translations exist from opset [20]" in str(report)
    assert check(Uncovered(), ARGS, exporter="dynamo", opset=20, registry=registry).ok


def test_custom_nodes_without_kernel_or_schema() -> None:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True, emits=["nokernel::Thing"])(
        lambda g, a, b: g.op("nokernel::Thing", a, b)
    )
    report = check(Covered(), ARGS, registry=registry)
    assert not report.missing and not report.ok
    (gap,) = report.missing_kernels
    assert gap.node_type == "nokernel::Thing" and "onnx_custom::my_add" in gap.emitted_by[0]
    assert "nokernel::Thing: no runtime kernel and no ONNX schema" in str(report)


def test_clean_model_and_custom_variant() -> None:
    assert check(Covered(), ARGS).ok
    custom = check(Covered(), ARGS, registry=onnx_custom.default_registry().with_variants("custom"))
    assert set(custom.emitted) == {"onnx_custom::my_add", "onnx_custom::multi_out"}
    if custom.kernels_checked:  # the shipped kernels cover the shipped custom nodes
        assert custom.ok, str(custom)


def test_untraceable_model_is_a_problem_not_a_crash() -> None:
    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    report = check(Branchy(), (torch.ones(3),))
    assert (
        not report.ok and report.problems and "torch.export could not trace" in report.problems[0]
    )


def test_bad_arguments() -> None:
    with pytest.raises(onnx_custom.OnnxCustomError, match="exporter must be one of"):
        check(Covered(), ARGS, exporter="tflite")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check(lambda x: x, ARGS)  # type: ignore[arg-type]


def test_package_level_check_and_cli(capsys: Any) -> None:
    assert onnx_custom.check(Covered(), ARGS).ok
    assert onnx_custom.check(Covered(), ARGS).ok  # still callable once the submodule is imported
    assert (
        main(
            [
                "check",
                "onnx_custom.models.my_add:Model",
                "--exporter",
                "torchscript",
                "--opset",
                "13",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Coverage for the torchscript exporter at opset 13" in out and "OK" in out

"""``check`` runs the translations (a dry export) to find custom nodes without kernels: no
``emits=`` needed, and no false positives on any zoo row."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed
from onnx_custom.translate.coverage import missing_ops_torchscript
from onnx_custom.verification.preflight import check
from onnx_custom.zoo import ZooCase, discover

EXPORTERS = [("dynamo", 18), ("torchscript", 17)]
ARGS = (torch.ones(2, 3), torch.ones(2, 3))


class AddThenSplit(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.onnx_custom.multi_out(torch.ops.onnx_custom.my_add(a, b))


def _registry_emitting(node_type: str) -> onnx_custom.Registry:
    registry = onnx_custom.default_registry().copy()
    # No emits=: check must find the node by running the translation.
    registry.symbolic("onnx_custom::my_add", opset=1, replace=True)(
        lambda g, a, b: g.op(node_type, a, b)
    )
    return registry


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS)
def test_a_custom_node_without_kernel_is_found_without_emits(exporter: str, opset: int) -> None:
    report = check(
        AddThenSplit(),
        ARGS,
        exporter=exporter,
        opset=opset,
        registry=_registry_emitting("nokernel_check::Thing"),
    )
    assert report.translations_ran and not report.ok and not report.missing
    (gap,) = report.missing_kernels
    assert gap.node_type == "nokernel_check::Thing" and "onnx_custom::my_add" in gap.emitted_by[0]
    assert "nokernel_check::Thing: no runtime kernel and no ONNX schema" in str(report)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS)
def test_a_kernel_in_the_users_own_registry_counts(exporter: str, opset: int) -> None:
    from onnx_custom.runtime import KernelRegistry

    kernels = KernelRegistry()
    kernels.kernel("ownkernel_check::Thing", inputs=["a", "b"], outputs=["y"])(lambda a, b: a + b)
    registry = _registry_emitting("ownkernel_check::Thing")
    assert not check(AddThenSplit(), ARGS, exporter=exporter, opset=opset, registry=registry).ok
    report = check(
        AddThenSplit(), ARGS, exporter=exporter, opset=opset, registry=registry, kernels=kernels
    )
    assert report.ok and report.emitted == ("ownkernel_check::Thing",)


def test_emits_is_still_accepted_when_the_export_cannot_run() -> None:
    @torch.library.custom_op("onnx_custom_test_check_kernels::untranslated", mutates_args=())
    def untranslated(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    untranslated.register_fake(lambda x: torch.empty_like(x))

    class Gap(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return untranslated(torch.ops.onnx_custom.my_add(a, b))

    registry = onnx_custom.default_registry().copy()
    registry.symbolic(
        "onnx_custom::my_add", opset=1, replace=True, emits=["declared_check::Thing"]
    )(lambda g, a, b: g.op("declared_check::Thing", a, b))
    report = check(Gap(), ARGS, registry=registry)
    assert not report.translations_ran and [m.name for m in report.missing] == [
        "onnx_custom_test_check_kernels::untranslated.default"
    ]
    assert [k.node_type for k in report.missing_kernels] == ["declared_check::Thing"]


class SliceHalf(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : x.shape[1] // 2] * 2  # the TorchScript trace holds an aten::Int


def test_scalar_conversions_the_torchscript_exporter_erases_are_not_missing() -> None:
    args = (torch.randn(2, 6),)
    graph, *_ = torch.jit._get_trace_graph(SliceHalf(), args)
    assert "aten::Int" in {n.kind() for n in graph.nodes()}
    assert missing_ops_torchscript(SliceHalf(), args, 17) == []
    report = check(SliceHalf(), args, exporter="torchscript", opset=17)
    assert report.ok and report.translations_ran, str(report)


def _zoo_rows() -> list[Any]:
    rows = []
    for short, module_name in discover().items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a model whose C++ extension cannot build here
            rows.append(
                pytest.param(
                    short,
                    None,
                    ZooCase("-", 0),
                    id=f"{short}-unavailable",
                    marks=pytest.mark.skip(reason=str(exc)[:200]),
                )
            )
            continue
        for case in module.ZOO:
            # A dynamo dry export costs ~2 s (torch rebuilds its torchlib registry per export):
            # the default suite keeps every TorchScript row (where trace-based guesses went wrong)
            # and every dynamo row that emits custom nodes or documents a refusal.
            # check() takes no dynamic_shapes: a dynamic row checks what its static twin does.
            cheap = (
                case.exporter == "torchscript" or case.variant or case.expect_error
            ) and not case.dynamic
            rows.append(
                pytest.param(
                    short,
                    module,
                    case,
                    id=f"{short}-{case.label}",
                    marks=() if cheap else pytest.mark.slow,
                )
            )
    return rows


@pytest.mark.parametrize(("name", "module", "case"), _zoo_rows())
def test_check_is_clean_on_every_zoo_row(name: str, module: Any, case: ZooCase) -> None:
    registry = onnx_custom.default_registry()
    if case.variant:
        registry = registry.with_variants(case.variant)
    report = check(
        module.Model().eval(),
        module.example_inputs(),
        exporter=case.exporter,
        opset=case.opset,
        registry=registry,
    )
    if case.expect_error:  # a row that documents a refusal: check says the same
        assert not report.ok and any(case.expect_error in p for p in report.problems)
        return
    assert report.ok, str(report)
    assert report.translations_ran and not report.missing and not report.missing_kernels
    if case.variant == "custom":
        assert report.emitted, f"{name} {case.label}: the custom variant emits custom nodes"

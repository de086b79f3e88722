"""``torch.compile(backend="onnx_custom", options={"fuse": ...})``: a recognised attention
module's traced code runs as our op in the ORT partition; a module computing something else
keeps its own code and is reported."""

from __future__ import annotations

import pytest
import torch
from fusion_cases import AttentionModel, MyAttention, inputs

import onnx_custom
from onnx_custom.compile import backend as compile_backend_module


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _run(model: torch.nn.Module, backend: object) -> tuple[torch.Tensor, torch.Tensor]:
    args = inputs()
    with torch.no_grad():
        expected = model(*args)
        got = torch.compile(model, backend=backend)(*args)  # type: ignore[call-overload]
    return got, expected


def test_compile_fuses_a_registered_module_class() -> None:
    model = AttentionModel(MyAttention()).eval()
    backend = onnx_custom.compile_backend(fuse=[MyAttention])
    got, expected = _run(model, backend)
    torch.testing.assert_close(got, expected)
    (report,) = backend.fusion_reports
    assert [s.name for s in report.fused] == ["attn"], str(report)
    custom = [op for r in backend.records for p in r.partitions for op in p.custom_ops]
    assert custom == ["onnx_custom.multi_scale_deformable_attn.default"]


def test_compile_leaves_a_different_module_alone() -> None:
    model = AttentionModel(MyAttention(align_corners=True)).eval()
    backend = onnx_custom.compile_backend(fuse=[MyAttention])
    got, expected = _run(model, backend)
    torch.testing.assert_close(got, expected)
    (report,) = backend.fusion_reports
    (site,) = report.not_fused
    assert site.name == "attn" and "numeric check failed" in site.reason
    assert not [op for r in backend.records for p in r.partitions for op in p.custom_ops]


def test_compile_options_by_name() -> None:
    """``options=`` of torch.compile reaches the backend registered as "onnx_custom"."""
    model = AttentionModel(MyAttention()).eval()
    args = inputs()
    with torch.no_grad():
        expected = model(*args)
        got = torch.compile(
            model,
            backend=compile_backend_module.onnx_custom_backend,
            options={"fuse": [MyAttention]},  # type: ignore[dict-item]
        )(*args)
    torch.testing.assert_close(got, expected)
    configured = list(compile_backend_module._configured.values())
    assert any(b.fusion_reports and b.fusion_reports[-1].fused for b in configured)


def test_compile_fuse_option_is_checked() -> None:
    with pytest.raises(onnx_custom.InvalidArgumentError, match="fuse must be True"):
        onnx_custom.compile_backend(fuse="yes")


def test_compile_fuses_the_transformers_module() -> None:
    """``fuse=True``: transformers' own class, found by identity, no registration."""
    modeling = pytest.importorskip("transformers.models.deformable_detr.modeling_deformable_detr")
    model = AttentionModel(modeling.MultiScaleDeformableAttention()).eval()
    backend = onnx_custom.compile_backend(fuse=True)
    got, expected = _run(model, backend)
    torch.testing.assert_close(got, expected)
    (report,) = backend.fusion_reports
    assert [s.name for s in report.fused] == ["attn"], str(report)

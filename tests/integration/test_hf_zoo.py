"""The real-model zoo: transformers detectors built from small configs (random weights, no
download), exported with both exporters, verified against PyTorch in ONNX Runtime.

Skipped when transformers is absent (``pip install -c constraints.txt -e '.[hf]'``). The default
suite builds every family and runs the quick rows; the whole table is ``-m slow``.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import onnxruntime as ort
import pytest
import torch

import onnx_custom
from onnx_custom.hf_zoo import (
    HfOptions,
    format_hf_table,
    raw_torch_export,
    run_hf_row,
    transformers_missing,
)

pytestmark = pytest.mark.skipif(bool(transformers_missing()), reason=transformers_missing())

FAMILIES = [
    "DeformableDetr",
    "RTDetr",
    "RTDetrV2",
    "DFine",
    "Deimv2",
    "GroundingDino",
    "Mask2Former",
    "OneFormer",
    "OmDetTurbo",
    "LwDetr",
    "RfDetr",
]

# Rows torch.export or the TorchScript tracer cannot take at all (checked: raw torch.onnx.export
# fails the same way); everything else exports and verifies.
TORCH_CANNOT = {
    ("OmDetTurbo", "dynamo"): "GuardOnDataDependentSymNode",
    ("GroundingDino", "torchscript"): "isin",
    ("RfDetr", "torchscript"): "_upsample_bicubic2d_aa",
}


def _build(name: str) -> tuple[torch.nn.Module, tuple[object, ...]]:
    from onnx_custom.models.hf_detectors import build

    return build(name)


def test_every_family_is_listed() -> None:
    from onnx_custom.models.hf_detectors import family_names

    assert family_names() == FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_family_builds_seeded_in_eval_mode(family: str) -> None:
    model, args = _build(family)
    again, args_again = _build(family)
    assert not model.training
    with torch.no_grad():
        first, second = model(*args), again(*args_again)
    assert all(isinstance(t, torch.Tensor) for t in first)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_default_zoo_does_not_run_the_hf_models() -> None:
    from onnx_custom.zoo import discover

    assert "hf_detectors" not in discover()


def test_deformable_detr_torchscript_row_runs_where_torch_file_does_not() -> None:
    """TorchScript traces the reference points in float64: torch's file feeds GridSample a
    float64 grid that ONNX Runtime refuses; ours casts it and verifies."""
    result = run_hf_row("DeformableDetr", "torchscript")
    assert result.status == "pass", result.detail
    assert result.torch.startswith("fails: ONNX Runtime refuses torch's file"), result.torch
    assert "GridSample" in result.torch
    assert result.beyond_torch


def test_rt_detr_torchscript_folded_batch_norms_are_not_reported() -> None:
    """TorchScript folds the backbone's BatchNorms into the convolutions: the weight check
    stays silent for the same weights and still reports other weights."""
    from onnx_custom.verification.initializers import compare_initializers

    model, args = _build("RTDetrV2")
    proto = onnx_custom.export(model, args, exporter="torchscript")
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error", onnx_custom.verification.initializers.InitializerMismatchWarning
        )
        assert compare_initializers(model, proto) == []
    from onnx_custom.models.hf_detectors import build

    other, _ = build("RTDetrV2", seed=1)
    assert len(compare_initializers(other, proto, warn=False)) >= 10


def test_a_row_torch_cannot_export_says_why() -> None:
    result = run_hf_row("RfDetr", "torchscript", HfOptions(check_torch=False))
    assert result.status == "torch-fails"
    assert "_upsample_bicubic2d_aa" in result.torch
    assert "_upsample_bicubic2d_aa" in result.detail


def _attention_modules(model: torch.nn.Module) -> int:
    """transformers' deformable attention kernels in the model, by class name."""
    return sum(type(m).__name__ == "MultiScaleDeformableAttention" for m in model.modules())


def test_fused_column_replaces_every_attention_module() -> None:
    """LW-DETR under TorchScript: one custom MSDA node per attention module, no GridSample left,
    and the fused file verifies against the model as written."""
    result = run_hf_row("LwDetr", "torchscript", HfOptions(check_torch=False, fuse=True))
    assert result.status == "pass", result.detail
    assert result.fused is not None
    assert result.fused.status == "pass", result.fused.detail
    model, _ = _build("LwDetr")
    expected = _attention_modules(model)
    assert expected >= 1
    assert result.fused.msda_nodes == expected
    assert result.fused.grid_samples == 0
    assert result.fused.reasons == []
    assert f"fused: {expected} MSDA, 0 GridSample" in format_hf_table([result])
    # the unfused file of the same model keeps the GridSample form
    unfused = onnx_custom.export(model, _build("LwDetr")[1], exporter="torchscript")
    assert any(n.op_type == "GridSample" for n in unfused.graph.node)


def test_fused_column_fuses_the_v2_attention() -> None:
    """RT-DETRv2's v2 attention (default sampling method): one custom MSDA node per attention
    module, and the fused file verifies against the model as written."""
    result = run_hf_row(
        "RTDetrV2", "torchscript", HfOptions(check_torch=False, dynamic=False, fuse=True)
    )
    assert result.status == "pass", result.detail
    assert result.fused is not None
    assert result.fused.status == "pass", result.fused.detail
    model, _ = _build("RTDetrV2")
    expected = sum(
        type(m).__name__ == "RTDetrV2MultiscaleDeformableAttention" for m in model.modules()
    )
    assert expected >= 1
    assert result.fused.msda_nodes == expected
    assert result.fused.grid_samples == 0
    assert result.fused.reasons == []
    assert f"fused: {expected} MSDA, 0 GridSample" in format_hf_table([result])


def test_rows_are_unfused_by_default() -> None:
    assert HfOptions().fuse is False


def test_cli_lists_the_families() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "onnx_custom.cli", "zoo", "--hf", "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.split() == FAMILIES


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("family", FAMILIES)
def test_zoo_row(family: str, exporter: str) -> None:
    result = run_hf_row(family, exporter)
    expected = TORCH_CANNOT.get((family, exporter))
    if expected:
        assert result.status == "torch-fails", result.detail
        assert expected in result.torch
        return
    assert result.status == "pass", result.detail


@pytest.mark.slow
@pytest.mark.parametrize("family", ["RTDetrV2", "DFine", "Deimv2", "GroundingDino", "OneFormer"])
def test_beyond_torch_under_dynamo(family: str) -> None:
    """aten::_is_all_true (and cummax/cummin for Grounding DINO) stop torch's own exporter."""
    model, args = _build(family)
    assert raw_torch_export(model, args, "dynamo").startswith("fails")
    proto = onnx_custom.export(model, args, exporter="dynamo")
    ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert onnx_custom.verify(model, args, proto, rtol=1e-4, atol=1e-4).passed

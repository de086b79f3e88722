"""fuse_file on files raw ``torch.onnx.export`` wrote from transformers' DeformableDetrModel
(small config, seeded random init, no downloads): one fused node per attention module."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.errors import FuseProofError

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra (transformers)")

ENCODER_LAYERS = DECODER_LAYERS = 1


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).last_hidden_state


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = transformers.DeformableDetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=32,
        encoder_layers=ENCODER_LAYERS,
        decoder_layers=DECODER_LAYERS,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=10,
        num_feature_levels=3,
        encoder_n_points=2,
        decoder_n_points=2,
    )
    return LastHidden(transformers.DeformableDetrModel(config).eval()).eval()


def _export(model: torch.nn.Module, path: Path, dynamo: bool) -> Path:
    x = torch.randn(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), str(path), dynamo=dynamo, opset_version=18, input_names=["pixel_values"]
        )
    return path


@pytest.mark.slow  # the dynamo export alone takes ~20 s
def test_deformable_detr_dynamo_file(tmp_path: Path) -> None:
    model = _model()
    path = _export(model, tmp_path / "detr.onnx", dynamo=True)
    original = onnx.load(str(path))
    assert [n.op_type for n in original.graph.node].count("GridSample") == 3 * (
        ENCODER_LAYERS + DECODER_LAYERS
    )
    out = tmp_path / "fused.onnx"
    fused, report = onnx_custom.fuse_file(path, output=out)
    assert report.count == ENCODER_LAYERS + DECODER_LAYERS and report.proven
    assert report.near_misses == []
    ops = [n.op_type for n in fused.graph.node]
    assert "GridSample" not in ops
    assert ops.count("MultiScaleDeformableAttn") == ENCODER_LAYERS + DECODER_LAYERS
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(x)
    (got,) = onnx_custom.InferenceSession(out).run(None, {"pixel_values": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-4)


def test_deformable_detr_torchscript_file_is_matched_but_never_written(tmp_path: Path) -> None:
    """TorchScript writes the model's grid in float64, which ONNX Runtime's GridSample refuses:
    the original cannot run, so nothing can be proven and nothing is written."""
    path = _export(_model(), tmp_path / "detr.onnx", dynamo=False)
    out = tmp_path / "fused.onnx"
    with pytest.raises(FuseProofError, match="GridSample") as info:
        onnx_custom.fuse_file(path, output=out)
    assert info.value.report.count == ENCODER_LAYERS + DECODER_LAYERS  # type: ignore[attr-defined]
    assert not out.exists()

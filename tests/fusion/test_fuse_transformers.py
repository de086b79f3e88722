"""``fuse=True`` on transformers' multi-scale deformable attention: every family's
``MultiScaleDeformableAttention`` module and ``multi_scale_deformable_attention`` function, and a
whole ``DeformableDetrModel`` (small config, seeded random weights), against the unfused model."""

from __future__ import annotations

import importlib

import pytest
import torch
from fusion_cases import HEADS, LEVELS, AttentionModel, inputs, op_counts
from torch import Tensor, nn

import onnx_custom
from onnx_custom.fusion import fusion_report

pytest.importorskip("transformers")

CUSTOM = onnx_custom.default_registry().with_variants("custom")
MODULE_FAMILIES = [
    "deformable_detr",
    "grounding_dino",
    "mm_grounding_dino",
    "rt_detr",
    "omdet_turbo",
    "lw_detr",
    "rf_detr",
    "pp_doclayout_v2",
]
FUNCTION_FAMILIES = ["mask2former", "oneformer"]


def _modeling(family: str) -> object:
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


class FunctionModel(nn.Module):
    def __init__(self, family: str) -> None:
        super().__init__()
        self.modeling = _modeling(family)  # imported with the model, as a real one does
        self.value_proj = nn.Linear(8, 8)

    def forward(self, value: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
        bs, keys, _ = value.shape
        value = self.value_proj(value).view(bs, keys, HEADS, -1)
        fn = self.modeling.multi_scale_deformable_attention  # type: ignore[attr-defined]
        return fn(value, list(LEVELS), locations, weights)  # type: ignore[no-any-return]


def _check_fused(model: nn.Module, exporter: str, expected: int = 1) -> None:
    args = inputs()
    proto = onnx_custom.export(model, args, exporter=exporter, registry=CUSTOM, fuse=True)
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == expected and "GridSample" not in counts
    report = fusion_report(proto)
    assert report is not None and len(report.fused) == expected and not report.not_fused
    onnx_custom.verify(model, args, proto)  # the unfused model is the reference


@pytest.mark.parametrize("family", MODULE_FAMILIES)
def test_each_family_module_is_fused(family: str) -> None:
    model = AttentionModel(_modeling(family).MultiScaleDeformableAttention()).eval()  # type: ignore[attr-defined]
    _check_fused(model, "torchscript")


@pytest.mark.parametrize("family", FUNCTION_FAMILIES)
def test_each_family_function_is_fused(family: str) -> None:
    _check_fused(FunctionModel(family).eval(), "torchscript")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_module_fused_under_both_exporters(exporter: str) -> None:
    attention = _modeling("deformable_detr").MultiScaleDeformableAttention()  # type: ignore[attr-defined]
    model = AttentionModel(attention).eval()
    _check_fused(model, exporter)
    assert "forward" not in attention.__dict__  # the instance patch is gone


def test_patched_subclass_is_not_fused_and_reported() -> None:
    base = _modeling("deformable_detr").MultiScaleDeformableAttention  # type: ignore[attr-defined]

    class Sharper(base):  # type: ignore[misc, valid-type]
        """A user's subclass that changes the math: must keep running its own code."""

        def forward(self, value: Tensor, *args: object) -> Tensor:
            return super().forward(value, *args) * 2  # type: ignore[no-any-return]

    model = AttentionModel(Sharper()).eval()
    args = inputs()
    proto = onnx_custom.export(
        model, args, exporter="torchscript", registry=CUSTOM, fuse=True, verify=True
    )
    counts = op_counts(proto)
    assert "MultiScaleDeformableAttn" not in counts and counts.get("GridSample") == len(LEVELS)
    report = fusion_report(proto)
    assert report is not None and not report.fused
    (site,) = report.not_fused
    assert site.name == "attn" and "numeric check failed" in site.reason, str(report)
    assert "not fused: attn" in str(report)


def _small_detr() -> nn.Module:
    from transformers import DeformableDetrConfig, DeformableDetrModel, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(
        num_channels=3,
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = DeformableDetrConfig(
        backbone_config=backbone,
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=10,
        num_feature_levels=3,
        encoder_n_points=2,
        decoder_n_points=2,
    )
    return DeformableDetrModel(config).eval()


def _attention_modules(model: nn.Module) -> int:
    base = _modeling("deformable_detr").MultiScaleDeformableAttention  # type: ignore[attr-defined]
    return sum(isinstance(m, base) for m in model.modules())


@pytest.mark.parametrize(
    "size",
    [(64, 64), pytest.param((96, 80), marks=pytest.mark.slow)],
    ids=["64x64", "96x80"],
)
def test_deformable_detr_torchscript(size: tuple[int, int]) -> None:
    model = _small_detr()
    pixels = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    unfused = onnx_custom.export(model, (pixels,), exporter="torchscript", registry=CUSTOM)
    fused = onnx_custom.export(model, (pixels,), exporter="torchscript", registry=CUSTOM, fuse=True)
    attention = _attention_modules(model)
    assert attention == 2
    assert op_counts(fused).get("MultiScaleDeformableAttn") == attention
    assert "GridSample" not in op_counts(fused)
    assert op_counts(unfused).get("GridSample") == attention * 3  # one per level
    assert len(fused.graph.node) < len(unfused.graph.node)
    report = onnx_custom.verify(model, (pixels,), fused, fuse=True)
    assert report.passed and len(report.fusion.fused) == attention  # type: ignore[union-attr]


@pytest.mark.slow
def test_deformable_detr_dynamo_dynamic_batch() -> None:
    """Dynamo, batch dynamic (the image size is fixed by the model's export), fused vs unfused."""
    model = _small_detr()
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    dims = {"pixel_values": {0: torch.export.Dim("batch", min=1, max=4)}}
    fused = onnx_custom.export(
        model, (pixels,), exporter="dynamo", registry=CUSTOM, fuse=True, dynamic_shapes=dims
    )
    counts = op_counts(fused)
    assert counts.get("MultiScaleDeformableAttn") == 2 and "GridSample" not in counts
    # our kernel sums the samples in another order than grid_sample's decomposition; the
    # encoder's LayerNorm carries that to ~1.5e-5 on a few elements: float32 whole-model bounds
    report = onnx_custom.verify(
        model,
        (pixels,),
        fused,
        fuse=True,
        shapes=[{"batch": 1}, {"batch": 3}],
        rtol=1e-4,
        atol=1e-4,
    )
    assert report.passed and len(report.shapes_tried) == 3


@pytest.mark.slow
def test_mask2former_function_form() -> None:
    """Mask2Former's pixel decoder calls the function form by its module-level name."""
    from transformers import Mask2FormerConfig, Mask2FormerModel, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        backbone_config=backbone,
        use_pretrained_backbone=False,
        use_timm_backbone=False,
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=64,
        dim_feedforward=64,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        num_queries=10,
    )
    model = Mask2FormerModel(config).eval()
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    proto = onnx_custom.export(model, (pixels,), exporter="torchscript", registry=CUSTOM, fuse=True)
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == 1 and "GridSample" not in counts
    (site,) = fusion_report(proto).fused  # type: ignore[union-attr]
    assert site.implementation.endswith("modeling_mask2former.multi_scale_deformable_attention")
    assert onnx_custom.verify(model, (pixels,), proto, fuse=True).passed

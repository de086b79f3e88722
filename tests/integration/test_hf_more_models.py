"""transformers models outside the hf zoo, built from small configs (seeded random weights, no
download): exported with both exporters and verified in ONNX Runtime, at the export size, other
sizes and batches where the file declares them, float16 and non-contiguous inputs.

Skipped when transformers is absent (``pip install -c constraints.txt -e '.[hf]'``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed (transformers)")

import onnx_custom


def _omdet_turbo() -> tuple[torch.nn.Module, tuple[object, ...]]:
    from onnx_custom.models.hf_detectors import build

    return build("OmDetTurbo")


@pytest.mark.slow
def test_omdet_turbo_traced_after_a_call_fails_verification() -> None:
    """OmDet-Turbo caches its text embeddings in a Python dict keyed by the token ids' values.
    Called once before a TorchScript export, the trace reads the cache: the file drops the
    token inputs and holds the example's embeddings as constants. verify must fail it (the fast
    variant: tests/verification/test_verify_pruned_values.py)."""
    model, args = _omdet_turbo()
    with torch.no_grad():
        model(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript")
    names = [i.name for i in proto.graph.input]
    assert "classes_input_ids" not in names and "tasks_input_ids" not in names
    # the reference: other class tokens (same shapes) give PyTorch other logits
    other = list(args)
    other[1] = torch.flip(args[1], dims=(1,))
    with torch.no_grad():
        assert not torch.allclose(model(*args)[1], model(*other)[1])
    report = onnx_custom.verify(model, args, proto, raise_on_mismatch=False, rtol=1e-4, atol=1e-4)
    assert not report.passed, str(report)
    (pruned,) = [r for r in report.shapes_tried if r.kind == "pruned"]
    assert pruned.status == "failed" and "classes_input_ids" in pruned.reason


@pytest.mark.slow
def test_omdet_turbo_traced_fresh_verifies() -> None:
    """Exported before any call, the trace runs the text encoder: the file takes the tokens."""
    model, args = _omdet_turbo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript")
    assert "classes_input_ids" in [i.name for i in proto.graph.input]
    fresh, _ = _omdet_turbo()
    report = onnx_custom.verify(fresh, args, proto, rtol=1e-4, atol=1e-4)
    assert report.passed, str(report)


@pytest.mark.slow
def test_omdet_turbo_dynamo_row_names_the_data_dependent_line() -> None:
    """torch.export cannot trace OmDet-Turbo's text-embedding cache (keyed by the token ids'
    values, read with .tolist()): the row says it is torch's failure and where (the fast
    variant: tests/exporter/test_export_errors.py)."""
    from onnx_custom.hf_zoo import HfOptions, run_hf_row

    result = run_hf_row("OmDetTurbo", "dynamo", HfOptions(check_torch=False, dynamic=False))
    assert result.status == "torch-fails", result.detail
    assert "GuardOnDataDependentSymNode" in result.detail
    assert "modeling_omdet_turbo.py:" in result.detail
    assert "_get_cache_key_at_index" in result.detail


def _dpt() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """DPT depth estimation (ViT backbone, 64x64 images in 16x16 patches), seeded."""
    from transformers import DPTConfig, DPTForDepthEstimation

    torch.manual_seed(0)
    config = DPTConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=16,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 32, 32],
        fusion_hidden_size=16,
        reassemble_factors=[4, 2, 1, 0.5],
    )
    model = DPTForDepthEstimation(config).eval()

    class Depth(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.m(pixel_values=pixel_values).predicted_depth

    return Depth().eval(), (torch.rand(2, 3, 64, 64),)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dynamic",
    [None, {0: "batch", 2: "h", 3: "w"}],
    ids=["static-2x3x64x64", "batch-h-w"],
)
def test_dpt_torchscript_declares_the_depth_map_it_returns(dynamic: dict[int, str] | None) -> None:
    """torch declares DPT's squeezed depth map [S_dim_0, S_dim_0, S_dim_2] (batch == height),
    also for a static export; our file leaves those dims unknown and verifies."""
    from torch.export import Dim

    model, args = _dpt()
    shapes = None
    if dynamic is not None:
        dims = {0: Dim("batch", min=1, max=8), 2: Dim("h", min=40), 3: Dim("w", min=40)}
        shapes = ({axis: dims[axis] for axis in dynamic},)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript", dynamic_shapes=shapes)
    (output,) = proto.graph.output
    names = [d.dim_param for d in output.type.tensor_type.shape.dim if d.dim_param]
    assert len(names) == len(set(names)), names
    report = onnx_custom.verify(model, args, proto, rtol=1e-4, atol=1e-4)
    assert report.passed and not report.type_mismatches, str(report)
    if dynamic is not None:
        assert any(r.kind == "shape" and r.status == "passed" for r in report.shapes_tried)


def _resnet() -> object:
    from transformers import ResNetConfig

    config: Any = ResNetConfig  # out_indices goes through **kwargs (BackboneConfigMixin)
    return config(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_indices=[4],
    )


class _Picked(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.m, self.key = model, key

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.m(pixel_values=pixel_values, return_dict=True)[self.key]


def _detr() -> torch.nn.Module:
    from transformers import DetrConfig, DetrModel

    config = DetrConfig(
        backbone_config=_resnet(),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=10,
    )
    return _Picked(DetrModel(config), "last_hidden_state")


def _dinov2() -> torch.nn.Module:
    from transformers import Dinov2Config, Dinov2Model

    config = Dinov2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        mlp_ratio=2,
        image_size=56,
        patch_size=14,
    )
    return _Picked(Dinov2Model(config), "last_hidden_state")


def _segformer() -> torch.nn.Module:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        num_attention_heads=[1, 2],
        decoder_hidden_size=32,
        patch_sizes=[7, 3],
        strides=[4, 2],
        mlp_ratios=[2, 2],
    )
    return _Picked(SegformerForSemanticSegmentation(config), "logits")


BUILDERS = {"Detr": _detr, "Dinov2": _dinov2, "Segformer": _segformer}


@pytest.mark.parametrize(
    ("name", "size"),
    # Dinov2 at 70x70: its position embeddings (trained for 56x56) are interpolated bicubically
    [("Detr", 64), ("Dinov2", 70), ("Segformer", 64)],
    ids=["Detr-1x3x64x64", "Dinov2-1x3x70x70", "Segformer-1x3x64x64"],
)
def test_torchscript_file_verifies_at_the_export_size(name: str, size: int) -> None:
    torch.manual_seed(0)
    model = BUILDERS[name]().eval()
    args = (torch.rand(1, 3, size, size),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript")
    report = onnx_custom.verify(model, args, proto, rtol=1e-4, atol=1e-4)
    assert report.passed, str(report)


def test_dinov2_torchscript_file_is_dynamic_in_batch_and_image_size() -> None:
    """Dinov2 interpolates its position embeddings to the image: a traced file with dynamic
    batch, height and width verifies at other sizes (and unequal height and width)."""
    from torch.export import Dim

    torch.manual_seed(0)
    model = _dinov2().eval()
    args = (torch.rand(2, 3, 70, 70),)
    # torch.export's check of the dims: the patch embedding needs 28 pixels (min=28)
    dims = {0: Dim("batch", max=8), 2: Dim("h", min=28), 3: Dim("w", min=28)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript", dynamic_shapes=(dims,))
    report = onnx_custom.verify(
        model, args, proto, rtol=1e-4, atol=1e-4, shapes=[{"batch": 1, "h": 84, "w": 112}]
    )
    assert report.passed, str(report)
    assert [r.status for r in report.shapes_tried if r.kind == "shape"] == ["passed"]

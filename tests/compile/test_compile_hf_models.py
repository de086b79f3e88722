"""The compile backend on a real model nobody here wrote: transformers' DeformableDetrModel.

A small config, random weights (seeded), no download. Its forward makes the level shapes a
tensor from Python data (``torch.as_tensor(spatial_shapes_list)``), which the backend must keep as
a graph constant; with ``fallback="error"`` every op runs in ONNX Runtime. The reference is the
uncompiled model. Skipped (with the reason) where transformers is not installed; the fast variant
of the same pattern is tests/compile/test_compile_constants.py.
"""

from __future__ import annotations

import pytest
import torch

import onnx_custom

transformers = pytest.importorskip("transformers", reason="needs transformers (the [hf] extra)")


def _deformable_detr() -> torch.nn.Module:
    config = transformers.DeformableDetrConfig(
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
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config={
            "model_type": "resnet",
            "embedding_size": 8,
            "hidden_sizes": [8, 16, 16, 16],
            "depths": [1, 1, 1, 1],
            "out_features": ["stage2", "stage3", "stage4"],
        },
    )
    torch.manual_seed(0)
    return transformers.DeformableDetrModel(config).eval()


@pytest.mark.slow  # ~40-100 s: aot tracing of ~750 nodes and one ORT session
def test_deformable_detr_inference_runs_whole_in_ort() -> None:
    model = _deformable_detr()
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    backend = onnx_custom.compile_backend(fallback="error")
    with torch.no_grad():
        want = model(pixel_values=pixels)
        got = torch.compile(model, backend=backend)(pixel_values=pixels)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
    torch.testing.assert_close(got.encoder_last_hidden_state, want.encoder_last_hidden_state)
    assert backend.records and all(r.ort_nodes == r.nodes for r in backend.records)

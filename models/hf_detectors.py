"""Hugging Face detectors with deformable attention, random-initialised from small configs.

Each builder returns ``(model, example_inputs)``: the model in eval mode, seeded, built from a
config written here (no download, no pretrained or timm backbone: a small ResNet, HGNetV2 or
ViT backbone config), wrapped so its outputs are a tuple of tensors. `FAMILIES` lists them with
what `onnx_custom.hf_zoo` needs to sweep other sizes. Needs the ``hf`` extra
(``pip install -c constraints.txt -e '.[hf]'``); importing this module without transformers
raises an ImportError carrying ``skip_reason``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["FAMILIES", "HfFamily", "build", "family_names"]

IMAGE = 64
"""The export image size (square): small enough for a loaded 2-core box."""


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        error = ImportError(
            "transformers is not installed; the hf detector zoo needs the hf extra:"
            " pip install -c constraints.txt -e '.[hf]'"
        )
        error.skip_reason = str(error)  # type: ignore[attr-defined]
        raise error from exc
    return transformers


_require_transformers()


class Outputs(nn.Module):
    """The wrapped model's named outputs as a tuple (exporters and verify want tensors)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.m = model
        self.keys = keys

    def _pick(self, out: Any) -> tuple[torch.Tensor, ...]:
        return tuple(out[k] for k in self.keys)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._pick(self.m(pixel_values=pixel_values, return_dict=True))


class TextOutputs(Outputs):
    """An image + text-prompt model (Grounding DINO)."""

    def forward(  # type: ignore[override]
        self, pixel_values: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        out = self.m(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            return_dict=True,
        )
        return self._pick(out)


class TaskOutputs(Outputs):
    """An image + task-token model (OneFormer)."""

    def forward(  # type: ignore[override]
        self, pixel_values: torch.Tensor, task_inputs: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return self._pick(
            self.m(pixel_values=pixel_values, task_inputs=task_inputs, return_dict=True)
        )


class PromptOutputs(Outputs):
    """An image + class and task prompts model (OmDet-Turbo)."""

    def forward(  # type: ignore[override]
        self,
        pixel_values: torch.Tensor,
        classes_input_ids: torch.Tensor,
        classes_attention_mask: torch.Tensor,
        tasks_input_ids: torch.Tensor,
        tasks_attention_mask: torch.Tensor,
        classes_structure: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        out = self.m(
            pixel_values=pixel_values,
            classes_input_ids=classes_input_ids,
            classes_attention_mask=classes_attention_mask,
            tasks_input_ids=tasks_input_ids,
            tasks_attention_mask=tasks_attention_mask,
            classes_structure=classes_structure,
            return_dict=True,
        )
        return self._pick(out)


def _resnet(channels: tuple[int, ...] = (16, 32, 64, 128), out: tuple[int, ...] = (2, 3, 4)) -> Any:
    from transformers import ResNetConfig

    return ResNetConfig(
        embedding_size=16,
        hidden_sizes=list(channels),
        depths=[1] * len(channels),
        layer_type="basic",
        out_indices=list(out),
    )


def _pixels(batch: int = 1, size: int = IMAGE) -> torch.Tensor:
    return torch.rand(batch, 3, size, size)


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- builders


def deformable_detr(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import DeformableDetrConfig, DeformableDetrModel

    _seeded(seed)
    config = DeformableDetrConfig(
        backbone_config=_resnet(),
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=10,
        num_feature_levels=3,
        encoder_n_points=2,
        decoder_n_points=2,
        disable_custom_kernels=True,
    )
    model = Outputs(DeformableDetrModel(config), ("last_hidden_state", "encoder_last_hidden_state"))
    return model.eval(), (_pixels(),)


def _rt_detr_config(cls: Any, **extra: Any) -> Any:
    return cls(
        backbone_config=_resnet(),
        encoder_in_channels=[32, 64, 128],
        encoder_hidden_dim=32,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        d_model=32,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_n_points=2,
        num_queries=10,
        num_denoising=0,
        initializer_range=0.2,
        **extra,
    )


_DETR_KEYS = ("last_hidden_state", "init_reference_points")


def rt_detr(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import RTDetrConfig, RTDetrModel

    _seeded(seed)
    model = Outputs(RTDetrModel(_rt_detr_config(RTDetrConfig)), _DETR_KEYS)
    return model.eval(), (_pixels(),)


def rt_detr_v2(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import RTDetrV2Config, RTDetrV2Model

    _seeded(seed)
    model = Outputs(RTDetrV2Model(_rt_detr_config(RTDetrV2Config)), _DETR_KEYS)
    return model.eval(), (_pixels(),)


def d_fine(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import DFineConfig, DFineModel

    _seeded(seed)
    config = _rt_detr_config(DFineConfig, lqe_hidden_dim=8, max_num_bins=8)
    model = Outputs(DFineModel(config), _DETR_KEYS)
    return model.eval(), (_pixels(),)


def deimv2(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import Deimv2Config, Deimv2Model

    _seeded(seed)
    config = _rt_detr_config(Deimv2Config, lqe_hidden_dim=8, max_num_bins=8)
    model = Outputs(Deimv2Model(config), _DETR_KEYS)
    return model.eval(), (_pixels(),)


def grounding_dino(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import BertConfig, GroundingDinoConfig, GroundingDinoModel

    _seeded(seed)
    text = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    config = GroundingDinoConfig(
        backbone_config=_resnet(),
        text_config=text,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=10,
        num_feature_levels=3,
        encoder_n_points=2,
        decoder_n_points=2,
        max_text_len=16,
        disable_custom_kernels=True,
    )
    model = TextOutputs(GroundingDinoModel(config), ("last_hidden_state",))
    ids = torch.tensor([[1, 5, 7, 9, 2, 3]])
    return model.eval(), (_pixels(), ids, torch.ones_like(ids))


def mask2former(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import Mask2FormerConfig, Mask2FormerModel

    _seeded(seed)
    config = Mask2FormerConfig(
        backbone_config=_resnet(out=(1, 2, 3, 4)),
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=64,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        dim_feedforward=64,
        num_queries=10,
    )
    keys = ("pixel_decoder_last_hidden_state", "transformer_decoder_last_hidden_state")
    model = Outputs(Mask2FormerModel(config), keys)
    return model.eval(), (_pixels(),)


def oneformer(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import OneFormerConfig, OneFormerModel

    _seeded(seed)
    config = OneFormerConfig(
        backbone_config=_resnet(out=(1, 2, 3, 4)),
        num_queries=10,
        conv_dim=32,
        mask_dim=32,
        hidden_dim=32,
        encoder_feedforward_dim=64,
        encoder_layers=1,
        decoder_layers=2,
        num_attention_heads=2,
        dim_feedforward=64,
        text_encoder_width=32,
        text_encoder_num_layers=1,
        text_encoder_vocab_size=100,
        task_seq_len=8,
        text_encoder_context_length=8,
        query_dec_layers=1,
    )
    keys = ("transformer_decoder_object_queries", "transformer_decoder_mask_predictions")
    model = TaskOutputs(OneFormerModel(config), keys)
    task = torch.randint(0, 100, (1, 8))
    return model.eval(), (_pixels(), task)


def omdet_turbo(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import CLIPTextConfig, OmDetTurboConfig, OmDetTurboForObjectDetection

    _seeded(seed)
    text = CLIPTextConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=2,
        projection_dim=32,
    )
    config = OmDetTurboConfig(
        backbone_config=_resnet(),
        text_config=text,
        text_projection_in_dim=32,
        text_projection_out_dim=32,
        task_encoder_hidden_dim=48,
        class_embed_dim=32,
        encoder_in_channels=[32, 64, 128],
        encoder_hidden_dim=48,
        vision_features_channels=[48, 48, 48],
        encoder_attention_heads=2,
        encoder_dim_feedforward=64,
        decoder_hidden_dim=48,
        decoder_num_heads=2,
        decoder_num_layers=1,
        decoder_dim_feedforward=64,
        decoder_num_points=2,
        num_queries=10,
        image_size=IMAGE,
        apply_layernorm_after_vision_backbone=False,
        disable_custom_kernels=True,
    )
    keys = ("decoder_coord_logits", "decoder_class_logits")
    model = PromptOutputs(OmDetTurboForObjectDetection(config), keys)
    classes = torch.randint(1, 100, (2, 6))
    tasks = torch.randint(1, 100, (1, 6))
    inputs = (
        _pixels(),
        classes,
        torch.ones_like(classes),
        tasks,
        torch.ones_like(tasks),
        torch.tensor([2]),
    )
    return model.eval(), inputs


def _vit_detr(config_cls: Any, backbone: dict[str, Any]) -> Any:
    return config_cls(
        backbone_config=backbone,
        projector_scale_factors=[1.0],
        d_model=32,
        decoder_ffn_dim=64,
        decoder_n_points=2,
        decoder_layers=1,
        decoder_self_attention_heads=2,
        decoder_cross_attention_heads=2,
        num_queries=10,
        group_detr=1,
    )


def lw_detr(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import LwDetrConfig, LwDetrModel

    _seeded(seed)
    backbone = {
        "model_type": "lw_detr_vit",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE,
        "pretrain_image_size": IMAGE,
        "patch_size": 16,
        "num_windows": 1,
        "out_indices": [1, 2],
    }
    config = _vit_detr(LwDetrConfig, backbone)
    model = Outputs(LwDetrModel(config), ("last_hidden_state",))
    return model.eval(), (_pixels(),)


def rf_detr(seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import RfDetrConfig, RfDetrModel

    _seeded(seed)
    backbone = {
        "model_type": "rf_detr_dinov2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": IMAGE,
        "patch_size": 16,
        "num_windows": 1,
        "out_indices": [1, 2],
    }
    config = _vit_detr(RfDetrConfig, backbone)
    model = Outputs(RfDetrModel(config), ("last_hidden_state",))
    return model.eval(), (_pixels(),)


# ---------------------------------------------------------------------------- the families


@dataclasses.dataclass(frozen=True)
class HfFamily:
    """One zoo family: how to build it and which of its input dims may vary."""

    name: str
    builder: Callable[[int], tuple[nn.Module, tuple[Any, ...]]]
    # Per input: the dims that vary ({dim index: name}); None: a static file (see ``note``).
    dynamic: tuple[dict[int, str] | None, ...] | None = None
    note: str = ""  # why the file is static
    fusion_note: str = ""  # why ``fuse=True`` recognises no attention module (a fused row says so)


_SPECIALIZED = (
    "static file: torch.export specializes batch and image size (transformers 5.23 computes the"
    " feature maps' spatial shapes as Python ints)"
)
_TEXT = "static file: the text inputs' length is specialized as well"
FAMILIES: dict[str, HfFamily] = {
    f.name: f
    for f in (
        HfFamily("DeformableDetr", deformable_detr, note=_SPECIALIZED),
        HfFamily("RTDetr", rt_detr, note=_SPECIALIZED),
        HfFamily("RTDetrV2", rt_detr_v2, note=_SPECIALIZED),
        HfFamily("DFine", d_fine, note=_SPECIALIZED),
        HfFamily("Deimv2", deimv2, note=_SPECIALIZED),
        HfFamily("GroundingDino", grounding_dino, note=_TEXT),
        HfFamily("Mask2Former", mask2former, note=_SPECIALIZED),
        HfFamily("OneFormer", oneformer, note=_TEXT),
        HfFamily("OmDetTurbo", omdet_turbo, note=_TEXT),
        HfFamily("LwDetr", lw_detr, note=_SPECIALIZED),
        HfFamily("RfDetr", rf_detr, note=_SPECIALIZED),
    )
}


def family_names() -> list[str]:
    return list(FAMILIES)


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """The family's model (eval mode) and example inputs, seeded."""
    model, args = FAMILIES[name].builder(seed)
    return _untied(model, seed), args


def _untied(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with its constant-initialised tensors (zero biases, unit norms) jittered (seeded).

    With transformers' initialisation RT-DETR-style encoders score every query the same and
    ``topk`` picks among exact ties, an order no two runtimes share. Trained weights never tie,
    so the zoo perturbs these.
    """
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            flat = param.flatten()
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    return model

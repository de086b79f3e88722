"""The multi-scale deformable attention implementations `fusing` recognises, and their
replacements by ``torch.ops.onnx_custom.multi_scale_deformable_attn``.

Two call forms are known:

- the *function* form (mmcv's ``multi_scale_deformable_attn_pytorch``; transformers'
  ``multi_scale_deformable_attention`` in Mask2Former and OneFormer)::

      fn(value, value_spatial_shapes, sampling_locations, attention_weights) -> Tensor

  ``value_spatial_shapes`` an int tensor ``(num_levels, 2)`` or a list of ``(H, W)`` pairs;
- the *module* form (transformers' ``MultiScaleDeformableAttention`` module, one copy per model
  family: Deformable DETR, Grounding DINO, MM Grounding DINO, RT-DETR, OmDet-Turbo, LW-DETR,
  RF-DETR, PP-DocLayout)::

      module(value, value_spatial_shapes, value_spatial_shapes_list, level_start_index,
             sampling_locations, attention_weights, im2col_step) -> Tensor

Both take ``value (bs, num_keys, num_heads, head_dim)``, ``sampling_locations (bs, num_queries,
num_heads, num_levels, num_points, 2)`` in [0, 1], ``attention_weights (bs, num_queries,
num_heads, num_levels, num_points)`` and return ``(bs, num_queries, num_heads * head_dim)``: our
op's contract, so the replacements only rebuild the level layout and cast.

A third form is transformers' *v2* attention (RT-DETRv2, D-FINE, DEIMv2: one attention class per
family, ``RTDetrV2MultiscaleDeformableAttention`` and the like, whose ``forward`` calls its
module's ``multi_scale_deformable_attention_v2``)::

    fn(value, value_spatial_shapes, sampling_locations, attention_weights, num_points_list,
       method="default") -> Tensor

with the points of all levels concatenated: ``sampling_locations (bs, num_queries, num_heads,
sum(num_points_list), 2)``, ``attention_weights (bs, num_queries, num_heads,
sum(num_points_list))``. With ``method="default"`` it is our op once the points are laid out per
level; levels with fewer points than the largest are padded with points of weight 0 (each adds
``0 * sample``: the same sum). ``method="discrete"`` samples the nearest pixel, not bilinearly:
our op does not compute it (`NotFusable`).

The library implementations are found by identity in the modules already imported (a model built
from transformers or mmcv has imported them), never by importing a library.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

import onnx_custom.ops.msda  # noqa: F401  (registers torch.ops.onnx_custom.multi_scale_deformable_attn)

__all__ = [
    "MSDA_OP",
    "NotFusable",
    "library_functions",
    "library_modules",
    "library_v2_modules",
    "msda_from_function_args",
    "msda_from_module_args",
    "msda_v2_from_function_args",
]

MSDA_OP = "onnx_custom::multi_scale_deformable_attn"
_DEFAULT_IM2COL_STEP = 64

# (module prefix, attribute) of the known pure-PyTorch implementations.
_FUNCTIONS = (
    ("mmcv.ops.multi_scale_deform_attn", "multi_scale_deformable_attn_pytorch"),
    ("transformers.models.", "multi_scale_deformable_attention"),
)
_MODULES = (("transformers.models.", "MultiScaleDeformableAttention"),)
# The v2 attention classes and the function their forward calls (defined in the same module).
_V2_PREFIX = "transformers.models."
_V2_FUNCTION = "multi_scale_deformable_attention_v2"
_V2_CLASSES = (
    "RTDetrV2MultiscaleDeformableAttention",
    "DFineMultiscaleDeformableAttention",
    "Deimv2MultiscaleDeformableAttention",
)


class NotFusable(Exception):
    """Raised by a replacement for arguments it does not compute (the message says why): the site
    keeps running the original code and the report gives the message as the reason."""


def _defined_in(prefix: str, attribute: str) -> Iterator[tuple[str, Any]]:
    """``(module name, object)`` for each imported module under ``prefix`` that defines
    ``attribute`` itself (re-exports of another module's object are skipped)."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix)):
            continue
        value = getattr(module, attribute, None)
        if value is not None and getattr(value, "__module__", None) == name:
            yield name, value


def library_functions() -> list[Any]:
    """The function-form implementations of the libraries imported in this process."""
    return [
        fn for prefix, attr in _FUNCTIONS for _, fn in _defined_in(prefix, attr) if callable(fn)
    ]


def library_modules() -> list[type[torch.nn.Module]]:
    """The module-form classes of the libraries imported in this process."""
    return [
        cls
        for prefix, attr in _MODULES
        for _, cls in _defined_in(prefix, attr)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module)
    ]


def library_v2_modules() -> list[tuple[type[torch.nn.Module], Any]]:
    """``(class, function)`` of transformers' v2 attention: each class with the
    ``multi_scale_deformable_attention_v2`` function its own modeling module defines."""
    found = []
    for name, fn in _defined_in(_V2_PREFIX, _V2_FUNCTION):
        module = sys.modules.get(name)
        for attribute in _V2_CLASSES:
            cls = getattr(module, attribute, None)
            if (
                callable(fn)
                and isinstance(cls, type)
                and issubclass(cls, torch.nn.Module)
                and cls.__module__ == name
            ):
                found.append((cls, fn))
    return found


def _as_index(value: Any) -> Tensor:
    return torch.as_tensor(value, dtype=torch.int64)


def _shapes_tensor(shapes: Any, device: torch.device) -> Tensor:
    """``(num_levels, 2)`` int64 from a tensor or a list of ``(H, W)`` (ints or symbolic ints)."""
    if isinstance(shapes, Tensor):
        return shapes.to(torch.int64)
    pairs = [tuple(pair) for pair in shapes]
    if all(isinstance(v, int) for pair in pairs for v in pair):
        return torch.tensor(pairs, dtype=torch.int64, device=device)
    return torch.stack([torch.stack([_as_index(h), _as_index(w)]) for h, w in pairs]).to(device)


def _level_start_index(spatial_shapes: Tensor) -> Tensor:
    """The exclusive cumulative sum of ``H * W`` per level."""
    areas = spatial_shapes[:, 0] * spatial_shapes[:, 1]
    return torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])


def _call_op(
    value: Tensor,
    spatial_shapes: Tensor,
    level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    im2col_step: Any,
) -> Tensor:
    step = im2col_step if isinstance(im2col_step, int) and im2col_step > 0 else _DEFAULT_IM2COL_STEP
    return torch.ops.onnx_custom.multi_scale_deformable_attn(  # type: ignore[no-any-return]
        value,
        spatial_shapes.to(torch.int64),
        level_start_index.to(torch.int64),
        sampling_locations.to(value.dtype),
        attention_weights.to(value.dtype),
        step,
    )


def msda_from_function_args(
    value: Tensor,
    value_spatial_shapes: Any,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    *_: Any,
) -> Tensor:
    """The function form, computed by our op (the level start index derived from the shapes)."""
    shapes = _shapes_tensor(value_spatial_shapes, value.device)
    return _call_op(
        value,
        shapes,
        _level_start_index(shapes),
        sampling_locations,
        attention_weights,
        _DEFAULT_IM2COL_STEP,
    )


def msda_from_module_args(
    value: Tensor,
    value_spatial_shapes: Any,
    value_spatial_shapes_list: Any,
    level_start_index: Any,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    im2col_step: Any = _DEFAULT_IM2COL_STEP,
    *_: Any,
) -> Tensor:
    """The module form (transformers' ``MultiScaleDeformableAttention.forward``), by our op."""
    if isinstance(value_spatial_shapes, Tensor):
        shapes = value_spatial_shapes.to(torch.int64)
    else:
        shapes = _shapes_tensor(value_spatial_shapes_list, value.device)
    starts = (
        level_start_index if isinstance(level_start_index, Tensor) else _level_start_index(shapes)
    )
    return _call_op(value, shapes, starts, sampling_locations, attention_weights, im2col_step)


_PAD_LOCATION = -1.0  # a padded point samples outside every map (zero padding: exactly 0)


def msda_v2_from_function_args(
    value: Tensor,
    value_spatial_shapes: Any,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    num_points_list: Any,
    method: str = "default",
    *_: Any,
) -> Tensor:
    """transformers' ``multi_scale_deformable_attention_v2`` by our op (``method="default"``):
    the concatenated points laid out per level, levels with fewer points padded with weight 0."""
    if method == "discrete":
        raise NotFusable(
            "the v2 attention's 'discrete' sampling method reads the nearest pixel (rounded"
            " indices), not a bilinear sample: our op does not compute it; it runs unfused"
        )
    if method != "default":
        raise NotFusable(f"the v2 attention's sampling method {method!r} is not 'default'")
    counts = [int(n) for n in num_points_list]
    if not counts or min(counts) < 1:
        raise NotFusable(f"num_points_list {counts} has a level without points")
    bs, queries, heads, total = sampling_locations.shape[:4]
    if total != sum(counts):
        raise NotFusable(
            f"sampling_locations holds {total} points per head, num_points_list {counts} sums"
            f" to {sum(counts)}"
        )
    points = max(counts)
    if all(n == points for n in counts):
        locations = sampling_locations.reshape(bs, queries, heads, len(counts), points, 2)
        weights = attention_weights.reshape(bs, queries, heads, len(counts), points)
    else:
        locations = torch.stack(
            [
                torch.nn.functional.pad(part, (0, 0, 0, points - n), value=_PAD_LOCATION)
                for part, n in zip(sampling_locations.split(counts, dim=3), counts, strict=True)
            ],
            dim=3,
        )
        weights = torch.stack(
            [
                torch.nn.functional.pad(part, (0, points - n), value=0.0)
                for part, n in zip(attention_weights.split(counts, dim=3), counts, strict=True)
            ],
            dim=3,
        )
    shapes = _shapes_tensor(value_spatial_shapes, value.device)
    return _call_op(
        value, shapes, _level_start_index(shapes), locations, weights, _DEFAULT_IM2COL_STEP
    )

"""Symbolic functions written for torch's API, the way mmcv, mmdeploy and detectron2 write them,
register unchanged and export with BOTH exporters; each file is verified in ONNX Runtime (at
other sizes of its dynamic dims too) against an eager op written independently (custom nodes run
numpy kernels written independently of the eager torch code).

Registration routes covered: `onnx_custom.register_custom_op_symbolic` (torch's signature),
`onnx_custom.symbolic` (a @parse_args function, and one with free parameter names), and
`onnx_custom.import_torch_symbolics` (from `torch.onnx.register_custom_op_symbolic`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch.onnx import symbolic_helper
from torch.onnx._internal.torchscript_exporter import registration as ts_registration

import onnx_custom
from onnx_custom.runtime import KernelRegistry

kernels = KernelRegistry()
registry = onnx_custom.default_registry().copy()


# -- 1. roi_align, mmcv style: @parse_args with list/float/int/str/bool codes, custom node ------


@torch.library.custom_op("tstyle::roi_align", mutates_args=())
def roi_align(
    input: torch.Tensor,
    rois: torch.Tensor,
    output_size: list[int],
    spatial_scale: float,
    sampling_ratio: int,
    pool_mode: str,
    aligned: bool,
) -> torch.Tensor:
    n, c, h, w = input.shape
    oh, ow = output_size
    s = sampling_ratio
    offset = 0.5 if aligned else 0.0
    batch = rois[:, 0].long().clamp(0, n - 1)
    x1, y1, x2, y2 = (rois[:, i] * spatial_scale - offset for i in range(1, 5))
    # sample s x s points per bin at their centers: positions along each axis, per roi
    fy = (torch.arange(oh * s, dtype=input.dtype) + 0.5) / (oh * s)
    fx = (torch.arange(ow * s, dtype=input.dtype) + 0.5) / (ow * s)
    ys = (y1[:, None] + fy[None] * (y2 - y1)[:, None]).clamp(0, h - 1)  # [K, oh*s]
    xs = (x1[:, None] + fx[None] * (x2 - x1)[:, None]).clamp(0, w - 1)
    y0, x0 = ys.floor().long(), xs.floor().long()
    y1i, x1i = (y0 + 1).clamp(max=h - 1), (x0 + 1).clamp(max=w - 1)
    ly, lx = ys - y0, xs - x0
    feats = input[batch]  # [K, C, H, W]

    def at(yi: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:  # [K, C, oh*s, ow*s]
        k = torch.arange(feats.shape[0])[:, None, None]
        return feats.permute(0, 2, 3, 1)[k, yi[:, :, None], xi[:, None, :]].permute(0, 3, 1, 2)

    wy, wx = ly[:, None, :, None], lx[:, None, None, :]
    value = (
        at(y0, x0) * (1 - wy) * (1 - wx)
        + at(y0, x1i) * (1 - wy) * wx
        + at(y1i, x0) * wy * (1 - wx)
        + at(y1i, x1i) * wy * wx
    )
    bins = value.reshape(value.shape[0], c, oh, s, ow, s)
    return bins.mean(dim=(3, 5)) if pool_mode == "avg" else bins.amax(dim=(3, 5))


@roi_align.register_fake
def _(input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned):  # type: ignore[no-untyped-def]
    return input.new_empty(rois.shape[0], input.shape[1], output_size[0], output_size[1])


@onnx_custom.symbolic("tstyle::roi_align", opset=9, registry=registry)
@symbolic_helper.parse_args("v", "v", "is", "f", "i", "s", "i")
def roi_align_symbolic(
    g, input, rois, output_size, spatial_scale, sampling_ratio, pool_mode, aligned
):  # type: ignore[no-untyped-def]
    return g.op(
        "mmcv::MMCVRoiAlign",
        input,
        rois,
        output_height_i=output_size[0],
        output_width_i=output_size[1],
        spatial_scale_f=spatial_scale,
        sampling_ratio_i=sampling_ratio,
        mode_s=pool_mode,
        aligned_i=aligned,
    )


def _bilinear(plane: np.ndarray, y: float, x: float) -> float:
    h, w = plane.shape
    y, x = min(max(y, 0.0), h - 1.0), min(max(x, 0.0), w - 1.0)
    y0, x0 = math.floor(y), math.floor(x)
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    ly, lx = y - y0, x - x0
    return float(
        plane[y0, x0] * (1 - ly) * (1 - lx)
        + plane[y0, x1] * (1 - ly) * lx
        + plane[y1, x0] * ly * (1 - lx)
        + plane[y1, x1] * ly * lx
    )


@kernels.kernel(
    "mmcv::MMCVRoiAlign",
    inputs=["input", "rois"],
    outputs=["output"],
    attrs={
        "output_height": "int",
        "output_width": "int",
        "spatial_scale": "float",
        "sampling_ratio": "int",
        "mode": "string",
        "aligned": "int",
    },
)
def roi_align_kernel(
    input, rois, *, output_height, output_width, spatial_scale, sampling_ratio, mode, aligned
):  # type: ignore[no-untyped-def]
    n, c = input.shape[:2]
    out = np.zeros((rois.shape[0], c, output_height, output_width), dtype=input.dtype)
    offset = 0.5 if aligned else 0.0
    s = sampling_ratio
    for k, roi in enumerate(rois.astype(np.float64)):
        b = min(max(int(roi[0]), 0), n - 1)
        x1, y1, x2, y2 = (float(v) * spatial_scale - offset for v in roi[1:])
        for ch in range(c):
            for i in range(output_height):
                for j in range(output_width):
                    ys = [
                        y1 + (i * s + sy + 0.5) / (output_height * s) * (y2 - y1) for sy in range(s)
                    ]
                    xs = [
                        x1 + (j * s + sx + 0.5) / (output_width * s) * (x2 - x1) for sx in range(s)
                    ]
                    samples = [_bilinear(input[b, ch], y, x) for y in ys for x in xs]
                    out[k, ch, i, j] = np.mean(samples) if mode == "avg" else np.max(samples)
    return out


class RoiAlign(torch.nn.Module):
    def __init__(self, mode: str = "avg", aligned: bool = True) -> None:
        super().__init__()
        self.mode, self.aligned = mode, aligned

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.roi_align(x, rois, [3, 2], 0.5, 2, self.mode, self.aligned)


def _rois(n: int, k: int, size: float) -> torch.Tensor:
    corners = torch.rand(k, 2, 2) * size * 2
    boxes = torch.cat([corners.amin(1), corners.amax(1) + 1], dim=1)
    return torch.cat([torch.randint(0, n, (k, 1)).float(), boxes], dim=1)


def _roi_inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, rois = args
    return torch.randn_like(x), _rois(x.shape[0], rois.shape[0], x.shape[2])


# -- 2. nms, mmdeploy style: free names, _is_value, _unsqueeze_helper, value_t, standard ops ----


@torch.library.custom_op("tstyle::nms_mask", mutates_args=())
def nms_mask(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    score_threshold: float,
    max_output_boxes: int,
) -> torch.Tensor:
    """1.0 for each box greedy NMS keeps (ONNX NonMaxSuppression semantics: [y1, x1, y2, x2]
    corners in any order, scores > score_threshold, IoU > iou_threshold suppresses)."""
    lo = torch.minimum(boxes[:, :2], boxes[:, 2:])
    hi = torch.maximum(boxes[:, :2], boxes[:, 2:])
    area = (hi - lo).prod(dim=1)
    keep = torch.zeros_like(scores)
    kept: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: -float(scores[i])):
        if float(scores[i]) <= score_threshold or len(kept) >= max_output_boxes:
            continue
        ok = True
        for j in kept:
            inter = (torch.minimum(hi[i], hi[j]) - torch.maximum(lo[i], lo[j])).clamp(min=0).prod()
            union = area[i] + area[j] - inter
            if union > 0 and float(inter / union) > iou_threshold:
                ok = False
                break
        if ok:
            kept.append(i)
            keep[i] = 1.0
    return keep


@nms_mask.register_fake
def _(boxes, scores, iou_threshold, score_threshold, max_output_boxes):  # type: ignore[no-untyped-def]
    return torch.empty_like(scores)


@onnx_custom.symbolic("tstyle::nms_mask", opset=11, registry=registry)
def nms_symbolic(g, boxes, scores, iou_thr, score_thr, max_num):  # type: ignore[no-untyped-def]
    batched_boxes = symbolic_helper._unsqueeze_helper(g, boxes, [0])
    batched_scores = symbolic_helper._unsqueeze_helper(
        g, symbolic_helper._unsqueeze_helper(g, scores, [0]), [0]
    )
    if not symbolic_helper._is_value(max_num):
        max_num = g.op("Constant", value_t=torch.tensor([max_num], dtype=torch.long))
    iou_thr = g.op("Constant", value_t=torch.tensor([iou_thr], dtype=torch.float))
    score_thr = g.op("Constant", value_t=torch.tensor([score_thr], dtype=torch.float))
    selected = g.op("NonMaxSuppression", batched_boxes, batched_scores, max_num, iou_thr, score_thr)
    box_index = g.op("Gather", selected, g.op("Constant", value_t=torch.tensor(2)), axis_i=1)
    zeros = g.op("ConstantOfShape", g.op("Shape", scores), value_t=torch.tensor([0.0]))
    ones = g.op("ConstantOfShape", g.op("Shape", box_index), value_t=torch.tensor([1.0]))
    return g.op("ScatterElements", zeros, box_index, ones, axis_i=0)


class Nms(torch.nn.Module):
    def forward(self, boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.nms_mask(boxes, scores, 0.3, 0.1, 5)


def _nms_inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    n = args[0].shape[0]
    return torch.rand(n, 4) * 10, torch.rand(n)


# -- 3. grid_sampler, mmcv symbolic.py style: parse_args('v', 'v', 'i', 'i', 'i') -> GridSample ---


@torch.library.custom_op("tstyle::grid_sampler", mutates_args=())
def grid_sampler(
    input: torch.Tensor,
    grid: torch.Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> torch.Tensor:
    modes, paddings = ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"]
    return F.grid_sample(
        input, grid, modes[interpolation_mode], paddings[padding_mode], align_corners
    )


@grid_sampler.register_fake
def _(input, grid, interpolation_mode, padding_mode, align_corners):  # type: ignore[no-untyped-def]
    return input.new_empty(input.shape[0], input.shape[1], grid.shape[1], grid.shape[2])


@symbolic_helper.parse_args("v", "v", "i", "i", "i")
def grid_sampler_symbolic(g, input, grid, interpolation_mode, padding_mode, align_corners=False):  # type: ignore[no-untyped-def]
    mode = ["bilinear", "nearest", "bicubic"][interpolation_mode]
    padding = ["zeros", "border", "reflection"][padding_mode]
    return g.op(
        "GridSample",
        input,
        grid,
        mode_s=mode,
        padding_mode_s=padding,
        align_corners_i=align_corners,
    )


onnx_custom.register_custom_op_symbolic(
    "tstyle::grid_sampler", grid_sampler_symbolic, 16, registry=registry
)


class GridSampler(torch.nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.grid_sampler(x, grid, 0, 1, False)


def _grid_inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, grid = args
    return torch.randn_like(x), torch.rand_like(grid) * 2.2 - 1.1


# -- 4. modulated deform conv, mmdeploy style: Tensor? bias, *input list, int[] attributes ----


@torch.library.custom_op("tstyle::modulated_deform_conv", mutates_args=())
def modulated_deform_conv(
    input: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    deform_groups: int,
) -> torch.Tensor:
    from onnx_custom.ops import (
        deform_conv2d,  # torchvision's semantics; ORT's DeformConv is the other side
    )

    return deform_conv2d(
        input, offset, weight, bias, tuple(stride), tuple(padding), tuple(dilation), mask
    )


@modulated_deform_conv.register_fake
def _(input, offset, mask, weight, bias, stride, padding, dilation, groups, deform_groups):  # type: ignore[no-untyped-def]
    return input.new_empty(input.shape[0], weight.shape[0], offset.shape[2], offset.shape[3])


def modulated_deform_conv_symbolic(
    g, input, offset, mask, weight, bias, stride, padding, dilation, groups, deform_groups
):  # type: ignore[no-untyped-def]
    kernel_shape = symbolic_helper._get_tensor_sizes(weight)[
        2:
    ]  # x.type().varyingSizes() under dynamo too
    assert weight.type().scalarType() == "Float", weight.type().scalarType()
    return g.op(
        "DeformConv",
        input,
        weight,
        offset,
        bias,
        mask,
        kernel_shape_i=kernel_shape,
        strides_i=stride,
        pads_i=padding + padding,
        dilations_i=dilation,
        group_i=groups,
        offset_group_i=deform_groups,
    )


onnx_custom.register_custom_op_symbolic(
    "tstyle::modulated_deform_conv", modulated_deform_conv_symbolic, 19, registry=registry
)


class ModulatedDeformConv(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 2, 3, 3) * 0.3)
        self.bias = torch.nn.Parameter(torch.randn(4)) if bias else None

    def forward(self, x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.modulated_deform_conv(
            x, offset, mask, self.weight, self.bias, [1, 1], [1, 1], [1, 1], 1, 1
        )


def _dcn_inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    x, offset, mask = args
    return torch.randn_like(x), torch.randn_like(offset), torch.rand_like(mask)


# -- 5. box decoding, mmdeploy style: Tensor? input, _is_none, outputs=2 custom node, tuple ----


@torch.library.custom_op("tstyle::delta2bbox", mutates_args=())
def delta2bbox(
    deltas: torch.Tensor,
    anchors: torch.Tensor,
    stds: torch.Tensor | None,
    max_ratio: float,
    clip_shape: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    d = deltas * stds if stds is not None else deltas
    center = (anchors[:, :2] + anchors[:, 2:]) / 2
    size = anchors[:, 2:] - anchors[:, :2]
    new_center = center + d[:, :2] * size
    new_size = size * d[:, 2:].clamp(-max_ratio, max_ratio).exp()
    limit = torch.tensor([clip_shape[1], clip_shape[0]], dtype=deltas.dtype)
    lo = torch.minimum((new_center - new_size / 2).clamp(min=0), limit)
    hi = torch.minimum((new_center + new_size / 2).clamp(min=0), limit)
    return torch.cat([lo, hi], dim=1), (hi - lo).prod(dim=1)


@delta2bbox.register_fake
def _(deltas, anchors, stds, max_ratio, clip_shape):  # type: ignore[no-untyped-def]
    return torch.empty_like(deltas), deltas.new_empty(deltas.shape[0])


def delta2bbox_symbolic(g, deltas, anchors, stds, max_ratio, clip_shape):  # type: ignore[no-untyped-def]
    inputs = [deltas, anchors] if symbolic_helper._is_none(stds) else [deltas, anchors, stds]
    boxes, areas = g.op(
        "mmdeploy::DeltaDecode", *inputs, max_ratio_f=max_ratio, clip_shape_i=clip_shape, outputs=2
    )
    return boxes, areas


onnx_custom.register_custom_op_symbolic(
    "tstyle::delta2bbox", delta2bbox_symbolic, 11, registry=registry
)


@kernels.kernel(
    "mmdeploy::DeltaDecode",
    inputs=["deltas", "anchors", "stds?"],
    outputs=["boxes", "areas"],
    attrs={"max_ratio": "float", "clip_shape": "ints"},
)
def delta_decode_kernel(deltas, anchors, stds=None, *, max_ratio, clip_shape):  # type: ignore[no-untyped-def]
    boxes = np.empty_like(deltas)
    areas = np.empty(deltas.shape[0], dtype=deltas.dtype)
    height, width = clip_shape
    for i in range(deltas.shape[0]):
        dx, dy, dw, dh = (deltas[i] * stds) if stds is not None else deltas[i]
        ax1, ay1, ax2, ay2 = anchors[i]
        w, h = ax2 - ax1, ay2 - ay1
        cx, cy = ax1 + w / 2 + dx * w, ay1 + h / 2 + dy * h
        w, h = (
            w * np.exp(np.clip(dw, -max_ratio, max_ratio)),
            h * np.exp(np.clip(dh, -max_ratio, max_ratio)),
        )
        x1, x2 = (min(max(v, 0), width) for v in (cx - w / 2, cx + w / 2))
        y1, y2 = (min(max(v, 0), height) for v in (cy - h / 2, cy + h / 2))
        boxes[i] = (x1, y1, x2, y2)
        areas[i] = (x2 - x1) * (y2 - y1)
    return boxes, areas


class Delta2Bbox(torch.nn.Module):
    def __init__(self, with_stds: bool) -> None:
        super().__init__()
        self.stds = torch.tensor([0.1, 0.1, 0.2, 0.2]) if with_stds else None

    def forward(
        self, deltas: torch.Tensor, anchors: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.tstyle.delta2bbox(deltas, anchors, self.stds, 2.0, [30, 40])


def _box_inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    n = args[0].shape[0]
    corners = torch.rand(n, 2, 2) * 35
    return torch.randn(n, 4), torch.cat([corners.amin(1), corners.amax(1) + 1], dim=1)


# -- 6. detectron2 style: undecorated, _maybe_get_const/_get_const/_get_tensor_rank, scalars ----


@torch.library.custom_op("tstyle::scaled_softmax", mutates_args=())
def scaled_softmax(x: torch.Tensor, scale: float, dim: int) -> torch.Tensor:
    return torch.softmax(x * scale, dim)


@scaled_softmax.register_fake
def _(x, scale, dim):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


def scaled_softmax_symbolic(g, self, scale, dim):  # type: ignore[no-untyped-def]
    scale = symbolic_helper._maybe_get_const(scale, "f")
    dim = symbolic_helper._get_const(dim, "i", "dim")
    rank = symbolic_helper._get_tensor_rank(self)
    if dim < 0 and rank is not None:
        dim += rank
    return g.op("Softmax", g.op("Mul", self, scale), axis_i=dim)  # a Python float input


onnx_custom.register_custom_op_symbolic(
    "tstyle::scaled_softmax", scaled_softmax_symbolic, 13, registry=registry
)


class ScaledSoftmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.scaled_softmax(x, 0.7, -1)


# -- 7. topk, torch symbolic_opset11 style: parse_args("v", "i", "b"), outputs=2 -------------------


@torch.library.custom_op("tstyle::topk_last", mutates_args=())
def topk_last(x: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.topk(x, k, dim=-1, largest=largest, sorted=True)
    return values, indices


@topk_last.register_fake
def _(x, k, largest):  # type: ignore[no-untyped-def]
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@symbolic_helper.parse_args("v", "i", "b")
def topk_symbolic(g, self, k, largest):  # type: ignore[no-untyped-def]
    k = g.op("Constant", value_t=torch.tensor([k], dtype=torch.int64))
    return g.op("TopK", self, k, axis_i=-1, largest_i=largest, sorted_i=1, outputs=2)


onnx_custom.register_custom_op_symbolic("tstyle::topk_last", topk_symbolic, 11, registry=registry)


class TopkLast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.tstyle.topk_last(x, 3, False)


# -- 8. normalize: fs/fs/s codes, custom node, registered with torch and imported -------------


@torch.library.custom_op("tstyle::normalize", mutates_args=())
def normalize(x: torch.Tensor, mean: list[float], std: list[float], layout: str) -> torch.Tensor:
    shape = [1, -1, 1, 1] if layout == "NCHW" else [1, 1, 1, -1]
    return (x - torch.tensor(mean, dtype=x.dtype).view(shape)) / torch.tensor(
        std, dtype=x.dtype
    ).view(shape)


@normalize.register_fake
def _(x, mean, std, layout):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


@symbolic_helper.parse_args("v", "fs", "fs", "s")
def normalize_symbolic(g, img, mean, std, layout):  # type: ignore[no-untyped-def]
    return g.op("mmdeploy::Normalize", img, mean_f=mean, std_f=std, layout_s=layout)


@kernels.kernel(
    "mmdeploy::Normalize",
    inputs=["img"],
    outputs=["out"],
    attrs={"mean": "floats", "std": "floats", "layout": "string"},
    shape_fn="like:img",
)
def normalize_kernel(img, *, mean, std, layout):  # type: ignore[no-untyped-def]
    out = np.empty_like(img)
    channels = img.shape[1] if layout == "NCHW" else img.shape[3]
    for ch in range(channels):
        index = (slice(None), ch) if layout == "NCHW" else (..., ch)
        out[index] = ((img[index].astype(np.float64) - mean[ch]) / std[ch]).astype(img.dtype)
    return out


class Normalize(torch.nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "NHWC":
            x = x.permute(0, 2, 3, 1)  # a non-contiguous input to the op
        return torch.ops.tstyle.normalize(x, [0.5, -0.25, 1.0], [0.2, 2.0, 0.5], self.layout)


# -- 9. weighted_sum: a Tensor[] unpacked the way torch's cat/stack symbolics do, Tensor?, fs ------


@torch.library.custom_op("tstyle::weighted_sum", mutates_args=())
def weighted_sum(
    xs: list[torch.Tensor], bias: torch.Tensor | None, weights: list[float]
) -> torch.Tensor:
    out = torch.zeros_like(xs[0])
    for x, w in zip(xs, weights, strict=True):
        out += w * x
    return out if bias is None else out + bias


@weighted_sum.register_fake
def _(xs, bias, weights):  # type: ignore[no-untyped-def]
    return torch.empty_like(xs[0])


@symbolic_helper.parse_args("v", "v", "fs")
def weighted_sum_symbolic(g, tensors, bias, weights):  # type: ignore[no-untyped-def]
    # torch's own idiom for a Tensor[] argument (symbolic_opset9.cat/stack): one packed value
    assert symbolic_helper._is_packed_list(tensors) and symbolic_helper._is_tensor_list(tensors)
    stacked = g.op(
        "Concat",
        *(
            symbolic_helper._unsqueeze_helper(g, t, [0])
            for t in symbolic_helper._unpack_list(tensors)
        ),
        axis_i=0,
    )
    shape = g.op(
        "Constant",
        value_t=torch.tensor([-1] + [1] * (symbolic_helper._get_tensor_rank(tensors[0]) or 0)),
    )
    scale = g.op("Reshape", g.op("Constant", value_t=torch.tensor(weights)), shape)
    out = symbolic_helper._reducesum_helper(
        g, g.op("Mul", stacked, scale), axes_i=[0], keepdims_i=0
    )
    return out if symbolic_helper._is_none(bias) else g.op("Add", out, bias)


def weighted_sum_iterating(g, tensor_list, bias_value, weight_list):  # type: ignore[no-untyped-def]
    # the other way a user writes it: iterate the argument (and read the weights as a Python list)
    out = None
    for t, w in zip(tensor_list, symbolic_helper._maybe_get_const(weight_list, "fs"), strict=True):
        term = g.op("Mul", t, g.op("Constant", value_t=torch.tensor(w)))
        out = term if out is None else g.op("Add", out, term)
    return out if symbolic_helper._is_none(bias_value) else g.op("Add", out, bias_value)


onnx_custom.symbolic("tstyle::weighted_sum", opset=13, registry=registry)(weighted_sum_symbolic)


class WeightedSum(torch.nn.Module):
    def __init__(self, with_bias: bool) -> None:
        super().__init__()
        self.with_bias = with_bias

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        bias = c[:, :1] if self.with_bias else None  # a sliced (non-contiguous) Tensor? argument
        return torch.ops.tstyle.weighted_sum([a, b.t().t(), c], bias, [0.5, 2.0, -1.25])


def _three(n: int = 3) -> tuple[torch.Tensor, ...]:
    return torch.randn(n, 4), torch.randn(n, 4), torch.randn(n, 4)


@pytest.fixture(scope="module", autouse=True)
def _normalize_registered_with_torch() -> Any:
    """tstyle::normalize is registered the way a user already has it: with torch."""
    table = ts_registration.registry._registry
    torch.onnx.register_custom_op_symbolic("tstyle::normalize", normalize_symbolic, 9)
    try:
        onnx_custom.import_torch_symbolics("tstyle::normalize", registry=registry)
        yield
    finally:
        table.pop("tstyle::normalize", None)  # torch's unregister leaves an empty group behind


# -- the table ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    model: Callable[[], torch.nn.Module]
    args: Callable[[], tuple[Any, ...]]
    dynamic: dict[str, dict[int, str]]
    opset: int = 17  # TorchScript; dynamo exports at max(opset, 18)
    inputs: Callable[[int, tuple[Any, ...]], tuple[Any, ...]] | None = None
    emits: tuple[str, ...] = ()  # node types the file must contain
    tol: tuple[float, float] | None = None


def _dcn_args(n: int = 2) -> tuple[Any, ...]:
    return torch.randn(n, 2, 6, 6), torch.randn(n, 18, 6, 6), torch.rand(n, 9, 6, 6)


CASES = [
    Case(
        "roi_align-avg-x[2,3,8,8]-rois[5,5]",
        lambda: RoiAlign("avg", True),
        lambda: (torch.randn(2, 3, 8, 8), _rois(2, 5, 8)),
        {"x": {0: "batch"}, "rois": {0: "num_rois"}},
        inputs=_roi_inputs,
        emits=("MMCVRoiAlign",),
    ),
    Case(
        "roi_align-max-unaligned-x[1,2,6,7]-rois[3,5]",
        lambda: RoiAlign("max", False),
        lambda: (torch.randn(1, 2, 6, 7), _rois(1, 3, 6)),
        {"rois": {0: "num_rois"}},
        inputs=_roi_inputs,
        emits=("MMCVRoiAlign",),
    ),
    Case(
        "nms-boxes[12,4]",
        Nms,
        lambda: _nms_inputs(0, (torch.empty(12),)),
        {"boxes": {0: "n"}, "scores": {0: "n"}},
        inputs=_nms_inputs,
        emits=("NonMaxSuppression", "ScatterElements"),
    ),
    Case(
        "grid_sampler-x[2,3,5,6]-grid[2,4,3,2]",
        GridSampler,
        lambda: _grid_inputs(0, (torch.empty(2, 3, 5, 6), torch.empty(2, 4, 3, 2))),
        {"x": {0: "batch"}, "grid": {0: "batch"}},
        inputs=_grid_inputs,
        emits=("GridSample",),
    ),
    Case(
        "modulated_deform_conv-bias-x[2,2,6,6]",
        lambda: ModulatedDeformConv(True),
        _dcn_args,
        {"x": {0: "batch"}, "offset": {0: "batch"}, "mask": {0: "batch"}},
        opset=19,
        inputs=_dcn_inputs,
        emits=("DeformConv",),
        tol=(1e-4, 1e-5),
    ),
    Case(
        "modulated_deform_conv-nobias-x[1,2,6,6]",
        lambda: ModulatedDeformConv(False),
        lambda: _dcn_args(1),
        {},
        opset=19,
        inputs=_dcn_inputs,
        emits=("DeformConv",),
        tol=(1e-4, 1e-5),
    ),
    Case(
        "delta2bbox-stds-deltas[7,4]",
        lambda: Delta2Bbox(True),
        lambda: _box_inputs(0, (torch.empty(7, 4),)),
        {"deltas": {0: "n"}, "anchors": {0: "n"}},
        inputs=_box_inputs,
        emits=("DeltaDecode",),
    ),
    Case(
        "delta2bbox-none-deltas[4,4]",
        lambda: Delta2Bbox(False),
        lambda: _box_inputs(0, (torch.empty(4, 4),)),
        {"deltas": {0: "n"}, "anchors": {0: "n"}},
        inputs=_box_inputs,
        emits=("DeltaDecode",),
    ),
    Case(
        "scaled_softmax-x[3,5]",
        ScaledSoftmax,
        lambda: (torch.randn(3, 5),),
        {"x": {0: "batch"}},
        emits=("Softmax", "Mul"),
    ),
    Case(
        "scaled_softmax-float64-x[2,4,5]",
        ScaledSoftmax,
        lambda: (torch.randn(2, 4, 5, dtype=torch.float64),),
        {"x": {0: "batch", 1: "rows"}},
        emits=("Softmax",),
    ),
    Case(
        "topk-x[4,9]", TopkLast, lambda: (torch.randn(4, 9),), {"x": {0: "batch"}}, emits=("TopK",)
    ),
    Case(
        "normalize-NCHW-x[2,3,4,5]",
        lambda: Normalize("NCHW"),
        lambda: (torch.randn(2, 3, 4, 5),),
        {"x": {0: "batch", 2: "h"}},
        emits=("Normalize",),
    ),
    Case(
        "weighted_sum-unpack_list-bias-3x[3,4]",
        lambda: WeightedSum(True),
        _three,
        {"a": {0: "n"}, "b": {0: "n"}, "c": {0: "n"}},
        opset=13,
        emits=("Concat", "ReduceSum"),
    ),
    Case(
        "weighted_sum-unpack_list-none-3x[3,4]",
        lambda: WeightedSum(False),
        _three,
        {"a": {0: "n"}, "b": {0: "n"}, "c": {0: "n"}},
        opset=13,
        emits=("Concat", "ReduceSum"),
    ),
    Case(
        "normalize-NHWC-permuted-x[2,3,4,5]",
        lambda: Normalize("NHWC"),
        lambda: (torch.randn(2, 3, 4, 5),),
        {"x": {0: "batch"}},
        emits=("Normalize",),
    ),
]


def _has_deform_conv_op() -> bool:
    try:
        from onnx_custom.ops.deform_conv import load_extension

        load_extension()
    except Exception:
        return False
    return True


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_style_symbolic_exports_and_verifies(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    if case.emits == ("DeformConv",) and not _has_deform_conv_op():
        pytest.skip("onnx_custom's deform_conv2d C++ op (the eager side) could not be built here")
    model, args = case.model(), case.args()
    path = tmp_path / "model.onnx"
    opset = case.opset if exporter == "torchscript" else max(case.opset, 18)
    onnx_custom.export(
        model,
        args,
        path,
        exporter=exporter,
        opset=opset,
        registry=registry,
        dynamic_shapes=case.dynamic or None,
    )
    proto = onnx.load(path)
    node_types = {n.op_type for n in proto.graph.node}
    assert set(case.emits) <= node_types, node_types
    rtol, atol = case.tol or (None, None)
    report = onnx_custom.verify(
        model,
        args,
        path,
        trials=2,
        kernels=kernels,
        input_generator=case.inputs,
        rtol=rtol,
        atol=atol,
    )
    assert report.passed
    if case.dynamic:
        other = [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"]
        assert other, [t.describe() for t in report.shapes_tried]  # verified at other sizes too


def test_each_registration_route_made_a_torch_style_entry() -> None:
    from onnx_custom.translate.torch_style import TORCH_STYLE_MARK

    for name in (
        "tstyle::roi_align",
        "tstyle::nms_mask",
        "tstyle::grid_sampler",
        "tstyle::normalize",
    ):
        (entry,) = registry.entries_for(name)
        entry = registry.lookup(
            name, entry.opset
        )  # free-named functions are recognised once the op exists
        assert getattr(entry.fn, TORCH_STYLE_MARK, None) is not None, name


def test_the_same_function_registered_with_torch_runs_in_torch_too(tmp_path: Path) -> None:
    """The imported symbolic is still torch's: torch.onnx.export alone (no onnx_custom scope)
    exports the same node, so onnx-custom did not change the function."""
    path = tmp_path / "torch.onnx"
    torch.onnx.export(
        Normalize("NCHW"), (torch.randn(1, 3, 2, 2),), str(path), dynamo=False, opset_version=13
    )
    (node,) = [n for n in onnx.load(path).graph.node if n.domain == "mmdeploy"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["layout"] == b"NCHW" and list(attrs["mean"]) == pytest.approx([0.5, -0.25, 1.0])


def test_contract_register_custom_op_symbolic_into_the_default_registry(tmp_path: Path) -> None:
    """The contract: torch's signature, the default registry,
    `onnx_custom.export` with both exporters."""
    onnx_custom.register_custom_op_symbolic("tstyle::topk_last", topk_symbolic, 11)
    try:
        for exporter in ("torchscript", "dynamo"):
            path = tmp_path / f"{exporter}.onnx"
            x = torch.randn(3, 7)
            onnx_custom.export(
                TopkLast(), (x,), path, exporter=exporter, dynamic_shapes={"x": {0: "batch"}}
            )
            assert onnx_custom.verify(TopkLast(), (x,), path).passed
    finally:
        onnx_custom.unregister_custom_op_symbolic("tstyle::topk_last", 11)
    assert "tstyle::topk_last" not in onnx_custom.default_registry()


def test_import_torch_symbolics_without_names_copies_the_users_not_ours() -> None:
    ours = {str(t) for t in onnx_custom.default_registry().targets()}
    target = onnx_custom.Registry()
    with onnx_custom.registered():  # our own symbolics sit in torch's table meanwhile
        entries = onnx_custom.import_torch_symbolics(registry=target)
    names = {str(e.target) for e in entries}
    assert "tstyle::normalize" in names
    assert not names & ours, names & ours


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_tensor_list_argument_can_also_be_iterated(exporter: str, tmp_path: Path) -> None:
    """A Tensor[] argument is torch's packed value and a Python list at once: a symbolic that
    iterates it (and zips it with the weights) exports and verifies too."""
    local = registry.copy()
    local.symbolic("tstyle::weighted_sum", opset=13, replace=True)(weighted_sum_iterating)
    path, args = tmp_path / "m.onnx", _three(2)
    onnx_custom.export(
        WeightedSum(True),
        args,
        path,
        exporter=exporter,
        registry=local,
        dynamic_shapes={"a": {0: "n"}, "b": {0: "n"}, "c": {0: "n"}},
    )
    assert onnx_custom.verify(WeightedSum(True), args, path).passed


def test_a_tensor_list_argument_refuses_other_torchscript_ir_by_name(tmp_path: Path) -> None:
    def reads_ir(g, tensor_list, bias_value, weight_list):  # type: ignore[no-untyped-def]
        return tensor_list.node().output()

    local = registry.copy()
    local.symbolic("tstyle::weighted_sum", opset=13, replace=True)(reads_ir)
    with pytest.raises(
        onnx_custom.SymbolicError,
        match=r"node\(\)\.output\(\) on a Tensor\[\] argument.*_unpack_list",
    ):
        onnx_custom.export(
            WeightedSum(False), _three(2), tmp_path / "m.onnx", exporter="dynamo", registry=local
        )


# -- torch's own helpers and symbolics called from a user's symbolic, under both exporters -------


@torch.library.custom_op("tstyle::gated", mutates_args=())
def gated(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) * y


@gated.register_fake
def _(x, y):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


def _gated_with_sizes(g, x, y):  # type: ignore[no-untyped-def]
    out = g.op("Mul", g.op("Sigmoid", x), y)
    out.setType(
        x.type().with_sizes(symbolic_helper._get_tensor_sizes(x)).with_dtype(torch.float32)
    )  # mmcv's idiom
    return out


def _gated_size_helper(g, x, y):  # type: ignore[no-untyped-def]
    # _size_helper -> opset9.select reads the index Constant back with _get_const: under dynamo a
    # Constant built by g.op must answer as torch's onnx::Constant node
    rows = symbolic_helper._size_helper(g, x, g.op("Constant", value_t=torch.tensor(0)))
    shape = g.op(
        "Concat",
        symbolic_helper._unsqueeze_helper(g, rows, [0]),
        g.op("Constant", value_t=torch.tensor([-1])),
        axis_i=0,
    )
    return g.op("Mul", g.op("Sigmoid", symbolic_helper._reshape_helper(g, x, shape)), y)


def _gated_get_const(g, x, y):  # type: ignore[no-untyped-def]
    half = g.op("Constant", value_t=torch.tensor(0.5))
    assert (
        symbolic_helper._is_constant(half) and symbolic_helper._get_const(half, "f", "half") == 0.5
    )
    assert not symbolic_helper._is_constant(x)
    scale = g.op(
        "Constant", value_t=torch.tensor(symbolic_helper._get_const(half, "f", "half") * 2)
    )
    return g.op("Mul", g.op("Sigmoid", x), g.op("Mul", y, scale))


def _gated_torch_symbolics(g, x, y):  # type: ignore[no-untyped-def]
    # torch's own symbolics called from a user's: opset11.squeeze builds an If unless it knows
    # the squeezed dim is 1, so the Unsqueeze before it must get its output shape under dynamo too
    from torch.onnx import symbolic_opset9, symbolic_opset11

    y = symbolic_opset11.squeeze(g, symbolic_opset11.unsqueeze(g, y, 0), 0)
    x = symbolic_opset9.transpose(g, symbolic_opset9.transpose(g, x, 0, 1), 0, 1)
    return symbolic_opset9.mul(g, symbolic_opset9.sigmoid(g, x), y)


class Gated(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.tstyle.gated(x, y)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(
    "symbolic",
    [_gated_with_sizes, _gated_size_helper, _gated_get_const, _gated_torch_symbolics],
    ids=lambda f: f.__name__.removeprefix("_gated_"),
)
def test_torch_helpers_work_on_our_values(
    symbolic: Callable[..., Any], exporter: str, tmp_path: Path
) -> None:
    local = registry.copy()
    onnx_custom.register_custom_op_symbolic("tstyle::gated", symbolic, 13, registry=local)
    path, args = tmp_path / "m.onnx", (torch.randn(3, 5), torch.randn(3, 5))
    onnx_custom.export(
        Gated(),
        args,
        path,
        exporter=exporter,
        registry=local,
        dynamic_shapes={"x": {0: "n"}, "y": {0: "n"}},
    )
    report = onnx_custom.verify(Gated(), args, path)
    assert report.passed and any(
        t.kind == "shape" and t.status == "passed" for t in report.shapes_tried
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_torch_control_flow_helpers_are_refused_with_the_fix(exporter: str, tmp_path: Path) -> None:
    from torch.onnx._internal.torchscript_exporter import jit_utils

    def branches(g, x, y):  # type: ignore[no-untyped-def]
        jit_utils.add_op_with_blocks(
            g, "If", g.op("Constant", value_t=torch.tensor(True)), n_blocks=2
        )

    local = registry.copy()
    onnx_custom.register_custom_op_symbolic("tstyle::gated", branches, 13, registry=local)
    with pytest.raises(
        onnx_custom.SymbolicError,
        match=r"g.op\('If'\) without its subgraph.*add_op_with_blocks.*Fix:",
    ):
        onnx_custom.export(
            Gated(),
            (torch.randn(2, 3), torch.randn(2, 3)),
            tmp_path / "m.onnx",
            exporter=exporter,
            registry=local,
        )

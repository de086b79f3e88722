"""Symbolic functions written the way published detection code writes them (torchvision's
``_register_onnx_ops``, mmcv 1.x ``symbolic`` methods, mmdeploy's rewrites; written here for this
project), registered unchanged for the opset their authors chose and exported by BOTH exporters
at later opsets. Each file runs in ONNX Runtime at its export sizes and at other sizes of its
dynamic dims, against a slow reference written independently in torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.onnx import symbolic_helper

import onnx_custom
from onnx_custom.runtime import KernelRegistry

EXPORTERS = ["torchscript", "dynamo"]


def _registry() -> onnx_custom.Registry:
    return onnx_custom.default_registry().copy()


def _ort(path: Path, *inputs: torch.Tensor) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs, strict=True)}
    return session.run(None, feeds)


def _export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    path: Path,
    exporter: str,
    opset: int,
    registry: onnx_custom.Registry,
    dynamic: dict[str, dict[int, str]] | None = None,
) -> onnx.ModelProto:
    return onnx_custom.export(
        model,
        args,
        path,
        exporter=exporter,
        opset=opset,
        registry=registry,
        dynamic_shapes=dynamic,
    )


def _check_sizes(
    path: Path,
    reference: Callable[..., torch.Tensor],
    inputs: list[tuple[torch.Tensor, ...]],
) -> None:
    for args in inputs:
        (got,) = _ort(path, *args)[:1]
        torch.testing.assert_close(torch.from_numpy(got), reference(*args))


# -- RoiAlign registered for opset 11 (torchvision style), exported at 16+ ----------------------


def roi_align_reference(
    x: torch.Tensor, rois: torch.Tensor, scale: float, out_h: int, out_w: int, ratio: int
) -> torch.Tensor:
    """Slow RoiAlign without the half-pixel offset (the opset-10 op, torchvision aligned=False):
    each bin averages ratio x ratio bilinear samples; a roi is at least 1 x 1."""
    _, c, h, w = x.shape
    out = torch.zeros(rois.shape[0], c, out_h, out_w, dtype=x.dtype)

    def sample(plane: torch.Tensor, y: float, xx: float) -> torch.Tensor:
        if y < -1.0 or y > h or xx < -1.0 or xx > w:
            return plane.new_zeros(())
        y, xx = max(y, 0.0), max(xx, 0.0)
        y0, x0 = int(y), int(xx)
        if y0 >= h - 1:
            y0 = y1 = h - 1
            y = float(y0)
        else:
            y1 = y0 + 1
        if x0 >= w - 1:
            x0 = x1 = w - 1
            xx = float(x0)
        else:
            x1 = x0 + 1
        ly, lx = y - y0, xx - x0
        return (
            plane[y0, x0] * (1 - ly) * (1 - lx)
            + plane[y0, x1] * (1 - ly) * lx
            + plane[y1, x0] * ly * (1 - lx)
            + plane[y1, x1] * ly * lx
        )

    for k, roi in enumerate(rois.tolist()):
        b = int(roi[0])
        x1, y1, x2, y2 = (v * scale for v in roi[1:])
        rh, rw = max(y2 - y1, 1.0), max(x2 - x1, 1.0)
        bh, bw = rh / out_h, rw / out_w
        for ch in range(c):
            plane = x[b, ch]
            for i in range(out_h):
                for j in range(out_w):
                    total = plane.new_zeros(())
                    for iy in range(ratio):
                        for ix in range(ratio):
                            yy = y1 + i * bh + (iy + 0.5) * bh / ratio
                            xx = x1 + j * bw + (ix + 0.5) * bw / ratio
                            total = total + sample(plane, yy, xx)
                    out[k, ch, i, j] = total / (ratio * ratio)
    return out


@torch.library.custom_op("rwsym::roi_align", mutates_args=())
def roi_align(
    x: torch.Tensor,
    rois: torch.Tensor,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> torch.Tensor:
    return roi_align_reference(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio)


@roi_align.register_fake
def _(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):  # type: ignore[no-untyped-def]
    return x.new_empty(rois.shape[0], x.shape[1], pooled_height, pooled_width)


@symbolic_helper.parse_args("v", "v", "f", "i", "i", "i", "i")
def roi_align_opset11(
    g, x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned
):  # type: ignore[no-untyped-def]
    # the batch index column, squeezed and cast; the box columns
    index = g.op("Constant", value_t=torch.tensor([0], dtype=torch.long))
    batch = g.op("Gather", rois, index, axis_i=1)
    batch = g.op("Cast", g.op("Squeeze", batch, axes_i=[1]), to_i=7)
    boxes = g.op("Gather", rois, g.op("Constant", value_t=torch.tensor([1, 2, 3, 4])), axis_i=1)
    return g.op(
        "RoiAlign",
        x,
        boxes,
        batch,
        spatial_scale_f=spatial_scale,
        output_height_i=pooled_height,
        output_width_i=pooled_width,
        sampling_ratio_i=sampling_ratio,
    )


class RoiAlignModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.roi_align(x, rois, 0.5, 3, 2, 2, False)


def _rois(n: int, k: int, size: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(k, 2, generator=gen) * size
    wh = torch.rand(k, 2, generator=gen) * size + 1.0
    batch = torch.randint(0, n, (k, 1), generator=gen).float()
    return torch.cat([batch, xy, xy + wh], dim=1)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_roi_align_registered_at_11_keeps_its_sampling_when_lifted(
    exporter: str, tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::roi_align", roi_align_opset11, 11, registry=reg)
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 10, 12), _rois(2, 4, 14.0, 0))
    path = tmp_path / "roi_align.onnx"
    opset = 16 if exporter == "torchscript" else 18
    proto = _export(RoiAlignModel(), args, path, exporter, opset, reg, {"rois": {0: "k"}})
    (node,) = [n for n in proto.graph.node if n.op_type == "RoiAlign"]
    modes = [a.s for a in node.attribute if a.name == "coordinate_transformation_mode"]
    assert modes == [b"output_half_pixel"]
    sizes = [args, (torch.randn(2, 3, 10, 12), _rois(2, 7, 14.0, 1))]
    _check_sizes(path, lambda x, r: roi_align_reference(x, r, 0.5, 3, 2, 2), sizes)


# -- Resize registered for opset 10 ((X, scales), asymmetric), exported at 11+ ------------------


def upsample_reference(x: torch.Tensor, factor: int, mode: str) -> torch.Tensor:
    """Opset-10 Resize by an integer factor over H and W: source coordinate out / factor
    (asymmetric); nearest takes its floor, linear interpolates (clamped at the border)."""
    n, c, h, w = x.shape
    out = torch.zeros(n, c, h * factor, w * factor, dtype=x.dtype)
    for i in range(h * factor):
        for j in range(w * factor):
            sy, sx = i / factor, j / factor
            y0, x0 = math.floor(sy), math.floor(sx)
            if mode == "nearest":
                out[:, :, i, j] = x[:, :, y0, x0]
                continue
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            ly, lx = sy - y0, sx - x0
            out[:, :, i, j] = (
                x[:, :, y0, x0] * (1 - ly) * (1 - lx)
                + x[:, :, y0, x1] * (1 - ly) * lx
                + x[:, :, y1, x0] * ly * (1 - lx)
                + x[:, :, y1, x1] * ly * lx
            )
    return out


@torch.library.custom_op("rwsym::upsample", mutates_args=())
def upsample(x: torch.Tensor, factor: int, mode: str) -> torch.Tensor:
    return upsample_reference(x, factor, mode)


@upsample.register_fake
def _(x, factor, mode):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape[0], x.shape[1], x.shape[2] * factor, x.shape[3] * factor)


@symbolic_helper.parse_args("v", "i", "s")
def upsample_opset10(g, x, factor, mode):  # type: ignore[no-untyped-def]
    scales = g.op("Constant", value_t=torch.tensor([1.0, 1.0, factor, factor]))
    return g.op("Resize", x, scales, mode_s=mode)


class Upsample(torch.nn.Module):
    def __init__(self, mode: str, factor: int = 2) -> None:
        super().__init__()
        self.mode, self.factor = mode, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.upsample(x, self.factor, self.mode)


# Factor 3 tells each of opset 10's nearest attributes apart from opset 11's defaults (at factor 2
# asymmetric + floor and half_pixel + round_prefer_floor pick the same pixels; at 3 a mix does not).
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    ("mode", "factor"),
    [("nearest", 2), ("nearest", 3), ("linear", 2)],
    ids=lambda v: str(v) if isinstance(v, str) else f"x{v}-x[2,3,4,5]",
)
def test_resize_registered_at_10_keeps_its_coordinates_when_lifted(
    exporter: str, mode: str, factor: int, tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::upsample", upsample_opset10, 10, registry=reg)
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 4, 5),)
    path = tmp_path / "resize.onnx"
    opset = 11 if exporter == "torchscript" else 18
    model = Upsample(mode, factor)
    _export(model, args, path, exporter, opset, reg, {"x": {0: "n", 2: "h", 3: "w"}})
    sizes = [args, (torch.randn(1, 3, 3, 6),)]
    _check_sizes(path, lambda x: upsample_reference(x, factor, mode), sizes)


# -- Softmax registered for opset 11 (normalises the input flattened at axis) ------------------


def flat_softmax_reference(x: torch.Tensor, axis: int) -> torch.Tensor:
    """Opset-11 Softmax: exp over everything from ``axis`` on, normalised together."""
    lead = int(np.prod(x.shape[:axis]))
    flat = x.reshape(lead, -1).double()
    e = (flat - flat.max(dim=1, keepdim=True).values).exp()
    return (e / e.sum(dim=1, keepdim=True)).to(x.dtype).reshape(x.shape)


@torch.library.custom_op("rwsym::score_softmax", mutates_args=())
def score_softmax(x: torch.Tensor, axis: int) -> torch.Tensor:
    return flat_softmax_reference(x, axis)


@score_softmax.register_fake
def _(x, axis):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


@symbolic_helper.parse_args("v", "i")
def score_softmax_opset11(g, x, axis):  # type: ignore[no-untyped-def]
    return g.op("Softmax", x, axis_i=axis)


class ScoreSoftmax(torch.nn.Module):
    def __init__(self, axis: int) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.score_softmax(x, self.axis)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("axis", [1, 3], ids=lambda a: f"axis{a}-x[2,3,4,5]")
def test_softmax_registered_at_11_keeps_its_flattening_when_lifted(
    exporter: str, axis: int, tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        "rwsym::score_softmax", score_softmax_opset11, 11, registry=reg
    )
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 4, 5),)
    path = tmp_path / "softmax.onnx"
    opset = 13 if exporter == "torchscript" else 18
    _export(ScoreSoftmax(axis), args, path, exporter, opset, reg, {"x": {0: "n", 2: "h"}})
    sizes = [args, (torch.randn(3, 3, 6, 5),)]
    _check_sizes(path, lambda x: flat_softmax_reference(x, axis), sizes)


# -- GridSample registered for opset 16 (mode "bilinear"), exported at 20 ---------------------


def grid_sample_reference(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Bilinear sampling, zeros padding, align_corners=False, one output pixel at a time."""
    n, c, h, w = x.shape
    _, oh, ow, _ = grid.shape
    out = torch.zeros(n, c, oh, ow, dtype=x.dtype)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                gx, gy = grid[b, i, j].tolist()
                px, py = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
                x0, y0 = math.floor(px), math.floor(py)
                for yy, xx in ((y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)):
                    if 0 <= yy < h and 0 <= xx < w:
                        weight = (1 - abs(py - yy)) * (1 - abs(px - xx))
                        out[b, :, i, j] += x[b, :, yy, xx] * weight
    return out


@torch.library.custom_op("rwsym::bilinear_sample", mutates_args=())
def bilinear_sample(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return grid_sample_reference(x, grid)


@bilinear_sample.register_fake
def _(x, grid):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape[0], x.shape[1], grid.shape[1], grid.shape[2])


def bilinear_sample_opset16(g, x, grid):  # type: ignore[no-untyped-def]
    return g.op("GridSample", x, grid, mode_s="bilinear", padding_mode_s="zeros", align_corners_i=0)


class BilinearSample(torch.nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.bilinear_sample(x, grid)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_grid_sample_registered_at_16_gets_its_mode_renamed_at_20(
    exporter: str, tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        "rwsym::bilinear_sample", bilinear_sample_opset16, 16, registry=reg
    )
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 5, 6), torch.rand(2, 4, 3, 2) * 2.2 - 1.1)
    path = tmp_path / "grid_sample.onnx"
    _export(BilinearSample(), args, path, exporter, 20, reg, {"x": {0: "n"}, "grid": {0: "n"}})
    sizes = [args, (torch.randn(3, 3, 5, 6), torch.rand(3, 4, 3, 2) * 2.2 - 1.1)]
    _check_sizes(path, grid_sample_reference, sizes)


# -- GroupNormalization registered for opset 18 (scale per group): refused at 21 ----------------


@torch.library.custom_op("rwsym::group_norm18", mutates_args=())
def group_norm18(x: torch.Tensor, groups: int) -> torch.Tensor:
    return torch.nn.functional.group_norm(x, groups)


@group_norm18.register_fake
def _(x, groups):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


@symbolic_helper.parse_args("v", "i")
def group_norm_opset18(g, x, groups):  # type: ignore[no-untyped-def]
    ones = g.op("Constant", value_t=torch.ones(groups))
    zeros = g.op("Constant", value_t=torch.zeros(groups))
    return g.op("GroupNormalization", x, ones, zeros, num_groups_i=groups, epsilon_f=1e-5)


class GroupNorm18(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.group_norm18(x, 2)


def test_group_normalization_registered_at_18_is_refused_at_21_with_the_fix(
    tmp_path: Path,
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        "rwsym::group_norm18", group_norm_opset18, 18, registry=reg
    )
    with pytest.raises(onnx_custom.SymbolicError, match=r"per channel.*per group.*Fix: export at"):
        _export(GroupNorm18(), (torch.randn(1, 4, 3, 3),), tmp_path / "g.onnx", "dynamo", 21, reg)


def test_every_default_change_in_onnx_history_is_classified() -> None:
    """onnx.defs history: each attribute whose default changed or appeared with a default
    between two versions of an op (from opset 7 on) is either kept to its old meaning when
    lifted or on the list of defaults that say what the older op did."""
    from onnx_custom.translate.opset_lift import KEEPS_MEANING, MEANING_CHANGES

    history: dict[str, list[Any]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            history.setdefault(schema.name, []).append(schema)

    def default(attr: Any) -> Any:
        value = attr.default_value
        return None if value is None or value.type == 0 else onnx.helper.get_attribute_value(value)

    unclassified = []
    for name, schemas in history.items():
        schemas.sort(key=lambda s: s.since_version)
        for old, new in itertools.pairwise(schemas):
            if old.since_version < 7:
                continue
            before = {k: default(v) for k, v in old.attributes.items()}
            changed = [
                k
                for k, v in new.attributes.items()
                if (k in before and before[k] != default(v))
                or (k not in before and not v.required and default(v) is not None)
            ]
            key = (name, new.since_version)
            if changed and key not in MEANING_CHANGES and key not in KEEPS_MEANING:
                unclassified.append((key, changed))
    assert not unclassified


# -- group_norm through a custom instance-norm node on a reshaped input (mmdeploy style) --------

plugin_kernels = KernelRegistry()


def group_norm_reference(
    x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """Group norm one (sample, group) at a time: mean and biased variance over its channels and
    pixels, then the per-channel affine."""
    n, c = x.shape[:2]
    out = torch.empty_like(x)
    per = c // groups
    for b in range(n):
        for grp in range(groups):
            part = x[b, grp * per : (grp + 1) * per].double()
            mean = part.sum() / part.numel()
            var = ((part - mean) ** 2).sum() / part.numel()
            out[b, grp * per : (grp + 1) * per] = ((part - mean) / (var + eps).sqrt()).to(x.dtype)
    shape = (1, c) + (1,) * (x.dim() - 2)
    return out * weight.reshape(shape) + bias.reshape(shape)


@torch.library.custom_op("rwsym::group_norm", mutates_args=())
def group_norm(
    x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    return group_norm_reference(x, groups, weight, bias, eps)


@group_norm.register_fake
def _(x, groups, weight, bias, eps):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


@plugin_kernels.kernel(
    "rwplugin::InstanceNormPlugin",
    inputs=["x"],
    outputs=["y"],
    attrs={"epsilon": "float"},
)
def instance_norm_plugin(x, *, epsilon):  # type: ignore[no-untyped-def]
    wide = x.astype(np.float64)
    mean = wide.mean(axis=-1, keepdims=True)
    var = wide.var(axis=-1, keepdims=True)
    return ((wide - mean) / np.sqrt(var + epsilon)).astype(x.dtype)


@symbolic_helper.parse_args("v", "i", "v", "v", "f")
def group_norm_via_instance_norm(g, x, groups, weight, bias, eps):  # type: ignore[no-untyped-def]
    shape = g.op("Shape", x)
    batch = g.op("Gather", shape, g.op("Constant", value_t=torch.tensor([0])), axis_i=0)
    rest = g.op("Constant", value_t=torch.tensor([groups, -1]))
    grouped = g.op("Reshape", x, g.op("Concat", batch, rest, axis_i=0))
    normed = g.op("rwplugin::InstanceNormPlugin", grouped, epsilon_f=eps)
    back = g.op("Reshape", normed, shape)
    scale = g.op("Unsqueeze", weight, axes_i=[1, 2])
    shift = g.op("Unsqueeze", bias, axes_i=[1, 2])
    return g.op("Add", g.op("Mul", back, scale), shift)


class GroupNormModel(torch.nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.groups = groups
        gen = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.rand(channels, generator=gen) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(channels, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.group_norm(x, self.groups, self.weight, self.bias, 1e-5)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_inner_custom_node_is_not_given_the_ops_output_shape(exporter: str, tmp_path: Path) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        "rwsym::group_norm", group_norm_via_instance_norm, 11, registry=reg
    )
    torch.manual_seed(0)
    model, args = GroupNormModel(4, 2), (torch.randn(2, 4, 5, 5),)
    path = tmp_path / "group_norm.onnx"
    opset = 17 if exporter == "torchscript" else 18
    _export(model, args, path, exporter, opset, reg, {"x": {0: "batch", 2: "h", 3: "w"}})
    report = onnx_custom.verify(model, args, path, trials=2, kernels=plugin_kernels)
    assert report.passed
    other = [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"]
    assert other, [t.describe() for t in report.shapes_tried]


# -- roi_pool returning (value, None) for the argmax nobody uses (torchvision style) ------------


def roi_pool_reference(
    x: torch.Tensor, rois: torch.Tensor, scale: float, out_h: int, out_w: int
) -> torch.Tensor:
    """Slow max RoI pooling: the roi rounded to pixels (at least 1 x 1), each bin the max over
    its pixels [floor(i * size / out), ceil((i + 1) * size / out)), 0 for an empty bin."""
    _, c, h, w = x.shape
    out = torch.zeros(rois.shape[0], c, out_h, out_w, dtype=x.dtype)
    for k, roi in enumerate(rois.tolist()):
        b = int(roi[0])
        x1, y1, x2, y2 = (math.floor(v * scale + 0.5) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for i in range(out_h):
            top = min(max(math.floor(i * rh / out_h) + y1, 0), h)
            bottom = min(max(math.ceil((i + 1) * rh / out_h) + y1, 0), h)
            for j in range(out_w):
                left = min(max(math.floor(j * rw / out_w) + x1, 0), w)
                right = min(max(math.ceil((j + 1) * rw / out_w) + x1, 0), w)
                if bottom > top and right > left:
                    out[k, :, i, j] = x[b, :, top:bottom, left:right].amax(dim=(1, 2))
    return out


@torch.library.custom_op("rwsym::roi_pool", mutates_args=())
def roi_pool(
    x: torch.Tensor, rois: torch.Tensor, scale: float, out_h: int, out_w: int
) -> tuple[torch.Tensor, torch.Tensor]:
    value = roi_pool_reference(x, rois, scale, out_h, out_w)
    return value, torch.zeros(value.shape, dtype=torch.int64)


@roi_pool.register_fake
def _(x, rois, scale, out_h, out_w):  # type: ignore[no-untyped-def]
    shape = (rois.shape[0], x.shape[1], out_h, out_w)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


@symbolic_helper.parse_args("v", "v", "f", "i", "i")
def roi_pool_opset11(g, x, rois, scale, out_h, out_w):  # type: ignore[no-untyped-def]
    pooled = g.op("MaxRoiPool", x, rois, pooled_shape_i=(out_h, out_w), spatial_scale_f=scale)
    return pooled, None  # the argmax: nothing downstream reads it


class RoiPoolModel(torch.nn.Module):
    def __init__(self, use_argmax: bool = False) -> None:
        super().__init__()
        self.use_argmax = use_argmax

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> Any:
        value, argmax = torch.ops.rwsym.roi_pool(x, rois, 0.5, 2, 3)
        return (value, argmax + 1) if self.use_argmax else value * 2


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_none_for_an_output_the_model_never_uses_is_accepted(exporter: str, tmp_path: Path) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::roi_pool", roi_pool_opset11, 11, registry=reg)
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 10, 12), _rois(2, 4, 14.0, 2))
    path = tmp_path / "roi_pool.onnx"
    opset = 17 if exporter == "torchscript" else 18
    _export(RoiPoolModel(), args, path, exporter, opset, reg, {"rois": {0: "k"}})
    sizes = [args, (torch.randn(2, 3, 10, 12), _rois(2, 6, 14.0, 3))]
    _check_sizes(path, lambda x, r: roi_pool_reference(x, r, 0.5, 2, 3) * 2, sizes)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_none_for_an_output_the_model_uses_is_refused_naming_it(
    exporter: str, tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::roi_pool", roi_pool_opset11, 11, registry=reg)
    args = (torch.randn(1, 3, 8, 8), _rois(1, 2, 10.0, 4))
    with pytest.raises(
        onnx_custom.SymbolicError, match=r"None as output 1 of 2, but the model uses"
    ):
        _export(RoiPoolModel(True), args, tmp_path / "r.onnx", exporter, 17, reg)


# -- the torch Value/Node/Type surface symbolics read (mmcv's adaptive pooling and others) ------


def adaptive_avg_pool_reference(x: torch.Tensor, out: list[int]) -> torch.Tensor:
    """Average over each output cell's input window [floor(i*H/o), ceil((i+1)*H/o))."""
    n, c, h, w = x.shape
    result = torch.zeros(n, c, out[0], out[1], dtype=x.dtype)
    for i in range(out[0]):
        top, bottom = (i * h) // out[0], -((-(i + 1) * h) // out[0])
        for j in range(out[1]):
            left, right = (j * w) // out[1], -((-(j + 1) * w) // out[1])
            result[:, :, i, j] = x[:, :, top:bottom, left:right].mean(dim=(2, 3))
    return result


@torch.library.custom_op("rwsym::adaptive_avg_pool", mutates_args=())
def adaptive_avg_pool(x: torch.Tensor, output_size: list[int]) -> torch.Tensor:
    return adaptive_avg_pool_reference(x, output_size)


@adaptive_avg_pool.register_fake
def _(x, output_size):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape[0], x.shape[1], output_size[0], output_size[1])


@symbolic_helper.parse_args("v", "is")
def adaptive_avg_pool_static(g, x, output_size):  # type: ignore[no-untyped-def]
    if output_size == [1] * len(output_size):
        return g.op("GlobalAveragePool", x)
    if not x.isCompleteTensor():
        raise NotImplementedError("adaptive pooling needs the input's sizes at export")
    sizes = x.type().sizes()[2:]
    strides = [int(s / o) for s, o in zip(sizes, output_size, strict=True)]
    kernel = [s - (o - 1) * st for s, o, st in zip(sizes, output_size, strides, strict=True)]
    return g.op("AveragePool", x, kernel_shape_i=kernel, strides_i=strides)


class AdaptivePool(torch.nn.Module):
    def __init__(self, out: list[int]) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.rwsym.adaptive_avg_pool(x, self.out)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(
    ("shape", "out"),
    [((2, 3, 8, 6), [4, 3]), ((1, 2, 9, 9), [3, 3]), ((2, 2, 5, 7), [1, 1])],
    ids=["x[2,3,8,6]-out[4,3]", "x[1,2,9,9]-out[3,3]", "x[2,2,5,7]-out[1,1]"],
)
def test_is_complete_tensor_and_sizes_drive_adaptive_pooling(
    exporter: str, shape: tuple[int, ...], out: list[int], tmp_path: Path
) -> None:
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        "rwsym::adaptive_avg_pool", adaptive_avg_pool_static, 11, registry=reg
    )
    torch.manual_seed(0)
    args = (torch.randn(*shape),)
    path = tmp_path / "pool.onnx"
    _export(AdaptivePool(out), args, path, exporter, 17 if exporter == "torchscript" else 18, reg)
    _check_sizes(path, lambda x: adaptive_avg_pool_reference(x, out), [args])


@torch.library.custom_op("rwsym::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


def _jit_scalar_type(x: Any) -> Any:
    from torch.onnx._internal.torchscript_exporter import _type_utils

    return _type_utils.JitScalarType.from_value(x) == _type_utils.JitScalarType.FLOAT


def _constant_node(g: Any) -> bool:
    c = g.op("Constant", value_t=torch.tensor([2.0, 3.0]))
    node = c.node()
    return (
        node.kind() == "onnx::Constant"
        and node.hasAttribute("value")
        and node.kindOf("value") == "t"
        and node.t("value").tolist() == [2.0, 3.0]
    )


# what each call answers for x: float32 [2, 3], a graph input (static shapes)
PROBES: dict[str, Callable[[Any, Any], bool]] = {
    "type().sizes()": lambda g, x: list(x.type().sizes()) == [2, 3],
    "type().varyingSizes()": lambda g, x: list(x.type().varyingSizes()) == [2, 3],
    "type().dim()": lambda g, x: x.type().dim() == 2,
    "type().scalarType()": lambda g, x: x.type().scalarType() == "Float",
    "type().dtype()": lambda g, x: x.type().dtype() == torch.float32,
    "type()-is-TensorType": lambda g, x: isinstance(x.type(), torch._C.TensorType),
    "isCompleteTensor()": lambda g, x: x.isCompleteTensor(),
    "node().kind()": lambda g, x: x.node().kind() not in ("onnx::Constant", "prim::Constant"),
    "debugName()": lambda g, x: isinstance(x.debugName(), str),
    "unique()": lambda g, x: isinstance(x.unique(), int),
    "requires_grad()": lambda g, x: x.requires_grad() in (False, True),
    "toIValue()": lambda g, x: x.toIValue() is None,
    "JitScalarType.from_value": lambda g, x: _jit_scalar_type(x),
    "_get_tensor_rank": lambda g, x: symbolic_helper._get_tensor_rank(x) == 2,
    "_is_tensor": lambda g, x: symbolic_helper._is_tensor(x),
    "_is_value": lambda g, x: symbolic_helper._is_value(x),
    "_is_none": lambda g, x: not symbolic_helper._is_none(x),
    "constant-node-t(value)": lambda g, x: _constant_node(g),
    "g.opset": lambda g, x: g.opset >= 11,
}


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("probe", list(PROBES))
def test_value_surface_answers_as_torchscript_does(
    exporter: str, probe: str, tmp_path: Path
) -> None:
    def symbolic(g, x):  # type: ignore[no-untyped-def]
        assert PROBES[probe](g, x), probe
        return g.op("Mul", x, g.op("Constant", value_t=torch.tensor(2.0)))

    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::twice", symbolic, 11, registry=reg)

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.rwsym.twice(x)

    args = (torch.randn(2, 3),)
    path = tmp_path / "twice.onnx"
    _export(Twice(), args, path, exporter, 17 if exporter == "torchscript" else 18, reg)
    _check_sizes(path, lambda x: x * 2, [args])


@pytest.mark.parametrize(
    "call",
    ["uses", "replaceAllUsesWith", "node().inputs", "node().i"],
)
def test_graph_editing_calls_are_refused_under_dynamo_with_the_alternative(
    call: str, tmp_path: Path
) -> None:
    def symbolic(g, x):  # type: ignore[no-untyped-def]
        if call.startswith("node()."):
            getattr(x.node(), call.split(".")[1])()
        else:
            getattr(x, call)()
        return g.op("Mul", x, x)

    reg = _registry()
    onnx_custom.register_custom_op_symbolic("rwsym::twice", symbolic, 11, registry=reg)

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.rwsym.twice(x)

    with pytest.raises(onnx_custom.SymbolicError, match=rf"value\.{call.split('.')[0]}.*Fix:"):
        _export(Twice(), (torch.randn(2, 3),), tmp_path / "t.onnx", "dynamo", 18, reg)


# -- precedence: torch's own newer translation of an ATen op over a user symbolic at 11 ---------


@symbolic_helper.parse_args("v", "i", "none")
def softmax_at_11(g, x, dim, dtype=None):  # type: ignore[no-untyped-def]
    e = g.op("Exp", x)
    return g.op("Div", e, g.op("ReduceSum", e, axes_i=[dim], keepdims_i=1))


@symbolic_helper.parse_args("v", "is", "v", "v", "f", "none")
def layer_norm_at_11(g, x, shape, weight, bias, eps, cudnn):  # type: ignore[no-untyped-def]
    axes = list(range(-len(shape), 0))
    centred = g.op("Sub", x, g.op("ReduceMean", x, axes_i=axes))
    var = g.op("ReduceMean", g.op("Mul", centred, centred), axes_i=axes)
    eps_value = g.op("Constant", value_t=torch.tensor(eps))
    normed = g.op("Div", centred, g.op("Sqrt", g.op("Add", var, eps_value)))
    return g.op("Add", g.op("Mul", normed, weight), bias)


@symbolic_helper.parse_args("v", "v", "i", "i", "b")
def grid_sampler_at_11(g, x, grid, mode, padding, align_corners):  # type: ignore[no-untyped-def]
    return g.op(
        "mmcv::grid_sampler",
        x,
        grid,
        interpolation_mode_i=mode,
        padding_mode_i=padding,
        align_corners_i=align_corners,
    )


class Builtin(torch.nn.Module):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op
        gen = torch.Generator().manual_seed(5)
        self.weight = torch.nn.Parameter(torch.rand(6, generator=gen) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(6, generator=gen))

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if self.op == "softmax":
            return torch.softmax(x, dim=-1)
        if self.op == "layer_norm":
            return torch.nn.functional.layer_norm(x, (6,), self.weight, self.bias)
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)


BUILTINS = {
    # op: (symbolic at 11, node only the user's symbolic writes, torch's node at 17)
    "softmax": (softmax_at_11, "ReduceSum", "Softmax"),
    "layer_norm": (layer_norm_at_11, "ReduceMean", "LayerNormalization"),
    "grid_sampler": (grid_sampler_at_11, "grid_sampler", "GridSample"),
}


_FORCED_CASES = [
    pytest.param(op, exporter, id=f"{op}-{exporter}") for op in BUILTINS for exporter in EXPORTERS
]


def _builtin_reference(op: str, model: Builtin, x: torch.Tensor, grid: torch.Tensor) -> Any:
    if op == "softmax":
        e = (x.double() - x.double().amax(dim=-1, keepdim=True)).exp()
        return (e / e.sum(dim=-1, keepdim=True)).float()
    if op == "layer_norm":
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        return (x - mean) / (var + 1e-5).sqrt() * model.weight.detach() + model.bias.detach()
    return grid_sample_reference(x, grid)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("op", list(BUILTINS))
def test_torchs_newer_builtin_wins_over_a_symbolic_registered_at_11(
    op: str, exporter: str, tmp_path: Path
) -> None:
    symbolic, users_node, torchs_node = BUILTINS[op]
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(f"::{op}", symbolic, 11, registry=reg)
    torch.manual_seed(0)
    model = Builtin(op)
    args = (torch.randn(2, 6, 5, 6), torch.rand(2, 4, 3, 2) * 2 - 1)
    path = tmp_path / "builtin.onnx"
    proto = _export(model, args, path, exporter, 17, reg)
    types = {n.op_type for n in proto.graph.node}
    assert users_node not in types and torchs_node in types, types
    (got,) = _ort(path, *args[: len(proto.graph.input)])  # TorchScript drops an unused grid
    torch.testing.assert_close(
        torch.from_numpy(got), _builtin_reference(op, model, *args), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(("op", "exporter"), _FORCED_CASES)
def test_override_builtins_makes_the_users_symbolic_win(
    op: str, exporter: str, tmp_path: Path
) -> None:
    symbolic, users_node, torchs_node = BUILTINS[op]
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(
        f"::{op}", symbolic, 11, registry=reg, override_builtins=True
    )
    model, args = Builtin(op), (torch.randn(2, 6, 5, 6), torch.rand(2, 4, 3, 2) * 2 - 1)
    opset = 17 if exporter == "torchscript" else 18
    proto = _export(model, args, tmp_path / "forced.onnx", exporter, opset, reg)
    types = {n.op_type for n in proto.graph.node}
    assert users_node in types and torchs_node not in types, types


@pytest.mark.parametrize("op", BUILTINS)
def test_below_torchs_newer_builtin_the_users_symbolic_serves(op: str, tmp_path: Path) -> None:
    symbolic, users_node, _ = BUILTINS[op]
    reg = _registry()
    onnx_custom.register_custom_op_symbolic(f"::{op}", symbolic, 11, registry=reg)
    model, args = Builtin(op), (torch.randn(2, 6, 5, 6), torch.rand(2, 4, 3, 2) * 2 - 1)
    proto = _export(model, args, tmp_path / "at11.onnx", "torchscript", 11, reg)
    assert users_node in {n.op_type for n in proto.graph.node}


class _NodeOfArity:
    """What `_overload_schemas` reads of a TorchScript node after the ONNX pass: its input count."""

    def __init__(self, count: int) -> None:
        self.count = count

    def inputsSize(self) -> int:  # torch._C.Node's name
        return self.count


@pytest.mark.parametrize(
    ("op", "count", "expected"),
    [("aten::softmax", 3, ["int"]), ("aten::log_softmax", 3, ["int"])],
    ids=["softmax-3-inputs", "log_softmax-3-inputs"],
)
def test_a_traced_node_never_takes_a_named_tensor_overload(
    op: str, count: int, expected: list[str]
) -> None:
    # Some torch releases keep a Dimname overload of the same arity; a trace never records it.
    from onnx_custom.exporter.torchscript import _overload_schemas

    found = _overload_schemas(op, _NodeOfArity(count))
    assert [s.overload_name for s in found] == expected


# -- an autograd.Function whose eager forward loops over the batch (mmcv style) ----------------


class PerSampleAffine(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        return torch.stack([x[i] * scale + 1 for i in range(x.shape[0])])


def per_sample_affine_symbolic(g, x, scale):  # type: ignore[no-untyped-def]
    return g.op("Add", g.op("Mul", x, g.constant(scale, like=x)), g.constant(1.0, like=x))


class PerSampleModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return PerSampleAffine.apply(x, 3.0)


def test_a_batch_loop_in_a_functions_forward_keeps_the_batch_dynamic(tmp_path: Path) -> None:
    reg = _registry()
    reg.symbolic(PerSampleAffine, opset=11)(per_sample_affine_symbolic)
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 4),)
    path = tmp_path / "per_sample.onnx"
    with pytest.warns(UserWarning, match="PerSampleAffine"):
        _export(PerSampleModel(), args, path, "torchscript", 17, reg, {"x": {0: "batch"}})
    sizes = [args, (torch.randn(5, 3, 4),), (torch.randn(1, 3, 4),)]
    _check_sizes(path, lambda x: x * 3.0 + 1, sizes)


# -- the gemm variant of custom_linear on an input that is not 2-D ------------------------------


class GemmLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.weight = torch.nn.Parameter(torch.randn(5, 4, generator=gen))
        self.bias = torch.nn.Parameter(torch.randn(5, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.custom_linear(x, self.weight, self.bias)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 4)], ids=["x[2,3,4]", "x[3,4]"])
def test_gemm_variant_of_custom_linear_takes_any_rank(
    exporter: str, shape: tuple[int, ...], tmp_path: Path
) -> None:
    import onnx_custom.ops.custom_linear  # defines the torch op

    reg = onnx_custom.default_registry().with_variants("gemm")
    model, args = GemmLinear(), (torch.randn(*shape),)
    path = tmp_path / "gemm.onnx"
    opset = 17 if exporter == "torchscript" else 18
    proto = _export(model, args, path, exporter, opset, reg, {"x": {0: "batch"}})
    assert "Gemm" in {n.op_type for n in proto.graph.node}
    other = (torch.randn(5, *shape[1:]),)
    w, b = model.weight.detach(), model.bias.detach()
    _check_sizes(path, lambda x: (x.unsqueeze(-2) * w).sum(-1) + b, [args, other])

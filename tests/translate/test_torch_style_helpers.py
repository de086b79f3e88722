"""torch's ``symbolic_helper`` functions inside torch-style symbolics, as mmcv's RoIAlign,
torchvision's nms and mmdeploy's symbolics call them, under BOTH exporters; each file verified
in ONNX Runtime against the op's eager implementation (plain torch, written independently of
the symbolic). nms returns as many rows as it keeps: sizes differ at every verified shape, and
a file that keeps different rows fails.

Two adapter gaps these cover: ``Cast(to_i=cast_pytorch_to_onnx["Long"])`` / torch's own
``to_i=TensorProtoDataType.INT64`` (a pybind enum, refused as "not an int" under both
exporters), and, under dynamo, helpers that branch on ``_is_value(x)`` (``_select_helper`` took a
graph value for a Python constant and built ``torch.LongTensor([x])``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from torch.onnx import symbolic_helper as sym_help
from torch.onnx._internal.torchscript_exporter import _type_utils

import onnx_custom


@torch.library.custom_op("thelp::roi_split", mutates_args=())
def roi_split(rois: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rois[:, 0].long(), rois[:, 1:] * scale


@roi_split.register_fake
def _(rois: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rois.new_empty(rois.shape[0], dtype=torch.long), rois.new_empty(rois.shape[0], 4)


@torch.library.custom_op("thelp::pick_rows", mutates_args=())
def pick_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.index_select(0, index.reshape(-1).long())


@pick_rows.register_fake
def _(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.new_empty((index.numel(), *x.shape[1:]))


# torchvision::nms's schema in our own library (torchvision's ops do not load here)
nms_lib = torch.library.Library("thelp", "FRAGMENT")
nms_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _nms_eager(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS, one box at a time (the reference; the file runs ONNX NonMaxSuppression)."""
    order = scores.argsort(descending=True, stable=True)
    lt = torch.maximum(dets[:, None, :2], dets[None, :, :2])
    rb = torch.minimum(dets[:, None, 2:], dets[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (dets[:, 2:] - dets[:, :2]).prod(-1)
    iou = inter / (area[:, None] + area[None] - inter)
    keep: list[int] = []
    for i in order.tolist():
        if all(iou[i, j] <= iou_threshold for j in keep):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.int64)


nms_lib.impl("nms", _nms_eager, "CPU")


@torch.library.register_fake("thelp::nms")
def _(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    return dets.new_empty(
        torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64
    )  # data-dependent


@sym_help.parse_args("v", "v", "f")
def nms_symbolic(g: Any, boxes: Any, scores: Any, iou_threshold: float) -> Any:
    """torchvision's registered nms symbolic, as it writes it: Unsqueeze/Slice/Squeeze helpers."""
    boxes = sym_help._unsqueeze_helper(g, boxes, [0])
    scores = sym_help._unsqueeze_helper(g, sym_help._unsqueeze_helper(g, scores, [0]), [0])
    max_output = g.op("Constant", value_t=torch.tensor([2**62], dtype=torch.long))
    threshold = g.op("Constant", value_t=torch.tensor([iou_threshold], dtype=torch.float))
    selected = g.op("NonMaxSuppression", boxes, scores, max_output, threshold)
    return sym_help._squeeze_helper(
        g, sym_help._slice_helper(g, selected, axes=[1], starts=[2], ends=[3]), [1]
    )


class Nms(torch.nn.Module):
    def forward(
        self, boxes: torch.Tensor, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keep = torch.ops.thelp.nms(boxes, scores, 0.3)
        return boxes[keep], scores[keep]  # as many rows as NMS keeps: differs at every size


def _boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xy, wh = torch.rand(n, 2, generator=g) * 12, torch.rand(n, 2, generator=g) * 6 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=g)


def roi_split_symbolic(g: Any, rois: Any, scale: Any) -> Any:
    """mmcv RoIAlign's opset-11 route: batch indices and boxes from the rois by _select_helper."""
    scale = sym_help._maybe_get_const(scale, "f")
    assert not sym_help._is_none(rois) and sym_help._get_tensor_dim_size(rois, 1) == 5
    batch = sym_help._select_helper(
        g, rois, 1, g.op("Constant", value_t=torch.tensor([0], dtype=torch.long))
    )
    batch = sym_help._squeeze_helper(g, batch, [1])
    batch = g.op("Cast", batch, to_i=sym_help.cast_pytorch_to_onnx["Long"])
    boxes = sym_help._select_helper(
        g, rois, 1, g.op("Constant", value_t=torch.tensor([1, 2, 3, 4], dtype=torch.long))
    )
    return batch, g.op(
        "Mul", boxes, g.op("Constant", value_t=torch.tensor(scale, dtype=torch.float))
    )


def pick_rows_symbolic(g: Any, x: Any, index: Any) -> Any:
    """A graph-value index (int32 here): _select_helper casts it with torch's own enum."""
    index = sym_help._maybe_cast_to_type(g, index, _type_utils.JitScalarType.INT64)
    return sym_help._select_helper(g, x, 0, index)


class RoiSplit(torch.nn.Module):
    def forward(self, rois: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.thelp.roi_split(rois, 0.5)


class PickRows(torch.nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.ops.thelp.pick_rows(x, index)


def _rois(n: int, seed: int) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.cat(
            [torch.randint(0, 3, (n, 1), generator=g).float(), torch.rand(n, 4, generator=g) * 10],
            1,
        ),
    )


def _rows(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randint(0, n, (k,), generator=g, dtype=torch.int32)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    op: str
    symbolic: Callable[..., Any]
    model: Callable[[], torch.nn.Module]
    args: tuple[Any, ...]
    dynamic: dict[str, dict[int, str]]
    inputs: Callable[[int, tuple[Any, ...]], tuple[Any, ...]]
    emits: str


CASES = [
    Case(
        "select_helper-cast_pytorch_to_onnx-rois[5,5]",
        "thelp::roi_split",
        roi_split_symbolic,
        RoiSplit,
        _rois(5, 0),
        {"rois": {0: "n"}},
        lambda t, a: _rois(a[0].shape[0], t + 1),
        "Gather",
    ),
    Case(
        "select_helper-value-index-x[6,3]-index[4]",
        "thelp::pick_rows",
        pick_rows_symbolic,
        PickRows,
        _rows(6, 4, 0),
        {"x": {0: "n"}, "index": {0: "k"}},
        lambda t, a: _rows(a[0].shape[0], a[1].shape[0], t + 1),
        "Gather",
    ),
    Case(
        "nms-data-dependent-boxes[12,4]",
        "thelp::nms",
        nms_symbolic,
        Nms,
        _boxes(12, 0),
        {"boxes": {0: "n"}, "scores": {0: "n"}},
        lambda t, a: _boxes(a[0].shape[0], t + 1),
        "NonMaxSuppression",
    ),
]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_helpers_in_a_torch_style_symbolic(case: Case, exporter: str, tmp_path: Path) -> None:
    registry = onnx_custom.default_registry().copy()
    onnx_custom.register_custom_op_symbolic(case.op, case.symbolic, 11, registry=registry)
    path = tmp_path / "m.onnx"
    onnx_custom.export(
        case.model(),
        case.args,
        path,
        exporter=exporter,
        registry=registry,
        dynamic_shapes=case.dynamic,
    )
    assert case.emits in {n.op_type for n in onnx.load(path).graph.node}
    report = onnx_custom.verify(case.model(), case.args, path, input_generator=case.inputs)
    assert report.passed
    assert [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"], report


@sym_help.parse_args("v", "v", "f")
def nms_wrong_threshold(g: Any, boxes: Any, scores: Any, iou_threshold: float) -> Any:
    return nms_symbolic(g, boxes, scores, iou_threshold + 0.4)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_verify_fails_a_data_dependent_output_that_keeps_other_rows(
    exporter: str, tmp_path: Path
) -> None:
    registry = onnx_custom.default_registry().copy()
    onnx_custom.register_custom_op_symbolic(
        "thelp::nms", nms_wrong_threshold, 11, registry=registry
    )
    path, args = tmp_path / "m.onnx", _boxes(12, 0)
    onnx_custom.export(
        Nms(),
        args,
        path,
        exporter=exporter,
        registry=registry,
        dynamic_shapes={"boxes": {0: "n"}, "scores": {0: "n"}},
    )
    report = onnx_custom.verify(Nms(), args, path, raise_on_mismatch=False)
    assert not report.passed

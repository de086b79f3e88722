"""User models written the way mmdet / mmdeploy / detection repos write their heads and box
code, through `onnx_custom.export` (both exporters, dynamic dims) and `onnx_custom.verify`
(ORT against the eager model, at other sizes of every dynamic dim the file claims).

The eager model is the reference: its export branch (``torch.onnx.is_in_onnx_export()``) is
written differently from the eager branch where mmdeploy's rewrites are (a tensor ``k`` clamped
to the dim for ``topk``), so a file of the wrong branch or a size baked in at export fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.translate.coverage import missing_ops_dynamo

# -- models ----------------------------------------------------------------------------------


def _topk_dynamic(values: torch.Tensor, k: int, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdeploy's default-backend ``topk`` rewrite: k becomes a tensor clamped to the dim."""
    size = values.shape[dim]
    k_t = torch.tensor(k, device=values.device, dtype=torch.long)
    k_t = torch.where(k_t < size, k_t, size)
    return values.topk(k_t, dim=dim)


class TopkHead(torch.nn.Module):
    """Pre-NMS top-k of a dense head: tensor k under export, int64 flat-index math, masked_fill,
    new_zeros, and an int output computed from ``.shape`` (a dynamic size as a tensor)."""

    def __init__(self, pre_topk: int = 6) -> None:
        super().__init__()
        self.pre_topk = pre_topk

    def forward(
        self, scores: torch.Tensor, boxes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, num, _ = scores.shape
        max_scores, labels = scores.max(-1)
        if torch.onnx.is_in_onnx_export():
            top, inds = _topk_dynamic(max_scores, self.pre_topk)
        else:
            top, inds = max_scores.topk(min(self.pre_topk, num))
        flat = (torch.arange(batch).view(-1, 1) * num + inds).reshape(-1)
        kept_boxes = boxes.reshape(-1, 4)[flat].reshape(batch, -1, 4)
        kept_labels = labels.reshape(-1)[flat].reshape(batch, -1)
        top = top.masked_fill(top < 0.3, 0.0)
        pad = kept_boxes.new_zeros((batch, kept_boxes.shape[1], 1))
        dropped = torch.tensor(num, dtype=torch.long) - kept_labels.shape[1]
        return torch.cat([kept_boxes, top.unsqueeze(-1) + pad], -1), kept_labels, dropped


class ClipBoxes(torch.nn.Module):
    """mmdet's box clipping by slice assignment (``copy_``), a filled column (``fill_``) and an
    in-place unsqueeze."""

    def forward(self, boxes: torch.Tensor) -> torch.Tensor:
        out = boxes.clone()
        out[..., 0::2] = out[..., 0::2].clamp(min=0, max=8)
        out[..., 1::2] = out[..., 1::2].clamp(min=0, max=6)
        out[:, 0] = -1.0
        return out.unsqueeze_(0)


class ScaleBySize(torch.nn.Module):
    """A dynamic size turned into a tensor (``torch.tensor(x.shape[1])``: ``detach_`` in the
    traced program)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = torch.tensor(x.shape[1], dtype=torch.long)
        return x * n + n


class ClampMixedBounds(torch.nn.Module):
    """Clamps of a float tensor with one int and one float bound (``scores.clamp(0, 1.0)``),
    which torch's dynamo exporter cannot re-dispatch after its type promotion."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.clamp(0, 1.5),
            torch.clamp(x, min=-1, max=0.5),
            x.clone().clamp_(0, 2.5),
            x.clip(-2, 1.5),
        )


# -- the table ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    model: Callable[[], torch.nn.Module]
    args: Callable[[], tuple[Any, ...]]
    dynamic: dict[str, dict[int, str]]
    shapes: tuple[dict[str, int], ...]


def _seeded(fn: Callable[[torch.Generator], tuple[Any, ...]]) -> Callable[[], tuple[Any, ...]]:
    return lambda: fn(torch.Generator().manual_seed(0))


CASES = [
    Case(
        "topk_head-scores[2,10,3]-boxes[2,10,4]",
        TopkHead,
        _seeded(lambda g: (torch.rand(2, 10, 3, generator=g), torch.rand(2, 10, 4, generator=g))),
        {"scores": {0: "batch", 1: "n"}, "boxes": {0: "batch", 1: "n"}},
        ({"n": 3}, {"n": 20, "batch": 1}, {"n": 6}),
    ),
    Case(
        "clip_boxes-boxes[3,4]",
        ClipBoxes,
        _seeded(lambda g: (torch.randn(3, 4, generator=g) * 8,)),
        {"boxes": {0: "n"}},
        ({"n": 1}, {"n": 7}),
    ),
    Case(
        "scale_by_size-x[2,5]",
        ScaleBySize,
        _seeded(lambda g: (torch.randn(2, 5, generator=g),)),
        {"x": {1: "n"}},
        ({"n": 1}, {"n": 9}),
    ),
    Case(
        "clamp_mixed_bounds-x[3,4]",
        ClampMixedBounds,
        _seeded(lambda g: (torch.randn(3, 4, generator=g) * 3,)),
        {"x": {0: "n"}},
        ({"n": 1}, {"n": 5}),
    ),
]
IN_PLACE = [c for c in CASES if c.id.startswith(("clip_boxes", "scale_by_size"))]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mm_style_model_exports_and_verifies_at_other_sizes(
    case: Case, exporter: str, tmp_path: Path
) -> None:
    model, args = case.model(), case.args()
    path = tmp_path / "m.onnx"
    onnx_custom.export(model, args, path, exporter=exporter, dynamic_shapes=case.dynamic)
    report = onnx_custom.verify(model, args, path, shapes=list(case.shapes))
    assert report.passed
    tried = [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"]
    assert len(tried) == len(case.shapes), [t.describe() for t in report.shapes_tried]


@pytest.mark.parametrize("case", IN_PLACE, ids=[c.id for c in IN_PLACE])
def test_in_place_aten_ops_count_as_covered_by_their_functional_twin(case: Case) -> None:
    """The traced program holds copy_/fill_/unsqueeze_/detach_; torch's decomposition
    functionalizes them, so `check` and the export's pre-check must not list them as missing."""
    model, args = case.model(), case.args()
    program = torch.export.export(model, args, strict=False)
    in_place = {
        str(n.target)
        for n in program.graph.nodes
        if n.op == "call_function" and str(n.target).split(".")[1].endswith("_")
    }
    assert in_place, "the case no longer exercises an in-place op"
    assert missing_ops_dynamo(program, 18) == []
    assert onnx_custom.check(model, args, exporter="dynamo").ok


def test_check_passes_a_clamp_with_mixed_bounds() -> None:
    assert onnx_custom.check(ClampMixedBounds(), (torch.randn(3, 4),), exporter="dynamo").ok

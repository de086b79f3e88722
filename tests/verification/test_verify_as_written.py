"""verify() runs its size trials on the file as written, not as ONNX Runtime's optimizer rewrote it.

ORT's level-1 ReshapeFusion turns a Reshape whose target shape is gathered from ``Shape`` into
constants with 0 (copy the input dim) and -1 (infer): a file computing ``[n, c, h * h]`` where
the op means ``[n, c, h * w]`` then runs right in a default ORT session even at h != w, while
TensorRT, OpenVINO or ORT with optimizations off refuse it. A default session at every trial
made verify PASS such a file; the size trials now run with graph optimizations off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime
import pytest
import torch

import onnx_custom


@torch.library.custom_op("octwritten::flat_hw", mutates_args=())
def flat_hw(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).clone()


@flat_hw.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])


def _registry(width_axis: int) -> onnx_custom.Registry:
    """torch's own spelling of a view (Gather per dim, Unsqueeze, Concat): ReshapeFusion's
    pattern. Width is read at ``width_axis`` (2: the bug, height twice)."""
    registry = onnx_custom.default_registry().copy()

    @onnx_custom.symbolic("octwritten::flat_hw", opset=13, registry=registry)
    def _(g: Any, x: Any) -> Any:
        shape = g.op("Shape", x)

        def dim(axis: int) -> Any:
            return g.op("Gather", shape, g.constant(axis), axis=0)

        def one(value: Any) -> Any:
            return g.op("Unsqueeze", value, g.constant([0]))

        target = g.op(
            "Concat", one(dim(0)), one(dim(1)), one(g.op("Mul", dim(2), dim(width_axis))), axis=0
        )
        return g.op("Reshape", x, target)

    return registry


class Flat(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.octwritten.flat_hw(x) * 2.0


DIMS = {"x": {0: "n", 2: "h", 3: "w"}}


def _export(width_axis: int, exporter: str, path: Path) -> None:
    onnx_custom.export(
        Flat(),
        (torch.randn(2, 3, 4, 4),),
        path,
        exporter=exporter,
        registry=_registry(width_axis),
        dynamic_shapes=DIMS,
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_reshape_orts_optimizer_repairs_still_fails(exporter: str, tmp_path: Path) -> None:
    path = tmp_path / "wrong.onnx"
    _export(2, exporter, path)
    x = torch.randn(2, 3, 4, 6)
    # the premise: ORT with its optimizations off refuses the file at h != w
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    unoptimized = onnxruntime.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"]
    )
    with pytest.raises(Exception, match="Reshape|reshape"):
        unoptimized.run(None, {"x": x.numpy()})
    report = onnx_custom.verify(Flat(), (torch.randn(2, 3, 4, 4),), path, raise_on_mismatch=False)
    assert not report.passed
    failed = [t for t in report.shapes_tried if t.status == "failed"]
    assert failed and all(t.kind in ("shape", "apart") for t in failed), [
        t.describe() for t in report.shapes_tried
    ]
    assert any(
        "h=" in t.describe() and "Reshape" in t.reason and "graph optimizations off" in t.reason
        for t in failed
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_right_file_passes_every_trial(exporter: str, tmp_path: Path) -> None:
    path = tmp_path / "right.onnx"
    _export(3, exporter, path)
    report = onnx_custom.verify(Flat(), (torch.randn(2, 3, 4, 4),), path)
    assert report.passed
    assert any(t.kind == "apart" and t.status == "passed" for t in report.shapes_tried)

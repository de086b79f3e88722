"""``torch.onnx.is_in_onnx_export()`` is True while onnx_custom traces a model, as in
``torch.onnx.export`` itself: models that branch on it (mmdet/mmdeploy heads,
``torch.onnx.ops.symbolic`` guarded by it) export their export branch with both exporters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.runtime import KernelRegistry

kernels = KernelRegistry()


@kernels.kernel("flagtest::Triple", inputs=["x"], outputs=["y"], attrs={"alpha": "float"})
def triple(x: np.ndarray, *, alpha: float) -> np.ndarray:
    return (x * alpha).astype(x.dtype)


class Branching(torch.nn.Module):
    """Eager: x * 3 with a Mul; exported: the same math as a custom node (mmdeploy's pattern)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        if torch.onnx.is_in_onnx_export():
            return torch.onnx.ops.symbolic(
                "flagtest::Triple", (y,), {"alpha": 3.0}, dtype=y.dtype, shape=y.shape, version=1
            )
        return y * 3


SEEN: list[bool] = []  # not a module attribute: torch.export undoes the model's own mutations


class Recording(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        SEEN.append(torch.onnx.is_in_onnx_export())
        return x.relu()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_model_sees_an_onnx_export(exporter: str, tmp_path: Path) -> None:
    SEEN.clear()
    onnx_custom.export(
        Recording(),
        (torch.randn(2, 3),),
        tmp_path / "m.onnx",
        exporter=exporter,
        dynamic_shapes={"x": {0: "batch"}},
    )
    assert SEEN and all(SEEN), SEEN
    assert not torch.onnx.is_in_onnx_export()  # and not after it


def test_the_export_branch_is_exported_and_verifies(tmp_path: Path) -> None:
    x = torch.randn(2, 3)
    path = tmp_path / "m.onnx"
    onnx_custom.export(
        Branching(), (x,), path, exporter="dynamo", dynamic_shapes={"x": {0: "batch"}}
    )
    assert "Triple" in {n.op_type for n in onnx.load(path).graph.node}
    report = onnx_custom.verify(
        Branching(), (x,), path, kernels=kernels
    )  # eager branch vs the node
    assert report.passed


class Failing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_flag_is_reset_after_a_failed_export(exporter: str, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="boom"):
        onnx_custom.export(Failing(), (torch.randn(2),), tmp_path / "m.onnx", exporter=exporter)
    assert not torch.onnx.is_in_onnx_export()


def test_torch_onnx_ops_symbolic_under_torchscript_is_a_typed_error_naming_the_fix(
    tmp_path: Path,
) -> None:
    # torch's TorchScript tracer cannot record the Tensor?[] argument; say so,
    # not "unsupported input list type"
    with pytest.raises(
        onnx_custom.errors.UnsupportedOpError,
        match=r"torch\.onnx\.ops\.symbolic.*exporter='dynamo'",
    ):
        onnx_custom.export(
            Branching(), (torch.randn(2, 3),), tmp_path / "m.onnx", exporter="torchscript"
        )
    assert not (tmp_path / "m.onnx").exists()

"""mmcv's pattern: a ``torch.autograd.Function`` with its own ``symbolic(g, ...)`` staticmethod
(a custom node with ``outputs=2``, one output unused) and a ``forward`` that calls an opaque
C++ extension (here NumPy, which fake tensors cannot enter either).

TorchScript calls ``symbolic``: the file holds the custom node and verifies against the eager
Function through an independently written kernel. ``torch.export`` runs ``forward`` and fails
inside the extension: a `SymbolicError` naming the Function and both routes that work, from
`export` and from `check`; a forward that traces is exported with a warning naming the Function
(mmdeploy's export-only Functions have a placeholder forward, which verify then fails). The route it
names (the computation as a custom op, the same ``symbolic`` registered with
`register_custom_op_symbolic`) exports with both exporters. A Function whose forward is plain torch
is traced under dynamo and verifies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.exporter.function_symbolics import FunctionSymbolicIgnoredWarning
from onnx_custom.runtime import KernelRegistry

kernels = KernelRegistry()


def _pool_reference(x: np.ndarray, rois: np.ndarray, scale: float) -> np.ndarray:
    """Per roi, the mean of its image times ``scale``, one roi at a time in float64."""
    out = np.empty((rois.shape[0], x.shape[1]), dtype=np.float64)
    for k, roi in enumerate(rois):
        out[k] = x[int(roi[0])].astype(np.float64).mean(axis=(1, 2)) * scale
    return out


def _ext_roi_pool_forward(
    x: torch.Tensor, rois: torch.Tensor, out: torch.Tensor, scale: float
) -> None:
    """A stand-in for mmcv's ``ext_module.roi_pool_forward``: writes into ``out``, outside torch."""
    out.copy_(
        torch.from_numpy(_pool_reference(x.detach().numpy(), rois.numpy(), scale)).to(out.dtype)
    )


class RoIPoolFunction(torch.autograd.Function):
    @staticmethod
    def symbolic(g: Any, input: Any, rois: Any, spatial_scale: float) -> Any:
        return g.op("mmfn::MMCVRoiPoolMean", input, rois, spatial_scale_f=spatial_scale, outputs=2)[
            0
        ]

    @staticmethod
    def forward(
        ctx: Any, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float
    ) -> torch.Tensor:
        out = input.new_zeros((rois.size(0), input.size(1)))
        _ext_roi_pool_forward(input, rois, out, spatial_scale)
        return out


class TracedMeanFunction(RoIPoolFunction):
    """Same symbolic, forward in plain torch ops: torch.export traces it."""

    @staticmethod
    def forward(
        ctx: Any, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float
    ) -> torch.Tensor:
        return input[rois[:, 0].long()].mean(dim=(2, 3)) * spatial_scale


class PlaceholderFunction(RoIPoolFunction):
    """mmdeploy's export-only Function (TRTBatchedNMSop): forward only makes the output shape."""

    @staticmethod
    def forward(
        ctx: Any, input: torch.Tensor, rois: torch.Tensor, spatial_scale: float
    ) -> torch.Tensor:
        return torch.rand(rois.shape[0], input.shape[1])


class ExportBranch(torch.nn.Module):
    """Eager computes; under export the placeholder Function stands in (mmdeploy's rewrite)."""

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return PlaceholderFunction.apply(x, rois, 0.25)
        return TracedMeanFunction.apply(x, rois, 0.25)


@kernels.kernel(
    "mmfn::MMCVRoiPoolMean",
    inputs=["input", "rois"],
    outputs=["output", "argmax"],
    attrs={"spatial_scale": "float"},
    dtypes={"argmax": ["int64"]},
)  # the unused second output has its own dtype
def roi_pool_mean(
    input: np.ndarray, rois: np.ndarray, *, spatial_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    return _pool_reference(input, rois, spatial_scale).astype(input.dtype), np.zeros(
        rois.shape[0], np.int64
    )


@torch.library.custom_op("mmfn::roi_pool_mean", mutates_args=())
def roi_pool_mean_op(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float) -> torch.Tensor:
    out = input.new_zeros((rois.size(0), input.size(1)))
    _ext_roi_pool_forward(input, rois, out, spatial_scale)
    return out


@roi_pool_mean_op.register_fake
def _(input: torch.Tensor, rois: torch.Tensor, spatial_scale: float) -> torch.Tensor:
    return input.new_empty((rois.shape[0], input.shape[1]))


class Pool(torch.nn.Module):
    def __init__(self, function: type[torch.autograd.Function] | None) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        if self.function is None:  # the route the error names
            return torch.ops.mmfn.roi_pool_mean(x, rois, 0.25) + 1
        return self.function.apply(x, rois, 0.25) + 1


def _args(batch: int = 2, num_rois: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    corners = torch.rand(num_rois, 4, generator=g) * 5
    index = torch.randint(0, batch, (num_rois, 1), generator=g).float()
    return torch.randn(batch, 3, 5, 5, generator=g), torch.cat([index, corners], 1)


def _inputs(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return _args(
        args[0].shape[0], args[1].shape[0], seed=trial + 1
    )  # roi indices valid at every size


DYNAMIC = {"x": {0: "batch"}, "rois": {0: "num_rois"}}


def _export_and_verify(model: torch.nn.Module, exporter: str, path: Path) -> onnx.ModelProto:
    args = _args()
    onnx_custom.export(model, args, path, exporter=exporter, dynamic_shapes=DYNAMIC)
    report = onnx_custom.verify(model, args, path, kernels=kernels, input_generator=_inputs)
    assert report.passed
    assert [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"], report
    return onnx.load(path)


@pytest.mark.parametrize(
    "function", [RoIPoolFunction, TracedMeanFunction], ids=["ext-forward", "torch-forward"]
)
def test_torchscript_exports_the_functions_symbolic(function: type, tmp_path: Path) -> None:
    proto = _export_and_verify(Pool(function), "torchscript", tmp_path / "m.onnx")
    assert [n.op_type for n in proto.graph.node if n.domain == "mmfn"] == ["MMCVRoiPoolMean"]


@pytest.mark.parametrize("route", ["export", "check"])
def test_dynamo_names_the_function_whose_forward_cannot_be_traced(
    route: str, tmp_path: Path
) -> None:
    model, path = Pool(RoIPoolFunction), tmp_path / "m.onnx"
    if route == "export":
        with pytest.raises(onnx_custom.SymbolicError) as info:
            onnx_custom.export(model, _args(), path, exporter="dynamo", dynamic_shapes=DYNAMIC)
        message = str(info.value)
        assert not path.exists()
    else:
        message = str(onnx_custom.check(model, _args(), exporter="dynamo"))
    for phrase in (
        "RoIPoolFunction is a torch.autograd.Function with a `symbolic`",
        ".numpy()",
        "exporter='torchscript'",
        "register_custom_op_symbolic('ns::op', RoIPoolFunction.symbolic",
    ):
        assert phrase in message, (phrase, message)


def test_dynamo_traces_a_plain_torch_forward_and_says_so(tmp_path: Path) -> None:
    with pytest.warns(
        FunctionSymbolicIgnoredWarning,
        match="TracedMeanFunction: torch.autograd.Function with a `symbolic`",
    ):
        proto = _export_and_verify(Pool(TracedMeanFunction), "dynamo", tmp_path / "m.onnx")
    assert not [
        n for n in proto.graph.node if n.domain == "mmfn"
    ]  # the forward's ops, not the symbolic


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_an_export_only_placeholder_function(exporter: str, tmp_path: Path) -> None:
    """TorchScript writes its symbolic (verifies); dynamo traces the placeholder: a warning
    naming it at export, and verify fails the file (random numbers, not the computation)."""
    path, args = tmp_path / "m.onnx", _args()
    if exporter == "torchscript":
        _export_and_verify(ExportBranch(), exporter, path)
        return
    with pytest.warns(FunctionSymbolicIgnoredWarning, match="PlaceholderFunction.*placeholder"):
        onnx_custom.export(ExportBranch(), args, path, exporter=exporter, dynamic_shapes=DYNAMIC)
    assert not onnx_custom.verify(
        ExportBranch(), args, path, kernels=kernels, raise_on_mismatch=False
    ).passed


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_named_route_exports_with_both_exporters(exporter: str, tmp_path: Path) -> None:
    registry = onnx_custom.default_registry().copy()
    onnx_custom.register_custom_op_symbolic(
        "mmfn::roi_pool_mean", RoIPoolFunction.symbolic, 11, registry=registry
    )
    args = _args()
    path = tmp_path / "m.onnx"
    onnx_custom.export(
        Pool(None), args, path, exporter=exporter, registry=registry, dynamic_shapes=DYNAMIC
    )
    assert [n.op_type for n in onnx.load(path).graph.node if n.domain == "mmfn"] == [
        "MMCVRoiPoolMean"
    ]
    report = onnx_custom.verify(Pool(None), args, path, kernels=kernels, input_generator=_inputs)
    assert report.passed

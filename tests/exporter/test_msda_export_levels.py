"""Level values at export: spatial_shapes / level_start_index that are constants of the file (a
buffer, a tensor made in forward) are checked against each other and against value's num_keys
before anything is written, under both exporters and every variant; level tensors that are graph
inputs export, and the kernel refuses bad values at run time (an ORT error status)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from _msda_reference import level_start
from test_msda_export import ConstantLevels as Buffers  # level tensors as buffers

import onnx_custom
from onnx_custom.errors import MultiScaleDeformableAttnError
from onnx_custom.ops import multi_scale_deformable_attn
from onnx_custom.ops.msda import load_extension

SHAPES = torch.tensor([[4, 4], [2, 2]])  # 20 keys
STARTS = level_start(SHAPES)  # [0, 16]


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


class MadeInForward(torch.nn.Module):
    """Level tensors built in forward from Python ints, as tutorials write them."""

    def __init__(self, shapes: torch.Tensor, starts: torch.Tensor) -> None:
        super().__init__()
        self.hw, self.first = shapes.tolist(), starts.tolist()

    def forward(self, value: torch.Tensor, loc: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        shapes = torch.as_tensor(self.hw, dtype=torch.long)
        starts = torch.as_tensor(self.first, dtype=torch.long)
        return multi_scale_deformable_attn(value, shapes, starts, loc, attn)


def _args(keys: int = 20) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(1, keys, 2, 4, generator=g),
        torch.rand(1, 3, 2, 2, 2, 2, generator=g),
        torch.rand(1, 3, 2, 2, 2, generator=g),
    )


BAD: list[
    tuple[str, torch.Tensor, torch.Tensor, int, str]
] = [  # (id, shapes, starts, value's keys, message)
    (
        "keys-mismatch",
        SHAPES,
        STARTS,
        21,
        "cover sum(H*W) = 20 keys but value has num_keys = 21",
    ),
    (
        "starts-inconsistent",
        SHAPES,
        torch.tensor([0, 15]),
        20,
        (
            "level_start_index [0, 15] does not match spatial_shapes [(4, 4), (2, 2)]: expected"
            " [0, 16]"
        ),
    ),
    (
        "negative-size",
        torch.tensor([[4, 4], [-2, -2]]),
        STARTS,
        20,
        "spatial_shapes holds a negative size",
    ),
]
MODELS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.nn.Module]] = {
    "buffers": Buffers,
    "made-in-forward": MadeInForward,
}
VARIANTS = {
    "default": (None, 17),
    "mmdeploy": ("mmdeploy", 17),
    "standard": ("standard", 16),
    "gather": ("gather", 17),
}


@pytest.mark.filterwarnings(
    "ignore::torch.jit.TracerWarning"
)  # MadeInForward's constants: the point
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(
    ("shapes", "starts", "keys", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_constant_level_values_are_checked_before_writing(
    tmp_path: Path,
    exporter: str,
    model: str,
    variant: str,
    shapes: torch.Tensor,
    starts: torch.Tensor,
    keys: int,
    message: str,
) -> None:
    name, opset = VARIANTS[variant]
    registry = (
        onnx_custom.default_registry()
        if name is None
        else onnx_custom.default_registry().with_variants(name)
    )
    target = tmp_path / "m.onnx"
    with pytest.raises(MultiScaleDeformableAttnError, match=_re(message)):
        onnx_custom.export(
            MODELS[model](shapes, starts),
            _args(keys),
            str(target),
            exporter=exporter,
            opset=max(opset, 18) if exporter == "dynamo" else opset,
            registry=registry,
        )
    assert not target.exists() and not list(tmp_path.iterdir())  # no file, not even half of one


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_good_constant_levels_still_export(tmp_path: Path, exporter: str) -> None:
    target = tmp_path / "m.onnx"
    onnx_custom.export(Buffers(SHAPES, STARTS), _args(), str(target), exporter=exporter)
    assert onnx_custom.verify(Buffers(SHAPES, STARTS), _args(), str(target)).passed


class LevelInputs(torch.nn.Module):
    def forward(
        self,
        value: torch.Tensor,
        shapes: torch.Tensor,
        starts: torch.Tensor,
        loc: torch.Tensor,
        attn: torch.Tensor,
    ) -> torch.Tensor:
        return multi_scale_deformable_attn(value, shapes, starts, loc, attn)


@pytest.mark.parametrize("kernels", ["native", "python"])
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_level_inputs_are_checked_by_the_kernel_at_run_time(
    tmp_path: Path, exporter: str, kernels: str
) -> None:
    value, loc, attn = _args()
    target = tmp_path / "m.onnx"
    onnx_custom.export(
        LevelInputs(), (value, SHAPES, STARTS, loc, attn), str(target), exporter=exporter
    )
    session = onnx_custom.InferenceSession(
        str(target), kernels="native" if kernels == "native" else None
    )
    names = [i.name for i in session.get_inputs()]
    good = dict(
        zip(
            names,
            (value.numpy(), SHAPES.numpy(), STARTS.numpy(), loc.numpy(), attn.numpy()),
            strict=True,
        )
    )
    assert session.run(None, good)[0].shape == (1, 3, 8)
    bad = {**good, names[2]: np.array([0, 15], dtype=np.int64)}
    with pytest.raises(Exception, match=_re("does not match spatial_shapes")):
        session.run(None, bad)


def _re(text: str) -> str:
    import re

    return re.escape(text)

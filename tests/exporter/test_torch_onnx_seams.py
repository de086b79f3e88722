"""`onnx_custom.common.torch_onnx`: torch.onnx's private modules found by where they live.

Every supported torch (2.11 to 2.15) has each module the package uses; a module this torch lacks
raises `OnnxCustomError` naming the torch version, the module and the places looked at.
"""

from __future__ import annotations

import pytest
import torch

from onnx_custom.common import torch_onnx
from onnx_custom.errors import OnnxCustomError

USED_DYNAMO = ("_building", "_tensors", "_flags", "_decomp", "_registration", "_dynamic_shapes")
USED_TORCHSCRIPT = ("registration", "symbolic_helper", "_type_utils", "utils")


@pytest.mark.parametrize("name", USED_DYNAMO)
def test_dynamo_exporter_modules_exist(name: str) -> None:
    assert torch_onnx.dynamo_exporter(name).__name__ == f"torch.onnx._internal.exporter.{name}"


@pytest.mark.parametrize("name", USED_TORCHSCRIPT)
def test_torchscript_exporter_modules_exist(name: str) -> None:
    module = torch_onnx.torchscript_exporter(name)
    assert module.__name__.endswith(f".{name}") and module.__name__.startswith("torch.onnx")


def test_a_missing_module_names_version_module_and_places() -> None:
    with pytest.raises(OnnxCustomError) as info:
        torch_onnx.dynamo_exporter("_no_such_module")
    text = str(info.value)
    assert torch.__version__ in text and "'_no_such_module'" in text
    assert "torch.onnx._internal.exporter._no_such_module" in text
    assert torch_onnx.optional_torchscript_exporter("_no_such_module") is None
    with pytest.raises(OnnxCustomError, match=r"torch\.onnx\._no_such_module"):
        torch_onnx.torchscript_exporter("_no_such_module")


# ------------------------------------------------ older torch pieces mended for an export


class _Pool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 2)


def test_a_dynamic_height_and_width_pass_torch_export_under_max_pool_in_the_fixes() -> None:
    # The pooled size floor((h - 2) / 2) + 1 holds for odd sizes too: no evenness guard.
    dim = torch.export.Dim
    with torch_onnx.torch_fixes():
        program = torch.export.export(
            _Pool(),
            (torch.randn(1, 2, 8, 8),),
            dynamic_shapes={"x": {2: dim("h", min=4), 3: dim("w", min=4)}},
            strict=False,
        )
    odd = torch.randn(1, 2, 9, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(program.module()(odd), torch.nn.functional.max_pool2d(odd, 2))


@pytest.mark.parametrize("size", [-7, -6, -1, 0, 5, 6], ids=lambda s: f"x{s}")
@pytest.mark.parametrize("by", [2, 3, -2], ids=lambda s: f"by{s}")
def test_the_pooling_division_rounds_toward_negative_infinity(size: int, by: int) -> None:
    import math

    assert torch_onnx._floor_division(size, by) == math.floor(size / by)


@pytest.mark.parametrize(
    ("packet", "args", "expected"),
    [
        (torch.ops.aten.mul, (torch.ones(2, requires_grad=True), torch.tensor(2.0)), "Tensor"),
        (torch.ops.aten.mul, (torch.ones(2), 2.0), "Scalar"),
        (torch.ops.aten.pow, (torch.ones(2), 2), "Tensor_Scalar"),
        (torch.ops.aten.pow, (torch.ones(2), torch.tensor(2.0)), "Tensor_Tensor"),
    ],
    ids=["mul-grad-tensor", "mul-scalar", "pow-scalar", "pow-tensor"],
)
def test_the_promoted_overload_is_found_by_its_schema(
    packet: object, args: tuple[object, ...], expected: str
) -> None:
    assert torch_onnx._overload_by_schema(packet, args, {})._overloadname == expected


def test_the_fixes_put_torch_back_on_leaving() -> None:
    import torch._meta_registrations as meta

    before = meta.div_rtn
    with torch_onnx.torch_fixes():
        inside = meta.div_rtn
    assert meta.div_rtn is before
    assert inside.__code__.co_nlocals == 2  # the floor division, on every release

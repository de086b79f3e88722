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

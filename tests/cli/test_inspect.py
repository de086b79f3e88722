"""``onnx-custom inspect``: domains, custom nodes and what can run them, opsets, IR version."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

import onnx_custom
from onnx_custom.cli import main
from onnx_custom.cli.inspect_model import inspect_model
from onnx_custom.errors import OnnxCustomError
from onnx_custom.models import my_add


def _export(tmp_path: Any, variant: str | None) -> Any:
    registry = onnx_custom.default_registry()
    if variant:
        registry = registry.with_variants(variant)
    path = tmp_path / f"my_add_{variant or 'std'}.onnx"
    onnx_custom.export(
        my_add.Model().eval(),
        my_add.example_inputs(),
        path,
        exporter="torchscript",
        opset=13,
        registry=registry,
    )
    return path


def test_standard_model(tmp_path: Any) -> None:
    summary = inspect_model(_export(tmp_path, None))
    assert summary.ok and not summary.custom_nodes
    assert ("", 13) in summary.opset_imports and summary.ir_version <= 10
    assert {d for d, _ in summary.domains} == {""}
    assert "runs in any ONNX runtime" in str(summary)


def test_custom_nodes_with_and_without_kernels(tmp_path: Any) -> None:
    path = _export(tmp_path, "custom")
    summary = inspect_model(path)
    (node,) = summary.custom_nodes
    assert node.node_type == "onnx_custom::my_add" and node.count == 1 and not node.has_function
    assert ("onnx_custom", 1) in summary.opset_imports
    if summary.kernels_checked:
        assert node.has_kernel and summary.ok
    proto = onnx.load(path)
    proto.graph.node[1].domain = "elsewhere"  # a domain nobody declared or implements
    renamed = inspect_model(proto)
    assert not renamed.ok and renamed.undeclared_domains == ("elsewhere",)
    text = str(renamed)
    assert "elsewhere::" in text and "nothing can run this node" in text


def test_cli_inspect(tmp_path: Any, capsys: Any) -> None:
    path = _export(tmp_path, None)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "IR version" in out and "opset imports: ai.onnx=13" in out


def test_missing_and_corrupt_files(tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        inspect_model(tmp_path / "absent.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_text("this is not protobuf")
    with pytest.raises(OnnxCustomError):
        inspect_model(bad)

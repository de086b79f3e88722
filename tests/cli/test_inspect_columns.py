"""``inspect`` explains its columns and reports schemas truthfully: a custom
node whose kernel declares ``shape_fn`` has a schema (the kernel registers it with every session),
one whose kernel declares none does not, and an unknown node has neither.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_custom.cli.inspect_model import COLUMNS, inspect_model
from onnx_custom.runtime.registry import user_kernel_registry


@pytest.fixture
def _kernels() -> Iterator[None]:
    registry = user_kernel_registry()

    @registry.kernel("inspect_test::Shaped", inputs=["x"], outputs=["y"], shape_fn="like:x")
    def shaped(x: np.ndarray) -> np.ndarray:
        return x

    @registry.kernel("inspect_test::Unshaped", inputs=["x"], outputs=["y"])
    def unshaped(x: np.ndarray) -> np.ndarray:
        return x

    try:
        yield
    finally:
        registry.remove("inspect_test::Shaped")
        registry.remove("inspect_test::Unshaped")


def _model() -> object:
    nodes = [
        helper.make_node(op, [src], [dst], domain="inspect_test")
        for op, src, dst in (("Shaped", "x", "a"), ("Unshaped", "a", "b"), ("Unknown", "b", "y"))
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("inspect_test", 1)],
    )


@pytest.mark.usefixtures("_kernels")
@pytest.mark.parametrize(
    ("node_type", "kernel", "schema"),
    [
        ("inspect_test::Shaped", True, True),
        ("inspect_test::Unshaped", True, False),
        ("inspect_test::Unknown", False, False),
    ],
    ids=["shape_fn", "no-shape_fn", "no-kernel"],
)
def test_schema_column_is_truthful(node_type: str, kernel: bool, schema: bool) -> None:
    summary = inspect_model(_model())  # type: ignore[arg-type]
    (info,) = [c for c in summary.custom_nodes if c.node_type == node_type]
    assert (info.has_kernel, info.has_schema) == (kernel, schema)


@pytest.mark.usefixtures("_kernels")
def test_columns_are_explained() -> None:
    text = str(inspect_model(_model()))  # type: ignore[arg-type]
    for column in ("kernel", "schema", "function"):
        assert any(line.strip().startswith(f"{column}: ") for line in text.splitlines()), text
    assert all(column in text for column in COLUMNS)

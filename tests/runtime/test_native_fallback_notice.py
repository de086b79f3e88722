"""``InferenceSession(kernels="native")`` says which custom op types fell back to Python kernels,
once, when the session is made; a model the library serves whole says nothing.
Real native library (built on first use), real ONNX Runtime.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_custom.runtime import InferenceSession
from onnx_custom.runtime.native import NativeFallbackWarning
from onnx_custom.runtime.registry import user_kernel_registry

pytest.importorskip("onnx_custom.runtime.native")


@pytest.fixture
def _python_only_kernel() -> Iterator[None]:
    """onnx_custom::Twice: a Python kernel in the default registry the native library does not
    serve."""
    registry = user_kernel_registry()  # what @onnx_custom.runtime.kernel fills

    @registry.kernel("onnx_custom::Twice", inputs=["x"], outputs=["y"], shape_fn="like0")
    def twice(x: np.ndarray) -> np.ndarray:
        return x * 2

    try:
        yield
    finally:
        registry.remove("onnx_custom::Twice")


def _model(*ops: str) -> object:
    nodes, previous = [], "a"
    for i, op in enumerate(ops):
        inputs = [previous, "b"] if op == "my_add" else [previous]
        nodes.append(
            helper.make_node(
                op,
                inputs,
                [f"t{i}"],
                domain="onnx_custom",
                **({"alpha": 2.0} if op == "my_add" else {}),
            )
        )
        previous = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("onnx_custom", 1)],
    )


FEEDS = {"a": np.full((2, 3), 1.0, np.float32), "b": np.full((2, 3), 0.5, np.float32)}


@pytest.mark.usefixtures("_python_only_kernel")
def test_fallback_is_named_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = InferenceSession(_model("my_add", "Twice"), kernels="native")
        for _ in range(3):
            (y,) = session.run(None, FEEDS)
    notices = [w for w in caught if issubclass(w.category, NativeFallbackWarning)]
    assert len(notices) == 1, [str(w.message) for w in caught]
    text = str(notices[0].message)
    assert "onnx_custom::Twice" in text and "custom::my_add" in text  # the whole domain fell back
    np.testing.assert_allclose(y, (2 * FEEDS["a"] + FEEDS["b"]) * 2)


def test_fully_native_model_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NativeFallbackWarning)
        (y,) = InferenceSession(_model("my_add"), kernels="native").run(None, FEEDS)
    np.testing.assert_allclose(y, 2 * FEEDS["a"] + FEEDS["b"])

"""float16/bfloat16 NumPy inputs of any flavour reach ONNX Runtime through InferenceSession.run
: ``ml_dtypes.bfloat16`` arrays (ORT's own ``run`` says "Numpy_type 256 can't
be converted to MLDataType"), ``uint16`` views of the bits, non-contiguous arrays; bfloat16
outputs come back as ``ml_dtypes.bfloat16``. Results are checked against NumPy on the same
rounded values; the wrapping of contiguous 2-byte arrays is zero-copy. Also: the
``sess_options`` error names the caller's argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_custom.errors import InvalidArgumentError
from onnx_custom.runtime import InferenceSession
from onnx_custom.runtime.feeds import to_ort_value

BF16, FP16 = TensorProto.BFLOAT16, TensorProto.FLOAT16


def _model(elem: int, out_elem: int | None = None) -> Any:
    """y = x + x (computed by ORT in the input type; Cast to ``out_elem`` when given)."""
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["xf", "xf"], ["yf"]),
        helper.make_node("Cast", ["yf"], ["y"], to=out_elem or elem),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, ["n", 3])],
        [helper.make_tensor_value_info("y", out_elem or elem, ["n", 3])],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


rng = np.random.default_rng(0)
BASE = rng.standard_normal((4, 3)).astype(np.float32)

# (id, ONNX element type, the array the user passes (a flavour of BASE), numpy type of the values)
Flavour = tuple[str, int, Callable[[], np.ndarray], Any]
FLAVOURS: list[Flavour] = [
    ("bf16/ml_dtypes", BF16, lambda: BASE.astype(ml_dtypes.bfloat16), ml_dtypes.bfloat16),
    (
        "bf16/uint16-view",
        BF16,
        lambda: BASE.astype(ml_dtypes.bfloat16).view(np.uint16),
        ml_dtypes.bfloat16,
    ),
    (
        "bf16/transposed",
        BF16,
        lambda: np.ascontiguousarray(BASE.T).astype(ml_dtypes.bfloat16).T,
        ml_dtypes.bfloat16,
    ),
    (
        "bf16/sliced-4x3",
        BF16,
        lambda: np.repeat(BASE, 2, axis=0).astype(ml_dtypes.bfloat16)[::2],
        ml_dtypes.bfloat16,
    ),
    ("bf16/0-rows", BF16, lambda: BASE[:0].astype(ml_dtypes.bfloat16), ml_dtypes.bfloat16),
    ("fp16/float16", FP16, lambda: BASE.astype(np.float16), np.float16),
    ("fp16/uint16-view", FP16, lambda: BASE.astype(np.float16).view(np.uint16), np.float16),
    (
        "fp16/transposed",
        FP16,
        lambda: np.ascontiguousarray(BASE.T).astype(np.float16).T,
        np.float16,
    ),
]


@pytest.mark.parametrize(
    ("elem", "make", "values"), [f[1:] for f in FLAVOURS], ids=[f[0] for f in FLAVOURS]
)
def test_half_inputs_of_any_flavour_run(
    elem: int, make: Callable[[], np.ndarray], values: Any
) -> None:
    feed = make()
    as_values = feed.view(values) if feed.dtype == np.uint16 else feed
    expected = (as_values.astype(np.float64) * 2).astype(
        values
    )  # independent: NumPy on the rounded inputs
    (got,) = InferenceSession(_model(elem)).run(None, {"x": feed})
    assert got.dtype == np.dtype(values) and got.shape == feed.shape
    np.testing.assert_array_equal(got.astype(np.float64), expected.astype(np.float64))


def test_half_input_float_output_uses_plain_numpy() -> None:
    feed = BASE.astype(ml_dtypes.bfloat16)
    (got,) = InferenceSession(_model(BF16, TensorProto.FLOAT)).run(["y"], {"x": feed})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, feed.astype(np.float32) * 2)


@pytest.mark.parametrize(
    ("elem", "dtype"), [(BF16, ml_dtypes.bfloat16), (FP16, np.float16)], ids=["bf16", "fp16"]
)
def test_contiguous_half_arrays_are_wrapped_without_a_copy(elem: int, dtype: Any) -> None:
    array = BASE.astype(dtype)
    for flavour in (array, array.view(np.uint16)):
        value = to_ort_value(flavour, "tensor(bfloat16)" if elem == BF16 else "tensor(float16)")
        assert value.data_ptr() == array.ctypes.data
        assert value.element_type() == elem


@pytest.mark.parametrize(
    ("feed", "expected", "received"),
    [
        (BASE, "declares tensor(bfloat16)", "input 'x' is float32"),
        (BASE.astype(np.float16), "ml_dtypes.bfloat16 array", "input 'x' is float16"),
    ],
    ids=["float32", "float16"],
)
def test_wrong_dtype_for_a_bfloat16_input_says_how_to_pass_one(
    feed: np.ndarray, expected: str, received: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        InferenceSession(_model(BF16)).run(None, {"x": feed})
    assert expected in str(info.value) and received in str(info.value)


@pytest.mark.parametrize(
    "value", ["fast", 3, {"intra_op_num_threads": 1}], ids=["str", "int", "dict"]
)
def test_sess_options_error_names_the_users_argument(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        InferenceSession(_model(FP16), sess_options=value)
    message = str(info.value)
    assert message.startswith("sess_options= expects onnxruntime.SessionOptions")
    assert "base=" not in message and type(value).__name__ in message


def test_session_options_error_names_base() -> None:
    from onnx_custom.runtime import session_options

    with pytest.raises(InvalidArgumentError, match=r"^base= expects onnxruntime.SessionOptions"):
        session_options(_model(FP16), base="fast")  # type: ignore[arg-type]


@pytest.mark.ort_logs  # severity 1 asks ORT for its info lines on purpose
def test_a_users_log_severity_is_kept() -> None:
    options = ort.SessionOptions()
    options.log_severity_level = 1
    InferenceSession(_model(FP16), sess_options=options)
    assert options.log_severity_level == 1
    fresh = ort.SessionOptions()
    InferenceSession(_model(FP16), sess_options=fresh)
    assert fresh.log_severity_level == 4  # ours: failures are raised, not logged

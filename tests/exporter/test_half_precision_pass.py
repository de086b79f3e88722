"""The half-precision pass on hand-built ONNX graphs, against real ONNX Runtime.

`cpu_runs` must agree with ONNX Runtime itself on every case here (a separate model with real
shapes and data is run to find out); the pass must leave a graph ORT runs and that computes the
same as the float32 graph rounded once per node."""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

from onnx_custom.errors import HalfPrecisionError, InvalidArgumentError
from onnx_custom.runtime.cpu_support import cpu_runs
from onnx_custom.runtime.half_precision import widen_function, widen_model
from onnx_custom.runtime.ort_log_level import quiet_session_options

F16, BF16, F32, I64 = T.FLOAT16, T.BFLOAT16, T.FLOAT, T.INT64
NP: dict[int, Any] = {F16: np.float16, BF16: ml_dtypes.bfloat16, F32: np.float32, I64: np.int64}


def _feed(value: np.ndarray, elem_type: int) -> ort.OrtValue:
    if elem_type == BF16:  # ORT's Python binding has no numpy bfloat16
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(value.view(np.uint16), BF16)
    return ort.OrtValue.ortvalue_from_numpy(value)


# (op, attrs, inputs as (elem type, concrete sample), opset, does ORT 1.31 CPU run it?)
CASES = [
    ("Sin", {}, [(BF16, np.ones((2, 3)))], 18, False),
    ("Sin", {}, [(F16, np.ones((2, 3)))], 18, True),
    ("Mul", {}, [(BF16, np.ones((2, 3)))] * 2, 14, False),
    ("Add", {}, [(BF16, np.ones((2, 3)))] * 2, 14, False),
    ("Mul", {}, [(F16, np.ones((2, 3)))] * 2, 14, True),
    ("MatMul", {}, [(BF16, np.ones((2, 3))), (BF16, np.ones((3, 4)))], 13, False),
    ("Gemm", {}, [(BF16, np.ones((2, 3))), (BF16, np.ones((3, 4)))], 13, False),
    ("Gemm", {}, [(F16, np.ones((2, 3))), (F16, np.ones((3, 4)))], 13, True),
    (
        "ScatterND",
        {"reduction": "add"},
        [(F16, np.zeros(5)), (I64, np.array([[1], [3]])), (F16, np.ones(2))],
        16,
        False,
    ),
    (
        "ScatterND",
        {},
        [(F16, np.zeros(5)), (I64, np.array([[1], [3]])), (F16, np.ones(2))],
        16,
        True,
    ),
    ("Relu", {}, [(BF16, np.ones((2, 3)))], 14, False),
    ("Relu", {}, [(F16, np.ones((2, 3)))], 14, True),
]
IDS = [
    f"{op}-{'/'.join(T.DataType.Name(t) for t, _ in ins)}"
    f"-{'-'.join(a.values()) or 'plain'}-opset{o}"
    for op, a, ins, o, _ in CASES
]


def _model(
    op: str,
    attrs: dict[str, str],
    types: list[int],
    opset: int,
    out: int,
    shapes: list[tuple[int, ...]] | None = None,
) -> onnx.ModelProto:
    """One node; its inputs' sizes declared when given (as an exported model declares them)."""
    names = [f"x{i}" for i in range(len(types))]
    node = helper.make_node(op, names, ["y"], name=f"the_{op}", **attrs)
    dims = shapes or [None] * len(types)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, t, d)
            for n, t, d in zip(names, types, dims, strict=True)
        ],
        [helper.make_tensor_value_info("y", out, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run(model: onnx.ModelProto, samples: list[tuple[int, np.ndarray]]) -> np.ndarray:
    # quiet: the refusals this file expects would print ORT's error line (the ORT log guard)
    session = ort.InferenceSession(
        model.SerializeToString(), quiet_session_options(), providers=["CPUExecutionProvider"]
    )
    feeds = {f"x{i}": _feed(np.asarray(v).astype(NP[t]), t) for i, (t, v) in enumerate(samples)}
    value = session.run_with_ort_values(None, feeds)[0]
    if value.element_type() != BF16:
        return value.numpy()
    raw = bytes((ctypes.c_char * value.tensor_size_in_bytes()).from_address(value.data_ptr()))
    return np.frombuffer(raw, dtype=ml_dtypes.bfloat16).reshape(value.shape())


def _ort_runs(model: onnx.ModelProto, samples: list[tuple[int, np.ndarray]]) -> bool:
    try:
        _run(model, samples)
    except Exception:
        return False
    return True


@pytest.mark.parametrize(("op", "attrs", "inputs", "opset", "runs"), CASES, ids=IDS)
def test_the_probe_agrees_with_onnxruntime(
    op: str, attrs: dict[str, str], inputs: list[tuple[int, np.ndarray]], opset: int, runs: bool
) -> None:
    model = _model(op, attrs, [t for t, _ in inputs], opset, inputs[0][0])
    assert _ort_runs(model, inputs) is runs  # ORT itself, with real shapes and data
    node = model.graph.node[0]
    assert cpu_runs(node, opset, [(t, np.shape(v)) for t, v in inputs]) is runs
    if attrs.get("reduction") != "add":  # refused only when it runs: the probe needs the sizes
        assert (
            cpu_runs(node, opset, [(t, None) for t, _ in inputs]) is runs
        )  # sizes unknown: same answer


@pytest.mark.parametrize(
    ("op", "attrs", "inputs", "opset", "runs"),
    [c for c in CASES if not c[-1]],
    ids=[i for i, c in zip(IDS, CASES, strict=True) if not c[-1]],
)
def test_the_pass_makes_refused_nodes_run_and_match_float32(
    op: str, attrs: dict[str, str], inputs: list[tuple[int, np.ndarray]], opset: int, runs: bool
) -> None:
    rng = np.random.default_rng(0)
    samples = [(t, rng.standard_normal(np.shape(v)) if t != I64 else v) for t, v in inputs]
    half = inputs[0][0]
    model = _model(op, attrs, [t for t, _ in inputs], opset, half, [np.shape(v) for _, v in inputs])
    widen_model(model)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert casts and model.graph.output[0].type.tensor_type.elem_type == half
    got = _run(model, samples)
    rounded = [
        (
            F32 if t == half else t,
            np.asarray(v).astype(NP[t]).astype(np.float32) if t == half else v,
        )
        for t, v in samples
    ]
    want = _run(_model(op, attrs, [t for t, _ in rounded], opset, F32), rounded).astype(NP[half])
    np.testing.assert_array_equal(
        got.astype(np.float32), want.astype(np.float32)
    )  # one rounding, exactly


def test_nodes_ort_runs_are_left_alone() -> None:
    model = _model("Mul", {}, [F16, F16], 14, F16)
    before = model.SerializeToString()
    assert widen_model(model).SerializeToString() == before


def test_strict_names_op_dtype_opset_node_and_provider() -> None:
    model = _model("Sin", {}, [BF16], 18, BF16)
    with pytest.raises(
        HalfPrecisionError,
        match=(
            r"CPUExecutionProvider(?s:.*)Sin \(opset 18, node 'the_Sin'\) at bfloat16; it runs in"
            r" float32"
        ),
    ):
        widen_model(model, "strict")


def test_bfloat16_below_opset_13_is_refused_with_the_opset_fix() -> None:
    model = _model("Mul", {}, [BF16, BF16], 11, BF16)
    with pytest.raises(
        HalfPrecisionError,
        match=r"(?s)Cast cannot convert bfloat16 at opset 11.*export at opset 13 or later",
    ):
        widen_model(model)


def test_off_changes_nothing() -> None:
    model = _model("Sin", {}, [BF16], 18, BF16)
    before = model.SerializeToString()
    assert widen_model(model, "off").SerializeToString() == before


@pytest.mark.parametrize("mode", ["fast", None, "float32"])
def test_an_unknown_mode_is_typed(mode: object) -> None:
    with pytest.raises(InvalidArgumentError, match="half_precision= expects one of"):
        widen_model(_model("Sin", {}, [BF16], 18, BF16), mode)  # type: ignore[arg-type]


def test_a_function_body_is_widened_for_its_callers_types() -> None:
    """alpha * x via an attribute reference, as the seed ops' bodies are built."""
    body = helper.make_function(
        "custom",
        "Scale",
        ["x"],
        ["y"],
        [
            helper.make_node("Constant", [], ["a"], value_float=0.0),
            helper.make_node("CastLike", ["a", "x"], ["a_like"]),
            helper.make_node("Mul", ["x", "a_like"], ["y"]),
        ],
        [helper.make_opsetid("", 18)],
        attributes=["alpha"],
    )
    body.node[0].attribute[0].ref_attr_name = "alpha"
    call = helper.make_node("Scale", ["x0"], ["y"], domain="custom", alpha=0.5)
    widen_function(body, [BF16], call)
    assert [n.op_type for n in body.node] == ["Constant", "CastLike", "Cast", "Cast", "Mul", "Cast"]
    graph = helper.make_graph(
        [call],
        "g",
        [helper.make_tensor_value_info("x0", BF16, None)],
        [helper.make_tensor_value_info("y", BF16, None)],
    )
    model = helper.make_model(
        graph,
        functions=[body],
        ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)],
    )
    x = np.array([[1.0, -3.0, 0.25]])
    np.testing.assert_array_equal(
        _run(model, [(BF16, x)]).astype(np.float32), (0.5 * x).astype(np.float32)
    )


def test_the_probe_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    node = helper.make_node("ScatterND", ["a", "b", "c"], ["y"], reduction="mul")  # a fresh key
    assert cpu_runs(node, 18, [(F16, (5,)), (I64, (2, 1)), (F16, (2,))]) is False
    out, err = capfd.readouterr()
    assert "onnxruntime" not in err + out

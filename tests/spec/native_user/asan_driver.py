"""Runs the acme user kernels (tests/spec/native_user) through plain onnxruntime, valid and invalid
inputs, for the AddressSanitizer build: any out-of-bounds access or use after free aborts.

Usage: python asan_driver.py LIBRARY.so   (prints "asan ok" when every case behaved)
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

F32, F16, F64, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.INT64


def session(
    lib: str,
    op: str,
    inputs: list[tuple[str, int]],
    outputs: list[tuple[str, int]],
    **attrs: object,
) -> ort.InferenceSession:
    node = helper.make_node(
        op, [n for n, _ in inputs], [n for n, _ in outputs], domain="acme", name="n", **attrs
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs if n],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
        ir_version=9,
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 3
    so.log_severity_level = 4
    so.register_custom_ops_library(lib)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def fails(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], text: str) -> None:
    try:
        sess.run(None, feeds)
    except Exception as exc:  # ORT's error status
        assert text in str(exc), (text, str(exc))
        return
    raise AssertionError(f"expected an error containing {text!r}")


def main(lib: str) -> None:
    rng = np.random.default_rng(0)
    for elem, dt in ((F32, np.float32), (F16, np.float16)):
        s = session(lib, "ScaleAdd", [("x", elem), ("y", elem)], [("out", elem)], alpha=0.5)
        for shape in ((3, 4), (0, 2), (), (50000,)):
            x, y = rng.standard_normal(shape).astype(dt), rng.standard_normal(shape).astype(dt)
            np.testing.assert_allclose(
                s.run(None, {"x": x, "y": y})[0].astype(np.float64),
                (0.5 * x.astype(np.float64) + y).astype(dt),  # type: ignore[operator]
                rtol=1e-3,
                atol=1e-3,
            )
        fails(s, {"x": np.ones((2, 3), dt), "y": np.ones((3, 2), dt)}, "must have one shape")
    s = session(lib, "Mix", [("x", F64), ("", F64), ("o", F64)], [("y", F64), ("r", F64)])
    x = rng.standard_normal((5, 4))
    y, r = s.run(None, {"x": x, "o": x})
    np.testing.assert_allclose(r, (2 * x).sum(-1))
    fails(
        session(lib, "Mix", [("x", F64), ("b", F64), ("o", F64)], [("y", F64), ("r", F64)]),
        {"x": x, "b": np.ones(3), "o": x},
        "bias must have 4 elements",
    )
    s = session(lib, "Positive", [("x", F32)], [("v", F32)])
    for n in (0, 1, 1000):
        v = rng.standard_normal(n).astype(np.float32)
        np.testing.assert_array_equal(s.run(None, {"x": v})[0], v[v > 0])
    for fault, text in (
        (0, "negative input at index"),
        (1, "unknown C++ exception"),
        (2, "asks for [3]"),
    ):
        s = session(lib, "CheckedSqrt", [("x", F32)], [("out", F32)], fault=fault)
        fails(s, {"x": np.array([1.0, -4.0] if fault == 0 else [1.0, 4.0], np.float32)}, text)
    s = session(
        lib,
        "GatherRows",
        [("t", F32), ("i", I64)],
        [("out", F32)],
        mode="raise",
        weights=[1.0, 2.0],
    )
    t = rng.standard_normal((6, 2)).astype(np.float32)
    np.testing.assert_allclose(
        s.run(None, {"t": t, "i": np.array([5, 0], np.int64)})[0], t[[5, 0]] * [1.0, 2.0], rtol=1e-6
    )
    fails(s, {"t": t, "i": np.array([6], np.int64)}, "out of range for 6 rows")
    fails(
        session(lib, "GatherRows", [("t", F32), ("i", I64)], [("out", F32)], weights=[1.0]),
        {"t": t, "i": np.array([0], np.int64)},
        "one value per column",
    )
    fails(
        session(lib, "ScaleAdd", [("x", F64), ("y", F64)], [("out", F64)]),
        {"x": np.ones(2), "y": np.ones(2)},
        "has dtype float64",
    )
    print("asan ok")


if __name__ == "__main__":
    main(sys.argv[1])

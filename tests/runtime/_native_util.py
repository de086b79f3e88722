"""Helpers shared by the tests of the native kernel library (tests/runtime/test_native_*.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_custom.runtime.native import library_path
from onnx_custom.runtime.ort_log_level import quiet_session_options

__all__ = [
    "DOMAINS",
    "ELEM",
    "TOL",
    "Io",
    "assert_close",
    "native_session",
    "node_model",
    "run_native",
    "run_python",
    "run_script",
]

ELEM = {
    "float16": TensorProto.FLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "bfloat16": TensorProto.BFLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "int8": TensorProto.INT8,
    "int16": TensorProto.INT16,
    "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16,
    "uint32": TensorProto.UINT32,
    "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL,
}
# torch.testing's defaults per dtype (rtol, atol)
TOL = {
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}
DOMAINS = {"onnx_custom": 1}

Io = tuple[str, str, Any]  # (name, dtype name, shape: list of int/str/None, or None = unknown rank)


_BF16_KEY = "test.bfloat16_outputs"


def node_model(
    op: str, domain: str, inputs: Sequence[Io], outputs: Sequence[Io], opset: int = 18, **attrs: Any
) -> onnx.ModelProto:
    """One custom node; inputs named "" are passed as absent optional inputs.

    ORT's Python API cannot feed or return bfloat16 arrays, so bfloat16 inputs/outputs cross the
    graph boundary as float32 with Cast nodes inside (run_native/run_python convert for you).
    """
    present = [i for i in inputs if i[0]]
    nodes, node_in, node_out = [], [], []
    for name, dtype, _ in inputs:
        if dtype == "bfloat16" and name:
            nodes.append(
                helper.make_node("Cast", [name], [name + "_bf16"], to=TensorProto.BFLOAT16)
            )
            name = name + "_bf16"
        node_in.append(name)
    casts = []
    for name, dtype, _ in outputs:
        if dtype == "bfloat16":
            casts.append(helper.make_node("Cast", [name + "_bf16"], [name], to=TensorProto.FLOAT))
            name = name + "_bf16"
        node_out.append(name)
    nodes.append(
        helper.make_node(op, node_in, node_out, domain=domain, name=f"{op.lower()}_node", **attrs)
    )

    def graph_type(dtype: str) -> int:
        return TensorProto.FLOAT if dtype == "bfloat16" else ELEM[dtype]

    graph = helper.make_graph(
        nodes + casts,
        "g",
        [helper.make_tensor_value_info(n, graph_type(t), s) for n, t, s in present],
        [helper.make_tensor_value_info(n, graph_type(t), s) for n, t, s in outputs],
    )
    imports = [
        helper.make_opsetid("", max(opset, 13) if casts or len(nodes) > 1 else opset),
        helper.make_opsetid(domain, 1),
    ]
    m = helper.make_model(graph, opset_imports=imports, ir_version=8)
    bf16 = [n for n, t, _ in outputs if t == "bfloat16"]
    if bf16:
        helper.set_model_props(m, {_BF16_KEY: ",".join(bf16)})
    return m


def _feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    bf16 = np.dtype(ml_dtypes.bfloat16)
    return {k: v.astype(np.float32) if v.dtype == bf16 else v for k, v in feeds.items()}


def _results(model: onnx.ModelProto, outs: list[Any]) -> list[np.ndarray]:
    props = {p.key: p.value for p in model.metadata_props}
    bf16 = set(props.get(_BF16_KEY, "").split(","))
    names = [o.name for o in model.graph.output]
    return [
        o.astype(ml_dtypes.bfloat16) if n in bf16 else o for n, o in zip(names, outs, strict=True)
    ]


def native_session(model: onnx.ModelProto, threads: int = 2) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    quiet_session_options(so)  # a failing kernel is raised; ORT's error line would repeat it
    so.register_custom_ops_library(str(library_path()))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_native(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 2
) -> list[np.ndarray]:
    return _results(model, native_session(model, threads).run(None, _feeds(feeds)))


def run_python(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnx_custom

    return _results(
        model, onnx_custom.InferenceSession(model).run(None, _feeds(feeds))
    )  # quiet by default


def _as_float64(a: np.ndarray) -> np.ndarray:
    return (
        a.astype(np.float64)
        if a.dtype != np.dtype(ml_dtypes.bfloat16)
        else a.astype(np.float32).astype(np.float64)
    )


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, scale: float = 1.0) -> None:
    """Same dtype and shape; values within the dtype's torch.testing tolerances
    (times ``scale``)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if dtype not in TOL:
        np.testing.assert_array_equal(actual, expected)
        return
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(
        _as_float64(actual), _as_float64(expected), rtol=rtol * scale, atol=atol * scale
    )


def run_script(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (no onnx_custom import unless the code does it)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(Path(__file__).parent),
    )

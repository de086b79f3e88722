"""User C++ kernels (onnx_custom/kernel.h) built from op specs into their own ORT library.

The kernels are tests/spec/native_user/acme_kernels.cpp, written the way a user would; the specs
are tests/spec/native_user/acme.yaml. Every result is compared with an independent numpy
computation in float64 (rounded to the dtype at the end) at the dtype's torch.testing
tolerances; runs use plain onnxruntime with the built library registered, several sizes per
session (dynamic dims), zero-size and 0-d tensors, 1 and 4 intra-op threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.runtime.native import NativeLibrary
from onnx_custom.spec import build_native_library, parse_specs

DATA = Path(__file__).parent / "native_user"
BF16 = np.dtype(ml_dtypes.bfloat16)
ELEM = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float64": TensorProto.DOUBLE,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
}
NP = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": BF16,
    "float64": np.dtype(np.float64),
}
TOL = {
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}


@pytest.fixture(scope="module")
def library() -> NativeLibrary:
    return build_native_library(parse_specs(DATA / "acme.yaml"), name="acme_test")


def node_model(
    op: str,
    inputs: Sequence[tuple[str, str, Any]],
    outputs: Sequence[tuple[str, str, Any]],
    **attrs: Any,
) -> onnx.ModelProto:
    """One acme node. bfloat16 crosses the graph boundary as float32 (ORT's Python API cannot
    feed it) through Cast nodes; an input named "" is an absent optional input."""
    nodes, node_in, node_out, casts = [], [], [], []
    for name, dtype, _ in inputs:
        if name and dtype == "bfloat16":
            nodes.append(helper.make_node("Cast", [name], [name + "_b"], to=TensorProto.BFLOAT16))
            name += "_b"
        node_in.append(name)
    for name, dtype, _ in outputs:
        if dtype == "bfloat16":
            casts.append(helper.make_node("Cast", [name + "_b"], [name], to=TensorProto.FLOAT))
            name += "_b"
        node_out.append(name)
    nodes.append(
        helper.make_node(op, node_in, node_out, domain="acme", name=f"{op.lower()}_node", **attrs)
    )

    def info(name: str, dtype: str, shape: Any) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(
            name, TensorProto.FLOAT if dtype == "bfloat16" else ELEM[dtype], shape
        )

    graph = helper.make_graph(
        nodes + casts, "g", [info(*i) for i in inputs if i[0]], [info(*o) for o in outputs]
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
        ir_version=9,
    )


def session(model: onnx.ModelProto, lib: NativeLibrary, threads: int = 2) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    so.register_custom_ops_library(str(lib.path))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return sess.run(
        None, {k: v.astype(np.float32) if v.dtype == BF16 else v for k, v in feeds.items()}
    )


def close(actual: np.ndarray, expected64: np.ndarray, dtype: str) -> None:
    expected = expected64.astype(NP[dtype]).astype(np.float64)
    got = actual.astype(np.float64)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def draw(shape: Sequence[int], dtype: str, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(NP[dtype])


# ---- scale_add: the user's template kernel at every declared dtype -------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("threads", [1, 4])
def test_scale_add_matches_numpy_at_every_size(
    library: NativeLibrary, dtype: str, threads: int
) -> None:
    model = node_model(
        "ScaleAdd",
        [("x", dtype, ["n", "m"]), ("y", dtype, ["n", "m"])],
        [("out", dtype, None)],
        alpha=0.5,
    )
    sess = session(model, library, threads)
    for i, shape in enumerate([(2, 3), (5, 7), (0, 4), (64, 1024)]):  # one session, dynamic dims
        x, y = draw(shape, dtype, i), draw(shape, dtype, 100 + i)
        (out,) = run(sess, {"x": x, "y": y})
        close(out, 0.5 * x.astype(np.float64) + y.astype(np.float64), dtype)


def test_scale_add_default_attribute_0d_and_declared_shape(library: NativeLibrary) -> None:
    model = node_model(
        "ScaleAdd",
        [("x", "float32", ["batch", 3]), ("y", "float32", ["batch", 3])],
        [("out", "float32", None)],
    )
    sess = session(model, library)
    assert sess.get_outputs()[0].shape == ["batch", 3]  # graph-time shape inference from like:x
    x, y = draw((4, 3), "float32", 1), draw((4, 3), "float32", 2)
    close(
        run(sess, {"x": x, "y": y})[0], 2.0 * x.astype(np.float64) + y, "float32"
    )  # alpha's default: 2.0
    scalar = session(
        node_model(
            "ScaleAdd", [("x", "float32", []), ("y", "float32", [])], [("out", "float32", None)]
        ),
        library,
    )
    (out,) = run(scalar, {"x": np.array(1.5, np.float32), "y": np.array(-1.0, np.float32)})
    assert out.shape == () and out == np.float32(2.0)


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        (
            {"x": np.ones((2, 2), np.float64), "y": np.ones((2, 2), np.float64)},
            r"input 'x' has dtype float64; the op spec declares float32, float16, bfloat16",
        ),
        # ORT's graph-time type check may refuse the session before the kernel's check runs
        (
            {"x": np.ones((2, 2), np.float32), "y": np.ones((2, 2), np.float16)},
            (
                r"(input 'y' has dtype float16 but input 'x' has float32|Type Error: Type"
                r" \(tensor\(float\)\) of output arg \(out\) of node \(sa\) does not match)"
            ),
        ),
        (
            {"x": np.ones((2, 2), np.float32), "y": np.ones((3, 2), np.float32)},
            r"x \[2, 2\] and y \[3, 2\] must have one shape",
        ),
    ],
    ids=["undeclared-dtype", "mixed-dtypes", "kernel-fail"],
)
def test_scale_add_bad_inputs_are_error_statuses(
    library: NativeLibrary, feeds: dict[str, np.ndarray], message: str
) -> None:
    def elem(a: np.ndarray) -> int:
        return {
            np.dtype(np.float32): TensorProto.FLOAT,
            np.dtype(np.float16): TensorProto.FLOAT16,
            np.dtype(np.float64): TensorProto.DOUBLE,
        }[a.dtype]

    graph = helper.make_graph(
        [helper.make_node("ScaleAdd", ["x", "y"], ["out"], domain="acme", name="sa")],
        "g",
        [helper.make_tensor_value_info(k, elem(v), None) for k, v in feeds.items()],
        [helper.make_tensor_value_info("out", elem(feeds["x"]), None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
        ir_version=9,
    )
    with pytest.raises(
        Exception,
        match=r"(onnx-custom native kernel acme::ScaleAdd \(node 'sa'\) failed: )?" + message,
    ):
        session(model, library).run(None, feeds)
    if feeds["x"].dtype == feeds["y"].dtype == np.float32:
        good = {k: np.ones((2, 2), np.float32) for k in feeds}
        assert run(session(model, library), good)[0].shape == (2, 2)  # the process carries on


# ---- mix: two outputs, an optional and a variadic input, an expression shape rule ----------------
def mix_reference(
    x: np.ndarray, bias: np.ndarray | None, others: Sequence[np.ndarray], scale: float
) -> tuple[np.ndarray, np.ndarray]:
    y = (
        x.astype(np.float64)
        + (0 if bias is None else bias.astype(np.float64))
        + sum(o.astype(np.float64) for o in others)
    )
    return scale * y, (scale * y).sum(-1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    ("with_bias", "n_others"),
    [(True, 1), (False, 1), (True, 3)],
    ids=["bias-1-extra", "no-bias-1-extra", "bias-3-extras"],
)
def test_mix_multi_output_optional_variadic(
    library: NativeLibrary, dtype: str, with_bias: bool, n_others: int
) -> None:
    inputs = [("x", dtype, ["n", 4]), ("bias" if with_bias else "", dtype, [4])]
    inputs += [(f"o{i}", dtype, ["n", 4]) for i in range(n_others)]
    model = node_model("Mix", inputs, [("y", dtype, None), ("rowsum", dtype, None)], scale=0.25)
    sess = session(model, library)
    assert [o.shape for o in sess.get_outputs()] == [
        ["n", 4],
        ["n"],
    ]  # like:x and x[:-1] at graph time
    for i, rows in enumerate([3, 1, 0]):
        x = draw((rows, 4), dtype, i)
        bias = draw((4,), dtype, 10 + i) if with_bias else None
        others = [draw((rows, 4), dtype, 20 + j) for j in range(n_others)]
        feeds = {
            "x": x,
            **({"bias": bias} if bias is not None else {}),
            **{f"o{j}": o for j, o in enumerate(others)},
        }
        y, rowsum = run(sess, feeds)
        ey, er = mix_reference(x, bias, others, 0.25)
        close(y, ey, dtype)
        close(rowsum, er, dtype)


# ---- positive: the kernel allocates an output whose size depends on the data ---------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_positive_data_dependent_output(library: NativeLibrary, dtype: str) -> None:
    sess = session(
        node_model("Positive", [("x", dtype, ["n"])], [("values", dtype, None)]), library
    )
    for i, n in enumerate([10, 1, 0, 1000]):
        x = draw((n,), dtype, i)
        (values,) = run(sess, {"x": x})
        np.testing.assert_array_equal(values, x[x > 0])
    (none,) = run(sess, {"x": -np.ones(5, NP[dtype])})
    assert none.shape == (0,)


# ---- checked_sqrt: what the kernel throws becomes an error status naming op and node -------------
@pytest.mark.parametrize(
    ("fault", "x", "message"),
    [
        (0, [1.0, 4.0, 9.0, -1.0], r"negative input at index 3"),
        (1, [1.0, 4.0], r"unknown C\+\+ exception"),
        (
            2,
            [1.0, 4.0],
            r"output 'out' has shape \[2\] \(from the spec's shape rule.*asks for \[3\]",
        ),
    ],
    ids=["std-exception-in-parallel-for", "non-std-exception", "wrong-output-size"],
)
def test_checked_sqrt_exceptions_become_statuses(
    library: NativeLibrary, fault: int, x: list[float], message: str
) -> None:
    sess = session(
        node_model(
            "CheckedSqrt", [("x", "float32", ["n"])], [("out", "float32", None)], fault=fault
        ),
        library,
        threads=4,
    )
    with pytest.raises(
        Exception, match=r"acme::CheckedSqrt \(node 'checkedsqrt_node'\) failed: " + message
    ):
        sess.run(None, {"x": np.asarray(x, np.float32)})
    if fault == 0:
        big = np.abs(draw((5000,), "float32", 3))
        close(run(sess, {"x": big})[0], np.sqrt(big.astype(np.float64)), "float32")


# ---- gather_rows: int64 input, int/str/float[]/bool attributes, an expression rule ---------------
def gather_reference(
    table: np.ndarray, index: np.ndarray, offset: int, weights: Sequence[float], negate: bool
) -> np.ndarray:
    rows = np.clip(index + offset, 0, table.shape[0] - 1)
    out = table.astype(np.float64)[rows] * (np.asarray(weights, np.float64) if weights else 1.0)
    return -out if negate else out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "attrs",
    [{}, {"offset": 1, "weights": [0.5, -1.0, 2.0], "negate": 1}],
    ids=["defaults", "all-attributes"],
)
def test_gather_rows_int64_indices_and_attributes(
    library: NativeLibrary, dtype: str, attrs: dict[str, Any]
) -> None:
    model = node_model(
        "GatherRows",
        [("table", dtype, ["r", 3]), ("index", "int64", ["k"])],
        [("out", dtype, None)],
        **attrs,
    )
    sess = session(model, library)
    assert sess.get_outputs()[0].shape == ["k", 3]  # [index.0, table.1] at graph time
    table = draw((6, 3), dtype, 0)
    for index in ([0, 5, 2, 2], [7, -3], []):
        idx = np.asarray(index, np.int64)
        (out,) = run(sess, {"table": table, "index": idx})
        close(
            out,
            gather_reference(
                table,
                idx,
                attrs.get("offset", 0),
                attrs.get("weights", []),
                bool(attrs.get("negate", 0)),
            ),
            dtype,
        )


def test_gather_rows_raise_mode_and_index_dtype(library: NativeLibrary) -> None:
    model = node_model(
        "GatherRows",
        [("table", "float32", ["r", 3]), ("index", "int64", ["k"])],
        [("out", "float32", None)],
        mode="raise",
    )
    sess = session(model, library)
    with pytest.raises(Exception, match=r"index 9 at position 1 is out of range for 6 rows"):
        sess.run(None, {"table": np.zeros((6, 3), np.float32), "index": np.array([0, 9], np.int64)})
    model32 = node_model(
        "GatherRows",
        [("table", "float32", ["r", 3]), ("index", "int32", ["k"])],
        [("out", "float32", None)],
    )
    # a trailing single-dtype input declares its type to ORT, which then refuses the model itself
    with pytest.raises(
        Exception,
        match=(
            r"Type 'tensor\(int32\)' of input parameter \(index\) of operator \(GatherRows\) in"
            r" node \(gatherrows_node\) is invalid"
        ),
    ):
        session(model32, library).run(
            None, {"table": np.zeros((6, 3), np.float32), "index": np.array([0], np.int32)}
        )


def _declared_input_types(spec: Any, source: Path) -> list[str]:
    from onnx_custom.spec.native_codegen import generate_source

    text = generate_source(source, [spec], 0).text
    line = next(ln for ln in text.splitlines() if "ops.push_back" in ln)
    return line.rsplit("{", 2)[1].split("}")[0].split(", ")


def test_single_dtype_inputs_before_a_multi_dtype_one_stay_undeclared_to_ort() -> None:
    """ORT guesses an output's type from the last multi-dtype input, so a single-dtype input is
    declared (ORT refuses a wrong dtype itself, test above) only after every multi-dtype input;
    before one (MSDA's int64 level tensors) it is left open so our check names the input and the
    fix (tests/runtime/test_msda_kernels.py::test_bad_input_is_an_error_status[...int32-shapes])."""
    from onnx_custom.ops.msda import MSDA

    gather = next(s for s in parse_specs(DATA / "acme.yaml") if s.op_type == "GatherRows")
    assert _declared_input_types(gather, DATA / "acme_kernels.cpp") == [
        "OC_ELEM_UNDEFINED",
        "OC_ELEM_INT64",
    ]  # (table, index)
    assert _declared_input_types(MSDA, Path(MSDA.native.path())) == ["OC_ELEM_UNDEFINED"] * 5  # type: ignore[union-attr]


# ---- onnx_custom.InferenceSession(kernels=library), beside the shipped library -------------------
def test_inference_session_uses_user_library_beside_shipped_one(library: NativeLibrary) -> None:
    nodes = [
        helper.make_node("ScaleAdd", ["x", "y"], ["s"], domain="acme", alpha=3.0),
        helper.make_node("my_add", ["s", "y"], ["out"], domain="onnx_custom", alpha=2.0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n"]) for n in "xy"],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 18),
            helper.make_opsetid("acme", 1),
            helper.make_opsetid("onnx_custom", 1),
        ],
        ir_version=9,
    )
    sess = onnx_custom.InferenceSession(model, kernels=library)
    assert (
        sess.kernel_specs == ()
    )  # both domains native: acme from the user library, custom shipped
    x, y = draw((7,), "float32", 1), draw((7,), "float32", 2)
    (out,) = sess.run(None, {"x": x, "y": y})
    close(out, 2 * (3 * x.astype(np.float64) + y) + y, "float32")
    with pytest.raises(
        onnx_custom.KernelError, match=r"neither a native nor a Python kernel: acme::ScaleAdd"
    ):
        onnx_custom.InferenceSession(
            model, kernels="native"
        )  # the shipped library alone lacks acme


def test_build_is_cached_and_copies_atomically(library: NativeLibrary, tmp_path: Path) -> None:
    again = build_native_library(
        parse_specs(DATA / "acme.yaml"), tmp_path / "dist", name="acme_test"
    )
    assert (
        again.ops == library.ops and again.domains_key == "onnx_custom.native.acme_test_ops.domains"
    )
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == ["libacme_test_ops.so"]
    assert again.path.read_bytes() == library.path.read_bytes()  # the cached build, not a rebuild
    assert (
        NativeLibrary.load(again.path).ops == library.ops
    )  # what the library itself says it serves


@pytest.mark.parametrize("threads", [1, 3])
def test_parallel_for_runs_on_the_intra_op_pool(library: NativeLibrary, threads: int) -> None:
    sess = session(
        node_model("ThreadIds", [("x", "float32", ["n"])], [("out", "int64", None)]),
        library,
        threads,
    )
    (ids,) = run(sess, {"x": np.zeros(64, np.float32)})
    used = len(set(ids.tolist()))
    assert used == 1 if threads == 1 else used >= 2, (
        threads,
        used,
    )  # sleeping chunks: the pool hands them out


def test_cmake_project_holds_everything_it_needs(tmp_path: Path) -> None:
    from onnx_custom.spec import write_cmake_project

    root = write_cmake_project(parse_specs(DATA / "acme.yaml"), tmp_path / "project", name="acme")
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {
        "CMakeLists.txt",
        "kernels/acme_kernels.cpp",
        "generated/user_ops.cpp",
        "runtime/library.cpp",
        "runtime/binding.cpp",
        "runtime/common.cpp",
        "include/onnx_custom/kernel.h",
        "include/onnx_custom/half.h",
        "include/onnx_custom_ort_abi.h",
    } <= files
    assert not any(
        f.startswith("runtime/") and f.endswith(("deform_conv.cpp", "seed.cpp")) for f in files
    )  # shipped kernels left out
    cmake = (root / "CMakeLists.txt").read_text()
    assert '"OC_LIBRARY_NAME=\\"libacme_ops\\""' in cmake and "OC_WITHOUT_SHIPPED_OPS" in cmake
    binding = next((root / "generated").glob("binding_*.cpp")).read_text()
    assert (
        '#include "acme_kernels.cpp"' in binding
        and "scale_add(a_x, a_y, a_out, m_alpha);" in binding
    )


@pytest.mark.slow
def test_include_shipped_serves_both_from_one_library(tmp_path: Path) -> None:
    lib = build_native_library(
        parse_specs(DATA / "acme.yaml"), tmp_path, name="acme_all", include_shipped=True
    )
    assert {"acme::ScaleAdd", "onnx_custom::my_add", "onnx_custom::DeformConv2d"} <= set(lib.ops)
    nodes = [
        helper.make_node("ScaleAdd", ["x", "y"], ["s"], domain="acme", alpha=3.0),
        helper.make_node("my_add", ["s", "y"], ["out"], domain="onnx_custom", alpha=2.0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n"]) for n in "xy"],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 18),
            helper.make_opsetid("acme", 1),
            helper.make_opsetid("onnx_custom", 1),
        ],
        ir_version=9,
    )
    x, y = draw((9,), "float32", 1), draw((9,), "float32", 2)
    (out,) = run(session(model, lib), {"x": x, "y": y})  # plain onnxruntime, one library
    close(out, 2 * (3 * x.astype(np.float64) + y) + y, "float32")

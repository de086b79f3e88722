"""End to end: real onnx.helper models run in real ONNX Runtime through the Python kernel host."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_custom.runtime as rt
from onnx_custom.errors import KernelError
from onnx_custom.function_bodies import embed_functions
from onnx_custom.ort_kernels.seed import kernels as seed_kernels
from onnx_custom.runtime import KernelRegistry, TensorInfo

ELEM = {
    "float16": TensorProto.FLOAT16,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "bfloat16": TensorProto.BFLOAT16,
    "bool": TensorProto.BOOL,
}


def vi(name: str, dtype: str, shape: Any) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ELEM[dtype], shape)


def model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    domains: dict[str, int] | None = None,
) -> onnx.ModelProto:
    doms = domains or {n.domain: 1 for n in nodes if n.domain}
    ops = [helper.make_opsetid("", 18)] + [helper.make_opsetid(d, v) for d, v in doms.items()]
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs), opset_imports=ops, ir_version=10
    )


def my_add_model(
    dtype: str, domain: str = "onnx_custom", op: str = "my_add", **attrs: Any
) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", "b"], ["y"], domain=domain, name="add0", **attrs)
    return model(
        [node], [vi("a", dtype, ["N", 3]), vi("b", dtype, [3])], [vi("y", dtype, ["N", 3])]
    )


def data(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype in ("int64", "int32"):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    return rng.standard_normal(shape).astype(np_dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(1, 3), (5, 3), (0, 3)], ids=lambda s: "x".join(map(str, s)))
def test_my_add_dtypes_and_shapes(dtype: str, shape: tuple[int, ...]) -> None:
    sess = rt.InferenceSession(my_add_model(dtype, alpha=3.0))
    a, b = data(dtype, shape, 1), data(dtype, (3,), 2)
    (y,) = sess.run(None, {"a": a, "b": b})
    assert y.dtype == a.dtype and y.shape == shape
    expected = 3.0 * a.astype(np.float64) + b.astype(np.float64)  # independent: float64
    np.testing.assert_allclose(
        y.astype(np.float64), expected, rtol=1e-3 if dtype == "float16" else 1e-6
    )


def test_my_add_default_alpha_and_outputs_metadata() -> None:
    sess = rt.InferenceSession(my_add_model("float32"))
    assert sess.get_outputs()[0].shape == ["N", 3]
    a, b = data("float32", (4, 3)), data("float32", (3,), 1)
    np.testing.assert_allclose(sess.run(None, {"a": a, "b": b})[0], 2.0 * a + b, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
def test_multi_out(dtype: str) -> None:
    node = helper.make_node(
        "multi_out", ["x"], ["s", "t"], domain="onnx_custom", scale=4.0, shift=-1.0
    )
    m = model(
        [node], [vi("x", dtype, [2, "K"])], [vi("s", dtype, [2, "K"]), vi("t", dtype, [2, "K"])]
    )
    x = data(dtype, (2, 5))
    s, t = rt.InferenceSession(m).run(None, {"x": x})
    # independent: float64, rounded once (x * 4 and x - 1 are correctly rounded in every dtype)
    es, et = (
        (x.astype(np.float64) * 4.0).astype(dtype),
        (x.astype(np.float64) - 1.0).astype(dtype),
    )
    np.testing.assert_array_equal(s, es)
    np.testing.assert_array_equal(t, et)


def test_reregistered_in_user_domains() -> None:
    reg = seed_kernels.copy()
    reg.alias("com.acme::MyAdd", "onnx_custom::my_add")
    reg.add(seed_kernels["onnx_custom::multi_out"].renamed("com.acme.v2::MultiOut"))
    nodes = [
        helper.make_node("MyAdd", ["a", "b"], ["y"], domain="com.acme", alpha=0.5),
        helper.make_node("MultiOut", ["y"], ["s", "t"], domain="com.acme.v2"),
    ]
    m = model(
        nodes,
        [vi("a", "float64", ["N", 3]), vi("b", "float64", [3])],
        [vi("s", "float64", ["N", 3]), vi("t", "float64", ["N", 3])],
    )
    a, b = data("float64", (2, 3)), data("float64", (3,), 1)
    s, t = rt.InferenceSession(m, kernels=reg).run(None, {"a": a, "b": b})
    np.testing.assert_allclose(s, (0.5 * a + b) * 2.0)
    np.testing.assert_allclose(t, (0.5 * a + b) + 3.0)
    # the default registry does not serve com.acme: a clear error names every missing op
    with pytest.raises(
        KernelError, match=r"(?s)2 custom op\(s\).*com\.acme::MyAdd.*com\.acme\.v2::MultiOut"
    ):
        rt.InferenceSession(m)


attr_kernels = KernelRegistry()


@attr_kernels.kernel(
    "test.attrs::Mix",
    inputs=["x"],
    outputs=["y", "info"],
    attrs={
        "axes": ("ints", [0]),
        "weights": ("floats", [1.0]),
        "mode": ("string", "sum"),
        "tags": ("strings", ["a"]),
        "bias": "int",
    },
    shape_fn=lambda ins, attrs: [ins[0], TensorInfo(np.int64, (3,))],
)
def mix(
    x: np.ndarray, *, axes: list[int], weights: list[float], mode: str, tags: list[str], bias: int
) -> tuple[np.ndarray, np.ndarray]:
    factor = sum(weights) * (2 if mode == "double" else 1)
    return (x * factor + bias).astype(x.dtype), np.array(
        [sum(axes), len(tags), len(mode)], np.int64
    )


@pytest.mark.parametrize("explicit", [True, False], ids=["attrs-set", "defaults"])
def test_ints_floats_string_strings_attributes(explicit: bool) -> None:
    attrs: dict[str, Any] = {"bias": 1}
    if explicit:
        attrs.update(axes=[1, 2, 3], weights=[0.5, 0.25], mode="double", tags=["p", "q"])
    node = helper.make_node("Mix", ["x"], ["y", "info"], domain="test.attrs", **attrs)
    m = model(
        [node], [vi("x", "float32", [2])], [vi("y", "float32", [2]), vi("info", "int64", [3])]
    )
    y, info = rt.InferenceSession(m, kernels=attr_kernels).run(None, {"x": np.ones(2, np.float32)})
    if explicit:
        np.testing.assert_allclose(y, [2.5, 2.5])
        assert info.tolist() == [6, 2, 6]
    else:
        np.testing.assert_allclose(y, [2.0, 2.0])
        assert info.tolist() == [0, 1, 3]


def test_missing_required_attribute_fails_at_session_creation() -> None:
    node = helper.make_node("Mix", ["x"], ["y", "info"], domain="test.attrs")
    m = model(
        [node], [vi("x", "float32", [2])], [vi("y", "float32", [2]), vi("info", "int64", [3])]
    )
    with pytest.raises(KernelError, match=r"lacks required attribute 'bias' \(int\); fix: set it"):
        rt.InferenceSession(m, kernels=attr_kernels)


def test_optional_and_variadic_inputs() -> None:
    reg = KernelRegistry()

    @reg.kernel("t::Masked", inputs=["x", "mask?"], outputs=["y"])
    def masked(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return x if mask is None else np.where(mask, x, 0).astype(x.dtype)

    @reg.kernel("t::SumAll", inputs=["xs*"], outputs=["y"])
    def sum_all(*xs: np.ndarray) -> np.ndarray:
        return np.sum(xs, axis=0).astype(xs[0].dtype)

    x = data("float32", (4,))
    mask = np.array([True, False, True, False])
    m1 = model(
        [helper.make_node("Masked", ["x", "m"], ["y"], domain="t")],
        [vi("x", "float32", [4]), vi("m", "bool", [4])],
        [vi("y", "float32", [4])],
    )
    np.testing.assert_array_equal(
        rt.InferenceSession(m1, kernels=reg).run(None, {"x": x, "m": mask})[0], np.where(mask, x, 0)
    )
    m2 = model(
        [helper.make_node("Masked", ["x", ""], ["y"], domain="t")],
        [vi("x", "float32", [4])],
        [vi("y", "float32", [4])],
    )
    np.testing.assert_array_equal(rt.InferenceSession(m2, kernels=reg).run(None, {"x": x})[0], x)
    m3 = model(
        [helper.make_node("SumAll", ["x", "x", "x"], ["y"], domain="t")],
        [vi("x", "float32", [4])],
        [vi("y", "float32", [4])],
    )
    np.testing.assert_allclose(
        rt.InferenceSession(m3, kernels=reg).run(None, {"x": x})[0], 3 * x, rtol=1e-6
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_torch_tensor_kernels(dtype: str) -> None:
    import torch

    reg = KernelRegistry()

    @reg.kernel("t::TorchGelu", inputs=["x"], outputs=["y"], tensor_type="torch")
    def gelu(x: torch.Tensor) -> torch.Tensor:
        assert isinstance(x, torch.Tensor)
        return torch.nn.functional.gelu(x)

    # ORT's Python API cannot feed bfloat16 arrays: cast inside the graph instead
    nodes = [
        helper.make_node("Cast", ["x"], ["xc"], to=ELEM[dtype]),
        helper.make_node("TorchGelu", ["xc"], ["yc"], domain="t"),
        helper.make_node("Cast", ["yc"], ["y"], to=TensorProto.FLOAT),
    ]
    m = model(nodes, [vi("x", "float32", [3, 4])], [vi("y", "float32", [3, 4])])
    x = data("float32", (3, 4))
    (y,) = rt.InferenceSession(m, kernels=reg).run(None, {"x": x})
    expect = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, expect, rtol=2e-2, atol=2e-2)


def test_dtype_constraint_reported_at_session_creation() -> None:
    reg = KernelRegistry()
    reg.kernel("t::FloatOnly", inputs=["x"], outputs=["y"], dtypes=["float32"])(lambda x: x)
    m = model(
        [helper.make_node("FloatOnly", ["x"], ["y"], domain="t")],
        [vi("x", "int64", [2])],
        [vi("y", "int64", [2])],
    )
    with pytest.raises(KernelError, match="of dtype int64; expected one of float32; fix: cast"):
        rt.InferenceSession(m, kernels=reg)


def test_missing_kernels_listed_before_ort() -> None:
    nodes = [
        helper.make_node("Nope", ["a"], ["b"], domain="x.y", name="n1"),
        helper.make_node("Relu", ["b"], ["c"]),
        helper.make_node("Nope", ["c"], ["d"], domain="x.y", name="n2"),
        helper.make_node("my_add", ["d", "d"], ["e"], domain="onnx_custom"),
        helper.make_node("Other", ["e"], ["f"], domain="z"),
    ]
    m = model(nodes, [vi("a", "float32", [2])], [vi("f", "float32", [2])])
    assert rt.missing_kernels(m) == [("x.y", "Nope"), ("z", "Other")]
    with pytest.raises(
        KernelError, match=r"(?s)2 custom op\(s\).*x\.y::Nope \(nodes n1, n2\).*z::Other"
    ):
        rt.InferenceSession(m)


def test_model_sources_and_bad_files(tmp_path: Any) -> None:
    m = my_add_model("float32")
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    a, b = data("float32", (2, 3)), data("float32", (3,), 1)
    for src in (m, m.SerializeToString(), path, str(path)):
        np.testing.assert_allclose(
            rt.InferenceSession(src).run(None, {"a": a, "b": b})[0], 2 * a + b, rtol=1e-6
        )
    with pytest.raises(FileNotFoundError, match="not found.*fix"):
        rt.InferenceSession(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x0a\xff\xff\xff garbage")
    with pytest.raises(rt.ModelLoadError, match="not a valid ONNX model"):
        rt.InferenceSession(bad)
    with pytest.raises(rt.ModelLoadError):
        rt.InferenceSession(12)  # type: ignore[arg-type]


def test_session_options_for_users_own_sessions() -> None:
    m = my_add_model("float32")
    so = rt.session_options(m)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a, b = data("float32", (2, 3)), data("float32", (3,), 1)
    np.testing.assert_allclose(sess.run(None, {"a": a, "b": b})[0], 2 * a + b, rtol=1e-6)
    # the same options serve a second session of the model; a user's spinning choice is kept
    ort.InferenceSession(
        m.SerializeToString(), rt.session_options(m, base=so), providers=["CPUExecutionProvider"]
    )
    mine = ort.SessionOptions()
    mine.add_session_config_entry("session.intra_op.allow_spinning", "1")
    assert (
        rt.session_options(m, base=mine).get_session_config_entry("session.intra_op.allow_spinning")
        == "1"
    )


def test_checker_shape_inference_and_reference_evaluator() -> None:
    rt.register_schemas()
    rt.register_schemas()  # idempotent
    nodes = [
        helper.make_node("my_add", ["a", "b"], ["y"], domain="onnx_custom", alpha=1.5),
        helper.make_node("multi_out", ["y"], ["s", "t"], domain="onnx_custom"),
    ]
    m = model(
        nodes,
        [vi("a", "float32", ["N", 3]), vi("b", "float32", [3])],
        [vi("s", "float32", ["N", 3]), vi("t", "float32", ["N", 3])],
    )
    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    y = next(v for v in inferred.graph.value_info if v.name == "y")
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["N", 3]
    feeds = {"a": data("float32", (4, 3)), "b": data("float32", (3,), 1)}
    got = rt.reference_evaluator(m).run(None, feeds)
    want = rt.InferenceSession(m).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_function_body_fallback_and_kernel_precedence() -> None:
    reg = KernelRegistry()
    body = helper.make_function(
        "t",
        "Bump",
        ["x"],
        ["y"],
        [
            helper.make_node("Constant", [], ["c"], value_float=100.0),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    # kernel and body deliberately disagree (+1 vs +100) to see which one runs
    reg.kernel("t::Bump", inputs=["x"], outputs=["y"], function=body)(lambda x: x + 1)
    m = model(
        [helper.make_node("Bump", ["x"], ["y"], domain="t")],
        [vi("x", "float32", [3])],
        [vi("y", "float32", [3])],
    )
    embedded = embed_functions(m, kernels=reg)
    assert [f.name for f in embedded.functions] == ["Bump"] and not m.functions
    x = np.zeros(3, np.float32)
    plain = ort.InferenceSession(embedded.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(plain.run(None, {"x": x})[0], x + 100)
    np.testing.assert_array_equal(
        rt.InferenceSession(embedded, kernels=reg).run(None, {"x": x})[0], x + 1
    )
    # a model carrying the body needs no kernel at all
    assert rt.missing_kernels(embedded, kernels=KernelRegistry()) == []


def test_seed_my_add_body_matches_kernel() -> None:
    m = embed_functions(my_add_model("float32", alpha=0.25))
    assert m.functions[0].name == "my_add"
    a, b = data("float32", (3, 3)), data("float32", (3,), 1)
    plain = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        plain.run(None, {"a": a, "b": b})[0],
        rt.InferenceSession(m).run(None, {"a": a, "b": b})[0],
        rtol=1e-6,
    )


def test_unknown_rank_inputs_keep_real_output_shapes() -> None:
    # ORT reports unknown-rank inputs as rank 0 to custom ops; outputs must not become scalars
    nodes = [
        helper.make_node("my_add", ["a", "b"], ["y"], domain="onnx_custom"),
        helper.make_node("multi_out", ["y"], ["s", "t"], domain="onnx_custom"),
    ]
    m = model(
        nodes,
        [vi("a", "float32", None), vi("b", "float32", None)],
        [vi("s", "float32", None), vi("t", "float32", None)],
    )
    a, b = data("float32", (2, 5)), data("float32", (2, 5), 1)
    s, t = rt.InferenceSession(m).run(None, {"a": a, "b": b})
    assert s.shape == t.shape == (2, 5)
    np.testing.assert_allclose(s, (2 * a + b) * 2, rtol=1e-6)


def test_parallel_execution_mode_and_read_only_inputs() -> None:
    reg = KernelRegistry()
    reg.kernel("t::Neg", inputs=["x"], outputs=["y"])(lambda x: -x)

    @reg.kernel("t::Scribble", inputs=["x"], outputs=["y"])
    def scribble(x: np.ndarray) -> np.ndarray:
        x[0] = 1  # inputs are zero-copy views of ORT memory: writing must fail
        return x

    nodes = [helper.make_node("Neg", ["x"], [f"n{i}"], domain="t") for i in range(4)]
    nodes.append(helper.make_node("Sum", [f"n{i}" for i in range(4)], ["y"]))
    m = model(nodes, [vi("x", "float32", [8])], [vi("y", "float32", [8])])
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 2
    sess = rt.InferenceSession(m, so, kernels=reg)
    x = data("float32", (8,))
    for _ in range(20):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], -4 * x, rtol=1e-6)
    m2 = model(
        [helper.make_node("Scribble", ["x"], ["y"], domain="t")],
        [vi("x", "float32", [8])],
        [vi("y", "float32", [8])],
    )
    with pytest.raises(Exception, match="read-only"):
        rt.InferenceSession(m2, kernels=reg).run(None, {"x": x})

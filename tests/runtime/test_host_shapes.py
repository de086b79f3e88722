"""Kernel shape rules never lie: no shape_fn claims no shape; "like:x"/"broadcast" only when
declared; ORT's and onnx's shape inference agree with what kernels return."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
import onnx_custom.runtime as rt
from onnx_custom.common.builtins import KERNEL_MODULES
from onnx_custom.runtime import KernelRegistry, TensorInfo
from onnx_custom.verification.runner import input_names
from onnx_custom.zoo import discover

kernels = KernelRegistry()


@kernels.kernel("shp::Reduce", inputs=["x"], outputs=["y"])  # no shape_fn: claims no shape
def reduce(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1, keepdims=True)


@kernels.kernel("shp::ReduceLying", inputs=["x"], outputs=["y"], shape_fn="like:x")  # a wrong rule
def reduce_lying(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1, keepdims=True)


@kernels.kernel("shp::Second", inputs=["a", "b"], outputs=["y", "z"], shape_fn="like:b")
def second(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return b * 2, b + a.sum().astype(b.dtype)


@kernels.kernel("shp::ArgMaxLast", inputs=["x"], outputs=["i"], dtypes={"i": "int64"})
def argmax(x: np.ndarray) -> np.ndarray:
    return x.argmax(axis=-1)


@kernels.kernel("shp::Scale", inputs=["x", "k"], outputs=["y"])  # dtype like x (not the last input)
def scale(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    return (x * k.reshape(-1, *([1] * (x.ndim - 1)))).astype(x.dtype)


def graph_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    domains = {n.domain for n in nodes if n.domain}
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, value_info=list(value_info)),
        opset_imports=[helper.make_opsetid("", 18)]
        + [helper.make_opsetid(d, 1) for d in sorted(domains)],
        ir_version=10,
    )


def reduce_model(op: str, value_info_shape: list[int] | None) -> onnx.ModelProto:
    nodes = [
        helper.make_node(op, ["x"], ["y"], domain="shp"),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    vi = (
        []
        if value_info_shape is None
        else [helper.make_tensor_value_info("y", TensorProto.FLOAT, value_info_shape)]
    )
    return graph_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        vi,
    )


def warnings_on(so: ort.SessionOptions | None = None) -> ort.SessionOptions:
    so = so or ort.SessionOptions()
    so.log_severity_level = 2  # the user's explicit choice wins over our quiet default
    return so


ORT_SHAPE_WARNINGS = ("MergeShapeInfo", "Error merging shape info", "VerifyOutputSizes")


@pytest.mark.parametrize("value_info", [[2, 1, 3], None], ids=["true-value-info", "no-value-info"])
def test_kernel_without_shape_fn_claims_no_shape(value_info: list[int] | None, capfd: Any) -> None:
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    sess = rt.InferenceSession(reduce_model("Reduce", value_info), warnings_on(), kernels=kernels)
    (z,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(
        z, np.maximum(x.sum(axis=1, keepdims=True), 0), rtol=1.3e-6, atol=1e-5
    )
    log = capfd.readouterr().err
    assert not [w for w in ORT_SHAPE_WARNINGS if w in log], log[-2000:]


def test_the_log_check_sees_a_lying_rule(capfd: Any) -> None:
    """Control for the test above: the same harness does catch ORT's complaint."""
    rt.InferenceSession(reduce_model("ReduceLying", [2, 1, 3]), warnings_on(), kernels=kernels)
    assert (
        "Error merging shape info for output. 'y' source:{2,5,3} target:{2,1,3}"
        in capfd.readouterr().err
    )


def test_quiet_by_default(capfd: Any) -> None:
    rt.InferenceSession(reduce_model("ReduceLying", [2, 1, 3]), kernels=kernels)
    assert "MergeShapeInfo" not in capfd.readouterr().err


def test_onnx_shape_inference_records_no_invented_shape() -> None:
    rt.register_schemas(kernels)
    inferred = onnx.shape_inference.infer_shapes(reduce_model("Reduce", None), strict_mode=True)
    (y,) = [v for v in inferred.graph.value_info if v.name == "y"]
    assert y.type.tensor_type.elem_type == TensorProto.FLOAT
    assert not y.type.tensor_type.HasField("shape")
    # with the true shape recorded, strict inference accepts it (it used to claim {2,5,3})
    onnx.shape_inference.infer_shapes(reduce_model("Reduce", [2, 1, 3]), strict_mode=True)
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.shape_inference.infer_shapes(reduce_model("ReduceLying", [2, 1, 3]), strict_mode=True)


@pytest.mark.parametrize(
    ("dtype", "rows"),
    [("float32", 3), ("float64", 1), ("float16", 0)],
    ids=["f32-3x4", "f64-1x4", "f16-0x4"],
)
def test_declared_rules_and_dtypes(dtype: str, rows: int) -> None:
    elem = {
        "float32": TensorProto.FLOAT,
        "float64": TensorProto.DOUBLE,
        "float16": TensorProto.FLOAT16,
    }[dtype]
    nodes = [
        helper.make_node("Second", ["a", "b"], ["y", "zz"], domain="shp"),
        helper.make_node("ArgMaxLast", ["b"], ["i"], domain="shp"),
        helper.make_node("Scale", ["b", "k"], ["s"], domain="shp"),
    ]
    m = graph_model(
        nodes,
        [
            helper.make_tensor_value_info("a", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("b", elem, ["R", 4]),
            helper.make_tensor_value_info("k", TensorProto.INT32, ["R"]),
        ],
        [onnx.ValueInfoProto(name=n) for n in ("y", "zz", "i", "s")],
    )
    rt.register_schemas(kernels)
    inferred = {
        v.name: v.type.tensor_type for v in onnx.shape_inference.infer_shapes(m).graph.output
    }
    assert [d.dim_param or d.dim_value for d in inferred["y"].shape.dim] == ["R", 4]  # like:b
    assert inferred["y"].elem_type == elem and inferred["zz"].elem_type == elem
    assert inferred["i"].elem_type == TensorProto.INT64 and not inferred["i"].HasField("shape")
    assert inferred["s"].elem_type == elem and not inferred["s"].HasField(
        "shape"
    )  # like input 0's dtype
    rng = np.random.default_rng(1)
    a = np.array([1, 2], np.int64)
    b = rng.standard_normal((rows, 4)).astype(dtype)
    k = rng.integers(-3, 3, rows).astype(np.int32)
    y, zz, i, s = rt.InferenceSession(m, kernels=kernels).run(None, {"a": a, "b": b, "k": k})
    assert (y.dtype, zz.dtype, i.dtype, s.dtype) == (b.dtype, b.dtype, np.int64, b.dtype)
    np.testing.assert_array_equal(y, b * 2)
    np.testing.assert_array_equal(i, b.argmax(axis=-1))
    np.testing.assert_array_equal(s, (b * k[:, None]).astype(b.dtype))


# ---- every shipped kernel on a model whose value_info carries the true shapes -------------
def _shipped_cases() -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    """One exported zoo model per shipped kernel (TorchScript first, the faster exporter)."""
    shipped = {
        name
        for module in KERNEL_MODULES
        for name in importlib.import_module(module).kernels.names()
    }
    covered: set[str] = set()
    cases = []
    for short, module_name in discover().items():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # e.g. a model needing torchvision's compiled ops
            continue
        zoo = sorted(
            (c for c in getattr(module, "ZOO", ()) if not c.dynamic and not c.expect_error),
            key=lambda c: (
                c.variant != "custom",
                c.variant is not None,
                c.exporter != "torchscript",
            ),
        )
        firsts = list({c.variant: c for c in reversed(zoo)}.values())[::-1]  # first row per variant
        # The row most likely to emit custom nodes first; a module's next variant only while the
        # last one found kernels not yet covered (msda's mmdeploy node): exports are not cheap.
        for case in firsts:
            registry = onnx_custom.default_registry()
            if case.variant:
                registry = registry.with_variants(case.variant)
            model, args = module.Model().eval(), module.example_inputs()
            proto = onnx_custom.export(
                model, args, exporter=case.exporter, opset=case.opset, registry=registry
            )
            ops = {f"{n.domain}::{n.op_type}" for n in proto.graph.node} & shipped
            if not ops - covered:
                break
            covered |= ops
            tensors = [t for t in args if isinstance(t, torch.Tensor)]
            feeds = {
                n: t.detach().numpy()
                for n, t in zip(input_names(proto, args), tensors, strict=True)
            }
            cases.append((f"{short}-{case.label}", proto, feeds))
    assert covered == shipped, (
        f"shipped kernels without a zoo model to test them: {sorted(shipped - covered)}"
    )
    return cases


def _with_true_shapes(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``proto`` whose value_info states the shapes custom-node outputs really have."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    outs = [o for n in proto.graph.node if n.domain not in ("", "ai.onnx") for o in n.output if o]
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=o) for o in outs if o not in known)
    values = dict(
        zip(
            [o.name for o in probe.graph.output],
            rt.InferenceSession(probe).run(None, feeds),
            strict=True,
        )
    )
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    kept = [v for v in fixed.graph.value_info if v.name not in outs]
    del fixed.graph.value_info[:]
    fixed.graph.value_info.extend(kept)
    for name in outs:
        if name not in known:
            elem = onnx.helper.np_dtype_to_tensor_dtype(values[name].dtype)
            fixed.graph.value_info.append(
                helper.make_tensor_value_info(name, elem, list(values[name].shape))
            )
    return fixed


def test_shipped_kernels_raise_no_shape_warnings(capfd: Any) -> None:
    cases = _shipped_cases()
    capfd.readouterr()
    for label, proto, feeds in cases:
        sess = rt.InferenceSession(_with_true_shapes(proto, feeds), warnings_on())
        sess.run(None, feeds)
        log = capfd.readouterr().err
        assert not [w for w in ORT_SHAPE_WARNINGS if w in log], f"{label}:\n{log[-3000:]}"


def test_shape_fn_may_leave_one_output_unknown() -> None:
    reg = KernelRegistry()

    @reg.kernel(
        "shp::Half",
        inputs=["x"],
        outputs=["same", "unknown"],
        shape_fn=lambda ins, attrs: [ins[0], TensorInfo(ins[0].dtype, None)],
    )
    def half(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x, x[: len(x) // 2]

    m = graph_model(
        [helper.make_node("Half", ["x"], ["a", "b"], domain="shp")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "ab"],
    )
    a, b = rt.InferenceSession(m, kernels=reg).run(None, {"x": np.arange(6, dtype=np.float32)})
    assert a.shape == (6,) and b.shape == (3,)

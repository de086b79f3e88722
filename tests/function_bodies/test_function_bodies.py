"""Function bodies built from translations: attribute references, opset and dtype handling,
errors, and kernel precedence. Models are real onnx.helper graphs run in real ONNX Runtime (with
nothing registered) and in onnx.reference; expected values come from NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnx_custom
from onnx_custom.errors import KernelError, SymbolicError
from onnx_custom.function_bodies import embed_functions, function_proto
from onnx_custom.function_bodies.builder import (
    INT_ATTRIBUTE_LIMIT,
    AttrRef,
    TranslationBody,
    cast_like,
)
from onnx_custom.runtime import KernelRegistry

ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}


# -- toy ops: every kind of attribute use a translation can make ----------------------------


def affine(g: Any, x: Any, *, scale: Any, shift: Any, times: Any) -> Any:
    """(x * scale + shift) * times: float and int attributes as constants."""
    y = g.op("Add", g.op("Mul", x, g.constant(scale, like=x)), g.constant(shift, like=x))
    return g.op("Mul", y, cast_like(g, g.constant(times, dtype=np.int64), x))


def affine_math(x: np.ndarray, *, scale: float, shift: float, times: int) -> np.ndarray:
    return (x * x.dtype.type(np.float32(scale)) + x.dtype.type(np.float32(shift))) * x.dtype.type(
        times
    )


def leaky(g: Any, x: Any, *, slope: Any) -> Any:
    """LeakyRelu(slope * x, slope): a float attribute passed on as node attributes, also to a
    node with an array input (which becomes a Constant that must not take the reference)."""
    scaled = g.op("Gemm", x, np.eye(3, dtype=np.float32), alpha=slope)
    return g.op("LeakyRelu", scaled, alpha=slope)


def leaky_math(x: np.ndarray, *, slope: float) -> np.ndarray:
    y = x * np.float32(slope)
    return np.where(y < 0, y * np.float32(slope), y)


def tiled_pair(g: Any, x: Any, *, reps: Any, axes: Any) -> tuple[Any, Any]:
    """(tile(x, reps), x.sum(axes)): list attributes."""
    tiled = g.op("Tile", x, g.constant(reps, dtype=np.int64))
    return tiled, g.op("ReduceSum", x, g.constant(axes, dtype=np.int64), keepdims=0)


AFFINE_ATTRS = {"scale": "float", "shift": ("float", 0.5), "times": ("int", 1)}
TILED_ATTRS = {"reps": "ints", "axes": "ints"}


def toy_kernels() -> KernelRegistry:
    reg = KernelRegistry()
    reg.kernel(
        "toy::Affine",
        inputs=["x"],
        outputs=["y"],
        attrs=AFFINE_ATTRS,
        function=TranslationBody(affine, min_opset=9),
    )(affine_math)
    reg.kernel(
        "toy::Leaky",
        inputs=["x"],
        outputs=["y"],
        attrs={"slope": "float"},
        function=TranslationBody(leaky),
    )(leaky_math)
    reg.kernel(
        "toy::Tiled",
        inputs=["x"],
        outputs=["tiled", "summed"],
        attrs=TILED_ATTRS,
        function=TranslationBody(tiled_pair, min_opset=13),
    )(tiled_math)
    return reg


def tiled_math(x: np.ndarray, *, reps: list[int], axes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.tile(x, reps), x.sum(tuple(axes))


def node_model(
    op: str,
    nodes_attrs: list[dict[str, Any]],
    dtypes: list[str],
    opset: int,
    outputs: int = 1,
    shape: tuple[Any, ...] = ("N", 3),
) -> onnx.ModelProto:
    """One ``toy::op`` node per attribute dict, node i reading x{i} (dtype dtypes[i])."""
    nodes, ins, outs = [], [], []
    for i, (attrs, dtype) in enumerate(zip(nodes_attrs, dtypes, strict=True)):
        names = [f"y{i}_{j}" for j in range(outputs)]
        nodes.append(helper.make_node(op, [f"x{i}"], names, domain="toy", name=f"{op}{i}", **attrs))
        ins.append(helper.make_tensor_value_info(f"x{i}", ELEM[dtype], list(shape)))
        outs += [helper.make_tensor_value_info(n, ELEM[dtype], None) for n in names]
    graph = helper.make_graph(nodes, "g", ins, outs)
    return helper.make_model(
        graph,
        ir_version=8,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("toy", 1)],
    )


def run_plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def feeds_for(dtypes: list[str], rows: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"x{i}": rng.standard_normal((rows, 3)).astype(d) for i, d in enumerate(dtypes)}


# -- one body, many nodes: attribute references ----------------------------------------------

AFFINE_NODES = [dict(scale=2.5, shift=-0.25, times=3), dict(scale=-1.0, times=7)]


@pytest.mark.parametrize("opset", [9, 11, 12, 13, 15, 18])
def test_one_body_serves_nodes_with_different_attributes(opset: int) -> None:
    reg = toy_kernels()
    model = embed_functions(node_model("Affine", AFFINE_NODES, ["float32", "float32"], opset), reg)
    assert len(model.functions) == 1  # one FunctionProto for both nodes
    (body,) = model.functions
    assert [(o.domain, o.version) for o in body.opset_import] == [("", opset)]
    uses = {n.op_type for n in body.node}
    assert ("CastLike" in uses) == (opset >= 15)  # dtype-generic from 15, Cast below
    assert ("EyeLike" in uses) == (opset < 12)  # no Constant(value_int) before 12
    feeds = feeds_for(["float32", "float32"], rows=5)
    got = run_plain(model, feeds)
    for i, attrs in enumerate(AFFINE_NODES):
        full = {"shift": 0.5, **attrs}  # the body declares the kernel's default for shift
        np.testing.assert_allclose(got[i], affine_math(feeds[f"x{i}"], **full), rtol=1e-6)


@pytest.mark.parametrize("opset", [11, 18])  # Gemm without C: opset 11+
def test_attribute_passed_on_as_a_node_attribute(opset: int) -> None:
    slopes = [dict(slope=0.1), dict(slope=0.5)]
    model = embed_functions(
        node_model("Leaky", slopes, ["float32", "float32"], opset), toy_kernels()
    )
    feeds = feeds_for(["float32", "float32"])
    gemm = [n for n in model.functions[0].node if n.op_type == "Gemm"]
    assert [a.ref_attr_name for n in gemm for a in n.attribute] == ["slope"]
    for i, got in enumerate(run_plain(model, feeds)):
        np.testing.assert_allclose(got, leaky_math(feeds[f"x{i}"], **slopes[i]), rtol=1e-6)


@pytest.mark.parametrize("opset", [13, 18])
def test_list_attributes_and_reference_evaluator(opset: int) -> None:
    attrs = [dict(reps=[2, 1], axes=[1]), dict(reps=[1, 3], axes=[0, 1])]
    model = embed_functions(
        node_model("Tiled", attrs, ["float64", "float64"], opset, outputs=2), toy_kernels()
    )
    feeds = feeds_for(["float64", "float64"])
    for got in (run_plain(model, feeds), ReferenceEvaluator(model).run(None, feeds)):
        for i, a in enumerate(attrs):
            np.testing.assert_array_equal(got[2 * i], np.tile(feeds[f"x{i}"], a["reps"]))  # type: ignore[index]
            np.testing.assert_allclose(got[2 * i + 1], feeds[f"x{i}"].sum(tuple(a["axes"])))  # type: ignore[index]


def test_float64_body_below_opset_15_is_specialised_to_the_models_dtype() -> None:
    model = embed_functions(node_model("Affine", AFFINE_NODES[:1], ["float64"], 13), toy_kernels())
    casts = {a.i for n in model.functions[0].node if n.op_type == "Cast" for a in n.attribute}
    assert casts == {TensorProto.DOUBLE}
    feeds = feeds_for(["float64"])
    np.testing.assert_allclose(
        run_plain(model, feeds)[0],
        affine_math(feeds["x0"], **{"shift": 0.5, **AFFINE_NODES[0]}),
        rtol=1e-12,
    )


def test_mixed_dtypes_share_one_body_from_opset_15() -> None:
    model = embed_functions(
        node_model("Affine", AFFINE_NODES, ["float32", "float64"], 15), toy_kernels()
    )
    feeds = feeds_for(["float32", "float64"])
    got = run_plain(model, feeds)
    assert [g.dtype for g in got] == [np.float32, np.float64]
    np.testing.assert_allclose(
        got[1], affine_math(feeds["x1"], **{"shift": 0.5, **AFFINE_NODES[1]}), rtol=1e-12
    )


# -- the shipped kernels' bodies at the opsets where ORT inlines them -----------------------


def test_my_add_body_runs_in_an_opset_13_model() -> None:
    """The old fixed body imported opset 18 (CastLike): ORT failed on opset-13 files."""
    node = helper.make_node("my_add", ["a", "b"], ["y"], domain="onnx_custom", alpha=0.25)
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("a", "b", "y")]
    model = helper.make_model(
        helper.make_graph([node], "g", vi[:2], vi[2:]),
        ir_version=7,
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("onnx_custom", 1)],
    )
    embedded = embed_functions(model)
    assert embedded.ir_version >= 9 and embedded.functions[0].opset_import[0].version == 13
    onnx.checker.check_model(embedded)
    a, b = feeds_for(["float32", "float32"]).values()
    np.testing.assert_allclose(run_plain(embedded, {"a": a, "b": b})[0], 0.25 * a + b, rtol=1e-6)


def test_registered_kernel_wins_over_the_embedded_body(tmp_path) -> None:
    """Plain ORT runs the DCN body (= eager); our InferenceSession runs the kernel (here a fake
    that answers zeros, so the two are told apart)."""
    from onnx_custom.models import deform_conv
    from onnx_custom.ort_kernels.deform_conv import make_kernels

    model, args = deform_conv.Model().eval(), deform_conv.example_inputs()
    proto = onnx_custom.export(model, args, exporter="torchscript", opset=11, functions=True)
    assert [f.name for f in proto.functions] == ["DeformConv2d"]
    calls: list[int] = []

    def fake(*tensors: torch.Tensor, **attrs: Any) -> torch.Tensor:
        calls.append(1)
        return torch.zeros(tensors[0].shape[0], tensors[1].shape[0], *tensors[2].shape[2:])

    spec = make_kernels()["onnx_custom::DeformConv2d"]
    fakes = KernelRegistry()
    fakes.kernel(
        spec.name,
        inputs=[p.name for p in spec.inputs],
        outputs=["output"],
        attrs={a.name: (a.type, a.default) for a in spec.attrs},
        tensor_type="torch",
        shape_fn=spec.shape_fn,
    )(fake)
    feeds = {proto.graph.input[0].name: args[0].numpy()}
    with torch.no_grad():
        expected = model(args[0])
    torch.testing.assert_close(torch.from_numpy(run_plain(proto, feeds)[0]), expected)
    path = tmp_path / "dcn.onnx"
    path.write_bytes(proto.SerializeToString())
    (ours,) = onnx_custom.InferenceSession(str(path), kernels=fakes).run(None, feeds)
    assert calls and not ours.any()


# -- errors: type, what was expected, what was received, the fix -----------------------------


@pytest.mark.parametrize("misuse", [bool, int, float, list, len])
def test_python_use_of_an_attribute_reference_is_refused(misuse: Any) -> None:
    with pytest.raises(
        SymbolicError, match=r"'stride'.*only known at run time.*fix: .*g\.constant"
    ):
        misuse(AttrRef("stride", "int"))


def test_translation_that_is_not_body_ready_names_the_attribute() -> None:
    def python_math(g: Any, x: Any, *, scale: Any, shift: Any, times: Any) -> Any:
        return g.op("Mul", x, g.constant(float(scale) * 2, like=x))

    reg = KernelRegistry()
    reg.kernel(
        "toy::Bad",
        inputs=["x"],
        outputs=["y"],
        attrs=AFFINE_ATTRS,
        function=TranslationBody(python_math),
    )(affine_math)
    with pytest.raises(KernelError, match=r"toy::Bad at opset 18.*'scale'.*float\(\).*fix"):
        function_proto(reg["toy::Bad"])


def test_int_attribute_outside_what_opset_11_can_read() -> None:
    attrs = [dict(scale=1.0, times=INT_ATTRIBUTE_LIMIT)]
    with pytest.raises(
        KernelError, match=r"Affine0.*times=4096.*outside \[0, 4096\).*fix: export at opset >= 12"
    ):
        embed_functions(node_model("Affine", attrs, ["float32"], 11), toy_kernels())
    embed_functions(node_model("Affine", attrs, ["float32"], 12), toy_kernels())  # fine from 12


def test_list_attribute_below_opset_12_and_min_opset() -> None:
    reg = toy_kernels()
    with pytest.raises(KernelError, match=r"toy::Tiled needs opset >= 13.*imports opset 12.*fix"):
        embed_functions(node_model("Tiled", [dict(reps=[1, 1], axes=[0])], ["float32"], 12, 2), reg)
    unguarded = KernelRegistry()  # no min_opset: the builder itself refuses
    unguarded.kernel(
        "toy::Tiled",
        inputs=["x"],
        outputs=["tiled", "summed"],
        attrs=TILED_ATTRS,
        function=TranslationBody(tiled_pair),
    )(reg["toy::Tiled"].fn)
    with pytest.raises(
        KernelError, match=r"list attribute 'reps'.*from opset 12.*fix: export at opset >= 12"
    ):
        function_proto(unguarded["toy::Tiled"], opset=11)


def test_mixed_dtypes_below_opset_15_are_refused() -> None:
    with pytest.raises(
        KernelError,
        match=r"feed input 'x' both torch.float32 and torch.float64.*fix: export at opset >= 15",
    ):
        embed_functions(
            node_model("Affine", AFFINE_NODES, ["float32", "float64"], 13), toy_kernels()
        )


def test_unknown_dtype_below_opset_15_is_refused() -> None:
    with pytest.raises(
        KernelError, match=r"dtype of a value is unknown and opset 13 has no CastLike.*fix"
    ):
        function_proto(toy_kernels()["toy::Affine"], opset=13)  # no model: no dtypes


@pytest.mark.parametrize(
    ("translation", "message"),
    [
        ("no_colon_here", r"expected 'package.module:function'.*fix"),
        ("onnx_custom.symbolics.seed:missing", r"'missing' is not a callable in module"),
        (lambda g, x: x, r"does not accept the node attribute\(s\) \['scale', 'shift', 'times'\]"),
        (lambda g, x, **attrs: (x, x), r"returned 2 value\(s\) but the node has 1 output"),
    ],
)
def test_bad_body_declarations(translation: Any, message: str) -> None:
    reg = KernelRegistry()
    reg.kernel(
        "toy::Bad",
        inputs=["x"],
        outputs=["y"],
        attrs=AFFINE_ATTRS,
        function=TranslationBody(translation),
    )(affine_math)
    with pytest.raises(KernelError, match=message):
        function_proto(reg["toy::Bad"])


def test_fixed_body_written_for_another_opset_is_refused() -> None:
    cast_like_body = helper.make_function(
        "toy",
        "Old",
        ["x"],
        ["y"],
        [helper.make_node("CastLike", ["x", "x"], ["y"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    reg = KernelRegistry()
    reg.kernel("toy::Old", inputs=["x"], outputs=["y"], function=cast_like_body)(lambda x: x)
    model = node_model("Old", [{}], ["float32"], 13)
    with pytest.raises(
        KernelError, match=r"written for opset 18.*CastLike differs at the model's opset 13.*fix"
    ):
        embed_functions(model, reg)
    assert embed_functions(node_model("Old", [{}], ["float32"], 18), reg).functions


@pytest.mark.slow
def test_benchmark_runs_and_reports_ratio_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """Smoke test of benchmarks/function_bodies.py (timings are not asserted: shared CPUs)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "function_bodies.py"
    spec = importlib.util.spec_from_file_location("bench_function_bodies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--repeat", "1", "--rounds", "2"])
    for label in ("function body (opset 11)", "function body (opset 18)"):
        assert results[f"{label} / ORT DeformConv (opset 19)"] > 0
        assert results[f"{label} peak_bytes"] > results["ORT DeformConv (opset 19) peak_bytes"]
    assert "peak MiB" in capsys.readouterr().out

"""Op specs end to end: one declaration gives a working torch op, both exporters, ONNX Runtime.

Every op here is new, declared in the test (YAML in tmp_path or Python), and compared with an
independent reference written in plain torch in the test itself.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.runtime import default_kernel_registry
from onnx_custom.spec import (
    Attribute,
    Input,
    OpSpec,
    Output,
    register_spec,
    registered_specs,
    spec_scope,
)
from onnx_custom.translate.registry import default_registry

EXPORTERS = [("torchscript", 17), ("dynamo", 18)]

ACME_YAML = """\
- op_name: "acme::scale_add"          # qualified torch op name
  op_type: "ScaleAdd"                 # ONNX node type, in domain "acme" unless `domain:` says
                                      # otherwise
  input_desc:
    - {name: x, dtype: [float32, float16]}
    - {name: y, dtype: [float32, float16]}
  output_desc:
    - {name: out, dtype: [float32, float16], shape: "like:x"}
  attr_desc:
    - {name: alpha, dtype: float, default_value: 2.0}
  impl: "acme_ops:scale_add"          # eager math: module:function (torch tensors)
  kernel: "acme_ops:scale_add_np"     # ORT kernel math: module:function (numpy arrays)
"""

ACME_OPS = """\
def scale_add(x, y, *, alpha):
    return alpha * x + y


def scale_add_np(x, y, *, alpha):
    return (x.dtype.type(alpha) * x + y).astype(x.dtype)
"""


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The issue's example: ops.yaml plus the math module acme_ops.py on sys.path."""
    (tmp_path / "acme_ops.py").write_text(ACME_OPS)
    (tmp_path / "ops.yaml").write_text(ACME_YAML)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_ops", raising=False)
    with spec_scope():
        yield tmp_path / "ops.yaml"
    sys.modules.pop("acme_ops", None)


class ScaleAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.acme.scale_add(x, y, 0.5)


def _reference(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.add(torch.mul(x, alpha), y)


def test_yaml_op_works_in_eager_fake_and_opcheck(acme: Path) -> None:
    (spec,) = onnx_custom.load_specs(acme)
    assert spec.schema == "(Tensor x, Tensor y, float alpha=2.0) -> Tensor"
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(torch.ops.acme.scale_add(x, y, 0.5), _reference(x, y, 0.5))
    torch.testing.assert_close(torch.ops.acme.scale_add(x, y), _reference(x, y, 2.0))  # the default
    torch.library.opcheck(torch.ops.acme.scale_add.default, (x, y, 0.5))
    xt = torch.randn(3, 2).t()  # non-contiguous
    torch.testing.assert_close(torch.ops.acme.scale_add(xt, y, 0.5), _reference(xt, y, 0.5))


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_yaml_op_exports_and_runs_in_ort_with_no_other_registration(
    acme: Path, exporter: str, opset: int
) -> None:
    onnx_custom.load_specs(acme)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    proto = onnx_custom.export(ScaleAdd(), (x, y), exporter=exporter, opset=opset)
    (node,) = [n for n in proto.graph.node if n.domain == "acme"]
    assert node.op_type == "ScaleAdd"
    (alpha,) = node.attribute
    assert (alpha.name, alpha.type) == ("alpha", onnx.AttributeProto.FLOAT)
    assert alpha.f == pytest.approx(0.5)
    onnx.checker.check_model(proto, full_check=True)  # the spec registered acme::ScaleAdd's schema
    session = onnx_custom.InferenceSession(proto.SerializeToString())
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), (x, y), strict=True)}
    (got,) = session.run(None, feeds)
    np.testing.assert_allclose(got, _reference(x, y, 0.5).numpy(), rtol=1.3e-6, atol=1e-5)
    assert onnx_custom.verify(ScaleAdd(), (x, y), proto, trials=3).passed


def test_dynamo_file_runs_at_other_batch_sizes(acme: Path) -> None:
    onnx_custom.load_specs(acme)
    batch = torch.export.Dim("batch")
    args = (torch.randn(2, 3), torch.randn(2, 3))
    proto = onnx_custom.export(
        ScaleAdd(), args, exporter="dynamo", dynamic_shapes=({0: batch}, {0: batch})
    )
    session = onnx_custom.InferenceSession(proto)
    for n in (1, 3, 7):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        (got,) = session.run(None, {"x": x.numpy(), "y": y.numpy()})
        np.testing.assert_allclose(got, _reference(x, y, 0.5).numpy(), rtol=1.3e-6, atol=1e-5)


def test_scope_takes_everything_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "acme_ops.py").write_text(ACME_OPS)
    (tmp_path / "ops.yaml").write_text(ACME_YAML)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_ops", raising=False)
    with pytest.raises(RuntimeError, match="boom"), spec_scope():
        onnx_custom.load_specs(tmp_path / "ops.yaml")
        assert "acme::scale_add" in registered_specs()
        assert "acme::ScaleAdd" in default_kernel_registry()
        assert onnx.defs.has("ScaleAdd", "acme")
        raise RuntimeError("boom")
    assert "acme::scale_add" not in registered_specs()
    assert torch._C._jit_get_schemas_for_operator("acme::scale_add") == []
    assert "acme::scale_add" not in default_registry()
    assert "acme::ScaleAdd" not in default_kernel_registry()
    assert not onnx.defs.has("ScaleAdd", "acme")
    with spec_scope():  # and the same declaration registers again afterwards
        onnx_custom.load_specs(tmp_path / "ops.yaml")
        assert torch.ops.acme.scale_add(torch.ones(2), torch.ones(2)).tolist() == [3.0, 3.0]


def test_identical_spec_registers_once(acme: Path) -> None:
    first = onnx_custom.load_specs(acme)
    again = onnx_custom.load_specs(acme)  # re-loading the same file is harmless
    assert first == again
    with register_spec(first[0]) as handle:  # already registered: this handle owns nothing
        assert not handle.owned
    assert "acme::scale_add" in registered_specs()


# -- a multi-output op with int[]/float/str attributes and a backward, declared in Python ----------


def tile_scale(
    x: torch.Tensor, *, repeats: list[int], scale: float, reduce: str
) -> tuple[torch.Tensor, ...]:
    reduced = x.sum(-1) if reduce == "sum" else x.mean(-1)
    return x * scale, x.tile(tuple(repeats)), reduced


def tile_scale_np(
    x: np.ndarray, *, repeats: list[int], scale: float, reduce: str
) -> tuple[np.ndarray, ...]:
    reduced = x.sum(-1) if reduce == "sum" else x.mean(-1)
    return x * x.dtype.type(scale), np.tile(x, repeats), reduced.astype(x.dtype)


def _save(ctx: Any, inputs: Any, output: object) -> None:
    # `inputs` is the tuple torch passes, with the spec's names: no signature to repeat here
    ctx.shape, ctx.repeats, ctx.scale, ctx.reduce = (
        inputs.x.shape,
        list(inputs.repeats),
        inputs.scale,
        inputs.reduce,
    )


def _tile_scale_backward(
    ctx: Any, g_scaled: torch.Tensor, g_tiled: torch.Tensor, g_reduced: torch.Tensor
) -> tuple[object, ...]:
    split: list[int] = []
    for size, reps in zip(g_tiled.shape, ctx.repeats, strict=True):
        split += [reps, size // reps]
    folded = g_tiled.reshape(split).sum(dim=tuple(range(0, len(split), 2)))
    spread = g_reduced.unsqueeze(-1).expand(ctx.shape)
    if ctx.reduce == "mean":
        spread = spread / ctx.shape[-1]
    return g_scaled * ctx.scale + folded + spread, None, None, None


TILE_SCALE = OpSpec(
    "spectest::tile_scale",
    op_type="TileScale",
    inputs=[Input("x", ["float32", "float64"])],
    outputs=[
        Output("scaled", shape="like:x"),
        Output("tiled", shape="[d * r for d, r in zip(x, repeats)]"),
        Output("reduced", shape="x[:-1]"),
    ],
    attributes=[
        Attribute("repeats", "int[]"),
        Attribute("scale", "float", 1.0),
        Attribute("reduce", "str", "sum"),
    ],
    impl=tile_scale,
    kernel=tile_scale_np,
    backward=_tile_scale_backward,
    setup_context=_save,
)


def test_multi_output_spec_with_backward_passes_check_op() -> None:
    from onnx_custom.testing import check_op

    samples = [
        (torch.randn(2, 3), [2, 1], 0.5, "sum"),
        (torch.randn(4, 2, 3).permute(2, 0, 1), [1, 2, 1], 2.0, "mean"),  # non-contiguous, 3-D
    ]
    report = check_op(TILE_SCALE, samples)
    names = [c.name for c in report.cases]
    assert sum(n.startswith("opcheck") for n in names) == 2
    assert [c.detail for c in report.cases if c.name.startswith("backward")] == [
        "gradcheck (finite differences, float64)"
    ] * 2
    exported = [c for c in report.cases if "custom node" in c.name and c.passed]
    assert {e for c in exported for e in ("torchscript", "dynamo") if e in c.name} == {
        "torchscript",
        "dynamo",
    }
    assert any("at float64" in c.name for c in exported)  # every declared dtype is exercised
    assert "spectest::tile_scale" not in registered_specs()  # check_op cleans up after itself


def test_multi_output_node_carries_typed_attributes() -> None:
    x = torch.randn(2, 3)

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.ops.spectest.tile_scale(x, [2, 1], 0.5, "mean")

    with register_spec(TILE_SCALE):
        for exporter, opset in EXPORTERS:
            proto = onnx_custom.export(M(), (x,), exporter=exporter, opset=opset)
            (node,) = [n for n in proto.graph.node if n.domain == "spectest"]
            kinds = {a.name: a.type for a in node.attribute}
            assert kinds == {
                "repeats": onnx.AttributeProto.INTS,
                "scale": onnx.AttributeProto.FLOAT,
                "reduce": onnx.AttributeProto.STRING,
            }
            assert len(node.output) == 3
            session = onnx_custom.InferenceSession(proto)
            got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
            want = (x * 0.5, x.repeat(2, 1), x.sum(-1) / 3)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w.numpy(), rtol=1.3e-6, atol=1e-5)


# -- shape rules: a Python meta function, and an expression under dynamic shapes ------------------


def linear_meta(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The seed article's Meta function: [..., in] x [out, in] -> [..., out], no kernel run."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x @ weight.T
    return y if bias is None else y + bias


def linear_np(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = np.matmul(x, weight.T)
    return y if bias is None else y + bias


def _linear_spec(name: str, **shape: str) -> OpSpec:
    return OpSpec(
        name,
        op_type="Linear",
        inputs=[Input("x", ["float32"]), Input("weight", ["float32"]), Input("bias?", ["float32"])],
        outputs=[Output("y", shape=shape.get("rule"))],
        shape=linear_meta if "rule" not in shape else None,
        impl=linear,
        kernel=linear_np,
    )


def _independent_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, w, b)


class Linear(torch.nn.Module):
    def __init__(self, op: object, bias: bool) -> None:
        super().__init__()
        self.op, self.bias = op, bias

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.op(x, weight, bias if self.bias else None)  # type: ignore[operator]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_meta_function_shape_rule(bias: bool) -> None:
    from onnx_custom.testing import check_op

    spec = _linear_spec("spectest::linear_meta")
    samples = [(torch.randn(2, 5, 4), torch.randn(3, 4), torch.randn(3) if bias else None)]
    report = check_op(spec, samples, dtypes=False)
    assert report.passed
    with register_spec(spec) as handle:
        kernel = handle.kernel
        assert kernel is not None
        from onnx_custom.runtime import TensorInfo

        f32 = np.dtype("float32")
        concrete = kernel.infer([TensorInfo(f32, (2, 5, 4)), TensorInfo(f32, (3, 4)), None], {})
        assert concrete == [
            TensorInfo(f32, (2, 5, 3))
        ]  # from running the meta function on meta tensors
        symbolic = kernel.infer(
            [TensorInfo(f32, ("batch", 5, 4)), TensorInfo(f32, (3, 4)), None], {}
        )
        assert symbolic == [TensorInfo(f32, None)]  # unknown, never a guessed static shape


def test_expression_rule_keeps_symbolic_dims_under_dynamo() -> None:
    spec = _linear_spec("spectest::linear_expr", rule="x[:-1] + [weight.0]")
    with register_spec(spec) as handle:
        op = handle.op
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        args = (torch.randn(2, 5, 4), torch.randn(3, 4), torch.randn(3))
        model = Linear(op, bias=True)
        proto = onnx_custom.export(
            model, args, exporter="dynamo", dynamic_shapes=({0: batch, 1: seq}, None, None)
        )
        dims = proto.graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims][2] == 3
        assert dims[0].dim_param and dims[1].dim_param  # symbolic, not the export-time 2 and 5
        session = onnx_custom.InferenceSession(proto)
        for b, s in ((1, 1), (3, 7), (7, 2)):
            x = torch.randn(b, s, 4)
            (got,) = session.run(
                None, {"x": x.numpy(), "weight": args[1].numpy(), "bias": args[2].numpy()}
            )
            want = _independent_linear(x, args[1], args[2])
            np.testing.assert_allclose(got, want.numpy(), rtol=1.3e-6, atol=1e-5)
        from onnx_custom.runtime import TensorInfo

        f32 = np.dtype("float32")
        kernel = handle.kernel
        assert kernel is not None
        inferred = kernel.infer(
            [TensorInfo(f32, ("batch", "seq", 4)), TensorInfo(f32, (3, 4)), None], {}
        )
        assert inferred == [TensorInfo(f32, ("batch", "seq", 3))]


def test_fake_kernel_never_specializes_symbolic_dims() -> None:
    spec = _linear_spec("spectest::linear_fake", rule="[*x[:-1], weight.0]")
    with register_spec(spec) as handle:
        program = torch.export.export(
            Linear(handle.op, bias=False),
            (torch.randn(4, 4), torch.randn(3, 4), torch.randn(3)),
            dynamic_shapes=({0: torch.export.Dim("batch")}, None, None),
        )
        (out,) = program.graph.output_node().args[0]
        first = out.meta["val"].shape[0]
        assert isinstance(first, torch.SymInt)  # still symbolic after the fake kernel ran


def test_yaml_and_python_forms_declare_the_same_spec(tmp_path: Path) -> None:
    (tmp_path / "ops.yaml").write_text(ACME_YAML)
    (from_yaml,) = onnx_custom.spec.parse_specs(tmp_path / "ops.yaml")
    in_python = OpSpec(
        "acme::scale_add",
        op_type="ScaleAdd",
        inputs=[Input("x", ["float32", "float16"]), Input("y", ["float32", "float16"])],
        outputs=[Output("out", ["float32", "float16"], shape="like:x")],
        attributes=[Attribute("alpha", "float", 2.0)],
        impl="acme_ops:scale_add",
        kernel="acme_ops:scale_add_np",
    )
    assert from_yaml == in_python
    assert from_yaml.source.endswith("ops.yaml:1")


def test_yaml_folder_with_translations_by_opset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standard-op translations by opset next to the custom node; the custom node is a variant."""
    (tmp_path / "acme_ops.py").write_text(
        ACME_OPS
        + textwrap.dedent("""
        def scale_add_onnx(g, x, y, *, alpha):
            return g.op("Add", g.op("Mul", x, g.constant(alpha, like=x)), y)
    """)
    )
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "a.yaml").write_text(
        ACME_YAML + '  translations: {9: "acme_ops:scale_add_onnx"}\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "acme_ops", raising=False)
    from onnx_custom.testing import check_op

    with spec_scope():
        (spec,) = onnx_custom.load_specs(tmp_path / "specs")
        x, y = torch.randn(2, 3), torch.randn(2, 3)
        default = onnx_custom.export(ScaleAdd(), (x, y), exporter="torchscript", opset=13)
        assert {n.op_type for n in default.graph.node} >= {"Mul", "Add"}
        custom = onnx_custom.export(
            ScaleAdd(),
            (x, y),
            exporter="dynamo",
            registry=default_registry().with_variants("custom"),
        )
        assert [n.op_type for n in custom.graph.node if n.domain == "acme"] == ["ScaleAdd"]
        report = check_op(spec, [(x, y, 0.5)], dtypes=False)
    labels = {c.name.split(",")[0] for c in report.cases if c.passed}
    assert any(label.startswith("translation opset>=9") for label in labels)
    assert "custom node acme::ScaleAdd" in labels


def scale_add_body() -> onnx.FunctionProto:
    """ONNX function body of acme-style ScaleAdd: CastLike(alpha, x) * x + y."""
    alpha = onnx.helper.make_node("Constant", [], ["alpha"])
    alpha.attribute.append(
        onnx.AttributeProto(
            name="value_float", ref_attr_name="alpha", type=onnx.AttributeProto.FLOAT
        )
    )
    nodes = [
        alpha,
        onnx.helper.make_node("CastLike", ["alpha", "x"], ["alpha_t"]),
        onnx.helper.make_node("Mul", ["x", "alpha_t"], ["scaled"]),
        onnx.helper.make_node("Add", ["scaled", "y"], ["out"]),
    ]
    return onnx.helper.make_function(
        "spectest",
        "ScaleAddFn",
        ["x", "y"],
        ["out"],
        nodes,
        [onnx.helper.make_opsetid("", 17)],
        attributes=["alpha"],
    )


def test_function_body_runs_without_our_kernels_and_native_is_reported() -> None:
    from onnx_custom.testing import check_op

    spec = OpSpec(
        "spectest::scale_add_fn",
        op_type="ScaleAddFn",
        inputs=[Input("x", ["float32"]), Input("y", ["float32"])],
        outputs=[Output("out", shape="broadcast")],
        attributes=[Attribute("alpha", "float", 2.0)],
        impl=lambda x, y, *, alpha: alpha * x + y,
        kernel=lambda x, y, *, alpha: (x.dtype.type(alpha) * x + y).astype(x.dtype),
        function=scale_add_body,
        native=True,
    )
    report = check_op(
        spec, [(torch.randn(2, 3), torch.randn(1, 3), 0.5)], exporters=["torchscript"], dtypes=False
    )
    (body,) = [c for c in report.cases if c.name.startswith("function body")]
    assert body.passed, body.detail
    (native,) = [c for c in report.cases if c.name.startswith("native kernel")]
    assert native.passed in (None, True)  # skipped (with its reason) until the native library ships
    if native.passed is None:
        assert "not part of this build" in native.detail


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_check_op_verifies_one_file_at_every_sample_size(acme: Path, exporter: str) -> None:
    from onnx_custom.testing import check_op

    (spec,) = onnx_custom.load_specs(acme)
    samples = [
        (torch.randn(2, 3), torch.randn(2, 3), 0.5),
        (torch.randn(7, 3), torch.randn(7, 3), 0.5),
        (torch.randn(1, 3), torch.randn(1, 3), 0.5),
        (torch.randn(0, 3), torch.randn(0, 3), 0.5),
    ]
    report = check_op(spec, samples, exporters=[exporter], dtypes=False)
    (case,) = [c for c in report.cases if c.name.startswith("custom node")]
    # one file (exported at 7x3), verified at every sample's size, then at other sizes
    assert case.shapes[0] == "x[7, 3], y[7, 3]", case.shapes
    assert {f"x[{n}, 3], y[{n}, 3]" for n in (7, 2, 1, 0)} <= set(case.shapes), case.shapes
    assert len(case.shapes) > 4 and f"at {len(case.shapes)} shape(s)" in case.detail


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_zero_d_through_the_custom_node(acme: Path, exporter: str, opset: int) -> None:
    from onnx_custom.testing import check_op

    (spec,) = onnx_custom.load_specs(acme)
    check_op(spec, [(torch.randn(()), torch.randn(()), 0.5)], exporters=[exporter], opsets=[opset])


def weighted_sum(xs: list[torch.Tensor], *, weights: list[float]) -> torch.Tensor:
    return sum((x * w for x, w in zip(xs, weights, strict=True)), torch.zeros_like(xs[0]))


def weighted_sum_np(*xs: np.ndarray, weights: list[float]) -> np.ndarray:
    out = np.zeros_like(xs[0])
    for x, w in zip(xs, weights, strict=True):
        out += x * x.dtype.type(w)
    return out


def test_variadic_input_spreads_into_node_inputs() -> None:
    from onnx_custom.testing import check_op

    spec = OpSpec(
        "spectest::weighted_sum",
        op_type="WeightedSum",
        inputs=[Input("xs*", ["float32"])],
        outputs=[Output("out", shape="like:xs")],
        attributes=[Attribute("weights", "float[]")],
        impl=weighted_sum,
        kernel=weighted_sum_np,
    )
    assert spec.schema == "(Tensor[] xs, float[] weights) -> Tensor"
    xs = [torch.randn(2, 3) for _ in range(3)]
    report = check_op(spec, [(xs, [0.5, -1.0, 2.0])], dtypes=False)
    assert sum("custom node" in c.name and bool(c.passed) for c in report.cases) == 2
    with register_spec(spec) as handle:
        proto = onnx_custom.export(_ThreeSum(handle.op), tuple(xs), exporter="dynamo")
        (node,) = [n for n in proto.graph.node if n.domain == "spectest"]
        assert len(node.input) == 3
        got = onnx_custom.InferenceSession(proto).run(
            None, {i.name: x.numpy() for i, x in zip(proto.graph.input, xs, strict=True)}
        )[0]
        np.testing.assert_allclose(
            got, (0.5 * xs[0] - xs[1] + 2.0 * xs[2]).numpy(), rtol=1.3e-6, atol=1e-5
        )


class _ThreeSum(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.op([a, b, c], [0.5, -1.0, 2.0])


def test_standard_translations_only(tmp_path: Path) -> None:
    """No custom node: the spec still makes the torch op, its fake kernel and the translations."""
    from onnx_custom.testing import check_op

    def axpy_onnx(g: Any, x: Any, y: Any, *, a: float) -> Any:
        return g.op("Add", g.op("Mul", x, g.constant(a, like=x)), y)

    def axpy_onnx_18(g: Any, x: Any, y: Any, *, a: float) -> Any:
        return g.op("Sum", g.op("Mul", x, g.constant(a, like=x)), y)

    spec = OpSpec(
        "spectest::axpy",
        inputs=["x", "y"],
        outputs=[Output("out", shape="broadcast")],
        attributes=[Attribute("a", "float")],
        impl=lambda x, y, *, a: a * x + y,
        translations={7: axpy_onnx, 18: axpy_onnx_18},
    )
    samples = [
        (torch.randn(1, 3), torch.randn(3), 2.0),
        (torch.randn(4, 3), torch.randn(3), 2.0),
        (torch.randn(0, 3), torch.randn(3), 2.0),
    ]
    report = check_op(spec, samples)
    ran = {
        (c.name.split(" (")[0], c.name.split(", ")[1]): c
        for c in report.cases
        if c.passed and c.name.startswith("translation")
    }
    assert set(ran) >= {
        ("translation opset>=7", "torchscript opset 7"),
        ("translation opset>=18", "torchscript opset 18"),
        ("translation opset>=18", "dynamo opset 18"),
    }
    # exported with the 4x3 sample (torch.export would pin a dim of size 1), verified at all three
    for c in ran.values():
        assert c.shapes[0] == "x[4, 3], y[3]" and {f"x[{n}, 3], y[3]" for n in (4, 1, 0)} <= set(
            c.shapes
        ), c.shapes
    (skipped,) = [c for c in report.cases if c.passed is None]
    assert "covers opsets 7..17, below the dynamo exporter's opset 18" in skipped.detail


def test_zero_d_output_of_a_translation_with_a_scalar_constant() -> None:
    from onnx_custom.testing import check_op

    def scale_onnx(g: Any, x: Any, *, a: float) -> Any:
        return g.op("Mul", x, g.constant(a, like=x))

    spec = OpSpec(
        "spectest::scale0d",
        inputs=["x"],
        outputs=[Output("out", shape="like:x")],
        attributes=[Attribute("a", "float")],
        impl=lambda x, *, a: a * x,
        translations={7: scale_onnx},
    )
    check_op(spec, [(torch.randn(()), -1.0)], exporters=["torchscript"])


def test_unregister_spec_by_name() -> None:
    from onnx_custom.spec import SpecError, unregister_spec

    register_spec(TILE_SCALE)
    unregister_spec("spectest::tile_scale")
    assert "spectest::tile_scale" not in registered_specs()
    with pytest.raises(
        SpecError, match=r"no spec is registered under 'spectest::tile_scale'; registered: "
    ):
        unregister_spec(TILE_SCALE)

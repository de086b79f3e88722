"""The smaller declaring fixes: TENSOR attributes (Python kernels and specs), the one variant
rule, ``translation_table(opset=)`` used at another opset, YAML node constants reaching the eager
math, and per-thread spec scopes with exports serialized."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import onnx_custom
from onnx_custom.runtime import KernelRegistry
from onnx_custom.spec import (
    Attribute,
    Input,
    OpSpec,
    Output,
    SpecError,
    load_specs,
    register_spec,
    registered_specs,
    spec_scope,
)
from onnx_custom.testing import check_op
from onnx_custom.translate.registry import Registry

# -- TENSOR attributes ------------------------------------------------------------------------

TABLES = [
    ("float32-2x3", np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "float32"),
    ("float64-3", np.array([0.5, -1.0, 2.0]), "float64"),
    ("int64-0d", np.array(3, dtype=np.int64), "int64"),
    ("float16-1x3", np.array([[1.5, -2.0, 0.25]], dtype=np.float16), "float16"),
]


@pytest.mark.parametrize(
    ("table", "dtype"), [(t, d) for _, t, d in TABLES], ids=[i for i, _, _ in TABLES]
)
def test_python_kernel_reads_a_tensor_attribute(table: np.ndarray, dtype: str) -> None:
    kernels = KernelRegistry()

    @kernels.kernel(
        "acme::AddTable", inputs=["x"], outputs=["y"], attrs={"table": "tensor"}, shape_fn="like:x"
    )
    def add_table(x, *, table):
        assert not table.flags.writeable  # one value per node, shared by every call
        return (x + table).astype(x.dtype)

    node = helper.make_node(
        "AddTable", ["x"], ["y"], domain="acme", table=onnx.numpy_helper.from_array(table)
    )
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, ["n", 2, 3])],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
        ir_version=10,
    )
    x = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(dtype)
    (y,) = onnx_custom.InferenceSession(model, kernels=kernels).run(None, {"x": x})
    np.testing.assert_array_equal(y, (x + table).astype(dtype))  # independent: plain numpy


def test_tensor_attribute_default_and_bad_default() -> None:
    kernels = KernelRegistry()
    default = np.array([1.0, 2.0, 3.0], dtype=np.float32)

    @kernels.kernel(
        "acme::Scale",
        inputs=["x"],
        outputs=["y"],
        attrs={"w": ("tensor", default)},
        shape_fn="like:x",
    )
    def scale(x, *, w):
        return x * w

    node = helper.make_node("Scale", ["x"], ["y"], domain="acme")  # no attribute: the default
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])],
        [helper.make_tensor_value_info("y", 1, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)],
        ir_version=10,
    )
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(
        onnx_custom.InferenceSession(model, kernels=kernels).run(None, {"x": x})[0], x * default
    )
    with pytest.raises(
        onnx_custom.SymbolicError,
        match=r"default of attribute 'w' must be a tensor; received \[1, 2\]; fix",
    ):
        kernels.kernel("acme::Bad", inputs=["x"], outputs=["y"], attrs={"w": ("tensor", [1, 2])})(
            scale
        )


def _weighted(x: torch.Tensor, *, weights: torch.Tensor) -> torch.Tensor:
    return x * weights.to(x.dtype)


def _weighted_np(x: np.ndarray, *, weights: np.ndarray) -> np.ndarray:
    return (x * weights).astype(x.dtype)


def test_spec_tensor_node_attribute_reaches_eager_kernel_and_both_exporters() -> None:
    weights = np.array([0.5, -1.0, 2.0, 4.0], dtype=np.float32)
    spec = OpSpec(
        "tensattr::weighted",
        op_type="Weighted",
        inputs=[Input("x", ["float32", "float64"])],
        outputs=[Output("y", shape="like:x")],
        node_attributes=[Attribute("weights", "tensor", weights)],
        impl=_weighted,
        kernel=_weighted_np,
    )
    with spec_scope():
        report = check_op(spec, [(torch.randn(3, 4),), (torch.randn(1, 4, dtype=torch.float64),)])
        assert report.passed, str(report)
        handle = register_spec(spec)
        x = torch.randn(2, 4)
        torch.testing.assert_close(
            handle.op(x), x * torch.from_numpy(weights)
        )  # eager got the constant
        proto = onnx_custom.export(_OpModule(handle.op), (x,), exporter="dynamo")
        (node,) = [n for n in proto.graph.node if n.domain == "tensattr"]
        (attr,) = node.attribute
        assert attr.type == onnx.AttributeProto.TENSOR
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(attr.t), weights)


class _OpModule(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


def test_tensor_type_is_only_for_node_constants() -> None:
    with pytest.raises(
        SpecError,
        match=(
            r"attribute 'w' has type 'tensor', which a torch op cannot take.*fix: make it an input,"
            r" or a node attribute"
        ),
    ):
        OpSpec(
            "tensattr::bad",
            inputs=["x"],
            outputs=[Output("y", shape="like:x")],
            attributes=[Attribute("w", "tensor", np.ones(2))],
            impl=_weighted,
            translations={1: _translation_a},
        )
    with pytest.raises(
        SpecError, match=r"attribute 'w' \(tensor\) has value 'abc'.*expected a numpy array"
    ):
        OpSpec(
            "tensattr::bad2",
            op_type="Bad",
            inputs=["x"],
            outputs=[Output("y", shape="like:x")],
            node_attributes=[Attribute("w", "tensor", "abc")],
        )


# -- the variant rule: a preferred variant wins at any opset <= the export opset ----------------


def _translation_a(g: Any, x: Any) -> Any:
    return g.op("Neg", x)


def _translation_b(g: Any, x: Any) -> Any:
    return g.op("Abs", x)


def _translation_c(g: Any, x: Any) -> Any:
    return g.op("Relu", x)


VARIANTS = [
    # (id, registrations (opset, variant, fn), prefer, export opset, expected fn)
    (
        "preferred-below-default",
        [(19, "default", _translation_a), (11, "custom", _translation_b)],
        ("custom",),
        20,
        _translation_b,
    ),
    (
        "no-preference-newest-default",
        [(19, "default", _translation_a), (11, "custom", _translation_b)],
        (),
        20,
        _translation_a,
    ),
    (
        "default-not-yet-valid",
        [(19, "default", _translation_a), (11, "custom", _translation_b)],
        (),
        13,
        _translation_b,
    ),
    (
        "preferred-not-yet-valid",
        [(11, "default", _translation_a), (19, "custom", _translation_b)],
        ("custom",),
        13,
        _translation_a,
    ),
    (
        "preferred-newest-of-its-own",
        [
            (9, "custom", _translation_c),
            (13, "custom", _translation_b),
            (18, "default", _translation_a),
        ],
        ("custom",),
        18,
        _translation_b,
    ),
    (
        "first-preference-first",
        [
            (9, "fast", _translation_c),
            (13, "custom", _translation_b),
            (18, "default", _translation_a),
        ],
        ("fast", "custom"),
        18,
        _translation_c,
    ),
]


@pytest.mark.parametrize(
    ("entries", "prefer", "opset", "expected"),
    [v[1:] for v in VARIANTS],
    ids=[v[0] for v in VARIANTS],
)
def test_one_variant_rule(
    entries: list[tuple[int, str, Any]], prefer: tuple[str, ...], opset: int, expected: Any
) -> None:
    registry = Registry()
    for at, variant, fn in entries:
        registry.symbolic("vtest::op", opset=at, variant=variant)(fn)
    chosen = (registry.with_variants(*prefer) if prefer else registry).lookup("vtest::op", opset)
    assert chosen.fn is expected


# -- translation_table(opset=) vs the export's opset --------------------------------------------


@pytest.fixture
def table_op() -> Iterator[Any]:
    @torch.library.custom_op("tabletest::neg", mutates_args=())
    def neg(x: torch.Tensor) -> torch.Tensor:
        return -x

    @neg.register_fake
    def _(x):
        return torch.empty_like(x)

    registry = Registry()
    registry.symbolic("tabletest::neg", opset=1)(_translation_a)
    yield registry
    from torch._library import custom_ops

    custom_ops.OPDEF_TO_LIB.pop("tabletest::neg")._destroy()


class _Neg(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tabletest.neg(x) * 2


def test_translation_table_used_at_another_opset_is_an_opset_error(table_op: Registry) -> None:
    table = onnx_custom.translation_table(opset=10, registry=table_op)
    with pytest.raises(Exception) as info:
        torch.onnx.export(
            _Neg(),
            (torch.randn(2, 3),),
            dynamo=True,
            opset_version=20,
            custom_translation_table=table,
        )
    chain: list[BaseException] = []
    error: BaseException | None = info.value
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    opset_errors = [e for e in chain if isinstance(e, onnx_custom.OpsetError)]
    assert opset_errors, [type(e).__name__ for e in chain]
    message = str(opset_errors[0])
    for phrase in (
        "translation_table(opset=10)",
        "records at opset 20",
        "expected the opset the table was made for (10)",
        "Fix: pass translation_table(opset=20)",
    ):
        assert phrase in message, (phrase, message)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_preferred_variant_below_the_default_is_exported(table_op: Registry, exporter: str) -> None:
    table_op.symbolic("tabletest::neg", opset=19)(_translation_c)  # default variant: Relu from 19
    table_op.symbolic("tabletest::neg", opset=11, variant="custom")(_translation_b)  # Abs from 11
    types = {}
    for registry in (table_op, table_op.with_variants("custom")):
        proto = onnx_custom.export(
            _Neg(), (torch.randn(2, 3),), exporter=exporter, opset=20, registry=registry
        )
        types[registry.prefer] = {n.op_type for n in proto.graph.node}
    assert "Relu" in types[()] and "Abs" not in types[()]
    assert "Abs" in types[("custom",)] and "Relu" not in types[("custom",)]


def test_translation_table_at_the_export_opset_works(table_op: Registry, tmp_path: Path) -> None:
    table = onnx_custom.translation_table(opset=20, registry=table_op)
    program = torch.onnx.export(
        _Neg(), (torch.randn(2, 3),), dynamo=True, opset_version=20, custom_translation_table=table
    )
    assert program is not None
    assert {o.domain: o.version for o in program.model_proto.opset_import}[""] == 20
    assert "Neg" in {n.op_type for n in program.model_proto.graph.node}


# -- YAML node constants reach the eager math --------------------------------------------------

CONSTANT_YAML = """\
- op_name: "consttest::affine"
  op_type: Affine
  input_desc:
    - {name: x, dtype: [float32, float64]}
  output_desc:
    - {name: y, shape: "like:x"}
  node_attr_desc:
    - {name: scale, dtype: float, value: 3.0}
    - {name: shift, dtype: float, value: -0.5}
  impl: "consttest_ops:affine"
  kernel: "consttest_ops:affine_np"
"""

CONSTANT_OPS = """\
def affine(x, *, scale, shift):
    return x * scale + shift


def affine_np(x, *, scale, shift):
    return (x * scale + shift).astype(x.dtype)
"""


def test_yaml_node_constants_reach_the_eager_math(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "consttest_ops.py").write_text(CONSTANT_OPS)
    (tmp_path / "affine.yaml").write_text(CONSTANT_YAML)
    monkeypatch.syspath_prepend(str(tmp_path))
    with spec_scope():
        (spec,) = load_specs(tmp_path / "affine.yaml")
        x = torch.randn(3, 4)
        torch.testing.assert_close(
            torch.ops.consttest.affine(x), x * 3.0 - 0.5
        )  # independent formula
        report = check_op(spec, [(x,)])
        assert report.passed, str(report)


def test_shipped_seed_eager_math_reads_its_yaml_constants() -> None:
    from onnx_custom.ops.seed import MULTI_OUT, MY_ADD

    assert {a.name: a.default for a in MY_ADD.node_attributes} == {"alpha": 2.0}
    a, b = torch.arange(6, dtype=torch.int64) * (2**40), torch.ones(6, dtype=torch.int64)
    torch.testing.assert_close(
        torch.ops.onnx_custom.my_add(a, b), 2 * a + b, rtol=0, atol=0
    )  # int64 exact
    scaled, shifted = torch.ops.onnx_custom.multi_out(torch.tensor([1.0, -2.0]))
    assert {a.name: a.default for a in MULTI_OUT.node_attributes} == {"scale": 2.0, "shift": 3.0}
    torch.testing.assert_close(scaled, torch.tensor([2.0, -4.0]))
    torch.testing.assert_close(shifted, torch.tensor([4.0, 1.0]))


# -- per-thread spec scopes; exports serialized ----------------------------------------------


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _plus_three(x: torch.Tensor) -> torch.Tensor:
    return x + 3


def _double_onnx(g: Any, x: Any) -> Any:
    return g.op("Mul", x, g.constant(2.0, like=x))


def _plus_three_onnx(g: Any, x: Any) -> Any:
    return g.op("Add", x, g.constant(3.0, like=x))


THREAD_SPECS = {
    "a": OpSpec(
        "threadtest::double",
        inputs=[Input("x", ["float32"])],
        outputs=[Output("y", shape="like:x")],
        impl=_double,
        translations={9: _double_onnx},
    ),
    "b": OpSpec(
        "threadtest::plus_three",
        inputs=[Input("x", ["float32"])],
        outputs=[Output("y", shape="like:x")],
        impl=_plus_three,
        translations={9: _plus_three_onnx},
    ),
}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_two_threads_exporting_different_specs_both_get_the_right_file(
    exporter: str, tmp_path: Path
) -> None:
    """Thread a leaves its scope while thread b is still inside its own: b's spec must survive
    (a process-global scope took it back), and both files hold their own op."""
    registered, a_left = threading.Barrier(2), threading.Event()
    results: dict[str, Any] = {}

    def work(name: str) -> None:
        try:
            with spec_scope():
                handle = register_spec(THREAD_SPECS[name])
                registered.wait(timeout=60)
                if name == "b":
                    assert a_left.wait(timeout=120)  # export only after a's scope has closed
                x = torch.randn(3, 4)
                path = tmp_path / f"{name}.onnx"
                onnx_custom.export(
                    _OpModule(handle.op),
                    (x,),
                    path,
                    exporter=exporter,
                    opset=17 if exporter == "torchscript" else 18,
                )
                results[name] = (
                    x,
                    path,
                    onnx_custom.verify(_OpModule(handle.op), (x,), path).passed,
                )
        except BaseException as exc:
            results[name] = exc
        finally:
            if name == "a":
                a_left.set()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for name, want_type in (("a", "Mul"), ("b", "Add")):
        result = results[name]
        assert not isinstance(result, BaseException), f"thread {name}: {result!r}"
        _, path, passed = result
        assert passed
        assert want_type in {n.op_type for n in onnx.load(path).graph.node}
    assert not registered_specs().keys() & {"threadtest::double", "threadtest::plus_three"}

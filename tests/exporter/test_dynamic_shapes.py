"""Dynamic shapes through both exporters: every form of ``dynamic_shapes``, the user's dim names
in the file, the zoo's custom nodes at other batch sizes in plain ONNX Runtime, the user's own
``torch.onnx.export`` calls, and a typed error for every spec that does not fit."""

from __future__ import annotations

import importlib
import io
import json
import warnings
from typing import Any

import onnx
import pytest
import torch
from torch.export import Dim

import onnx_custom
from onnx_custom import DynamicShapesError
from onnx_custom.errors import ExtensionBuildError

EXPORTERS = [("torchscript", 17), ("dynamo", 18)]
BATCHES = (1, 3, 7)
METADATA_KEY = "onnx_custom.dynamic_dims"


def _dims(info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]


def _inputs(proto: onnx.ModelProto) -> dict[str, list[int | str]]:
    return {i.name: _dims(i) for i in proto.graph.input}


def _metadata(proto: onnx.ModelProto) -> dict[str, Any] | None:
    entry = next((p.value for p in proto.metadata_props if p.key == METADATA_KEY), None)
    return None if entry is None else json.loads(entry)


def _value_types(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    return {v.name: v for v in [*proto.graph.value_info, *proto.graph.output]}


def _custom_outputs(proto: onnx.ModelProto) -> list[str]:
    return [o for n in proto.graph.node if n.domain not in ("", "ai.onnx") for o in n.output]


# -- the zoo: every custom-variant model at batch sizes 1, 3 and 7 ----------------------------

ZOO_ROWS = [
    ("my_add", "torchscript", 13),
    ("my_add", "dynamo", 18),
    ("multi_out", "torchscript", 13),
    ("multi_out", "dynamo", 18),
    ("multi_out3", "torchscript", 13),
    ("multi_out3", "dynamo", 18),
    ("my_add_ext", "torchscript", 17),
    ("my_add_ext", "dynamo", 18),
    ("custom_linear", "torchscript", 17),
    ("custom_linear", "dynamo", 18),
    # autograd.Function translations are TorchScript-only (the dynamo exporter refuses them).
    ("autograd_fn", "torchscript", 17),
    # DeformConv2d is a custom node below opset 19; the dynamo exporter needs opset >= 18 for
    # dynamic shapes (its Shape nodes cannot be lowered to 11).
    ("deform_conv", "torchscript", 11),
    ("deform_conv", "dynamo", 18),
]


def _zoo_module(name: str) -> Any:
    try:
        return importlib.import_module(f"onnx_custom.models.{name}")
    except ExtensionBuildError as exc:
        pytest.skip(getattr(exc, "skip_reason", str(exc)))


def _at_batch(module: Any, batch: int) -> tuple[torch.Tensor, ...]:
    """The module's example inputs with every axis its dynamic_shapes names "batch" resized."""
    generator = torch.Generator().manual_seed(batch)
    out = []
    for example, spec in zip(module.example_inputs(), module.dynamic_shapes, strict=True):
        shape = list(example.shape)
        for axis, dim in (spec or {}).items():
            if dim.__name__ == "batch":
                shape[axis] = batch
        out.append(torch.randn(*shape, generator=generator, dtype=example.dtype))
    return tuple(out)


@pytest.mark.parametrize(
    ("name", "exporter", "opset"), ZOO_ROWS, ids=[f"{n}-{e}-opset{o}" for n, e, o in ZOO_ROWS]
)
def test_zoo_custom_nodes_run_at_other_batch_sizes(name: str, exporter: str, opset: int) -> None:
    module = _zoo_module(name)
    model = module.Model().eval()
    registry = onnx_custom.default_registry().with_variants("custom")
    proto = onnx_custom.export(
        model,
        module.example_inputs(),
        exporter=exporter,
        opset=opset,
        registry=registry,
        dynamic_shapes=module.dynamic_shapes,
    )
    custom = _custom_outputs(proto)
    assert custom, "the custom variant emits custom nodes"
    assert all(dims[0] == "batch" for dims in _inputs(proto).values())
    assert _metadata(proto)["batch"] == {"min": _bound(module, "min"), "max": _bound(module, "max")}  # type: ignore[index]
    # No static batch anywhere a custom node's output is typed (the old bug: traced sizes).
    types = _value_types(proto)
    for output in custom:
        if output in types:
            assert isinstance(_dims(types[output])[0], str), (output, _dims(types[output]))
    session = onnx_custom.InferenceSession(proto)
    names = [i.name for i in session.get_inputs()]
    for batch in BATCHES:
        inputs = _at_batch(module, batch)
        got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
        with torch.no_grad():
            expected = model(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(torch.from_numpy(g), e)  # shapes included


def _bound(module: Any, which: str) -> int | None:
    dim = module.dynamic_shapes[0][0]
    value = getattr(dim, which)
    return value if isinstance(value, int) and value > 0 else None


@pytest.mark.parametrize(("exporter", "opset"), [("torchscript", 17), ("dynamo", 18)])
def test_bev_pool_batch_is_fixed_by_bev_feat_shape(exporter: str, opset: int) -> None:
    # bev_pool_v2's output batch comes from bev_feat_shape and its ranks index one batch: a
    # dynamic batch cannot be honoured, and the example batch of 1 cannot even be checked.
    bev = _zoo_module("bev_pool")
    spec = {"depth_logits": {0: "batch"}, "feat": {0: "batch"}}
    registry = onnx_custom.default_registry().with_variants("custom")
    if exporter == "dynamo":
        with pytest.raises(DynamicShapesError, match=r"'batch'.*constant 1.*size >= 2"):
            onnx_custom.export(
                bev.Model().eval(),
                bev.example_inputs(),
                exporter=exporter,
                opset=opset,
                registry=registry,
                dynamic_shapes=spec,
            )
        return
    with pytest.warns(UserWarning, match=r"\['batch'\] were traced at size 0 or 1.*Fix"):
        onnx_custom.export(
            bev.Model().eval(),
            bev.example_inputs(),
            exporter=exporter,
            opset=opset,
            registry=registry,
            dynamic_shapes=spec,
        )


# -- every form of dynamic_shapes, the same file from both exporters ---------------------------


class TwoInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2, b + 1


def _two_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, generator=g), torch.randn(2, 5, generator=g)


FORMS: list[tuple[str, dict[str, Any], dict[str, list[Any]], dict[str, Any]]] = [
    # (id, export kwargs, expected input dims, expected metadata)
    (
        "dict-by-name-reordered-Dims",
        {"dynamic_shapes": {"b": {0: Dim("batch")}, "a": {1: Dim("feat")}}},
        {"a": [2, "feat"], "b": ["batch", 5]},
        {"batch": {"min": None, "max": None}, "feat": {"min": None, "max": None}},
    ),
    (
        "tuple-by-position-strings",
        {"dynamic_shapes": ({0: "batch"}, {0: "batch"})},
        {"a": ["batch", 3], "b": ["batch", 5]},
        {"batch": {"min": None, "max": None}},
    ),
    (
        "list-per-axis-name-with-space",
        {"dynamic_shapes": [["batch", None], [None, "seq len"]]},
        {"a": ["batch", 3], "b": [2, "seq len"]},
        {"batch": {"min": None, "max": None}, "seq len": {"min": None, "max": None}},
    ),
    (
        "Dim-with-range",
        {"dynamic_shapes": {"a": {0: Dim("n", min=2, max=64)}}},
        {"a": ["n", 3], "b": [2, 5]},
        {"n": {"min": 2, "max": 64}},
    ),
    (
        "negative-axis",
        {"dynamic_shapes": {"b": {-1: "seq"}}},
        {"a": [2, 3], "b": [2, "seq"]},
        {"seq": {"min": None, "max": None}},
    ),
    (
        "AUTO-STATIC-DYNAMIC",
        {"dynamic_shapes": {"a": {0: Dim.AUTO, 1: Dim.STATIC}, "b": {1: Dim.DYNAMIC}}},
        {"a": ["a_dim0", 3], "b": [2, "b_dim1"]},
        {"a_dim0": {"min": None, "max": None}, "b_dim1": {"min": None, "max": None}},
    ),
    (
        "torchscript-dynamic_axes",
        {"dynamic_axes": {"a": {0: "batch"}, "b": [1]}},
        {"a": ["batch", 3], "b": [2, "b_dim1"]},
        {"batch": {"min": None, "max": None}, "b_dim1": {"min": None, "max": None}},
    ),
    (
        "dynamic_axes-custom-input-names",
        {
            "input_names": ["lhs", "rhs"],
            "dynamic_axes": {"lhs": {0: "batch"}, "out": {0: "batch"}},
            "output_names": ["out", "out2"],
        },
        {"lhs": ["batch", 3], "rhs": [2, 5]},
        {"batch": {"min": None, "max": None}},
    ),
]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
@pytest.mark.parametrize(
    ("kwargs", "dims", "metadata"), [f[1:] for f in FORMS], ids=[f[0] for f in FORMS]
)
def test_dim_names_and_input_names_survive(
    kwargs: dict[str, Any],
    dims: dict[str, list[Any]],
    metadata: dict[str, Any],
    exporter: str,
    opset: int,
) -> None:
    model, args = TwoInputs(), _two_inputs()
    proto = onnx_custom.export(model, args, exporter=exporter, opset=opset, **kwargs)
    assert _inputs(proto) == dims
    assert _metadata(proto) == metadata
    # The file really is dynamic along the named dims: run with those dims resized.
    sizes = {name: 4 + i for i, name in enumerate(metadata)}
    resized = [
        torch.randn(*[sizes.get(d, d) if isinstance(d, str) else d for d in shape])
        for shape in dims.values()
    ]
    session = onnx_custom.InferenceSession(proto)
    got = session.run(None, {n: t.numpy() for n, t in zip(dims, resized, strict=True)})
    for g, e in zip(got, model(*resized), strict=True):
        torch.testing.assert_close(torch.from_numpy(g), e)


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return x.sum(-1) + pair[0].sum(-1) * pair[1].mean(-1)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_nested_inputs_named_like_torch_export(exporter: str, opset: int) -> None:
    g = torch.Generator().manual_seed(0)
    args = (
        torch.randn(2, 3, generator=g),
        (torch.randn(2, 4, generator=g), torch.randn(2, 6, generator=g)),
    )
    spec = {"x": {0: "batch"}, "pair": ({0: "batch", 1: "n"}, {0: "batch"})}
    proto = onnx_custom.export(Nested(), args, exporter=exporter, opset=opset, dynamic_shapes=spec)
    assert _inputs(proto) == {"x": ["batch", 3], "pair_0": ["batch", "n"], "pair_1": ["batch", 6]}
    session = onnx_custom.InferenceSession(proto)
    x, p0, p1 = torch.randn(5, 3), torch.randn(5, 7), torch.randn(5, 6)
    (got,) = session.run(None, {"x": x.numpy(), "pair_0": p0.numpy(), "pair_1": p1.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), Nested()(x, (p0, p1)))


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_static_export_has_no_dynamic_dims_metadata(exporter: str, opset: int) -> None:
    proto = onnx_custom.export(TwoInputs(), _two_inputs(), exporter=exporter, opset=opset)
    assert _inputs(proto) == {"a": [2, 3], "b": [2, 5]}  # forward's names under both exporters
    assert _metadata(proto) is None


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_auto_dim_the_model_fixes_is_static_in_both_files(exporter: str, opset: int) -> None:
    class FixesRows(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, -1)

    proto = onnx_custom.export(
        FixesRows(),
        (torch.randn(2, 3),),
        exporter=exporter,
        opset=opset,
        dynamic_shapes={"x": {0: Dim.AUTO, 1: Dim.AUTO}},
    )
    assert _inputs(proto) == {"x": [2, "x_dim1"]}
    assert _metadata(proto) == {"x_dim1": {"min": None, "max": None}}


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
def test_derived_dim_keeps_its_expression(exporter: str, opset: int) -> None:
    class Doubles(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cat([a, a]) + b

    n = Dim("n", min=2, max=50)
    proto = onnx_custom.export(
        Doubles(),
        (torch.randn(4, 3), torch.randn(8, 3)),
        exporter=exporter,
        opset=opset,
        dynamic_shapes={"a": {0: n}, "b": {0: 2 * n}},
    )
    assert _inputs(proto) == {"a": ["n", 3], "b": ["2*n", 3]}
    assert _metadata(proto) == {"n": {"min": 2, "max": 50}}
    a, b = torch.randn(5, 3), torch.randn(10, 3)
    (got,) = onnx_custom.InferenceSession(proto).run(None, {"a": a.numpy(), "b": b.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), Doubles()(a, b))


# -- the user's own torch.onnx.export calls ---------------------------------------------------


def _multi_out3() -> tuple[Any, Any, tuple[torch.Tensor, ...]]:
    module = _zoo_module("multi_out3")
    return module, module.Model().eval(), module.example_inputs()


def _run_at_batches(
    proto: onnx.ModelProto, model: torch.nn.Module, batches: tuple[int, ...] = (1, 5, 7)
) -> None:
    session = onnx_custom.InferenceSession(proto)
    name = session.get_inputs()[0].name
    for batch in batches:
        x = torch.randn(batch, 3, 4, generator=torch.Generator().manual_seed(batch))
        got = session.run(None, {name: x.numpy()})
        for g, e in zip(got, model(x), strict=True):
            torch.testing.assert_close(torch.from_numpy(g), e)


def test_users_own_torchscript_export_keeps_symbolic_dims() -> None:
    # The reproduction: export with a dynamic batch, run at batch 5.
    _, model, args = _multi_out3()
    buffer = io.BytesIO()
    with (
        onnx_custom.registered(onnx_custom.default_registry().with_variants("custom")),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            args,
            buffer,
            dynamo=False,
            opset_version=13,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
        )
    proto = onnx.load_from_string(buffer.getvalue())
    types = _value_types(proto)
    custom = _custom_outputs(proto)
    assert next(_dims(types[o]) for o in custom if o in types) == ["batch", 3, 4]
    assert all(isinstance(_dims(types[o])[0], str) for o in custom if o in types)
    _run_at_batches(proto, model)


def test_users_own_dynamo_export_keeps_symbolic_dims() -> None:
    _, model, args = _multi_out3()
    table = onnx_custom.translation_table(
        opset=18, registry=onnx_custom.default_registry().with_variants("custom")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=18,
            custom_translation_table=table,
            dynamic_shapes={"x": {0: "batch"}},
            verbose=False,
        )
    assert program is not None
    proto = program.model_proto
    types = _value_types(proto)
    dims = [_dims(types[o]) for o in _custom_outputs(proto) if o in types]
    assert ["batch", 3, 4] in dims and ["2*batch", 3, 12] in dims
    _run_at_batches(proto, model)


@pytest.mark.parametrize(("exporter", "opset"), [("torchscript", 13), ("dynamo", 18)])
def test_derived_dims_named_alike_by_both_exporters(exporter: str, opset: int) -> None:
    module, model, args = _multi_out3()
    proto = onnx_custom.export(
        model,
        args,
        exporter=exporter,
        opset=opset,
        registry=onnx_custom.default_registry().with_variants("custom"),
        dynamic_shapes=module.dynamic_shapes,
    )
    outputs = [_dims(o) for o in proto.graph.output]
    assert outputs == [["batch", 3, 4], ["2*batch", 3, 12], ["batch", 3]]
    assert not any(a.name == "onnx_custom_tag" for n in proto.graph.node for a in n.attribute)


# -- bad input: a typed error naming the input, the dim and the fix ----------------------------


class Rows2(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, -1)


class Adds(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def _pair(rows_b: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 3), torch.randn(rows_b, 3)


ERRORS: list[tuple[str, Any, Any, dict[str, Any], list[str]]] = [
    # (id, model, args, export kwargs, message fragments: what was expected/received and the fix)
    (
        "unknown-key",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"c": {0: "batch"}}},
        ["['c']", "Valid keys: ['a', 'b']", "Fix"],
    ),
    (
        "tuple-too-short",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": ({0: "batch"},)},
        ["1 entries", "2 input(s) ['a', 'b']", "Fix"],
    ),
    (
        "axis-out-of-range",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {2: "batch"}}},
        ["'a'", "axis 2", "2 dim(s) (shape [2, 3])", "Fix"],
    ),
    (
        "axis-list-wrong-length",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": ["batch"]}},
        ["'a'", "1 dim(s)", "has 2", "Fix"],
    ),
    (
        "unsupported-dim",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {0: 3.5}}},
        ["'a'", "axis 0", "unsupported dim 3.5", "Expected"],
    ),
    (
        "unknown-dynamic_axes-input",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_axes": {"z": [0]}},
        ["'z'", "['a', 'b']", "Fix"],
    ),
    (
        "static-int-mismatch",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {0: 4}}},
        ["'a'", "size 4", "size 2", "Fix"],
    ),
    (
        "range-excludes-example",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {0: Dim("batch", min=4, max=8)}}},
        ["'batch'", "'a'", "axis 0", "[4, 8]", "size 2", "Fix"],
    ),
    (
        "one-name-two-sizes",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {0: "n"}, "b": {1: "n"}}},
        ["'n'", "a[0]=2", "b[1]=5", "Fix"],
    ),
    (
        "one-name-two-ranges",
        Adds(),
        _pair(),
        {"dynamic_shapes": {"a": {0: Dim("n", max=8)}, "b": {0: Dim("n", max=9)}}},
        ["'n'", "max=8", "max=9", "Fix"],
    ),
    (
        "specialized-by-the-model",
        Rows2(),
        (torch.randn(2, 3),),
        {"dynamic_shapes": {"x": {0: "batch"}}},
        ["'batch'", "x[0]", "constant 2", "Fix"],
    ),
    (
        "dims-the-model-ties",
        Adds(),
        _pair(),
        {"dynamic_shapes": {"a": {0: "rows"}, "b": {0: "n"}}},
        ["'rows'", "'n'", "a[0]", "b[0]", "must always be equal", "Fix: give them the same name"],
    ),
    (
        "both-forms",
        TwoInputs(),
        _two_inputs(),
        {"dynamic_shapes": {"a": {0: "b"}}, "dynamic_axes": {"a": [0]}},
        ["dynamic_shapes or dynamic_axes, not both"],
    ),
    (
        "too-many-input-names",
        TwoInputs(),
        _two_inputs(),
        {"input_names": ["p", "q", "r"]},
        ["3 names", "2 tensor input(s) ['a', 'b']", "Pass at most"],
    ),
]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=[e for e, _ in EXPORTERS])
@pytest.mark.parametrize(
    ("model", "args", "kwargs", "fragments"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_bad_dynamic_shapes_raise_a_typed_error(
    model: Any, args: Any, kwargs: dict[str, Any], fragments: list[str], exporter: str, opset: int
) -> None:
    with pytest.raises(DynamicShapesError) as info:
        onnx_custom.export(model, args, exporter=exporter, opset=opset, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_exported_program_with_dynamic_shapes_is_refused() -> None:
    program = torch.export.export(TwoInputs(), _two_inputs(), strict=False)
    with pytest.raises(
        DynamicShapesError, match=r"ExportedProgram.*Fix: pass them to torch.export.export"
    ):
        onnx_custom.export(
            program, _two_inputs(), exporter="dynamo", dynamic_shapes={"a": {0: "batch"}}
        )

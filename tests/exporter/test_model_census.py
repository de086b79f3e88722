"""`model_census` (one walk feeding the export's post-passes) against an independent walk, and
each pass given the census against the same pass walking the model itself.

The models nest subgraphs the ways ONNX allows (If's ``g`` attributes, Loop's body, a custom
node with a ``graphs`` attribute), read a graph output inside a subgraph, put custom nodes in
subgraphs and local functions, and mention half precision only in a node attribute: the facts a
census could get wrong by stopping at the main graph or at the first attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx
import pytest
from onnx import TensorProto, helper

from onnx_custom.common.onnx_utils import HALF_ELEM_TYPES, model_census
from onnx_custom.errors import NodeDeclarationError
from onnx_custom.exporter.dim_params import rename_dims, write_metadata
from onnx_custom.exporter.dynamic_shapes import DimSpec, DynamicSpec
from onnx_custom.exporter.output_names import rename_outputs
from onnx_custom.exporter.pipeline import finalize_model
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.half_precision import HALF_TYPES, widen_model
from onnx_custom.runtime.kernel_spec import make_spec
from onnx_custom.runtime.validate import validate_registered

F = TensorProto.FLOAT


def _value(name: str, elem: int = F, shape: list[int | str] | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, [2] if shape is None else shape)


def _flat() -> onnx.ModelProto:
    """No subgraph: a custom node between standard ones, a Cast to float16 and back."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Foo", ["r"], ["f"], domain="my.ops", alpha=1.0),
        helper.make_node("Cast", ["f"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["y"], to=F),
    ]
    graph = helper.make_graph(
        nodes, "flat", [_value("x", shape=["batch", 2])], [_value("y", shape=["batch", 2])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _nested() -> onnx.ModelProto:
    """If (then/else bodies reading the graph output 'a' from outside), a Loop body with a custom
    node, a custom node with a ``graphs`` attribute, a local function with its own domain, and
    a float16 constant only inside a subgraph (the half facts are the main graph's)."""
    then = helper.make_graph(
        [helper.make_node("Bar", ["a"], ["t"], domain="sub.ops")], "then", [], [_value("t")]
    )
    other = helper.make_graph(
        [
            helper.make_node(
                "Constant",
                [],
                ["c"],
                value=helper.make_tensor("c", TensorProto.FLOAT16, [1], [1.0]),
            ),
            helper.make_node("Identity", ["a"], ["e"]),
        ],
        "else",
        [],
        [_value("e")],
    )
    body = helper.make_graph(
        [
            helper.make_node("Baz", ["carried"], ["next"], domain="loop.ops"),
            helper.make_node("Identity", ["cond"], ["keep"]),
        ],
        "body",
        [
            _value("i", TensorProto.INT64, []),
            _value("cond", TensorProto.BOOL, []),
            _value("carried"),
        ],
        [_value("keep", TensorProto.BOOL, []), _value("next")],
    )
    inner = helper.make_graph([helper.make_node("Neg", ["a"], ["n"])], "inner", [], [_value("n")])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("If", ["flag"], ["b"], then_branch=then, else_branch=other),
        helper.make_node("Loop", ["trips", "flag", "b"], ["looped"], body=body),
        helper.make_node("Multi", ["looped"], ["m"], domain="multi.ops", bodies=[inner, inner]),
        helper.make_node("Fn", ["m"], ["y"], domain="fn.local"),
    ]
    graph = helper.make_graph(
        nodes,
        "nested",
        [_value("x"), _value("flag", TensorProto.BOOL, []), _value("trips", TensorProto.INT64, [])],
        [_value("a"), _value("y", shape=["n", 2])],
    )
    function = helper.make_function(
        "fn.local",
        "Fn",
        ["u"],
        ["v"],
        [helper.make_node("Qux", ["u"], ["v"], domain="in.function")],
        [helper.make_opsetid("", 17), helper.make_opsetid("in.function", 1)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], functions=[function]
    )


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "flat-4-nodes": _flat,
    "nested-if-loop-graphs-function": _nested,
}


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Independent reference: every graph, recursively, in document order."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield from _graphs(sub)


def _half_attribute(graph: onnx.GraphProto) -> bool:
    return any(
        (a.name == "to" and a.i in (TensorProto.FLOAT16, TensorProto.BFLOAT16))
        or (
            a.type == onnx.AttributeProto.TENSOR
            and a.t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        )
        for node in graph.node
        for a in node.attribute
    )


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_census_matches_an_independent_walk(build: Callable[[], onnx.ModelProto]) -> None:
    model = build()
    census = model_census(model)
    graphs = list(_graphs(model.graph))
    assert sorted(g.name for g in census.graphs) == sorted(g.name for g in graphs)
    assert census.graphs[0].name == model.graph.name
    nodes = [n for g in graphs for n in g.node]
    assert census.names == {name for n in nodes for name in (*n.input, *n.output)}
    assert sorted((n.domain, n.op_type) for n in census.domain_nodes) == sorted(
        (n.domain, n.op_type) for n in nodes if n.domain
    )
    outputs = {o.name for o in model.graph.output}
    expected_users = sorted(n.op_type for n in nodes if outputs & {*n.input, *n.output})
    assert sorted(n.op_type for n in census.output_users) == expected_users
    assert census.half_attributes == _half_attribute(model.graph)
    assert sorted(n.op_type for n in census.nodes()) == sorted(n.op_type for n in nodes)


def test_census_half_types_are_the_half_precision_pass_types() -> None:
    assert set(HALF_TYPES) == HALF_ELEM_TYPES


RENAMES = {
    "first-output": ["renamed_a"],
    "both-outputs": ["renamed_a", "renamed_y"],
    "taken-name": ["b", "renamed_y"],
}


@pytest.mark.parametrize("keep_values", [False, True], ids=["rename", "identity"])
@pytest.mark.parametrize("names", RENAMES.values(), ids=RENAMES.keys())
@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_rename_outputs_with_census_matches_without(
    build: Callable[[], onnx.ModelProto], names: list[str], keep_values: bool
) -> None:
    walked, counted = build(), build()
    rename_outputs(walked, names, keep_values=keep_values)
    rename_outputs(counted, names, keep_values=keep_values, census=model_census(counted))
    assert counted == walked
    assert names[0] in {o.name for o in counted.graph.output} or names[0] == "b"


def test_rename_outputs_reaches_a_subgraph_reading_an_output() -> None:
    model = _nested()
    rename_outputs(model, ["renamed_a"], census=model_census(model))
    branches = {a.name: a.g for a in model.graph.node[1].attribute}
    assert list(branches["then_branch"].node[0].input) == ["renamed_a"]
    assert list(branches["else_branch"].node[1].input) == ["renamed_a"]


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_finalize_with_census_declares_the_same_domains(
    build: Callable[[], onnx.ModelProto],
) -> None:
    walked, counted = build(), build()
    finalize_model(walked)
    finalize_model(counted, census=model_census(counted))
    assert counted == walked
    assert {"my.ops"} <= {o.domain for o in counted.opset_import} or {
        "sub.ops",
        "loop.ops",
        "multi.ops",
        "fn.local",
        "in.function",
    } <= {o.domain for o in counted.opset_import}


def _spec(domain: str, op: str, inputs: int) -> KernelRegistry:
    registry = KernelRegistry()
    registry.add(
        make_spec(
            f"{domain}::{op}",
            lambda *a: a[0],
            inputs=[f"x{i}" for i in range(inputs)],
            outputs=["y"],
        )
    )
    return registry


KERNELS = {
    "main-graph": ("my.ops", "Foo"),
    "subgraph": ("sub.ops", "Bar"),
    "loop-body": ("loop.ops", "Baz"),
    "function": ("in.function", "Qux"),
}


@pytest.mark.parametrize("key", KERNELS.values(), ids=KERNELS.keys())
def test_validate_with_census_finds_the_same_mismatch(key: tuple[str, str]) -> None:
    """A kernel declaring two inputs for a one-input node: refused with and without the census,
    wherever the node sits."""
    model = _flat() if key[0] == "my.ops" else _nested()
    registry = _spec(*key, inputs=2)
    with pytest.raises(NodeDeclarationError) as walked:
        validate_registered(model, registry)
    with pytest.raises(NodeDeclarationError) as counted:
        validate_registered(model, registry, census=model_census(model))
    assert str(counted.value) == str(walked.value)


@pytest.mark.parametrize("mode", ["float32-compute", "strict"])
def test_widen_with_census_sees_a_half_cast_attribute(mode: str) -> None:
    """Half precision only in a Cast's ``to``: the census's attribute fact must not skip the pass
    (a Sin on the bfloat16 value, which ONNX lacks, is widened, or refused under strict, the
    same either way)."""

    def build() -> onnx.ModelProto:
        nodes = [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
            helper.make_node("Sin", ["h"], ["s"]),
            helper.make_node("Cast", ["s"], ["y"], to=F),
        ]
        graph = helper.make_graph(nodes, "sin", [_value("x")], [_value("y")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    results = []
    for census in (False, True):
        model = build()
        try:
            widen_model(model, mode, census=model_census(model) if census else None)
            results.append(("ok", [n.op_type for n in model.graph.node]))
        except Exception as exc:
            results.append((type(exc).__name__, str(exc)))
    assert results[0] == results[1]
    assert results[0][0] != "ok" or ("Sin" in results[0][1] and results[0][1].count("Cast") > 2)


def _dims_spec(names: tuple[str, ...]) -> DynamicSpec:
    dims = {n: DimSpec(n, 1, 64, (("x", 0),)) for n in names}
    return DynamicSpec(leaves=(), axes={}, dims=dims, export_shapes=None, torch_names={})


@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_dim_passes_with_census_graphs_match_the_walk(build: Callable[[], onnx.ModelProto]) -> None:
    walked, counted = build(), build()
    rename_dims(walked, {"batch": "rows", "n": "count"})
    rename_dims(counted, {"batch": "rows", "n": "count"}, graphs=model_census(counted).graphs)
    assert counted == walked


DIMS = {"none": (), "used": ("batch",), "used-and-unused": ("batch", "n", "unused")}


@pytest.mark.parametrize("names", DIMS.values(), ids=DIMS.keys())
@pytest.mark.parametrize("build", MODELS.values(), ids=MODELS.keys())
def test_metadata_with_census_graphs_matches_the_walk(
    build: Callable[[], onnx.ModelProto], names: tuple[str, ...]
) -> None:
    """Only the dims the file uses are recorded; a spec without dims records none (the walk is
    skipped) and drops a previous write's entry, as before."""
    walked, counted = build(), build()
    for model in (walked, counted):
        model.metadata_props.add(key="onnx_custom.dynamic_dims", value='{"old": {}}')
    write_metadata(walked, _dims_spec(names))
    write_metadata(counted, _dims_spec(names), graphs=model_census(counted).graphs)
    assert counted == walked
    recorded = [p.value for p in counted.metadata_props]
    expected = {"flat": {"batch"}, "nested": {"n"}}[counted.graph.name]  # the dims each file uses
    assert all("old" not in v for v in recorded)
    assert bool(recorded) == bool(expected & set(names))

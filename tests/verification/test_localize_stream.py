"""Localization internals that keep it linear and small: segmented ONNX runs, one comparison per
value, linear cones, and parameters compared for real."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import onnx_custom
import onnx_custom.verification.localize as localize_module
from onnx_custom.verification.localize import _Cones, localize
from onnx_custom.verification.segmented import SegmentedRun

FLOAT = TensorProto.FLOAT


def _branch(name: str, op: str) -> onnx.GraphProto:
    """An If branch reading the outer-scope values b and x."""
    return helper.make_graph(
        [helper.make_node(op, ["b", "x"], [f"{name}_out"])],
        name,
        [],
        [helper.make_tensor_value_info(f"{name}_out", FLOAT, None)],
    )


def _graph_model() -> onnx.ModelProto:
    """Relu, an initializer, an If reading outer values, int64 values, a custom node, and a value
    (a) read again many nodes later: every way a value can cross a segment boundary."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Mul", ["a", "w"], ["b"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node(
            "Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.float32))
        ),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node(
            "If",
            ["positive"],
            ["c"],
            then_branch=_branch("then", "Add"),
            else_branch=_branch("else", "Sub"),
        ),
        helper.make_node("Shape", ["c"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=FLOAT),
        helper.make_node("Add", ["a", "c"], ["f"]),
        helper.make_node("my_add", ["a", "f"], ["y"], domain="onnx_custom", alpha=2.0),
    ]
    graph = helper.make_graph(
        nodes,
        "segments",
        [helper.make_tensor_value_info("x", FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("y", FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape_f", FLOAT, [2]),
        ],
        initializer=[w],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("onnx_custom", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference: one ordinary run with every node output made a graph output."""
    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    existing = {o.name for o in extended.graph.output}
    for node in extended.graph.node:
        extended.graph.output.extend(
            onnx.ValueInfoProto(name=o) for o in node.output if o not in existing
        )
    session = onnx_custom.InferenceSession(extended)
    names = [o.name for o in extended.graph.output]
    return dict(zip(names, session.run(names, feeds), strict=True))


@pytest.mark.parametrize(
    "budget", [1, 64, 1 << 30], ids=["one-node-per-segment", "small", "one-segment"]
)
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["then", "else"])
def test_segmented_run_equals_one_run(budget: int, sign: float) -> None:
    model = _graph_model()
    feeds = {"x": sign * np.arange(1, 7, dtype=np.float32).reshape(2, 3)}
    expected = _all_values(model, feeds)
    wanted = [o for node in model.graph.node for o in node.output]
    run = SegmentedRun(
        model,
        {"x": ort.OrtValue.ortvalue_from_numpy(feeds["x"])},
        [*wanted, "a", "x", "w"],
        budget_bytes=budget,
    )
    if budget == 1:
        assert run.segments == len(model.graph.node)
    for name in wanted:
        np.testing.assert_array_equal(run.take(name), expected[name], err_msg=name)
    np.testing.assert_array_equal(run.take("a"), expected["a"])  # wanted twice
    assert run.take("a") is None  # handed out as often as wanted, then released
    np.testing.assert_array_equal(
        run.take("x"), feeds["x"]
    )  # graph inputs and initializers as they are
    np.testing.assert_array_equal(run.take("w"), numpy_helper.to_array(model.graph.initializer[0]))
    assert run.take("not_a_value") is None


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            self.first = torch.nn.Linear(4, 8)
            self.second = torch.nn.Linear(8, 3)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        return torch.sigmoid(self.second(h) * 2.0) + h.sum(dim=-1, keepdim=True)


def _args() -> tuple[torch.Tensor]:
    return (torch.randn(5, 4, generator=torch.Generator().manual_seed(1)),)


def _with_scaled_initializer(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    edited = onnx.ModelProto()
    edited.CopyFrom(proto)
    for init in edited.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, name))
    return edited


def test_parameters_are_compared_not_assumed() -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="dynamo")
    loc = localize(model, args, proto)
    parameters = [v for n in loc.nodes for v in n.inputs if v.note.startswith("model parameter")]
    assert parameters and all(p.passed for p in parameters)
    observed = [p for p in parameters if p.observed]
    assert {p.onnx_name for p in observed} >= {"first.weight", "second.weight"}
    assert all(p.total > 0 and "same values on both sides" not in p.describe() for p in observed)
    inputs = [v for n in loc.nodes for v in n.inputs if v.name == "x"]
    assert inputs and "fed to both sides" in inputs[0].describe()
    assert loc.first is None and not loc.note


def test_a_file_from_other_weights_is_named() -> None:
    model, args = Chain().eval(), _args()
    proto = _with_scaled_initializer(
        onnx_custom.export(model, args, exporter="dynamo"), "second.weight"
    )
    loc = localize(model, args, proto)
    first = loc.first
    assert first is not None and not first.origin
    differing = [i for i in first.inputs if i.observed and not i.passed]
    assert [d.onnx_name for d in differing] == ["second.weight"]
    assert "the file was not exported from these weights" in loc.summary()
    assert (
        "WARNING: the file's initializers differ from the model's parameters: second.weight"
        in loc.note
    )


def test_probe_names_a_file_from_other_weights() -> None:
    model, args = Chain().eval(), _args()
    proto = onnx_custom.export(model, args, exporter="torchscript")
    names = {i.name for i in proto.graph.initializer}
    assert "first.weight" in names
    loc = localize(model, args, _with_scaled_initializer(proto, "first.weight"))
    assert loc.method == "probe" and loc.first is None  # the re-export itself is right
    assert "initializers differ from the model's parameters: first.weight" in loc.note


def test_each_value_is_compared_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node inputs reuse their producer's comparison (the old code compared per consumer)."""
    calls: list[str] = []
    real = localize_module.compare_arrays

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(k["name"])
        return real(*a, **k)

    monkeypatch.setattr(localize_module, "compare_arrays", counting)
    model, args = Chain().eval(), _args()
    loc = localize(model, args, onnx_custom.export(model, args, exporter="dynamo"))
    assert len(calls) == len(set(calls))
    values = {v.name for n in loc.nodes for v in (*n.inputs, *n.outputs) if v.observed and v.total}
    assert set(calls) == values


def _reference_cone(
    graph: onnx.GraphProto, outputs: list[str], inputs: list[str]
) -> tuple[str, ...]:
    """The old per-node definition: ancestors of the outputs minus ancestors of the inputs."""
    producers = {out: node for node in graph.node for out in node.output if out}

    def ancestors(names: list[str]) -> set[int]:
        seen: set[int] = set()
        stack = [producers[n] for n in names if n in producers]
        while stack:
            node = stack.pop()
            if id(node) not in seen:
                seen.add(id(node))
                stack.extend(producers[i] for i in node.input if i in producers)
        return seen

    inside = ancestors(outputs) - ancestors(inputs)
    return tuple(
        localize_module._label(n) for n in graph.node if id(n) in inside and n.op_type != "Constant"
    )


def test_linear_cones_equal_the_old_definition_on_a_chain() -> None:
    graph = _graph_model().graph
    cones = _Cones(graph)
    steps = [
        (["a"], ["x"]),
        (["b"], ["a"]),
        (["c"], ["b", "x"]),
        (["shape_f"], ["c"]),
        (["y"], ["a", "c"]),
    ]
    for outputs, inputs in steps:
        assert cones.claim(outputs, inputs) == _reference_cone(graph, outputs, inputs), outputs

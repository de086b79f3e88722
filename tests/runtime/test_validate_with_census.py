"""`validate_registered` with the export's `ModelCensus` reads the custom nodes off it instead of
walking the graph twice more: its verdict and problem lines (in order) must be those of the walk
without a census, for main-graph nodes, nodes inside an ``If`` branch and local functions."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from onnx_custom.common.onnx_utils import model_census
from onnx_custom.errors import NodeDeclarationError
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.validate import validate_registered

kernels = KernelRegistry()


@kernels.kernel(
    "vc::Scale", inputs=["x"], outputs=["y"], attrs={"alpha": ("float", 1.0)}, shape_fn="like:x"
)
def _scale(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    return x * alpha


F = onnx.TensorProto.FLOAT


def _scale_node(name: str, src: str, dst: str, **attrs: Any) -> onnx.NodeProto:
    return oh.make_node("Scale", [src], [dst], name=name, domain="vc", **attrs)


def _model(where: str, bad: bool) -> onnx.ModelProto:
    """Two custom nodes in the main graph (the second with a string ``alpha`` when ``bad``) and,
    per ``where``, a third inside an If branch or a local function, also bad when ``bad``."""
    wrong = {"alpha": "half"} if bad else {"alpha": 0.5}
    nodes = [_scale_node("first", "x", "a", alpha=2.0), _scale_node("second", "a", "b", **wrong)]
    functions = []
    if where == "if-branch":
        branch = oh.make_graph(
            [_scale_node("inner", "b", "c_then", **wrong)],
            "then",
            [],
            [oh.make_tensor_value_info("c_then", F, None)],
        )
        other = oh.make_graph(
            [oh.make_node("Identity", ["b"], ["c_else"])],
            "else",
            [],
            [oh.make_tensor_value_info("c_else", F, None)],
        )
        nodes += [
            oh.make_node(
                "Constant",
                [],
                ["cond"],
                value=oh.make_tensor("t", onnx.TensorProto.BOOL, [], [True]),
            ),
            oh.make_node("If", ["cond"], ["c"], then_branch=branch, else_branch=other),
        ]
    elif where == "function":
        body = [_scale_node("in_function", "u", "v", **wrong)]
        functions.append(
            oh.make_function(
                "local",
                "Wrap",
                ["u"],
                ["v"],
                body,
                [oh.make_opsetid("", 17), oh.make_opsetid("vc", 1)],
            )
        )
        nodes.append(oh.make_node("Wrap", ["b"], ["c"], domain="local"))
    else:
        nodes.append(oh.make_node("Identity", ["b"], ["c"]))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", F, [2])],
        [oh.make_tensor_value_info("c", F, [2])],
    )
    opsets = [oh.make_opsetid("", 17), oh.make_opsetid("vc", 1), oh.make_opsetid("local", 1)]
    return oh.make_model(graph, opset_imports=opsets, functions=functions)


def _lines(model: onnx.ModelProto, census: Any) -> list[str] | None:
    try:
        validate_registered(model, kernels, census=census)
    except NodeDeclarationError as exc:
        return list(exc.problems)
    return None


@pytest.mark.parametrize("bad", [False, True], ids=["matching", "string-alpha"])
@pytest.mark.parametrize("where", ["main-only", "if-branch", "function"])
def test_same_verdict_as_the_walk(where: str, bad: bool) -> None:
    model = _model(where, bad)
    without = _lines(model, None)
    assert _lines(model, model_census(model)) == without
    assert (without is not None) is bad
    if bad:  # the main graph's bad node, and the nested one
        assert len(without or []) == (1 if where == "main-only" else 2), without

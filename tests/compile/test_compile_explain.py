"""``explain_compile`` names what ran where and why; ``verify=True`` compares each ORT partition's
first call with eager and raises `VerificationError` on a planted wrong translation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _compile_util import load_zoo

import onnx_custom
from onnx_custom import Registry, VerificationError


@torch.library.custom_op("compile_explain::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@scaled_sin.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


def _registry(correct: bool) -> Registry:
    registry = Registry()

    @registry.symbolic("compile_explain::scaled_sin", opset=13)
    def translation(g: Any, x: Any, scale: float) -> Any:
        sin = g.op("Sin", x)
        # the planted bug: the scale is forgotten
        return g.op("Mul", sin, g.constant(scale, dtype=torch.float32)) if correct else sin

    return registry


def _model(x: torch.Tensor) -> torch.Tensor:
    return scaled_sin(x + 1.0, 3.0).relu()


X = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))


def test_verify_passes_a_correct_translation() -> None:
    backend = onnx_custom.compile_backend(registry=_registry(correct=True), verify=True)
    compiled = torch.compile(_model, backend=backend)
    torch.testing.assert_close(compiled(X), _model(X))
    assert backend.records[0].partitions[0].custom_ops == ("compile_explain.scaled_sin.default",)


def test_verify_raises_on_a_wrong_translation() -> None:
    backend = onnx_custom.compile_backend(registry=_registry(correct=False), verify=True)
    with pytest.raises(VerificationError, match="differs from PyTorch"):
        torch.compile(_model, backend=backend)(X)


def test_without_verify_the_wrong_translation_runs() -> None:
    """The planted bug is real: without verify= the compiled result differs from eager."""
    backend = onnx_custom.compile_backend(registry=_registry(correct=False))
    got = torch.compile(_model, backend=backend)(X)
    assert not torch.allclose(got, _model(X))


def test_explain_dcn_training_runs_in_one_partition_each_way() -> None:
    module = load_zoo("deform_conv")
    model = module.Model().train()
    explanation = onnx_custom.explain_compile(model, *module.example_inputs(), backward=True)
    forward, backward = explanation.graphs
    assert (forward.kind, backward.kind) == ("forward", "backward")
    for graph in (forward, backward):
        assert not graph.fallbacks and len(graph.partitions) == 1, str(explanation)
    assert "onnx_custom._deform_conv2d_backward.default" in backward.partitions[0].custom_ops
    assert "graph0_forward: 20/20 nodes in ONNX Runtime" in str(explanation)


def test_explain_names_a_backward_op_without_translation() -> None:
    module = load_zoo("bev_pool")
    leaves = [t.requires_grad_() for t in module.example_inputs()]
    explanation = onnx_custom.explain_compile(module.Model(), *leaves, backward=True)
    backward = explanation.graphs[1]
    assert [f.target for f in backward.fallbacks] == ["onnx_custom::bev_pool_v2_backward"]
    text = str(explanation)
    assert "eager onnx_custom::bev_pool_v2_backward" in text and "no translation" in text


def test_explain_forward_only_uses_the_inference_graph() -> None:
    module = load_zoo("custom_linear")
    explanation = onnx_custom.explain_compile(
        module.Model(), *module.example_inputs(), variants=("custom",)
    )
    (graph,) = explanation.graphs
    assert graph.kind == "inference" and graph.ort_nodes == graph.nodes
    assert "onnx_custom.custom_linear.default" in graph.partitions[0].custom_ops

"""The Deformable-DETR encoder layer (models/msda.py) deployed: the custom-node file and the
mmdeploy file in plain onnxruntime with only libonnx_custom_ops.so registered, and the custom-node
file with its function body embedded in plain onnxruntime with nothing registered; at a batch other
than the export's, against PyTorch eager."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _native_util import native_session

import onnx_custom
from onnx_custom.models import msda

OPSETS = {"torchscript": 17, "dynamo": 18}


def _export(exporter: str, **kwargs: Any) -> onnx.ModelProto:
    model = msda.Model().eval()
    return onnx_custom.export(
        model,
        msda.example_inputs(),
        exporter=exporter,
        opset=OPSETS[exporter],
        dynamic_shapes=msda.dynamic_shapes,
        **kwargs,
    )


def _other_batch() -> tuple[tuple[torch.Tensor, ...], np.ndarray]:
    gen = torch.Generator().manual_seed(3)
    args = tuple(torch.randn(3, msda.EMBED, h, w, generator=gen) for h, w in msda.LEVELS)
    with torch.no_grad():
        expected = msda.Model().eval()(*args).numpy()
    return args, expected


def _run(sess: ort.InferenceSession, args: tuple[torch.Tensor, ...]) -> np.ndarray:
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {n: a.numpy() for n, a in zip(names, args, strict=True)})[0]


@pytest.mark.parametrize("variant", [None, "mmdeploy"], ids=["custom", "mmdeploy"])
@pytest.mark.parametrize("exporter", list(OPSETS))
def test_native_library_alone_runs_the_file(exporter: str, variant: str | None) -> None:
    registry = onnx_custom.default_registry().with_variants(variant) if variant else None
    proto = _export(exporter, registry=registry)
    domain = variant or "onnx_custom"
    assert any(n.domain == domain for n in proto.graph.node)
    args, expected = _other_batch()
    np.testing.assert_allclose(_run(native_session(proto), args), expected, rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("exporter", list(OPSETS))
def test_function_body_runs_with_nothing_registered(exporter: str) -> None:
    proto = _export(exporter, functions=True)
    assert [f.name for f in proto.functions] == ["MultiScaleDeformableAttn"]
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    args, expected = _other_batch()
    np.testing.assert_allclose(_run(sess, args), expected, rtol=1.3e-6, atol=1e-5)


def test_verify_with_native_kernels() -> None:
    model = msda.Model().eval()
    proto = _export("torchscript")
    report = onnx_custom.verify(model, msda.example_inputs(), proto, kernels="native", trials=2)
    assert report.passed


def test_verify_with_python_kernels_when_head_dim_is_unknown_at_graph_time() -> None:
    """value comes from a Reshape whose last dim ORT cannot infer, so the Python kernel declares
    the output (2, 336, None): the host names that dim instead of letting ORT store -1, which
    made the MatMul after the node refuse to load (regression)."""
    model = msda.Model().eval()
    proto = _export("torchscript")
    assert onnx_custom.verify(model, msda.example_inputs(), proto, trials=2).passed

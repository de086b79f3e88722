"""Every zoo model under ``torch.compile(backend="onnx_custom")``: forward output vs eager, with
each translation variant and both kernel kinds; every node must run in ONNX Runtime."""

from __future__ import annotations

import pytest
import torch
from _compile_util import ZOO_MODELS, load_zoo

import onnx_custom

CASES = [
    pytest.param(name, variants, kernels, id=f"{name}-{'-'.join(variants) or 'default'}-{kernels}")
    for name in ZOO_MODELS
    for variants, kernels in (((), "python"), (("custom",), "python"), (("custom",), "native"))
]


@pytest.mark.parametrize(("name", "variants", "kernels"), CASES)
def test_forward_matches_eager(name: str, variants: tuple[str, ...], kernels: str) -> None:
    module = load_zoo(name)
    model = module.Model().eval()
    args = module.example_inputs()
    backend = onnx_custom.compile_backend(variants=variants, kernels=kernels)
    with torch.no_grad():
        expected = model(*args)
        got = torch.compile(model, backend=backend)(*args)
    torch.testing.assert_close(got, expected)
    assert backend.records, "the backend compiled no graph"
    for record in backend.records:
        assert not record.fallbacks, f"{record.name} fell back: {record.fallbacks}"
        assert record.ort_nodes == record.nodes > 0


def test_entry_point_name_runs_in_ort() -> None:
    """backend="onnx_custom" resolves through the torch_dynamo_backends entry point."""
    from torch._dynamo.backends.registry import lookup_backend

    from onnx_custom.compile.backend import onnx_custom_backend

    assert lookup_backend("onnx_custom") is onnx_custom_backend
    x = torch.randn(4, 5)
    got = torch.compile(lambda t: torch.asinh(t) * 0.5, backend="onnx_custom")(x)
    torch.testing.assert_close(got, torch.asinh(x) * 0.5)

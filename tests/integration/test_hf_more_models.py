"""transformers models outside the hf zoo, built from small configs (seeded random weights, no
download): exported with both exporters and verified in ONNX Runtime, at the export size, other
sizes and batches where the file declares them, float16 and non-contiguous inputs.

Skipped when transformers is absent (``pip install -c constraints.txt -e '.[hf]'``).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra is not installed (transformers)")

import onnx_custom


def _omdet_turbo() -> tuple[torch.nn.Module, tuple[object, ...]]:
    from onnx_custom.models.hf_detectors import build

    return build("OmDetTurbo")


@pytest.mark.slow
def test_omdet_turbo_traced_after_a_call_fails_verification() -> None:
    """OmDet-Turbo caches its text embeddings in a Python dict keyed by the token ids' values.
    Called once before a TorchScript export, the trace reads the cache: the file drops the
    token inputs and holds the example's embeddings as constants. verify must fail it (the fast
    variant: tests/verification/test_verify_pruned_values.py)."""
    model, args = _omdet_turbo()
    with torch.no_grad():
        model(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript")
    names = [i.name for i in proto.graph.input]
    assert "classes_input_ids" not in names and "tasks_input_ids" not in names
    # the reference: other class tokens (same shapes) give PyTorch other logits
    other = list(args)
    other[1] = torch.flip(args[1], dims=(1,))
    with torch.no_grad():
        assert not torch.allclose(model(*args)[1], model(*other)[1])
    report = onnx_custom.verify(model, args, proto, raise_on_mismatch=False, rtol=1e-4, atol=1e-4)
    assert not report.passed, str(report)
    (pruned,) = [r for r in report.shapes_tried if r.kind == "pruned"]
    assert pruned.status == "failed" and "classes_input_ids" in pruned.reason


def test_omdet_turbo_traced_fresh_verifies() -> None:
    """Exported before any call, the trace runs the text encoder: the file takes the tokens."""
    model, args = _omdet_turbo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        proto = onnx_custom.export(model, args, exporter="torchscript")
    assert "classes_input_ids" in [i.name for i in proto.graph.input]
    fresh, _ = _omdet_turbo()
    report = onnx_custom.verify(fresh, args, proto, rtol=1e-4, atol=1e-4)
    assert report.passed, str(report)


@pytest.mark.slow
def test_omdet_turbo_dynamo_row_names_the_data_dependent_line() -> None:
    """torch.export cannot trace OmDet-Turbo's text-embedding cache (keyed by the token ids'
    values, read with .tolist()): the row says it is torch's failure and where (the fast
    variant: tests/exporter/test_export_errors.py)."""
    from onnx_custom.hf_zoo import HfOptions, run_hf_row

    result = run_hf_row("OmDetTurbo", "dynamo", HfOptions(check_torch=False, dynamic=False))
    assert result.status == "torch-fails", result.detail
    assert "GuardOnDataDependentSymNode" in result.detail
    assert "modeling_omdet_turbo.py:" in result.detail
    assert "_get_cache_key_at_index" in result.detail

"""verify() reports what goes wrong at a trial instead of aborting.

- A Python kernel failing (`KernelRunError`) at a size other than the export's aborted verify,
  also with ``raise_on_mismatch=False``, and its message did not name the trial's shapes: now it
  fails that trial (a report entry naming the sizes and input shapes, the other trials still
  run) and, with ``raise_on_mismatch=True``, the `VerificationError` chains it. At the export
  shape it is raised as before.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from onnx_custom.errors import VerificationError
from onnx_custom.runtime import KernelRegistry, KernelRunError
from onnx_custom.verification.verifier import verify

# ---------------------------------------------------------------------------- a kernel failing at other sizes


def _twice_file(batch: int | str) -> onnx.ModelProto:
    node = helper.make_node("Twice", ["x"], ["y"], domain="octkr")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("octkr", 1)]
    return helper.make_model(graph, ir_version=10, opset_imports=opsets)


def _kernels(batch: int | None) -> KernelRegistry:
    """octkr::Twice, written for one batch size (None: fails at every size)."""
    registry = KernelRegistry()

    @registry.kernel("octkr::Twice", inputs=["x"], outputs=["y"], shape_fn="like0")
    def twice(x: np.ndarray) -> np.ndarray:
        if batch is None or x.shape[0] != batch:
            raise ValueError(f"Twice is written for batch {batch}, got {x.shape[0]}")
        return x * 2

    return registry


def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _example() -> tuple[torch.Tensor]:
    return (torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),)


def test_a_kernel_failing_at_other_sizes_fails_those_trials_naming_their_shapes() -> None:
    report = verify(
        _twice, _example(), _twice_file("batch"), kernels=_kernels(4), raise_on_mismatch=False
    )
    assert not report.passed
    assert [(r.kind, r.status) for r in report.shapes_tried] == [("example", "passed")] + [
        ("shape", "failed")
    ] * 3
    for record in report.failed_trials():
        (size,) = (v for k, v in record.sizes if k == "batch")
        assert f"at batch={size} (x[{size}, 3]): KernelRunError" in record.reason, record.reason
        assert f"got {size}" in record.reason  # the kernel's own message, kept


def test_raise_on_mismatch_raises_a_verification_error_caused_by_the_kernel() -> None:
    with pytest.raises(
        VerificationError, match=r"trial 1 \(shape\) batch=1: x\[1, 3\] -> FAILED"
    ) as caught:
        verify(_twice, _example(), _twice_file("batch"), kernels=_kernels(4))
    assert isinstance(caught.value.__cause__, KernelRunError)
    assert caught.value.report is not None and len(caught.value.report.failed_trials()) == 3


@pytest.mark.parametrize("raise_on_mismatch", [True, False])
def test_a_kernel_failing_at_the_export_shape_still_raises_its_own_error(
    raise_on_mismatch: bool,
) -> None:
    with pytest.raises(KernelRunError, match="written for batch None, got 4"):
        verify(
            _twice,
            _example(),
            _twice_file("batch"),
            kernels=_kernels(None),
            raise_on_mismatch=raise_on_mismatch,
        )

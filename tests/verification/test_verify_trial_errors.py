"""verify() reports what goes wrong at a trial instead of aborting, and checks every backend.

- A Python kernel failing (`KernelRunError`) at a size other than the export's aborted verify,
  also with ``raise_on_mismatch=False``, and its message did not name the trial's shapes: now it
  fails that trial (a report entry naming the sizes and input shapes, the other trials still
  run) and, with ``raise_on_mismatch=True``, the `VerificationError` chains it. At the export
  shape it is raised as before.
- The declared-type check ran on backend ``"onnxruntime"`` only: a file declaring an output dim
  its kernels do not produce passed on ``"onnxruntime-native"`` and ``"reference"``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.errors import VerificationError
from onnx_custom.runtime import KernelRegistry, KernelRunError
from onnx_custom.verification.verifier import BACKENDS, verify

# ------------------------------------------------------------------ a kernel failing at other sizes


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


# -------------------------------------------------------------------- declared types, every backend


def _relu_file(declared_width: int) -> onnx.ModelProto:
    """Relu of x[batch, 3] whose output is declared [batch, declared_width]."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", declared_width])],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrongly_declared_output_fails_on_every_backend(backend: str) -> None:
    args = _example()
    assert verify(torch.relu, args, _relu_file(3), backends=(backend,)).passed
    report = verify(torch.relu, args, _relu_file(7), backends=(backend,), raise_on_mismatch=False)
    assert not report.passed
    assert report.type_mismatches and {m.backend for m in report.type_mismatches} == {backend}
    first, *_ = report.type_mismatches
    assert "dim 1 is static 7 in the file but 3 at run time" in first.describe()
    assert (
        "ONNX Runtime returned" if backend == "onnxruntime" else f"backend {backend} returned"
    ) in first.describe()


def _custom_linear(exporter: str) -> tuple[Any, tuple[Any, ...], onnx.ModelProto]:
    from onnx_custom.models import custom_linear
    from onnx_custom.translate.registry import default_registry

    args = custom_linear.example_inputs()
    model = custom_linear.Model()
    registry = default_registry().with_variants("custom")
    return model, args, onnx_custom.export(model, args, exporter=exporter, registry=registry)


@pytest.mark.parametrize("backend", ["onnxruntime-native", "reference"])
def test_a_wrongly_declared_custom_node_output_fails_on_the_native_and_reference_backends(
    backend: str,
) -> None:
    """The custom node's typed intermediate output (a value_info, not a graph output)."""
    model, args, proto = _custom_linear("torchscript")
    assert verify(model, args, proto, backends=(backend,)).passed
    wrong = copy.deepcopy(proto)
    produced = {o for n in wrong.graph.node if n.op_type == "CustomLinear" for o in n.output}
    (info,) = [v for v in wrong.graph.value_info if v.name in produced]
    dim = info.type.tensor_type.shape.dim[-1]
    dim.Clear()
    dim.dim_value = 999
    report = verify(model, args, wrong, backends=(backend,), raise_on_mismatch=False)
    assert not report.passed
    assert [(m.value, m.backend) for m in report.type_mismatches] == [(info.name, backend)]

"""A custom node whose attributes contradict its registered kernel's declaration is refused at
export, with the `NodeDeclarationError` creating a session raises, BEFORE
any file is written, under both exporters; the kernel may be passed as ``kernels=`` or registered
globally with ``@onnx_custom.runtime.kernel``. The symbolic is written the way torch's tutorials
write one (``g.op("mydomain::MyOp", x, alpha_f=alpha)``, registered with torch's signature).

A node with no registered kernel is left alone (the file may be meant for another runtime), and a
matching declaration exports and runs in ONNX Runtime against eager.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.errors import NodeDeclarationError
from onnx_custom.runtime import InferenceSession, KernelRegistry
from onnx_custom.runtime.registry import user_kernel_registry

EXPORTERS = ("torchscript", "dynamo")


@torch.library.custom_op("kdecl::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + 1.0


@scale_shift.register_fake
def _(x, alpha):  # type: ignore[no-untyped-def]
    return torch.empty_like(x)


def scale_shift_symbolic(g, x, alpha):  # type: ignore[no-untyped-def]
    # as torch's tutorials write it: the Python float becomes a float attribute
    return g.op("mydomain::MyOp", x, alpha_f=alpha).setType(x.type())


registry = onnx_custom.default_registry().copy()
onnx_custom.register_custom_op_symbolic(
    "kdecl::scale_shift", scale_shift_symbolic, 9, registry=registry
)


class Model(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kdecl.scale_shift(x, 0.5)


def _kernel(x: np.ndarray, **attrs: Any) -> np.ndarray:
    return (x * np.float32(attrs.get("alpha", 0.0)) + 1.0).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    id: str
    attrs: dict[str, Any]  # what the kernel declares
    says: tuple[str, ...]  # words the error must hold


MISMATCHES = [
    Mismatch(
        "renamed-scale-vs-alpha",
        {"scale": "float"},
        (
            "sets attribute 'alpha', which the kernel does not declare",
            "lacks required attribute 'scale'",
        ),
    ),
    Mismatch(
        "type-int-vs-float",
        {"alpha": "int"},
        ("sets attribute 'alpha' as float but the kernel declares int",),
    ),
    Mismatch(
        "type-floats-vs-float",
        {"alpha": "floats"},
        ("sets attribute 'alpha' as float but the kernel declares floats",),
    ),
    Mismatch(
        "missing-required-beta",
        {"alpha": "float", "beta": "float"},
        ("lacks required attribute 'beta'",),
    ),
    Mismatch(
        "unknown-extra-alpha",
        {},
        ("sets attribute 'alpha', which the kernel does not declare", "declared: none"),
    ),
]


def _registry_with(attrs: dict[str, Any]) -> KernelRegistry:
    kernels = KernelRegistry()
    kernels.kernel("mydomain::MyOp", inputs=["x"], outputs=["y"], attrs=attrs, shape_fn="like:x")(
        _kernel
    )
    return kernels


@pytest.fixture
def global_kernel() -> Iterator[Any]:
    """Registers ``mydomain::MyOp`` in the process's default kernels; removed afterwards."""
    added: list[str] = []

    def register(attrs: dict[str, Any]) -> None:
        onnx_custom.runtime.kernel(
            "mydomain::MyOp", inputs=["x"], outputs=["y"], attrs=attrs, shape_fn="like:x"
        )(_kernel)
        added.append("mydomain::MyOp")

    yield register
    for name in added:
        user_kernel_registry().remove(name)


# every mismatch with kernels=; the globally registered kernel with one of them
ROWS = [pytest.param(c, "kernels-arg", id=f"{c.id}-kernels-arg") for c in MISMATCHES] + [
    pytest.param(MISMATCHES[0], "global-kernel", id=f"{MISMATCHES[0].id}-global-kernel")
]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize(("case", "where"), ROWS)
def test_mismatch_is_refused_before_writing(
    case: Mismatch, exporter: str, where: str, tmp_path: Path, global_kernel: Any
) -> None:
    target = tmp_path / "model.onnx"
    kernels = None
    if where == "kernels-arg":
        kernels = _registry_with(case.attrs)
    else:
        global_kernel(case.attrs)
    with pytest.raises(NodeDeclarationError) as info:
        onnx_custom.export(
            Model(),
            (torch.randn(2, 3),),
            target,
            exporter=exporter,
            registry=registry,
            kernels=kernels,
        )
    message = str(info.value)
    assert "mydomain::MyOp" in message
    for words in case.says:
        assert words in message
    assert "Nothing was written to" in message
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no half-written file either

    # the same error creating a session, which is where it used to surface (after the write)
    proto = onnx_custom.export(
        Model(),
        (torch.randn(2, 3),),
        exporter=exporter,
        registry=registry,
        kernels=KernelRegistry(),
    )
    with pytest.raises(NodeDeclarationError) as at_session:
        InferenceSession(proto, kernels=kernels)
    assert all(words in str(at_session.value) for words in case.says)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_matching_declaration_exports_and_runs(exporter: str, tmp_path: Path) -> None:
    kernels = _registry_with({"alpha": "float"})
    target = tmp_path / "model.onnx"
    x = torch.randn(3, 4)
    onnx_custom.export(Model(), (x,), target, exporter=exporter, registry=registry, kernels=kernels)
    model = onnx.load(target)
    assert [n.op_type for n in model.graph.node if n.domain == "mydomain"] == ["MyOp"]
    (got,) = InferenceSession(str(target), kernels=kernels).run(
        None, {model.graph.input[0].name: x.numpy()}
    )
    np.testing.assert_allclose(
        got, (x * 0.5 + 1.0).numpy(), rtol=1.3e-6, atol=1e-5
    )  # independent of the kernel's code


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_node_without_a_registered_kernel_is_left_alone(exporter: str, tmp_path: Path) -> None:
    """No kernel for mydomain::MyOp anywhere: the file is written
    (it may be for another runtime)."""
    target = tmp_path / "model.onnx"
    onnx_custom.export(Model(), (torch.randn(2, 3),), target, exporter=exporter, registry=registry)
    assert target.exists()

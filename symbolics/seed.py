"""Translations of the seed ops (`onnx_custom.ops.seed`): standard ops by default, custom nodes
as the ``"custom"`` variant (``registry.with_variants("custom")``). Custom nodes use domain
``custom``; their kernels live in ``onnx_custom.ort_kernels.seed``."""

from __future__ import annotations

import onnx_custom.ops.seed  # noqa: F401  (defines the torch ops)
from onnx_custom.registry import Registry

__all__ = ["alpha_a_plus_b", "registry", "scaled_and_shifted"]

registry = Registry()


def alpha_a_plus_b(g, a, b, *, alpha):  # type: ignore[no-untyped-def]
    """alpha * a + b; also the function body of ``custom::my_add`` (alpha: its attribute)."""
    return g.op("Add", g.op("Mul", a, g.constant(alpha, like=a)), b)


def scaled_and_shifted(g, x, *, scale, shift):  # type: ignore[no-untyped-def]
    """(x * scale, x + shift); also the function body of ``custom::multi_out``."""
    return g.op("Mul", x, g.constant(scale, like=x)), g.op("Add", x, g.constant(shift, like=x))


@registry.symbolic("mylib::my_add", opset=1)
def my_add(g, a, b):  # type: ignore[no-untyped-def]
    """mylib::my_add(Tensor a, Tensor b) -> Tensor"""
    return alpha_a_plus_b(g, a, b, alpha=2.0)


@registry.symbolic("mylib::my_add", opset=1, variant="custom", emits=["custom::my_add"])
def my_add_custom(g, a, b):  # type: ignore[no-untyped-def]
    """mylib::my_add(Tensor a, Tensor b) -> Tensor"""
    return g.op("custom::my_add", a, b, alpha=2.0)


@registry.symbolic("mylib::multi_out", opset=1)
def multi_out(g, x):  # type: ignore[no-untyped-def]
    """mylib::multi_out(Tensor x) -> (Tensor, Tensor)"""
    return scaled_and_shifted(g, x, scale=2.0, shift=3.0)


@registry.symbolic("mylib::multi_out", opset=1, variant="custom", emits=["custom::multi_out"])
def multi_out_custom(g, x):  # type: ignore[no-untyped-def]
    """mylib::multi_out(Tensor x) -> (Tensor, Tensor)"""
    return g.op("custom::multi_out", x, scale=2.0, shift=3.0, outputs=2)

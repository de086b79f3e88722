"""Translations of ``my_ops::my_add`` (the C++ extension op) and of ``MyAddFunction``.

Two routes, as in the seed article:

* ``my_ops::my_add`` itself (both exporters): Mul + Add by default, or a ``custom::my_add`` node
  (variant ``"custom"``, kernel in ``ort_kernels/seed.py``).
* ``MyAddFunction`` (an ``autograd.Function`` calling the C++ op): TorchScript exporter only. The
  dynamo exporter inlines Functions, so ``onnx_custom.export(..., exporter="dynamo")`` refuses a
  model whose Function has a translation here; export ``my_ops::my_add`` directly instead.

Importing this module does not build the extension.
"""

from __future__ import annotations

from typing import Any

from onnx_custom.ops.extension import MyAddFunction
from onnx_custom.registry import Registry

__all__ = ["registry"]

registry = Registry()


def _two_a_plus_b(g: Any, a: Any, b: Any) -> Any:
    return g.op("Add", g.op("Mul", a, g.constant(2.0, like=a)), b)


def _custom_node(g: Any, a: Any, b: Any) -> Any:
    return g.op("custom::my_add", a, b, alpha=2.0)


@registry.symbolic("my_ops::my_add", opset=1)
def my_add(g: Any, a: Any, b: Any) -> Any:
    """my_ops::my_add(Tensor a, Tensor b) -> Tensor"""
    return _two_a_plus_b(g, a, b)


@registry.symbolic("my_ops::my_add", opset=1, variant="custom", emits=["custom::my_add"])
def my_add_custom(g: Any, a: Any, b: Any) -> Any:
    """my_ops::my_add(Tensor a, Tensor b) -> Tensor"""
    return _custom_node(g, a, b)


@registry.symbolic(MyAddFunction, opset=1)
def my_add_function(g: Any, a: Any, b: Any) -> Any:
    """MyAddFunction.apply(Tensor a, Tensor b) -> Tensor  (TorchScript exporter only)"""
    return _two_a_plus_b(g, a, b)


@registry.symbolic(MyAddFunction, opset=1, variant="custom", emits=["custom::my_add"])
def my_add_function_custom(g: Any, a: Any, b: Any) -> Any:
    """MyAddFunction.apply(Tensor a, Tensor b) -> Tensor  (TorchScript exporter only)"""
    return _custom_node(g, a, b)

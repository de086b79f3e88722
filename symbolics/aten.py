"""ATen ops the TorchScript exporter lacks (the dynamo exporter's torchlib has them)."""

from __future__ import annotations

from onnx_custom.translate.registry import Registry

__all__ = ["registry"]

registry = Registry()


@registry.symbolic("aten::asinh", opset=9)
def asinh(g, self):  # type: ignore[no-untyped-def]
    """aten::asinh(Tensor self) -> Tensor"""
    return g.op("Asinh", self)

"""Translations of ``mylib::multi_out3`` (3 outputs, int-list + float arguments).

Default: standard ops (Mul, Tile, ReduceSum). Variant ``"custom"``: one ``custom::MultiOut3``
node with ``repeats`` (INTS) and ``scale`` (FLOAT) attributes and 3 outputs; kernel in
``ort_kernels/multi_output.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import onnx_custom.ops.multi_output  # noqa: F401  (defines the torch op)
from onnx_custom.registry import Registry

__all__ = ["registry"]

registry = Registry()


@registry.symbolic("mylib::multi_out3", opset=7)
def multi_out3(g: Any, x: Any, *, repeats: list[int], scale: float) -> tuple[Any, Any, Any]:
    """mylib::multi_out3(Tensor x, int[] repeats, float scale) -> (Tensor, Tensor, Tensor)"""
    # g.constant(attribute) (no float()/np.asarray): this translation is also the function body
    # of custom::MultiOut3, where repeats and scale are references to the node's attributes.
    scaled = g.op("Mul", x, g.constant(scale, like=x))
    tiled = g.op("Tile", x, g.constant(repeats, dtype=np.int64))
    if g.opset >= 13:  # ReduceSum took axes as an input from opset 13 on
        summed = g.op("ReduceSum", x, g.constant(np.asarray([-1], dtype=np.int64)), keepdims=0)
    else:
        summed = g.op("ReduceSum", x, axes=[-1], keepdims=0)
    return scaled, tiled, summed


@registry.symbolic("mylib::multi_out3", opset=7, variant="custom", emits=["custom::MultiOut3"])
def multi_out3_custom(g: Any, x: Any, *, repeats: list[int], scale: float) -> tuple[Any, Any, Any]:
    """mylib::multi_out3(Tensor x, int[] repeats, float scale) -> (Tensor, Tensor, Tensor)"""
    return g.op(
        "custom::MultiOut3", x, repeats=[int(r) for r in repeats], scale=float(scale), outputs=3
    )

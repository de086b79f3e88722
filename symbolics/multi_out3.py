"""ONNX math of ``onnx_custom::multi_out3`` (declared in ``onnx_custom/ops/multi_out3.py``).

Default: standard ops (Mul, Tile, ReduceSum). Variant ``"custom"``: one ``onnx_custom::MultiOut3``
node with ``repeats`` (INTS) and ``scale`` (FLOAT) attributes and 3 outputs, whose function body
is the same standard-op translation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_custom.ops.multi_out3 import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["multi_out3_onnx", "registry"]


def multi_out3_onnx(g: Any, x: Any, *, repeats: Any, scale: Any) -> tuple[Any, Any, Any]:
    """(x * scale, Tile(x, repeats), ReduceSum(x, -1))."""
    # g.constant(attribute) (no float()/np.asarray): this translation is also the function body
    # of onnx_custom::MultiOut3, where repeats and scale are references to the node's attributes.
    scaled = g.op("Mul", x, g.constant(scale, like=x))
    tiled = g.op("Tile", x, g.constant(repeats, dtype=np.int64))
    if g.opset >= 13:  # ReduceSum took axes as an input from opset 13 on
        summed = g.op("ReduceSum", x, g.constant(np.asarray([-1], dtype=np.int64)), keepdims=0)
    else:
        summed = g.op("ReduceSum", x, axes=[-1], keepdims=0)
    return scaled, tiled, summed


registry = spec_translations(*SPECS)

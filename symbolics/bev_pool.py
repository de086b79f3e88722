"""Translations of ``onnx_custom::bev_pool_v2`` (BEVDet voxel pooling).

Default (opset 16+): a standard-op decomposition, Gather depth and feature rows, Mul, then
ScatterND(reduction="add") into a zero (B*Z*Y*X, C) grid, Reshape and Transpose to (B, C, Z, Y, X).
It assumes the intervals cover every point and each interval holds one ranks_bev value (what
``voxel_pooling_prepare_v2`` produces); the interval tensors are then not needed.
Variant ``"custom"``: one ``onnx_custom::BEVPoolV2`` node (kernel in ``ort_kernels/bev_pool.py``)
that honours the intervals exactly like the CUDA kernel; generated from the op's spec
(``onnx_custom/ops/bev_pool.py``), which also makes `bev_pool_v2` the node's function body.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnx_custom.ops.bev_pool import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["bev_pool_v2", "registry"]


def _i64(g: Any, values: list[int]) -> Any:
    return g.constant(np.asarray(values, dtype=np.int64))


def bev_pool_v2(
    g: Any,
    depth: Any,
    feat: Any,
    ranks_depth: Any,
    ranks_feat: Any,
    ranks_bev: Any,
    interval_starts: Any,
    interval_lengths: Any,
    *,
    bev_feat_shape: list[int],
) -> Any:
    """Gather, Mul, ScatterND(add) into the BEV grid, Reshape, Transpose (the interval inputs
    are unused: see the module's docstring)."""
    # Sizes as graph values (constants here, folded by ONNX Runtime): the same code is the function
    # body of onnx_custom::BEVPoolV2, where bev_feat_shape is a reference to the node's attribute.
    shape = g.constant(bev_feat_shape, dtype=np.int64)  # [B, Z, Y, X, C]
    channels = g.op("Slice", shape, _i64(g, [4]), _i64(g, [5]))
    cells = g.op("ReduceProd", g.op("Slice", shape, _i64(g, [0]), _i64(g, [4])), keepdims=1)
    depth_values = g.op("Gather", g.op("Reshape", depth, _i64(g, [-1])), ranks_depth, axis=0)
    rows = g.op("Concat", _i64(g, [-1]), channels, axis=0)
    feat_rows = g.op("Gather", g.op("Reshape", feat, rows), ranks_feat, axis=0)
    values = g.op("Mul", feat_rows, g.op("Unsqueeze", depth_values, _i64(g, [1])))  # (P, C)
    targets = g.op("Unsqueeze", g.op("Cast", ranks_bev, to=onnx.TensorProto.INT64), _i64(g, [1]))
    grid_2d = g.op("Concat", cells, channels, axis=0)
    zeros = g.op("CastLike", g.op("ConstantOfShape", grid_2d), feat)
    grid = g.op("ScatterND", zeros, targets, values, reduction="add")
    return g.op("Transpose", g.op("Reshape", grid, shape), perm=[0, 4, 1, 2, 3])


registry = spec_translations(*SPECS)

"""Translations of ``bev::bev_pool_v2`` (BEVDet voxel pooling).

Default (opset 16+): a standard-op decomposition, Gather depth and feature rows, Mul, then
ScatterND(reduction="add") into a zero (B*Z*Y*X, C) grid, Reshape and Transpose to (B, C, Z, Y, X).
It assumes the intervals cover every point and each interval holds one ranks_bev value (what
``voxel_pooling_prepare_v2`` produces); the interval tensors are then not needed.
Variant ``"custom"``: one ``bev::BEVPoolV2`` node (kernel in ``ort_kernels/bev.py``) that honours
the intervals exactly like the CUDA kernel. (Not named ``bev::bev_pool_v2``: the TorchScript
exporter mistakes a custom node named like a registered torch op for an onnxscript function and
refuses it at the domain's version 1.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

import onnx_custom.ops.bev_pool  # noqa: F401  (defines the torch op)
from onnx_custom.registry import Registry

__all__ = ["registry"]

registry = Registry()


def _i64(g: Any, values: list[int]) -> Any:
    return g.constant(np.asarray(values, dtype=np.int64))


@registry.symbolic("bev::bev_pool_v2", opset=16)  # ScatterND reduction needs opset 16
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
    """bev::bev_pool_v2(Tensor depth, Tensor feat, Tensor ranks_depth, Tensor ranks_feat, Tensor ranks_bev, int[] bev_feat_shape, Tensor interval_starts, Tensor interval_lengths) -> Tensor"""
    # Sizes as graph values (constants here, folded by ONNX Runtime): the same code is the function
    # body of bev::BEVPoolV2, where bev_feat_shape is a reference to the node's attribute.
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


@registry.symbolic("bev::bev_pool_v2", opset=16, variant="custom", emits=["bev::BEVPoolV2"])
def bev_pool_v2_custom(
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
    """bev::bev_pool_v2(Tensor depth, Tensor feat, Tensor ranks_depth, Tensor ranks_feat, Tensor ranks_bev, int[] bev_feat_shape, Tensor interval_starts, Tensor interval_lengths) -> Tensor"""
    return g.op(
        "bev::BEVPoolV2",
        depth,
        feat,
        ranks_depth,
        ranks_feat,
        ranks_bev,
        interval_starts,
        interval_lengths,
        bev_feat_shape=[int(s) for s in bev_feat_shape],
    )

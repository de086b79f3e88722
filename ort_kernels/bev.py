"""Kernel of ``bev::BEVPoolV2`` (the node for the torch op ``bev::bev_pool_v2``), NumPy.

Deliberately a different algorithm from the eager op (which scatters with ``index_add_``): like
BEVDet's CUDA kernel it sums each interval (here as a difference of float64 prefix sums) and
assigns the sum to the interval's BEV cell; points outside every interval are ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_custom.errors import KernelError
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.function_builder import TranslationBody
from onnx_custom.runtime.types import TensorInfo

__all__ = ["kernels"]

kernels = KernelRegistry()

_FLOATS = ("float32", "float64", "float16")
_INDEX = ("int32", "int64")
_DTYPES = {
    "depth": _FLOATS,
    "feat": _FLOATS,
    "ranks_depth": _INDEX,
    "ranks_feat": _INDEX,
    "ranks_bev": _INDEX,
    "interval_starts": _INDEX,
    "interval_lengths": _INDEX,
    "bev": _FLOATS,
}


def _shape(inputs: list[TensorInfo | None], attrs: dict[str, Any]) -> TensorInfo:
    feat = inputs[1]
    if feat is None:
        raise KernelError("bev::BEVPoolV2: input feat is required")
    b, z, y, x, c = (int(s) for s in attrs["bev_feat_shape"])
    return TensorInfo(feat.dtype, (b, c, z, y, x))


def _check_range(name: str, values: np.ndarray, upper: int) -> None:
    if values.size and (values.min() < 0 or values.max() >= upper):
        raise ValueError(
            f"bev::BEVPoolV2: {name} must lie in [0, {upper}), got values in "
            f"[{values.min()}, {values.max()}]"
        )


@kernels.kernel(
    "bev::BEVPoolV2",
    inputs=["depth", "feat", "ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths"],
    outputs=["bev"],
    attrs={"bev_feat_shape": "ints"},
    dtypes=_DTYPES,
    shape_fn=_shape,
    function=TranslationBody("onnx_custom.symbolics.bev:bev_pool_v2", min_opset=16),
)
def bev_pool_v2(
    depth: np.ndarray,
    feat: np.ndarray,
    ranks_depth: np.ndarray,
    ranks_feat: np.ndarray,
    ranks_bev: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    *,
    bev_feat_shape: list[int],
) -> np.ndarray:
    """BEV features (B, C, Z, Y, X) from depth (B,N,D,fH,fW) and feat (B,N,fH,fW,C)."""
    b, z, y, x, c = (int(s) for s in bev_feat_shape)
    starts = interval_starts.astype(np.int64)
    ends = starts + interval_lengths.astype(np.int64)
    _check_range("ranks_depth", ranks_depth, depth.size)
    _check_range("ranks_feat", ranks_feat, feat.size // c)
    _check_range("ranks_bev", ranks_bev, b * z * y * x)
    if starts.size and (starts.min() < 0 or ends.max() > ranks_bev.size):
        raise ValueError("bev::BEVPoolV2: intervals must lie within the ranks")
    values = depth.reshape(-1)[ranks_depth].astype(np.float64)[:, None] * feat.reshape(-1, c)[ranks_feat]
    prefix = np.zeros((values.shape[0] + 1, c), dtype=np.float64)
    np.cumsum(values, axis=0, out=prefix[1:])
    out = np.zeros((b * z * y * x, c), dtype=feat.dtype)
    out[ranks_bev[starts]] = prefix[ends] - prefix[starts]
    return np.ascontiguousarray(out.reshape(b, z, y, x, c).transpose(0, 4, 1, 2, 3))

"""Kernel math of ``onnx_custom::BEVPoolV2`` (the node of the torch op ``onnx_custom::bev_pool_v2``,
declared with its dtypes, attributes and shape rule in ``onnx_custom/ops/bev_pool.py``).

Semantics are the eager op's: every point of every interval adds ``depth * feat_row`` to its
interval's BEV cell (``ranks_bev[start]``); points outside every interval are ignored and an empty
interval adds nothing. (BEVDet's CUDA kernel assigns each interval's sum to its cell, which is the
same for its intervals: one per cell, never empty. Where two intervals share a cell the CUDA
threads race; here their sums add up.)

The node runs the eager op's C++ kernels straight into ONNX Runtime's output buffer when they are
available (``onnx_custom.ops.bev_pool.bev_pool_v2_into``), else :func:`bev_pool_v2_numpy`: plain
NumPy in float32 in chunks of points (no (points x channels) array of the whole input), with
float64 only for the interval sums (``np.add.reduceat``). bfloat16 arrays (``ml_dtypes``) reach
the C++ kernels as torch bfloat16 views.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from onnx_custom.ops.bev_pool import SPECS
from onnx_custom.spec import spec_kernels

__all__ = ["bev_pool_v2", "bev_pool_v2_numpy", "kernels"]

# Points per NumPy chunk: the chunk's (points x C) float32 products stay a few MiB.
_CHUNK_POINTS = 1 << 14


def _check_range(name: str, values: np.ndarray, upper: int) -> None:
    if values.size and (values.min() < 0 or values.max() >= upper):
        raise ValueError(
            f"onnx_custom::BEVPoolV2: {name} must lie in [0, {upper}), got values in "
            f"[{values.min()}, {values.max()}]"
        )


def _check_intervals(starts: np.ndarray, lengths: np.ndarray, points: int) -> None:
    if lengths.size and lengths.min() < 0:
        raise ValueError(
            "onnx_custom::BEVPoolV2: interval_lengths must be >= 0, got a minimum of"
            f" {lengths.min()}"
        )
    used = lengths > 0
    if used.any() and (starts[used].min() < 0 or (starts + lengths)[used].max() > points):
        raise ValueError(f"onnx_custom::BEVPoolV2: intervals must lie within the {points} ranks")


def _check_ranks(
    depth: np.ndarray,
    feat: np.ndarray,
    ranks_depth: np.ndarray,
    ranks_feat: np.ndarray,
    ranks_bev: np.ndarray,
    cells: int,
) -> None:
    _check_range("ranks_depth", ranks_depth, depth.size)
    _check_range("ranks_feat", ranks_feat, feat.size // feat.shape[-1] if feat.shape[-1] else 0)
    _check_range("ranks_bev", ranks_bev, cells)


def _pieces(
    starts: np.ndarray, lengths: np.ndarray, cells: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Non-empty intervals, longer ones split into pieces of at most _CHUNK_POINTS, by start."""
    keep = lengths > 0
    starts, lengths, cells = starts[keep], lengths[keep], cells[keep]
    count = (lengths + _CHUNK_POINTS - 1) // _CHUNK_POINTS
    first = np.repeat(starts, count)
    offset = (
        np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    ) * _CHUNK_POINTS
    begin = first + offset
    end = np.minimum(begin + _CHUNK_POINTS, np.repeat(starts + lengths, count))
    order = np.argsort(begin, kind="stable")
    return begin[order], end[order], np.repeat(cells, count)[order]


def bev_pool_v2_numpy(
    depth: np.ndarray,
    feat: np.ndarray,
    ranks_depth: np.ndarray,
    ranks_feat: np.ndarray,
    ranks_bev: np.ndarray,
    interval_starts: np.ndarray,
    interval_lengths: np.ndarray,
    bev_feat_shape: list[int],
) -> np.ndarray:
    """BEV features (B, C, Z, Y, X) in NumPy; inputs as the node's (validated by the caller).

    Products in float32 (float64 for float64 inputs), chunk by chunk of points; each interval's
    sum in float64 (``np.add.reduceat``), added to its cell in float64, rounded once at the end.
    """
    b, z, y, x, c = (int(s) for s in bev_feat_shape)
    work = np.float64 if feat.dtype == np.float64 else np.float32
    depth_flat = depth.reshape(-1).astype(work, copy=False)
    feat_rows = feat.reshape(-1, c).astype(work, copy=False)
    starts = interval_starts.astype(np.int64)
    lengths = interval_lengths.astype(np.int64)
    cells = np.zeros_like(starts)
    used = lengths > 0
    cells[used] = ranks_bev[starts[used]]
    begin, end, piece_cells = _pieces(starts, lengths, cells)
    grid = np.zeros((b * z * y * x, c), dtype=np.float64)
    if begin.size:
        groups = np.flatnonzero(np.diff(begin // _CHUNK_POINTS)) + 1  # spans of at most 2 chunks
        for lo_piece, hi_piece in zip(np.r_[0, groups], np.r_[groups, begin.size], strict=True):
            lo, hi = int(begin[lo_piece]), int(end[lo_piece:hi_piece].max())
            values = np.empty(
                (hi - lo + 1, c), dtype=work
            )  # + a zero row: reduceat may index hi - lo
            # mode="clip": the caller checked the ranks; "raise" would buffer a copy of the output
            np.take(feat_rows, ranks_feat[lo:hi], axis=0, out=values[:-1], mode="clip")
            values[:-1] *= np.take(depth_flat, ranks_depth[lo:hi], mode="clip")[:, None]
            values[-1] = 0
            bounds = np.stack(
                (begin[lo_piece:hi_piece] - lo, end[lo_piece:hi_piece] - lo), axis=1
            ).reshape(-1)
            sums = np.add.reduceat(values, bounds, axis=0, dtype=np.float64)[::2]
            np.add.at(grid, piece_cells[lo_piece:hi_piece], sums)
    bev = grid.reshape(b, z * y * x, c).transpose(0, 2, 1).astype(feat.dtype)
    return bev.reshape(b, c, z, y, x)


def _torch_view(a: np.ndarray) -> Any:
    """A torch tensor sharing ``a``'s memory
    (torch.from_numpy does not know ml_dtypes' bfloat16)."""
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _native_into(
    out: np.ndarray, arrays: tuple[np.ndarray, ...], bev_feat_shape: list[int]
) -> bool:
    """The eager op's C++ kernels into ``out`` (False when they cannot run here)."""
    try:
        import torch

        from onnx_custom.ops.bev_pool import bev_arguments, bev_pool_v2_into
    except ImportError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", UserWarning
        )  # ORT's inputs are read-only; torch only reads them
        depth, feat, ranks_depth, ranks_feat, ranks_bev, starts, lengths = (
            _torch_view(np.ascontiguousarray(a)) for a in arrays
        )
    with torch.inference_mode():
        return bev_pool_v2_into(
            _torch_view(out),
            bev_arguments(
                depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, starts, lengths
            ),
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
    out: tuple[np.ndarray, ...] | None = None,
) -> np.ndarray | None:
    """BEV features (B, C, Z, Y, X) from depth (B,N,D,fH,fW) and feat (B,N,fH,fW,C).

    Writes into ``out[0]`` (ONNX Runtime's output buffer) when given, else returns a new array.
    """
    b, z, y, x, c = (int(s) for s in bev_feat_shape)
    target = out[0] if out is not None else np.empty((b, c, z, y, x), dtype=feat.dtype)
    arrays = (depth, feat, ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths)
    if not (
        target.flags.c_contiguous
        and target.flags.writeable
        and _native_into(target, arrays, [b, z, y, x, c])
    ):
        # The C++ kernels check every index they read (and name a bad one); NumPy needs them first.
        _check_intervals(
            interval_starts.astype(np.int64), interval_lengths.astype(np.int64), ranks_bev.size
        )
        _check_ranks(depth, feat, ranks_depth, ranks_feat, ranks_bev, b * z * y * x)
        target[...] = bev_pool_v2_numpy(*arrays, [b, z, y, x, c])
    return None if out is not None else target


kernels = spec_kernels(*SPECS)

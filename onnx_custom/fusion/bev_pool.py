"""The BEV pooling implementations `fusing` recognises, and their replacement by
``torch.ops.onnx_custom.bev_pool_v2``.

BEVDet's ``bev_pool_v2`` (``mmdet3d/ops/bev_pool_v2``, and the copies of it in BEVDet-derived
projects) is a compiled CUDA extension that no exporter can trace; BEVDet-style models often carry
a pure-PyTorch fallback with the same signature (gather the depth x feature products by rank, sum
them per BEV cell with ``index_add``/``scatter_add`` or a cumsum trick, write the cells of a
``(B, Z, Y, X, C)`` grid and permute it)::

    fn(depth, feat, ranks_depth, ranks_feat, ranks_bev, bev_feat_shape, interval_starts,
       interval_lengths) -> Tensor (B, C, Z, Y, X)

``depth (B, N, D, fH, fW)``, ``feat (B, N, fH, fW, C)``, 1-D int ranks sorted by ``ranks_bev``,
``bev_feat_shape = (B, Z, Y, X, C)``: our op's contract (`onnx_custom.ops.bev_pool`), so the
replacement only normalises the arguments. A function whose output has another layout fails the
numeric check (its shape differs) and is reported, not fused.

The library implementations are found by identity in the modules already imported, never by
importing a library.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

import onnx_custom.ops.bev_pool  # noqa: F401  (registers torch.ops.onnx_custom.bev_pool_v2)

__all__ = [
    "BEV_POOL_OP",
    "PARAMETERS",
    "bev_pool_from_function_args",
    "has_bev_pool_signature",
    "library_functions",
]

BEV_POOL_OP = "onnx_custom::bev_pool_v2"

PARAMETERS = (
    "depth",
    "feat",
    "ranks_depth",
    "ranks_feat",
    "ranks_bev",
    "bev_feat_shape",
    "interval_starts",
    "interval_lengths",
)

# (module prefix, attribute) of the known implementations: BEVDet's mmdet3d fork
# (mmdet3d/ops/bev_pool_v2/bev_pool.py) and the BEVDet-derived plug-in projects' copies.
_FUNCTIONS = (
    ("mmdet3d.", "bev_pool_v2"),
    ("projects.mmdet3d_plugin.", "bev_pool_v2"),
    ("mmdet3d_plugin.", "bev_pool_v2"),
)


def _defined_in(prefix: str, attribute: str) -> Iterator[Any]:
    """``attribute`` of each imported module under ``prefix`` that defines it itself
    (re-exports of another module's object are skipped)."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(prefix):
            continue
        value = getattr(module, attribute, None)
        if value is not None and getattr(value, "__module__", None) == name:
            yield value


def library_functions() -> list[Any]:
    """The ``bev_pool_v2`` functions of the libraries imported in this process."""
    return [fn for prefix, attr in _FUNCTIONS for fn in _defined_in(prefix, attr) if callable(fn)]


def has_bev_pool_signature(fn: Any) -> bool:
    """Whether ``fn`` takes bev_pool_v2's arguments: its parameters carry those names, or it has
    exactly eight positional ones (the other fusable signatures have fewer). Classes never."""
    if isinstance(fn, type):
        return False
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    names = tuple(p.name for p in positional)
    if names[: len(PARAMETERS)] == PARAMETERS:
        return True
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    return len(required) == len(PARAMETERS)


def _shape(bev_feat_shape: Any) -> list[Any]:
    """``[B, Z, Y, X, C]`` as a list of ints (a tensor, tuple, list or ``torch.Size``)."""
    if isinstance(bev_feat_shape, Tensor):
        return [int(v) for v in bev_feat_shape.tolist()]
    if not isinstance(bev_feat_shape, Sequence):
        raise TypeError(f"bev_feat_shape must be a sequence of 5 ints; got {bev_feat_shape!r:.80}")
    return [v if isinstance(v, torch.SymInt) else int(v) for v in bev_feat_shape]


def _index(t: Tensor) -> Tensor:
    return t if t.dtype in (torch.int32, torch.int64) else t.to(torch.int64)


def bev_pool_from_function_args(
    depth: Tensor,
    feat: Tensor,
    ranks_depth: Tensor,
    ranks_feat: Tensor,
    ranks_bev: Tensor,
    bev_feat_shape: Any,
    interval_starts: Tensor,
    interval_lengths: Tensor,
    *_: Any,
) -> Tensor:
    """bev_pool_v2's arguments, computed by our op: ``(B, C, Z, Y, X)`` in ``feat``'s dtype."""
    return torch.ops.onnx_custom.bev_pool_v2(  # type: ignore[no-any-return]
        depth.to(feat.dtype).contiguous(),
        feat.contiguous(),
        _index(ranks_depth),
        _index(ranks_feat),
        _index(ranks_bev),
        _shape(bev_feat_shape),
        _index(interval_starts),
        _index(interval_lengths),
    )

"""Tensor type/shape descriptions shared by shape functions, schemas and the ORT host.

A shape function has the signature ``shape_fn(inputs, attrs) -> TensorInfo | list[TensorInfo]``
where ``inputs`` holds one :class:`TensorInfo` per node input (``None`` for an absent optional
input) and ``attrs`` maps attribute names to Python values. Dimensions are ``int`` (known),
``str`` (symbolic, e.g. ``"batch"``) or ``None`` (unknown); ``shape`` itself is ``None`` when even
the rank is unknown. The same function serves ONNX shape inference (symbolic dims), ONNX Runtime
graph inference, and preallocation of ``out=`` buffers at run time (all dims ``int``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Dim", "Shape", "TensorInfo", "broadcast_shapes", "concrete_shape"]

Dim = int | str | None
Shape = tuple[Dim, ...] | None


@dataclass(frozen=True)
class TensorInfo:
    """Element type and (possibly symbolic) shape of one tensor."""

    dtype: np.dtype[Any]
    shape: Shape = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


def _merge_dim(x: Dim, y: Dim) -> Dim:
    if x == 1:
        return y
    if y == 1 or x == y:
        return x
    if isinstance(x, int) and isinstance(y, int):
        raise ValueError(f"dimensions {x} and {y} do not broadcast")
    if isinstance(x, int):
        return x  # the symbolic side must be 1 or equal to x
    if isinstance(y, int):
        return y
    return None


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy broadcasting over possibly symbolic shapes (``None`` if any rank is unknown)."""
    known = [s for s in shapes if s is not None]
    if len(known) != len(shapes):
        return None
    rank = max((len(s) for s in known), default=0)
    out: list[Dim] = [1] * rank
    for s in known:
        padded = (1,) * (rank - len(s)) + tuple(s)
        out = [_merge_dim(a, b) for a, b in zip(out, padded, strict=True)]
    return tuple(out)


def concrete_shape(shape: Shape, what: str = "shape") -> tuple[int, ...]:
    """``shape`` as ints (for allocating a buffer); raises ValueError naming ``what`` otherwise."""
    if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(
            f"{what} must be concrete non-negative ints at run time; received {shape!r}; fix: "
            "compute output dims from the input shapes the shape function receives."
        )
    return tuple(int(d) for d in shape)  # type: ignore[arg-type]

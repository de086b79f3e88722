"""``mylib::multi_out3``: three outputs of different shapes, an int-list and a float argument.

    multi_out3(x, repeats, scale) = (x * scale, x.tile(repeats), x.sum(-1))

It exists to prove that several outputs and non-tensor arguments survive both exporters, as
attributes of a custom node (``custom::MultiOut3``) or folded into standard ops.
(The 2-output ``mylib::multi_out`` lives in ``ops/seed.py``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "check_multi_out3_inputs",
    "fold_tiles",
    "multi_out3",
    "multi_out3_math",
    "multi_out3_shapes",
]


def check_multi_out3_inputs(x: torch.Tensor, repeats: Sequence[int], scale: float) -> None:
    """Shared by the eager and fake kernels."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"mylib::multi_out3 expects a floating-point x, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("mylib::multi_out3 expects x with at least 1 dimension, got a 0-d tensor")
    if len(repeats) != x.dim():
        # ONNX Tile needs one repeat per axis; torch.tile would silently pad.
        raise ValueError(
            f"mylib::multi_out3 expects one repeat per dimension of x: x has shape "
            f"{list(x.shape)} ({x.dim()} dims) but repeats is {list(repeats)}"
        )
    if any(int(r) < 1 for r in repeats):
        raise ValueError(f"mylib::multi_out3 expects repeats >= 1, got {list(repeats)}")


def multi_out3_shapes(
    shape: Sequence[int], repeats: Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """Output shapes from the input shape (pure function, used by the fake kernel)."""
    # no int(s): under torch.export s may be a SymInt, and int() would specialize it
    tiled = [s * int(r) for s, r in zip(shape, repeats, strict=True)]
    return list(shape), tiled, list(shape[:-1])


def fold_tiles(grad: torch.Tensor, repeats: Sequence[int]) -> torch.Tensor:
    """Adjoint of tile: sum the gradient over the copies, [s*r, ...] -> [s, ...]."""
    split: list[int] = []
    for size, reps in zip(grad.shape, repeats, strict=True):
        split += [int(reps), size // int(reps)]
    return grad.reshape(split).sum(dim=tuple(range(0, len(split), 2)))


def multi_out3_math(
    x: torch.Tensor, repeats: Sequence[int], scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference math in plain PyTorch."""
    return x * scale, x.tile(tuple(repeats)), x.sum(-1)


@torch.library.custom_op(
    "mylib::multi_out3",
    mutates_args=(),
    # Spelled out: the inferred schema would say SymInt[]; repeats are static attributes.
    schema="(Tensor x, int[] repeats, float scale) -> (Tensor, Tensor, Tensor)",
)
def multi_out3(
    x: torch.Tensor, repeats: Sequence[int], scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x * scale, x.tile(repeats), x.sum(-1))."""
    check_multi_out3_inputs(x, repeats, scale)
    return multi_out3_math(x, repeats, scale)


@multi_out3.register_fake
def _multi_out3_fake(
    x: torch.Tensor, repeats: Sequence[int], scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_multi_out3_inputs(x, repeats, scale)
    scaled, tiled, summed = multi_out3_shapes(x.shape, repeats)
    return x.new_empty(scaled), x.new_empty(tiled), x.new_empty(summed)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, repeats, scale = inputs
    ctx.repeats = list(repeats)
    ctx.scale = scale


def _backward(
    ctx: Any, g_scaled: torch.Tensor, g_tiled: torch.Tensor, g_summed: torch.Tensor
) -> tuple[torch.Tensor, None, None]:
    grad = g_scaled * ctx.scale + fold_tiles(g_tiled, ctx.repeats) + g_summed.unsqueeze(-1)
    return grad, None, None


multi_out3.register_autograd(_backward, setup_context=_setup_context)

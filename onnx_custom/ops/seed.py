"""The seed ops of the first custom-op articles, as ``torch.library.custom_op``s.

``mylib::my_add(a, b) = 2a + b`` and ``mylib::multi_out(x) = (x * 2, x + 3)``.
"""

from __future__ import annotations

import torch

__all__ = ["multi_out", "my_add"]


def _check_same_shape(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name}: expected a and b of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}.")
    if a.dtype != b.dtype:
        raise TypeError(f"{name}: expected a and b of the same dtype, got {a.dtype} and {b.dtype}.")


@torch.library.custom_op("mylib::my_add", mutates_args=())
def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_same_shape("mylib::my_add", a, b)
    return 2 * a + b


@my_add.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_same_shape("mylib::my_add", a, b)
    return torch.empty_like(a)


@torch.library.custom_op("mylib::multi_out", mutates_args=())
def multi_out(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x * 2, x + 3


@multi_out.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)

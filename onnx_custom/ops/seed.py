"""The seed ops of the first custom-op articles: ``onnx_custom::my_add(a, b) = 2a + b`` and
``onnx_custom::multi_out(x) = (x * 2, x + 3)``.

Both are declared once, in ``seed.yaml`` beside this module (the YAML form of `OpSpec`); this
module holds their eager math and defines the torch ops when imported. The ONNX math lives in
``symbolics/seed.py``, the kernel math in ``ort_kernels/seed.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from onnx_custom.spec import define_op, op_arguments, parse_specs

__all__ = [
    "MULTI_OUT",
    "MY_ADD",
    "SPECS",
    "alpha_a_plus_b",
    "check_my_add",
    "multi_out",
    "multi_out_backward",
    "my_add",
    "my_add_backward",
    "scale_and_shift",
]

SPECS = tuple(parse_specs(Path(__file__).with_name("seed.yaml")))
MY_ADD, MULTI_OUT = SPECS


@op_arguments(MY_ADD)
def check_my_add(args: Any) -> None:
    """a and b of one shape and dtype (shared by the eager and fake kernels)."""
    a, b = args.a, args.b
    if a.shape != b.shape:
        raise ValueError(
            f"onnx_custom::my_add: expected a and b of the same shape, got {tuple(a.shape)} and"
            f" {tuple(b.shape)}."
        )
    if a.dtype != b.dtype:
        raise TypeError(
            f"onnx_custom::my_add: expected a and b of the same dtype, got {a.dtype} and {b.dtype}."
        )


def alpha_a_plus_b(a: torch.Tensor, b: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """alpha * a + b; alpha is the node constant declared in seed.yaml (node_attr_desc)."""
    return _exact(alpha, a) * a + b


def my_add_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return 2 * grad, grad


def scale_and_shift(
    x: torch.Tensor, *, scale: float, shift: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * scale, x + shift), the constants from seed.yaml (node_attr_desc)."""
    return x * _exact(scale, x), x + _exact(shift, x)


def _exact(constant: float, like: torch.Tensor) -> float | int:
    """A float attribute as an int for integer tensors (2.0 * int64 would go through float32
    and round large values; the kernels compute in the tensor's own dtype too)."""
    if like.is_floating_point() or not float(constant).is_integer():
        return constant
    return int(constant)


def multi_out_backward(
    ctx: Any, grad_scaled: torch.Tensor, grad_shifted: torch.Tensor
) -> torch.Tensor:
    return 2 * grad_scaled + grad_shifted


my_add = define_op(MY_ADD)
multi_out = define_op(MULTI_OUT)

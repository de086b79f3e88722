"""Seed kernels: ``custom::my_add`` and ``custom::multi_out`` (math in pure functions below)."""

from __future__ import annotations

import numpy as np

from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.function_builder import TranslationBody

__all__ = ["kernels", "multi_out_math", "my_add_into", "my_add_math"]

kernels = KernelRegistry()


def my_add_math(a: np.ndarray, b: np.ndarray, alpha: float) -> np.ndarray:
    """y = alpha * a + b, in a's dtype."""
    return (a * np.asarray(alpha, dtype=a.dtype) + b).astype(a.dtype, copy=False)


def my_add_into(a: np.ndarray, b: np.ndarray, alpha: float, y: np.ndarray) -> None:
    """y[...] = alpha * a + b without temporaries (y has the broadcast shape, a's dtype)."""
    np.multiply(a, np.asarray(alpha, dtype=y.dtype), out=y)
    np.add(y, b, out=y)


def multi_out_math(x: np.ndarray, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """(x * scale, x + shift), in x's dtype."""
    return (x * np.asarray(scale, dtype=x.dtype)).astype(x.dtype, copy=False), (
        x + np.asarray(shift, dtype=x.dtype)
    ).astype(x.dtype, copy=False)


@kernels.kernel(
    "custom::my_add", inputs=["a", "b"], outputs=["y"], attrs={"alpha": ("float", 2.0)},
    shape_fn="broadcast", function=TranslationBody("onnx_custom.symbolics.seed:alpha_a_plus_b"),
)
def my_add(a: np.ndarray, b: np.ndarray, *, alpha: float, out: tuple[np.ndarray, ...]) -> None:
    my_add_into(a, b, alpha, out[0])  # straight into ORT's output buffer: no result copy


@kernels.kernel(
    "custom::multi_out", inputs=["x"], outputs=["scaled", "shifted"],
    attrs={"scale": ("float", 2.0), "shift": ("float", 3.0)}, shape_fn="like:x",
    function=TranslationBody("onnx_custom.symbolics.seed:scaled_and_shifted"),
)
def multi_out(x: np.ndarray, *, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    return multi_out_math(x, scale, shift)


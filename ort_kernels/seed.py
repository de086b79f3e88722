"""Seed kernels: ``custom::my_add`` and ``custom::multi_out`` (math in pure functions below)."""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, FunctionProto, helper

from onnx_custom.runtime import KernelRegistry

__all__ = ["kernels", "multi_out_math", "my_add_body", "my_add_into", "my_add_math"]

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


def my_add_body() -> FunctionProto:
    """ONNX body of my_add (Mul/Add with the alpha attribute) for runtimes without our kernel."""
    alpha = helper.make_node("Constant", [], ["alpha_f"])
    alpha.attribute.append(
        AttributeProto(name="value_float", type=AttributeProto.FLOAT, ref_attr_name="alpha")
    )
    nodes = [
        alpha,
        helper.make_node("CastLike", ["alpha_f", "a"], ["alpha_t"]),
        helper.make_node("Mul", ["a", "alpha_t"], ["scaled"]),
        helper.make_node("Add", ["scaled", "b"], ["y"]),
    ]
    return helper.make_function(
        "custom", "my_add", ["a", "b"], ["y"], nodes,
        opset_imports=[helper.make_opsetid("", 18)],
        attribute_protos=[helper.make_attribute("alpha", 2.0)],
    )


@kernels.kernel(
    "custom::my_add", inputs=["a", "b"], outputs=["y"], attrs={"alpha": ("float", 2.0)},
    shape_fn="broadcast", function=my_add_body,
)
def my_add(a: np.ndarray, b: np.ndarray, *, alpha: float, out: tuple[np.ndarray, ...]) -> None:
    my_add_into(a, b, alpha, out[0])  # straight into ORT's output buffer: no result copy


@kernels.kernel(
    "custom::multi_out", inputs=["x"], outputs=["scaled", "shifted"],
    attrs={"scale": ("float", 2.0), "shift": ("float", 3.0)}, shape_fn="like:x",
)
def multi_out(x: np.ndarray, *, scale: float, shift: float) -> tuple[np.ndarray, np.ndarray]:
    return multi_out_math(x, scale, shift)


"""``onnx_custom::numpy_sin``: a custom op whose kernel runs NumPy (the tutorial example of the
custom-op API): a kernel opaque to PyTorch, a fake kernel for tracing, an autograd formula
(d sin = cos), and a device registration (``cuda``) that is accepted even on a machine without
a GPU. Declared once below (`NUMPY_SIN`); translated to ONNX ``Sin`` (``symbolics/numpy_sin.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnx_custom.spec import Input, OpSpec, Output, define_op, op_arguments

__all__ = ["NUMPY_SIN", "SPECS", "check_numpy_sin_input", "numpy_sin", "numpy_sin_math"]

NUMPY_SIN = OpSpec(
    "onnx_custom::numpy_sin",
    doc="sin(x) computed by NumPy",
    inputs=[Input("x", ("float32", "float64", "float16", "bfloat16"))],
    outputs=[Output("y", shape="like:x")],
    impl="onnx_custom.ops.numpy_sin:numpy_sin_math",
    check="onnx_custom.ops.numpy_sin:check_numpy_sin_input",
    devices=["cpu", "cuda"],  # registering cuda needs no GPU; running it round-trips via the host
    backward="onnx_custom.ops.numpy_sin:numpy_sin_backward",
    setup_context="onnx_custom.ops.numpy_sin:numpy_sin_save",
    translations={7: "onnx_custom.symbolics.numpy_sin:numpy_sin_onnx"},
)
SPECS = (NUMPY_SIN,)


@op_arguments(NUMPY_SIN)
def check_numpy_sin_input(args: Any) -> None:
    """Shared by the eager and fake kernels."""
    x = args.x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"onnx_custom::numpy_sin expects a Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"onnx_custom::numpy_sin expects a floating-point tensor, got {x.dtype}")


def numpy_sin_math(x: torch.Tensor) -> torch.Tensor:
    """sin(x) computed by NumPy on the host (the result is a new tensor, never a view of x)."""
    # float16/bfloat16 go through float32: bfloat16 has no NumPy dtype.
    values = x.detach().to(torch.float32 if x.element_size() < 4 else x.dtype).cpu().numpy()
    return torch.from_numpy(np.sin(values)).to(device=x.device, dtype=x.dtype)


def numpy_sin_save(ctx: Any, inputs: Any, output: Any) -> None:
    ctx.save_for_backward(inputs.x)


def numpy_sin_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


numpy_sin = define_op(NUMPY_SIN)

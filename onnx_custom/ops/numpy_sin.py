"""``onnx_custom::numpy_sin``: a ``torch.library.custom_op`` whose CPU kernel runs NumPy.

The tutorial example of the custom-op API: a kernel opaque to PyTorch (NumPy), a fake kernel for
tracing, an autograd formula (d sin = cos), and an extra device registration (``cuda``) that
is accepted even on a machine without a GPU. Translated to ONNX ``Sin``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["check_numpy_sin_input", "numpy_sin"]


def check_numpy_sin_input(x: torch.Tensor) -> None:
    """Shared by the eager and fake kernels."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"onnx_custom::numpy_sin expects a Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"onnx_custom::numpy_sin expects a floating-point tensor, got {x.dtype}")


@torch.library.custom_op("onnx_custom::numpy_sin", mutates_args=(), device_types="cpu")
def numpy_sin(x: torch.Tensor) -> torch.Tensor:
    """sin(x) computed by NumPy (the result is a new tensor, never a view of x)."""
    check_numpy_sin_input(x)
    # float16/bfloat16 go through float32: bfloat16 has no NumPy dtype.
    values = x.detach().to(torch.float32 if x.element_size() < 4 else x.dtype).numpy()
    return torch.from_numpy(np.sin(values)).to(x.dtype)


@numpy_sin.register_kernel("cuda")
def _numpy_sin_cuda(x: torch.Tensor) -> torch.Tensor:
    # Registering needs no GPU; running round-trips through host memory like the tutorial.
    check_numpy_sin_input(x)
    values = x.detach().to(torch.float32 if x.element_size() < 4 else x.dtype).cpu().numpy()
    return torch.from_numpy(np.sin(values)).to(device=x.device, dtype=x.dtype)


@numpy_sin.register_fake
def _numpy_sin_fake(x: torch.Tensor) -> torch.Tensor:
    check_numpy_sin_input(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    (x,) = inputs
    ctx.save_for_backward(x)


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return grad * torch.cos(x)


numpy_sin.register_autograd(_backward, setup_context=_setup_context)

"""``onnx_custom::deform_conv2d``: torchvision's deformable convolution (v1/v2), CPU.

Same schema and semantics as ``torchvision::deform_conv2d``::

    deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias,
                  int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h,
                  int dilation_w, int groups, int offset_groups, bool use_mask) -> Tensor

``offset[:, 2*(g*kh*kw + k)]`` is the y shift and ``+1`` the x shift of kernel tap ``k`` in offset
group ``g``; samples are bilinear with zero padding (a sample at ``y <= -1``, ``y >= H``,
``x <= -1`` or ``x >= W``, or a non-finite one, is 0). The kernels are C++ (im2col with bilinear
sampling, one GEMM per group) built on first use with ``torch.utils.cpp_extension.load`` into
``$ONNX_CUSTOM_CACHE_DIR`` (default ``~/.cache/onnx_custom``). ``validate_deform_conv2d`` is shared
by the eager and the fake kernel, so export fails early with the same message as eager.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from onnx_custom._native import build_torch_extension

__all__ = [
    "deform_conv2d",
    "deform_conv2d_op",
    "load_extension",
    "output_size",
    "validate_deform_conv2d",
]

_SOURCE = Path(__file__).parent / "csrc" / "deform_conv2d.cpp"
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_LOCK = threading.Lock()


def _cflags() -> list[str]:
    flags = ["-O3", "-fopenmp"]  # -fopenmp turns at::parallel_for on; torch already loads libgomp
    # AVX2 gathers vectorize the bilinear sampling loop (~15% faster); only where the CPU has them.
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


@functools.cache
def _load() -> ModuleType:
    module = build_torch_extension("onnx_custom_deform_conv2d", _SOURCE, extra_cflags=_cflags(), is_python_module=True)
    assert isinstance(module, ModuleType)
    return module


def load_extension() -> ModuleType:
    """Build (first call, ~30 s) or load the cached C++ kernels."""
    with _LOCK:
        return _load()


def output_size(
    size: int, kernel: int, stride: int, pad: int, dilation: int
) -> Any:  # int or SymInt
    """Convolution output length along one spatial axis."""
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1


def _shape(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape)


def validate_deform_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> tuple[Any, Any, Any, Any]:
    """Check arguments like torchvision does; return the output shape ``(N, Cout, Ho, Wo)``.

    Raises ``TypeError`` for dtype problems and ``ValueError`` for shape/parameter problems.
    """
    named = {"input": input, "weight": weight, "offset": offset, "bias": bias}
    if use_mask:
        named["mask"] = mask
    if input.dtype not in _DTYPES:
        raise TypeError(
            f"deform_conv2d supports float32 and float64 input, got {input.dtype}; cast with .float()."
        )
    for name, t in named.items():
        if t.dtype != input.dtype:
            raise TypeError(
                f"deform_conv2d: {name} has dtype {t.dtype} but input has {input.dtype}; all "
                "tensors must share one dtype."
            )
    for name, value in (
        ("stride_h", stride_h),
        ("stride_w", stride_w),
        ("dilation_h", dilation_h),
        ("dilation_w", dilation_w),
        ("groups", groups),
        ("offset_groups", offset_groups),
    ):
        if value <= 0:
            raise ValueError(f"deform_conv2d: {name} must be positive, got {value}.")
    if pad_h < 0 or pad_w < 0:
        raise ValueError(f"deform_conv2d: padding must be non-negative, got ({pad_h}, {pad_w}).")
    for name in ("input", "weight", "offset") + (("mask",) if use_mask else ()):
        if named[name].dim() != 4:
            raise ValueError(
                f"deform_conv2d: {name} must be 4-D (N, C, H, W), got shape {_shape(named[name])}."
            )
    if bias.dim() != 1:
        raise ValueError(f"deform_conv2d: bias must be 1-D, got shape {_shape(bias)}.")
    n, c, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    if c % groups != 0 or cin_g * groups != c:
        raise ValueError(
            f"deform_conv2d: input channels {c} (input {_shape(input)}) must equal "
            f"weight.shape[1] * groups = {cin_g} * {groups} (weight {_shape(weight)})."
        )
    if cout % groups != 0:
        raise ValueError(
            f"deform_conv2d: out channels {cout} (weight {_shape(weight)}) not divisible by "
            f"groups={groups}."
        )
    if c % offset_groups != 0:
        raise ValueError(
            f"deform_conv2d: input channels {c} not divisible by offset_groups={offset_groups}."
        )
    if bias.shape[0] != cout:
        raise ValueError(
            f"deform_conv2d: bias shape {_shape(bias)} does not match out channels {cout}."
        )
    ho = output_size(h, kh, stride_h, pad_h, dilation_h)
    wo = output_size(w, kw, stride_w, pad_w, dilation_w)
    if ho <= 0 or wo <= 0:
        raise ValueError(
            f"deform_conv2d: input {_shape(input)} is too small for kernel ({kh}, {kw}), "
            f"padding ({pad_h}, {pad_w}), dilation ({dilation_h}, {dilation_w}): output would be "
            f"({ho}, {wo})."
        )
    expected = (n, 2 * offset_groups * kh * kw, ho, wo)
    if _shape(offset) != expected:
        raise ValueError(
            f"deform_conv2d: offset must have shape (N, 2*offset_groups*kh*kw, Ho, Wo) = "
            f"{expected}, got {_shape(offset)} (input {_shape(input)}, weight {_shape(weight)})."
        )
    if use_mask:
        expected = (n, offset_groups * kh * kw, ho, wo)
        if _shape(mask) != expected:
            raise ValueError(
                f"deform_conv2d: mask must have shape (N, offset_groups*kh*kw, Ho, Wo) = "
                f"{expected}, got {_shape(mask)} (offset {_shape(offset)})."
            )
    for name, t in named.items():
        if t.device != input.device:
            raise ValueError(f"deform_conv2d: {name} is on {t.device} but input on {input.device}.")
    return n, cout, ho, wo


@torch.library.custom_op("onnx_custom::deform_conv2d", mutates_args=())
def deform_conv2d_op(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> torch.Tensor:
    """Eager CPU kernel (C++)."""
    args = (input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
            dilation_h, dilation_w, groups, offset_groups, use_mask)  # fmt: skip
    validate_deform_conv2d(*args)
    if input.device.type != "cpu":
        raise ValueError(f"deform_conv2d: only CPU tensors are supported, got {input.device}.")
    return load_extension().forward(*args)


@deform_conv2d_op.register_fake
def _(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
      dilation_h, dilation_w, groups, offset_groups, use_mask):  # fmt: skip
    shape = validate_deform_conv2d(
        input,
        weight,
        offset,
        mask,
        bias,
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        dilation_h,
        dilation_w,
        groups,
        offset_groups,
        use_mask,
    )
    return input.new_empty(shape)


@torch.library.custom_op("onnx_custom::_deform_conv2d_backward", mutates_args=())
def _deform_conv2d_backward(
    grad: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor,
    stride_h: int,
    stride_w: int,
    pad_h: int,
    pad_w: int,
    dilation_h: int,
    dilation_w: int,
    groups: int,
    offset_groups: int,
    use_mask: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for (input, weight, offset, mask, bias); mask's is zero unless ``use_mask``."""
    grads = load_extension().backward(
        grad, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
        dilation_h, dilation_w, groups, offset_groups, use_mask,
    )  # fmt: skip
    return tuple(grads)


@_deform_conv2d_backward.register_fake
def _(grad, input, weight, offset, mask, bias, *args):
    return (torch.empty_like(input), torch.empty_like(weight), torch.empty_like(offset),
            torch.empty_like(mask), torch.empty_like(bias))  # fmt: skip


_PARAMS = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups",
           "offset_groups", "use_mask")  # fmt: skip


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:5])
    ctx.params = inputs[5:]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    input, weight, offset, mask, bias = ctx.saved_tensors
    gi, gw, go, gm, gb = _deform_conv2d_backward(
        grad, input, weight, offset, mask, bias, *ctx.params
    )
    use_mask = ctx.params[-1]
    return (gi, gw, go, gm if use_mask else None, gb) + (None,) * len(_PARAMS)


deform_conv2d_op.register_autograd(_backward, setup_context=_setup_context)


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    h, w = value
    return int(h), int(w)


def deform_conv2d(
    input: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Drop-in for ``torchvision.ops.deform_conv2d`` (same argument order and defaults)."""
    if weight.dim() != 4 or offset.dim() != 4:
        raise ValueError(
            f"deform_conv2d: weight and offset must be 4-D, got weight {_shape(weight)}, "
            f"offset {_shape(offset)}."
        )
    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    kh, kw = weight.shape[-2:]
    if input.dim() != 4:
        raise ValueError(f"deform_conv2d: input must be 4-D (N, C, H, W), got {_shape(input)}.")
    # Channel counts are static; skip the Python-level checks while TorchScript traces (they
    # would only produce TracerWarnings). The op's own validation still runs.
    tracing = torch.jit.is_tracing()
    groups = (
        input.shape[1] // max(int(weight.shape[1]), 1)
        if not tracing
        else input.shape[1] // weight.shape[1]
    )
    offset_groups = offset.shape[1] // (2 * kh * kw)
    if not tracing and (offset_groups == 0 or offset.shape[1] != 2 * offset_groups * kh * kw):
        raise ValueError(
            f"deform_conv2d: offset channels {offset.shape[1]} (offset {_shape(offset)}) must be "
            f"a positive multiple of 2*kh*kw = {2 * kh * kw} (weight {_shape(weight)})."
        )
    use_mask = mask is not None
    if mask is None:
        # torchvision's placeholder; never read when use_mask is False.
        mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
    if bias is None:
        bias = torch.zeros(weight.shape[0], device=input.device, dtype=input.dtype)
    return deform_conv2d_op(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                            dil_h, dil_w, groups, offset_groups, use_mask)  # fmt: skip

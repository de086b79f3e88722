"""``onnx_custom::deform_conv2d``: torchvision's deformable convolution (v1/v2), CPU.

Same schema and semantics as ``torchvision::deform_conv2d``::

    deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias,
                  int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h,
                  int dilation_w, int groups, int offset_groups, bool use_mask) -> Tensor

``offset[:, 2*(g*kh*kw + k)]`` is the y shift and ``+1`` the x shift of kernel tap ``k`` in offset
group ``g``; samples are bilinear with zero padding (a sample at ``y <= -1``, ``y >= H``,
``x <= -1`` or ``x >= W``, or a non-finite one, is 0). Gradients follow torchvision too: the
offset gradient of a sample is the derivative of the interpolation on its cell
``[floor(y), floor(y)+1] x [floor(x), floor(x)+1]`` (one-sided from above at integer
coordinates, so non-zero on the lines -1 and H-1 / W-1); a non-finite sample gets offset and mask
gradients of 0 and adds nothing to the others.

dtypes: float32, float64, float16 and bfloat16 (``DTYPES``); the half types compute in float32
and round once. All tensors share one dtype. Any strides are accepted.

The op is declared once below (`DEFORM_CONV2D`): schema, validator, shape rule, autograd, the
custom node ``onnx_custom::DeformConv2d`` (its kernel is this eager op, its function body the
standard-op decomposition in ``symbolics/deform_conv_decomposed.py``) and the opset-19
``DeformConv`` translation (``symbolics/deform_conv.py``). ``TORCHVISION_DEFORM_CONV2D`` is the same
declaration for ``torchvision::deform_conv2d``, adopted where torchvision's compiled ops load.

The kernels are C++ (bilinear sampling into im2col columns per tile, one GEMM per group and tile:
hand-written AVX-512 kernels for float32 where the CPU has AVX-512F, else ``at::addmm``) built on
first use with ``torch.utils.cpp_extension.load`` into ``$ONNX_CUSTOM_CACHE_DIR`` (default
``~/.cache/onnx_custom``). ``validate_deform_conv2d`` is shared by the eager and the fake kernel,
so export fails early with the same message as eager.

``deform_conv2d`` (torchvision's Python signature) and ``DeformConv2d`` (torchvision's module)
are drop-ins for ``torchvision.ops``' and compile with ``torch.jit.script``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from onnx_custom.common.native_build import KernelModule
from onnx_custom.errors import DeformConv2dDtypeError, DeformConv2dError
from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.spec import EAGER, NODE, Attribute, Input, OpSpec, Output, define_op, op_arguments

__all__ = [
    "DEFORM_CONV2D",
    "DTYPES",
    "SPECS",
    "TORCHVISION_DEFORM_CONV2D",
    "DeformConv2d",
    "DeformConv2dDtypeError",
    "DeformConv2dError",
    "build_directory",
    "deform_conv2d",
    "deform_conv2d_op",
    "load_extension",
    "output_size",
    "torchvision_ops_available",
    "torchvision_unavailable_reason",
    "validate_deform_conv2d",
]

_SOURCE = Path(__file__).parent / "csrc" / "deform_conv.cpp"
_EXTENSION = "onnx_custom_deform_conv2d"
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""The dtypes ``deform_conv2d`` accepts (eager, fake, and the ``onnx_custom::DeformConv2d``
kernel)."""
_FLOATS = tuple(str(d).removeprefix("torch.") for d in DTYPES)
_VISION = "onnx_custom.symbolics.deform_conv"
# What a custom node without the attribute means (the torch schema, torchvision's, has no defaults).
_NODE_DEFAULTS = {
    "stride_h": 1,
    "stride_w": 1,
    "pad_h": 0,
    "pad_w": 0,
    "dilation_h": 1,
    "dilation_w": 1,
    "groups": 1,
    "offset_groups": 1,
}

DEFORM_CONV2D = OpSpec(
    "onnx_custom::deform_conv2d",
    doc="torchvision's deformable convolution (v1/v2): bilinear sampling at offset kernel taps",
    inputs=[Input(name, _FLOATS) for name in ("input", "weight", "offset", "mask", "bias")],
    attributes=[
        *(Attribute(name, "int", node_default=value) for name, value in _NODE_DEFAULTS.items()),
        Attribute("use_mask", "bool", node_default=False),
    ],
    # (N, Cout, Ho, Wo): the offset's spatial dims are the output's (the validator checks it)
    outputs=[Output("output", shape="[input.0, weight.0, offset.2, offset.3]")],
    impl="onnx_custom.ops.deform_conv:deform_conv2d_forward",
    check="onnx_custom.ops.deform_conv:validate_deform_conv2d",
    backward="onnx_custom.ops.deform_conv:deform_conv2d_backward",
    setup_context="onnx_custom.ops.deform_conv:deform_conv2d_save",
    op_type="DeformConv2d",  # CamelCase, like ONNX op types
    domain="onnx_custom",
    kernel=EAGER,  # the node runs this op on torch views of ORT's buffers: one implementation
    native=True,  # ort_kernels/native/deform_conv.cpp
    function=TranslationBody(f"{_VISION}_decomposed:deform_conv2d_decomposed", min_opset=11),
    translations={
        1: {"default": NODE, "standard": f"{_VISION}_decomposed:deform_conv2d_decomposed"},
        # ONNX DeformConv; `standard` names it too: it stops at 19 (a preferred variant's own
        # newest entry wins at any opset, so without this it would decompose at 19+ as well)
        19: {"default": f"{_VISION}:deform_conv2d", "standard": f"{_VISION}:deform_conv2d"},
    },
)
# torchvision's op has the same schema and its own fake kernel and autograd: adopted, exported
# the same way, its node served by the kernel above.
TORCHVISION_DEFORM_CONV2D = dataclasses.replace(
    DEFORM_CONV2D,
    name="torchvision::deform_conv2d",
    impl=None,
    check=None,
    backward=None,
    setup_context=None,
    kernel="onnx_custom.ort_kernels.deform_conv:kernels",
    function=None,
)


def torchvision_unavailable_reason() -> str | None:
    """None when ``torchvision::deform_conv2d`` is registered; else what exactly is missing
    (torchvision not installed, or installed but its compiled ops do not load), for skip reasons
    and messages."""
    try:
        import torchvision
    except ImportError as exc:
        return f"torchvision is not installed ({exc.name or exc})"
    except Exception as exc:  # a broken install fails at import in other ways
        return (
            f"torchvision fails to import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        )
    try:
        torch.ops.torchvision.deform_conv2d.default  # noqa: B018  (raises if the op is missing)
    except Exception as exc:
        version = getattr(torchvision, "__version__", "?")
        return (
            f"torchvision {version} is installed but its compiled ops do not load with torch "
            f"{torch.__version__} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        )
    return None


def torchvision_ops_available() -> bool:
    """True when ``torchvision::deform_conv2d`` is registered (torchvision's C++ ops loaded)."""
    return torchvision_unavailable_reason() is None


SPECS = (DEFORM_CONV2D, *((TORCHVISION_DEFORM_CONV2D,) if torchvision_ops_available() else ()))


def _cflags() -> list[str]:
    flags = ["-O3", "-fopenmp"]  # -fopenmp turns at::parallel_for on; torch already loads libgomp
    # AVX2 gathers vectorize the bilinear sampling loop (~15% faster); only where the CPU has them.
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


def _headers() -> list[tuple[str, Path]]:
    # The kernels the native library runs too (one copy of the forward's math): the torch-free
    # header in the runtime's include folder (imported here: importing the op should not load the
    # build machinery).
    from onnx_custom.runtime.shim_build import abi_include_dir

    name = "onnx_custom/kernels/deform_conv.h"
    return [(name, abi_include_dir() / name)]


_KERNELS = KernelModule(_EXTENSION, _SOURCE, _cflags, headers=_headers)
build_directory = (
    _KERNELS.directory
)  # the C++ kernels' build-cache folder (the zoo announces a build)
load_extension = _KERNELS.load  # build (first call) or load the cached C++ kernels


def output_size(
    size: int, kernel: int, stride: int, pad: int, dilation: int
) -> Any:  # int or SymInt
    """Convolution output length along one spatial axis."""
    return (size + 2 * pad - (dilation * (kernel - 1) + 1)) // stride + 1


def _shape(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape)


def _dtype_names() -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in DTYPES)


def _layout_hint(t: torch.Tensor, expected: tuple[Any, ...]) -> str:
    """A fix for a tensor holding the expected dims in channels-last order (N, Ho, Wo, C)."""
    n, c, ho, wo = expected
    if t.dim() == 4 and _shape(t) == (n, ho, wo, c):
        return " It looks channels-last-ordered (N, Ho, Wo, C): pass t.permute(0, 3, 1, 2)."
    return ""


@op_arguments(DEFORM_CONV2D)
def validate_deform_conv2d(args: Any) -> tuple[Any, Any, Any, Any]:
    """Check the op's arguments like torchvision does; return the output shape ``(N, Cout, Ho,
    Wo)``. Shared by the eager op and its fake kernel, so export fails early with eager's message.

    Raises `DeformConv2dDtypeError` (a ``TypeError``) for dtype problems and `DeformConv2dError`
    (a ``ValueError``) for shape, layout and parameter problems.
    """
    input, weight, bias = args.input, args.weight, args.bias
    named = {"input": input, "weight": weight, "offset": args.offset, "bias": bias}
    if args.use_mask:
        named["mask"] = args.mask
    _check_dtypes(named)
    _check_parameters(args)
    _check_ranks(named)
    n, _, h, w = input.shape
    cout, _, kh, kw = weight.shape
    _check_channels(input, weight, bias, args.groups, args.offset_groups)
    ho = output_size(h, kh, args.stride_h, args.pad_h, args.dilation_h)
    wo = output_size(w, kw, args.stride_w, args.pad_w, args.dilation_w)
    _check_offset_and_mask(args, (n, ho, wo))
    for name, t in named.items():
        if t.device != input.device:
            raise DeformConv2dError(
                f"deform_conv2d: {name} is on {t.device} but input on {input.device}; move it "
                f"with .to({str(input.device)!r})."
            )
    return n, cout, ho, wo


def _check_dtypes(named: dict[str, torch.Tensor]) -> None:
    """Input in `DTYPES`, every other tensor in the input's dtype."""
    input = named["input"]
    if input.dtype not in DTYPES:
        raise DeformConv2dDtypeError(
            f"deform_conv2d supports {_dtype_names()} input, got {input.dtype}; cast with .float()."
        )
    for name, t in named.items():
        if t.dtype != input.dtype:
            raise DeformConv2dDtypeError(
                f"deform_conv2d: {name} has dtype {t.dtype} but input has {input.dtype}; all "
                "tensors must share one dtype (float16/bfloat16 already accumulate in float32): "
                f"cast with {name}.to({input.dtype}), or run the op in {t.dtype} throughout."
            )


def _check_parameters(args: Any) -> None:
    """Strides, dilations and groups positive; padding non-negative."""
    for name in ("stride_h", "stride_w", "dilation_h", "dilation_w", "groups", "offset_groups"):
        value = getattr(args, name)
        if value <= 0:
            raise DeformConv2dError(
                f"deform_conv2d: {name} must be positive, got {value}; fix: pass 1 or more."
            )
    if args.pad_h < 0 or args.pad_w < 0:
        raise DeformConv2dError(
            f"deform_conv2d: padding must be non-negative, got ({args.pad_h}, {args.pad_w})."
        )


def _check_ranks(named: dict[str, torch.Tensor]) -> None:
    """input, weight, offset (and mask when used) 4-D; bias 1-D."""
    for name in ("input", "weight", "offset") + (("mask",) if "mask" in named else ()):
        if named[name].dim() != 4:
            raise DeformConv2dError(
                f"deform_conv2d: {name} must be 4-D (N, C, H, W), got shape {_shape(named[name])};"
                f" fix: add the batch dim with {name}.unsqueeze(0), or reshape it."
            )
    bias = named["bias"]
    if bias.dim() != 1:
        raise DeformConv2dError(f"deform_conv2d: bias must be 1-D, got shape {_shape(bias)}.")


def _check_channels(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int, offset_groups: int
) -> None:
    """Channel counts consistent across input, weight, bias, groups and offset groups."""
    c = input.shape[1]
    cout, cin_g = weight.shape[0], weight.shape[1]
    if c % groups != 0 or cin_g * groups != c:
        raise DeformConv2dError(
            f"deform_conv2d: input channels {c} (input {_shape(input)}) must equal "
            f"weight.shape[1] * groups = {cin_g} * {groups} (weight {_shape(weight)})."
        )
    if cout % groups != 0:
        raise DeformConv2dError(
            f"deform_conv2d: out channels {cout} (weight {_shape(weight)}) not divisible by "
            f"groups={groups}."
        )
    if c % offset_groups != 0:
        raise DeformConv2dError(
            f"deform_conv2d: input channels {c} not divisible by offset_groups={offset_groups}."
        )
    if bias.shape[0] != cout:
        raise DeformConv2dError(
            f"deform_conv2d: bias shape {_shape(bias)} does not match out channels {cout}; fix:"
            f" pass a bias of shape ({cout},) (weight.shape[0]), or bias=None."
        )


def _check_offset_and_mask(args: Any, out: tuple[Any, Any, Any]) -> None:
    """A positive output size ``out = (N, Ho, Wo)``; offset (and mask) shaped for it."""
    input, offset, mask = args.input, args.offset, args.mask
    kh, kw = args.weight.shape[2], args.weight.shape[3]
    n, ho, wo = out
    if ho <= 0 or wo <= 0:
        raise DeformConv2dError(
            f"deform_conv2d: input {_shape(input)} is too small for kernel ({kh}, {kw}), "
            f"padding ({args.pad_h}, {args.pad_w}), dilation ({args.dilation_h},"
            f" {args.dilation_w}): output would be ({ho}, {wo})."
        )
    expected = (n, 2 * args.offset_groups * kh * kw, ho, wo)
    if _shape(offset) != expected:
        raise DeformConv2dError(
            "deform_conv2d: the shape of the offset tensor is not valid: offset must have shape"
            f" (N, 2*offset_groups*kh*kw, Ho, Wo) = {expected}, got {_shape(offset)} (input"
            f" {_shape(input)}, weight {_shape(args.weight)}); fix: produce the offset with"
            f" {expected[1]} channels at the output size {expected[2:]}."
            + _layout_hint(offset, expected)
        )
    if args.use_mask:
        expected = (n, args.offset_groups * kh * kw, ho, wo)
        if _shape(mask) != expected:
            raise DeformConv2dError(  # torchvision's words: "mask.shape[1] is not valid"
                "deform_conv2d: mask.shape[1] is not valid: mask must have shape (N,"
                f" offset_groups*kh*kw, Ho, Wo) = {expected}, got {_shape(mask)} (offset"
                f" {_shape(offset)}); fix: produce the mask with {expected[1]} channels (half the"
                " offset's), or pass mask=None." + _layout_hint(mask, expected)
            )


@op_arguments(DEFORM_CONV2D)
def deform_conv2d_forward(args: Any) -> torch.Tensor:
    """The eager math: the C++ kernel (its arguments are the op's, in schema order)."""
    if args.input.device.type != "cpu":
        raise DeformConv2dError(
            f"deform_conv2d: only CPU tensors are supported, got {args.input.device}; move the "
            "tensors with .cpu()."
        )
    return load_extension().forward(*args)


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
        grad,
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
    return tuple(grads)


@_deform_conv2d_backward.register_fake
def _(grad, input, weight, offset, mask, bias, *args):
    # Contiguous like the C++ kernel's results, whatever the inputs' strides.
    return tuple(t.new_empty(t.shape) for t in (input, weight, offset, mask, bias))


def deform_conv2d_save(ctx: Any, inputs: Any, output: torch.Tensor) -> None:
    ctx.save_for_backward(inputs.input, inputs.weight, inputs.offset, inputs.mask, inputs.bias)
    ctx.params = tuple(inputs)[5:]  # the attributes, in schema order
    ctx.use_mask = inputs.use_mask


def deform_conv2d_backward(ctx: Any, grad: torch.Tensor) -> dict[str, torch.Tensor | None]:
    gi, gw, go, gm, gb = _deform_conv2d_backward(grad, *ctx.saved_tensors, *ctx.params)
    return {
        "input": gi,
        "weight": gw,
        "offset": go,
        "mask": gm if ctx.use_mask else None,
        "bias": gb,
    }


deform_conv2d_op = define_op(DEFORM_CONV2D)


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return value[0], value[1]


# Scriptable (torch.jit.script): no helpers with `...` annotations, shapes printed as lists; the
# op's own validation (eager and fake) does the rest.
def deform_conv2d(
    input: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = (1, 1),
    padding: int | tuple[int, int] = (0, 0),
    dilation: int | tuple[int, int] = (1, 1),
    mask: Tensor | None = None,
) -> Tensor:
    """Drop-in for ``torchvision.ops.deform_conv2d`` (same arguments, order and defaults).

    ``stride``, ``padding`` and ``dilation`` also take one int for both axes, as torchvision's
    eager function does.
    """
    for name, value in (("input", input), ("offset", offset), ("weight", weight)):
        if not isinstance(value, torch.Tensor):
            raise DeformConv2dError(
                f"deform_conv2d: {name} must be a torch.Tensor, got {type(value).__name__}; fix:"
                f" pass the {name} tensor."
            )
    if input.dim() != 4 or weight.dim() != 4 or offset.dim() != 4:
        raise DeformConv2dError(
            f"deform_conv2d: input, weight and offset must be 4-D, got input {list(input.shape)},"
            f" weight {list(weight.shape)}, offset {list(offset.shape)}; fix: add the batch dim"
            " with .unsqueeze(0) (input and offset are (N, C, H, W))."
        )
    stride_h, stride_w = _pair(stride)
    pad_h, pad_w = _pair(padding)
    dil_h, dil_w = _pair(dilation)
    kh, kw = weight.shape[2], weight.shape[3]
    taps = 2 * kh * kw
    if not torch.jit.is_tracing():  # static channel counts: no TracerWarnings while tracing
        if offset.shape[1] == 0 or offset.shape[1] % taps != 0:
            raise DeformConv2dError(  # torchvision's words: "the shape of the offset"
                "deform_conv2d: the shape of the offset tensor is not valid: offset channels"
                f" {offset.shape[1]} (offset {list(offset.shape)}) must be a positive multiple of"
                f" 2*kh*kw = {taps} (weight {list(weight.shape)}): one (dy, dx) pair per kernel tap"
                " and offset group."
            )
        if weight.shape[1] == 0 or input.shape[1] % weight.shape[1] != 0:
            raise DeformConv2dError(
                f"deform_conv2d: input channels {input.shape[1]} must be a multiple of "
                f"weight.shape[1] = {weight.shape[1]} (weight {list(weight.shape)}): "
                "weight is (out_channels, in_channels // groups, kh, kw)."
            )
    groups = input.shape[1] // weight.shape[1]
    offset_groups = offset.shape[1] // taps
    use_mask = mask is not None
    if mask is None:
        # torchvision's placeholder; never read when use_mask is False.
        mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
    if bias is None:
        bias = torch.zeros(weight.shape[0], device=input.device, dtype=input.dtype)
    return torch.ops.onnx_custom.deform_conv2d(
        input,
        weight,
        offset,
        mask,
        bias,
        stride_h,
        stride_w,
        pad_h,
        pad_w,
        dil_h,
        dil_w,
        groups,
        offset_groups,
        use_mask,
    )


class DeformConv2d(nn.Module):
    """Drop-in for ``torchvision.ops.DeformConv2d``: same constructor, parameter names, shapes and
    initialization, ``forward(input, offset, mask=None)``; scriptable."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        sizes = {
            "in_channels": in_channels,
            "out_channels": out_channels,
            "groups": groups,
            "kernel_size": _pair(kernel_size),
            "stride": _pair(stride),
            "dilation": _pair(dilation),
        }
        bad = {k: v for k, v in sizes.items() if min(v if isinstance(v, tuple) else (v,)) <= 0}
        if bad:
            raise DeformConv2dError(
                f"DeformConv2d: {', '.join(f'{k}={v}' for k, v in bad.items())}; expected positive "
                "sizes. Fix: pass 1 or more (e.g. kernel_size=3)."
            )
        if in_channels % groups != 0 or out_channels % groups != 0:
            raise DeformConv2dError(
                f"DeformConv2d: in_channels={in_channels} and out_channels={out_channels} must "
                f"both be divisible by groups={groups}; pick groups dividing both."
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        self.weight = nn.Parameter(
            torch.empty(
                out_channels, in_channels // groups, self.kernel_size[0], self.kernel_size[1]
            )
        )
        self.bias: nn.Parameter | None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's initialization (that of ``nn.Conv2d``)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor, offset: Tensor, mask: Tensor | None = None) -> Tensor:
        """``offset``: (N, 2*offset_groups*kh*kw, Ho, Wo); ``mask``: (N, offset_groups*kh*kw,
        Ho, Wo) or None (DCNv1)."""
        return deform_conv2d(
            input,
            offset,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            mask=mask,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}"
        )

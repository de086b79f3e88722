"""Translations for ATen ops that aot_autograd graphs contain and torchlib lacks.

Written with our own `Registry` (the machinery of every user translation) and used only where
torchlib has no translation (`onnx_custom.compile.fx_to_onnx.scoped_translations`):

- ``aten::sym_numel`` (training batch norm's decomposition counts elements): ``Size``;
- ``aten::convolution_backward`` (every conv's backward): grad_input as ``ConvTranspose`` of
  grad_output, grad_weight as a ``Conv`` of the input with grad_output as kernel (batch and
  channels swapped), grad_bias as ``ReduceSum``. Covered: non-transposed 1-3d convs with
  ``groups == 1`` and static spatial sizes; anything else raises, so the node runs eager.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from onnx_custom.errors import SymbolicError
from onnx_custom.translate.registry import Registry

__all__ = ["aten_extra_registry"]


def _sym_numel(g: Any, self: Any) -> Any:
    """aten::sym_numel(Tensor self) -> SymInt"""
    return g.op("Size", self)


def _int_list(values: Sequence[Any], rank: int, name: str) -> list[int]:
    out = [int(v) for v in values]
    if len(out) == 1:
        out *= rank
    if len(out) != rank or not all(isinstance(v, int) for v in out):
        raise SymbolicError(f"convolution_backward: {name}={list(values)} for {rank} spatial dims")
    return out


def _convolution_backward(
    g: Any,
    grad_output: Any,
    input: Any,
    weight: Any,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[Any, Any, Any]:
    """aten::convolution_backward(grad_output, input, weight, SymInt[]? bias_sizes, SymInt[] stride,
    SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups,
    bool[3] output_mask) -> (Tensor, Tensor, Tensor)"""
    in_shape, w_shape, out_shape = g.shape(input), g.shape(weight), g.shape(grad_output)
    if transposed or groups != 1 or in_shape is None or w_shape is None or out_shape is None:
        raise SymbolicError(
            "convolution_backward: only non-transposed convs with groups=1 and known ranks are"
            " translated"
        )
    rank = len(in_shape) - 2
    spatial = [in_shape[2:], w_shape[2:], out_shape[2:]]
    if any(d is None for dims in spatial for d in dims):
        raise SymbolicError(
            "convolution_backward: spatial sizes must be static (the backward's output padding"
            " depends on them)"
        )
    stride_, pad_, dil_ = (
        _int_list(v, rank, n)
        for v, n in ((stride, "stride"), (padding, "padding"), (dilation, "dilation"))
    )
    kernel = list(w_shape[2:])
    # grad_input: the transposed conv maps grad_output back onto the input's size; the rows the
    # forward's stride skipped at the end are output padding.
    extra = [
        in_shape[2 + i]
        - ((out_shape[2 + i] - 1) * stride_[i] - 2 * pad_[i] + dil_[i] * (kernel[i] - 1) + 1)
        for i in range(rank)
    ]
    if any(e < 0 or e >= max(stride_[i], dil_[i]) for i, e in enumerate(extra)):
        raise SymbolicError(f"convolution_backward: output padding {extra} outside ONNX's range")
    grad_input = g.op(
        "ConvTranspose",
        grad_output,
        weight,
        strides=stride_,
        pads=pad_ + pad_,
        dilations=dil_,
        output_padding=extra,
        kernel_shape=kernel,
    )
    # grad_weight[o, i, k] = sum_n,y input[n, i, y*s + k*d] * grad_output[n, o, y]: a conv over the
    # batch (as channels) with grad_output as the kernel, stride and dilation exchanged.
    perm = [1, 0, *range(2, rank + 2)]
    swapped = g.op(
        "Conv",
        g.op("Transpose", input, perm=perm),
        g.op("Transpose", grad_output, perm=perm),
        strides=dil_,
        pads=pad_ + pad_,
        dilations=stride_,
        kernel_shape=list(out_shape[2:]),
    )
    grad_weight = g.op("Transpose", swapped, perm=perm)
    full = [
        ((in_shape[2 + i] + 2 * pad_[i]) - ((out_shape[2 + i] - 1) * stride_[i] + 1)) // dil_[i] + 1
        for i in range(rank)
    ]
    if full != kernel:  # the conv above covers every tap that fits; keep the kernel's
        zeros = g.constant([0] * rank, dtype="int64")
        grad_weight = g.op(
            "Slice",
            grad_weight,
            zeros,
            g.constant(kernel, dtype="int64"),
            g.constant(list(range(2, rank + 2)), dtype="int64"),
        )
    grad_bias = g.op(
        "ReduceSum", grad_output, g.constant([0, *range(2, rank + 2)], dtype="int64"), keepdims=0
    )
    return grad_input, grad_weight, grad_bias


@functools.cache
def aten_extra_registry() -> Registry:
    registry = Registry()
    registry.symbolic("aten::sym_numel", opset=13)(_sym_numel)
    registry.symbolic("aten::convolution_backward", opset=13)(_convolution_backward)
    return registry

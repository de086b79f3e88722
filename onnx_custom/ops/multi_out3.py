"""``onnx_custom::multi_out3``: three outputs of different shapes, an int-list and a float argument.

    multi_out3(x, repeats, scale) = (x * scale, x.tile(repeats), x.sum(-1))

It exists to prove that several outputs and non-tensor arguments survive both exporters, as
attributes of a custom node (``onnx_custom::MultiOut3``) or folded into standard ops. The op is
declared once below (`MULTI_OUT3`); this module holds its eager math and backward and defines
the torch op when imported; the ONNX math lives in ``symbolics/multi_out3.py``, the kernel
math in ``ort_kernels/multi_out3.py``. (The 2-output ``onnx_custom::multi_out`` lives in
``ops/seed.yaml``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.spec import Attribute, Input, OpSpec, Output, define_op, op_arguments

__all__ = [
    "FLOATS",
    "MULTI_OUT3",
    "SPECS",
    "check_multi_out3_inputs",
    "fold_tiles",
    "multi_out3",
    "multi_out3_math",
    "multi_out3_shapes",
]

FLOATS = ("float32", "float64", "float16", "bfloat16")

MULTI_OUT3 = OpSpec(
    "onnx_custom::multi_out3",
    doc="(x * scale, x.tile(repeats), x.sum(-1))",
    inputs=[Input("x", FLOATS)],
    # Declared, not inferred: an inferred schema would say SymInt[]; repeats are static attributes.
    attributes=[Attribute("repeats", "int[]"), Attribute("scale", "float")],
    outputs=[
        Output("scaled", shape="like:x"),
        Output("tiled", shape="[d * r for d, r in zip(x, repeats)]"),
        Output("summed", shape="x[:-1]"),
    ],
    impl="onnx_custom.ops.multi_out3:multi_out3_math",
    check="onnx_custom.ops.multi_out3:check_multi_out3_inputs",
    backward="onnx_custom.ops.multi_out3:multi_out3_backward",
    setup_context="onnx_custom.ops.multi_out3:multi_out3_save",
    op_type="MultiOut3",
    domain="onnx_custom",
    kernel="onnx_custom.ort_kernels.multi_out3:multi_out3",
    native=True,  # ort_kernels/native/multi_out3.cpp
    # list attributes are readable in a body from opset 12 (Constant value_ints)
    function=TranslationBody("onnx_custom.symbolics.multi_out3:multi_out3_onnx", min_opset=12),
    translations={
        7: {"default": "onnx_custom.symbolics.multi_out3:multi_out3_onnx", "custom": "node"}
    },
)
SPECS = (MULTI_OUT3,)


@op_arguments(MULTI_OUT3)
def check_multi_out3_inputs(args: Any) -> None:
    """Shared by the eager and fake kernels."""
    x, repeats = args.x, args.repeats
    if not x.dtype.is_floating_point:
        raise TypeError(f"onnx_custom::multi_out3 expects a floating-point x, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(
            "onnx_custom::multi_out3 expects x with at least 1 dimension, got a 0-d tensor"
        )
    if len(repeats) != x.dim():
        # ONNX Tile needs one repeat per axis; torch.tile would silently pad.
        raise ValueError(
            "onnx_custom::multi_out3 expects one repeat per dimension of x: x has shape "
            f"{list(x.shape)} ({x.dim()} dims) but repeats is {list(repeats)}"
        )
    if any(int(r) < 1 for r in repeats):
        raise ValueError(f"onnx_custom::multi_out3 expects repeats >= 1, got {list(repeats)}")


def multi_out3_shapes(
    shape: Sequence[int], repeats: Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """Output shapes from the input shape (what the spec's shape rules say, as a function)."""
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
    """The eager math in plain PyTorch."""
    return x * scale, x.tile(tuple(repeats)), x.sum(-1)


def multi_out3_save(ctx: Any, inputs: Any, output: Any) -> None:
    ctx.repeats, ctx.scale = list(inputs.repeats), inputs.scale


def multi_out3_backward(
    ctx: Any, g_scaled: torch.Tensor, g_tiled: torch.Tensor, g_summed: torch.Tensor
) -> dict[str, torch.Tensor]:
    return {"x": g_scaled * ctx.scale + fold_tiles(g_tiled, ctx.repeats) + g_summed.unsqueeze(-1)}


multi_out3 = define_op(MULTI_OUT3)

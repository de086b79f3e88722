"""``deform_conv2d`` in standard ONNX ops (opset 11+): bilinear sampling by Gather + one MatMul.

Two uses of one decomposition:

- variant ``"standard"`` below opset 19 (``registry.with_variants("standard")``): files that run in
  any ONNX runtime without a custom op or ONNX's ``DeformConv`` (opset 19). From opset 19 on the
  default ``DeformConv`` translation (``symbolics/deform_conv.py``) wins. (The registry entries come
  from the op's spec in ``onnx_custom/ops/deform_conv.py``.)
- the function body of ``onnx_custom::DeformConv2d`` (``export(..., functions=True)``), built by
  `onnx_custom.function_bodies.builder` with the node's attributes as references.

Like the eager op (and torchvision), a sample at (y, x) = tap origin + offset is bilinear with
zero padding and is 0 unless -1 < y < H and -1 < x < W (non-finite offsets included). The image is
zero-padded by one pixel so all four corners of an inside sample are in bounds; corner (y0, x0)
of offset group g in batch n is row ``((n*OG + g)*(H+2) + y0+1)*(W+2) + x0+1`` of the padded
image laid out as (N*OG*(H+2)*(W+2), C/OG), fetched with one Gather per corner. The sampled
columns, laid out (N, Ho*Wo, kh*kw, C), meet the weight in one MatMul (a GEMM per group).

Every size comes from ``Shape`` at run time (dynamic batch and image size) and every attribute
goes through ``g.constant``, so the same code runs with Python attribute values (translation) and
with attribute references (function body). Non-sampling layout (A): (N, Ho, Wo, kh, kw, OG, 1).
Cost (benchmarks/function_bodies.py, N=4, C=64, 56x56, 3x3, Cout=64, mask on): ~3x the time and
instructions of ORT's ``DeformConv``; a call's working memory is about four gathered tensors of
N*Ho*Wo*kh*kw*C values (~160 MiB there, against 6 MiB).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnx_custom.errors import SymbolicError
from onnx_custom.function_bodies.builder import AttrRef, cast_like
from onnx_custom.ops.deform_conv import DEFORM_CONV2D

__all__ = ["MIN_OPSET", "deform_conv2d_decomposed"]

MIN_OPSET = 11  # Range; negative axes in Slice and Flatten
_OFFSET_TO_A = [0, 5, 6, 2, 3, 1, 4]  # (N, OG, kh, kw, 2|1, Ho, Wo) -> (N, Ho, Wo, kh, kw, OG, 2|1)


def _i64(g: Any, values: Any) -> Any:
    """int64 constant; ``values`` may hold attribute references (function body)."""
    return g.constant(values, dtype=np.int64)


def _dim(g: Any, shape: Any, axis: int) -> Any:
    return g.op("Slice", shape, _i64(g, [axis]), _i64(g, [axis + 1]))


def _scalar(g: Any, vector: Any) -> Any:
    return g.op("Reshape", vector, _i64(g, np.zeros(0, dtype=np.int64)))


def _reshape(g: Any, x: Any, *dims: Any) -> Any:
    """Reshape to the concatenation of 1-D int64 ``dims``; a 0 stays 0 (zero batch) from opset 14."""
    allowzero = {"allowzero": 1} if g.opset >= 14 else {}
    return g.op("Reshape", x, g.op("Concat", *dims, axis=0), **allowzero)


def _tap_origins(g: Any, out_len: Any, taps: Any, stride: Any, pad: Any, dilation: Any) -> Any:
    """(out_len, taps) int64: ``o * stride - pad + k * dilation``, a tap's unshifted coordinate."""
    zero, one = _scalar(g, _i64(g, [0])), _scalar(g, _i64(g, [1]))
    starts = g.op("Mul", g.op("Range", zero, _scalar(g, out_len), one), _i64(g, stride))
    starts = g.op("Sub", starts, _i64(g, pad))
    steps = g.op("Mul", g.op("Range", zero, _scalar(g, taps), one), _i64(g, dilation))
    return g.op("Add", _reshape(g, starts, out_len, _i64(g, [1])), steps)


def _sample_axis(g: Any, origins: Any, shift: Any, size: Any, like: Any) -> tuple[Any, Any]:
    """(-1 < coordinate < size, coordinate) for coordinates ``origins + shift`` along one axis."""
    coord = g.op("Add", cast_like(g, origins, like), shift)
    upper = cast_like(g, _scalar(g, size), like)
    inside = g.op("And", g.op("Greater", coord, g.constant(-1.0, like=like)), g.op("Less", coord, upper))
    return inside, coord


def _zero_border(g: Any, x: Any, n: Any, c: Any, h: Any, w: Any, zero: Any) -> Any:
    """``x`` (N, C, H, W) with a one-pixel zero border. (Concat, not Pad: Pad changed at opsets 13
    and 18, which would stop the dynamo exporter's opset-18 graph from lowering to opset 11.)"""
    one = _i64(g, [1])
    rows = g.op("Expand", zero, g.op("Concat", n, c, one, w, axis=0))
    x = g.op("Concat", rows, x, rows, axis=2)
    cols = g.op("Expand", zero, g.op("Concat", n, c, g.op("Add", h, _i64(g, [2])), one, axis=0))
    return g.op("Concat", cols, x, cols, axis=3)


def _modulation(g: Any, mask: Any, use_mask: Any, dims: dict[str, Any], like: Any) -> Any:
    """The mask in layout A, or None when unused; ones where ``use_mask`` is 0 at run time."""
    if not isinstance(use_mask, AttrRef):
        if not use_mask:
            return None
        source = mask
    else:
        # One body serves nodes with and without a mask (whose mask input is a placeholder of
        # another shape): take the mask's values, or as many ones, by a run-time slice start.
        count = g.op("Mul", g.op("Mul", dims["n"], dims["og"]), g.op("Mul", dims["k"], dims["p"]))
        ones = g.op("Expand", g.constant(1.0, like=like), count)
        flat = g.op("Concat", g.op("Reshape", mask, _i64(g, [-1])), ones, axis=0)
        size = g.op("Reshape", g.op("Size", mask), _i64(g, [1]))
        used = g.op("Cast", _i64(g, [use_mask]), to=onnx.TensorProto.BOOL)
        start = g.op("Where", used, _i64(g, [0]), size)
        source = g.op("Slice", flat, start, g.op("Add", start, count))
    grouped = _reshape(g, source, dims["n"], dims["og"], dims["kh"], dims["kw"], _i64(g, [1]), dims["ho"], dims["wo"])
    return g.op("Transpose", grouped, perm=_OFFSET_TO_A)


def deform_conv2d_decomposed(
    g: Any,
    input: Any,
    weight: Any,
    offset: Any,
    mask: Any,
    bias: Any,
    *,
    stride_h: Any,
    stride_w: Any,
    pad_h: Any,
    pad_w: Any,
    dilation_h: Any,
    dilation_w: Any,
    groups: Any,
    offset_groups: Any,
    use_mask: Any,
) -> Any:
    if g.opset < MIN_OPSET:
        raise SymbolicError(
            f"{g.target}: the standard-op deform_conv2d needs opset >= {MIN_OPSET}, got "
            f"{g.opset}; fix: export at opset >= {MIN_OPSET}."
        )
    x_shape, w_shape, o_shape = (g.op("Shape", v) for v in (input, weight, offset))
    n, c, h, w = (_dim(g, x_shape, i) for i in range(4))
    cout, cpg, kh, kw = (_dim(g, w_shape, i) for i in range(4))
    ho, wo = _dim(g, o_shape, 2), _dim(g, o_shape, 3)  # the output size, by the op's contract
    one, two = _i64(g, [1]), _i64(g, [2])
    k = g.op("Mul", kh, kw)
    # groups = C / (C per group) and offset_groups = offset channels / (2*kh*kw): the op validates
    # both, and reading them from shapes keeps them out of the attributes a body must decode.
    grp = g.op("Div", c, cpg)
    og = g.op("Div", _dim(g, o_shape, 1), g.op("Mul", two, k))
    dims = {"n": n, "og": og, "kh": kh, "kw": kw, "ho": ho, "wo": wo, "k": k, "p": g.op("Mul", ho, wo)}

    # Shifts in layout A; origins broadcast as (Ho, 1, kh, 1, 1, 1) and (Wo, 1, kw, 1, 1).
    shifts = g.op("Transpose", _reshape(g, offset, n, og, kh, kw, two, ho, wo), perm=_OFFSET_TO_A)
    dy = g.op("Slice", shifts, _i64(g, [0]), one, _i64(g, [-1]))
    dx = g.op("Slice", shifts, one, two, _i64(g, [-1]))
    oy = _tap_origins(g, ho, kh, stride_h, pad_h, dilation_h)
    ox = _tap_origins(g, wo, kw, stride_w, pad_w, dilation_w)
    in_y, y = _sample_axis(g, _reshape(g, oy, ho, one, kh, one, one, one), dy, h, input)
    in_x, x = _sample_axis(g, _reshape(g, ox, wo, one, kw, one, one), dx, w, input)
    inside = g.op("And", in_y, in_x)
    zero_t, one_t = g.constant(0.0, like=input), g.constant(1.0, like=input)
    y, x = g.op("Where", inside, y, zero_t), g.op("Where", inside, x, zero_t)  # finite from here on
    floor_y, floor_x = g.op("Floor", y), g.op("Floor", x)
    ly, lx = g.op("Sub", y, floor_y), g.op("Sub", x, floor_x)
    hy = g.op("Where", inside, g.op("Sub", one_t, ly), zero_t)  # zeroes all four weights outside
    hx = g.op("Sub", one_t, lx)
    modulation = _modulation(g, mask, use_mask, dims, input)
    if modulation is not None:
        hy, ly = g.op("Mul", hy, modulation), g.op("Mul", ly, modulation)

    # Rows of the zero-bordered image (N*OG*(H+2)*(W+2), C/OG) for corner (y0, x0): layout A
    # without its trailing 1, so that Gather's (C/OG) lands where the weights have their 1.
    hp, wp = g.op("Add", h, two), g.op("Add", w, two)
    a6 = (n, ho, wo, kh, kw, og)
    y0 = g.op("Cast", _reshape(g, floor_y, *a6), to=onnx.TensorProto.INT64)
    x0 = g.op("Cast", _reshape(g, floor_x, *a6), to=onnx.TensorProto.INT64)
    plane_ids = g.op("Range", _scalar(g, _i64(g, [0])), _scalar(g, g.op("Mul", n, og)), _scalar(g, one))
    planes = g.op("Mul", plane_ids, g.op("Mul", hp, wp))
    planes = _reshape(g, planes, n, one, one, one, one, og)
    row = g.op("Mul", g.op("Add", y0, one), wp)
    top_left = g.op("Add", g.op("Add", planes, row), g.op("Add", x0, one))
    bottom_left = g.op("Add", top_left, wp)

    cg = g.op("Div", c, og)
    padded = _zero_border(g, input, n, c, h, w, zero_t)
    image = g.op("Transpose", _reshape(g, padded, n, og, cg, hp, wp), perm=[0, 1, 3, 4, 2])
    image = _reshape(g, image, g.op("Mul", g.op("Mul", n, og), g.op("Mul", hp, wp)), cg)
    corners = (
        (top_left, g.op("Mul", hy, hx)),
        (g.op("Add", top_left, one), g.op("Mul", hy, lx)),
        (bottom_left, g.op("Mul", ly, hx)),
        (g.op("Add", bottom_left, one), g.op("Mul", ly, lx)),
    )
    # One Sum of the four weighted corners: a single pass instead of three Adds.
    sampled = g.op("Sum", *(g.op("Mul", g.op("Gather", image, rows, axis=0), w_c) for rows, w_c in corners))

    # (N, Ho, Wo, kh, kw, OG, C/OG) = (N, P, K, C) -> (G, N*P, K*Cpg) @ (G, K*Cpg, Cout/G): one
    # GEMM per group over the whole batch (and no batch broadcasting, which ORT's MatMul gets
    # wrong for a zero batch).
    p, cog = dims["p"], g.op("Div", cout, grp)
    columns = g.op("Transpose", _reshape(g, sampled, n, p, k, grp, cpg), perm=[3, 0, 1, 2, 4])
    columns = _reshape(g, columns, grp, g.op("Mul", n, p), g.op("Mul", k, cpg))
    kernel = g.op("Transpose", _reshape(g, weight, grp, cog, cpg, k), perm=[0, 3, 2, 1])
    kernel = _reshape(g, kernel, grp, g.op("Mul", k, cpg), cog)
    out = _reshape(g, g.op("MatMul", columns, kernel), grp, n, p, cog)
    out = _reshape(g, g.op("Transpose", out, perm=[1, 0, 3, 2]), n, cout, ho, wo)  # (N, G, Cog, P)
    return g.op("Add", out, _reshape(g, bias, cout, one, one))


deform_conv2d_decomposed.__doc__ = f"{DEFORM_CONV2D.op_name}{DEFORM_CONV2D.schema}"

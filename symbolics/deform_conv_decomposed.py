"""``deform_conv2d`` in standard ONNX ops (opset 11+): Gather-based bilinear sampling and a GEMM
per kernel tap, summed over the taps.

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
image laid out as (N*OG*(H+2)*(W+2), C/OG). Coordinates, corner rows and bilinear weights (the
mask folded in) are computed for all taps first; they have no C in them (layout T: (kh, kw, N,
Ho, Wo, OG), flattened to 1-D). In a translation, per tap k: one Gather fetches the four corners
(4, N*Ho*Wo*OG, C/OG), a Mul weights them, a (1, 4) @ (4, M) MatMul sums them, and (N*Ho*Wo, C) @
W_k (a GEMM per group) adds the tap's share to the output: unrolled when the weight shape is
static, all taps at once (one (N*Ho*Wo, K*C) column tensor) when the kernel size is dynamic. The
function body (kh*kw known at run time only) is a ``Loop`` over chunks of output pixels instead:
each iteration samples its pixels' corners for all K taps the same way, then one (S, K*C) @
(K*C, Cout) GEMM (block-diagonal over the groups) gives those pixels' outputs, stacked by the
Loop. The corners of a chunk (~CHUNK_VALUES floats) stay in cache from the Gather to the corner
sum, and there is no per-tap partial sum to add up.
float16/bfloat16 compute in float32 (ORT's CPU provider lacks bfloat16 Mul/MatMul, and the half
precision pass does not widen inside a Loop) and round once.

Every size comes from ``Shape`` at run time (dynamic batch and image size) and every attribute
goes through ``g.constant``, so the same code runs with Python attribute values (translation) and
with attribute references (function body).
Cost of the function body (benchmarks/function_bodies.py, N=4, C=64, 56x56, 3x3, Cout=64, mask
on): see the README's benchmark table. The per-tap Loop it replaced streamed 4*N*P*C values
through memory three times per tap (~90 MiB of traffic per tap, 27 MiB per warm call); the
chunked Loop holds a chunk's corners and 12-17 MiB per warm call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom.errors import SymbolicError
from onnx_custom.function_bodies.builder import AttrRef, cast_like
from onnx_custom.ops.deform_conv import DEFORM_CONV2D

__all__ = ["CHUNK_VALUES", "MIN_OPSET", "deform_conv2d_decomposed"]

MIN_OPSET = 11  # Range; negative axes in Slice and Flatten


def _i64(g: Any, values: Any) -> Any:
    """int64 constant; ``values`` may hold attribute references (function body)."""
    return g.constant(values, dtype=np.int64)


def _dim(g: Any, shape: Any, axis: int) -> Any:
    return g.op("Slice", shape, _i64(g, [axis]), _i64(g, [axis + 1]))


def _scalar(g: Any, vector: Any) -> Any:
    return g.op("Reshape", vector, _i64(g, np.zeros(0, dtype=np.int64)))


def _reshape(g: Any, x: Any, *dims: Any) -> Any:
    """Reshape to the concatenation of 1-D int64 ``dims``; a 0 stays 0
    (zero batch) from opset 14."""
    allowzero = {"allowzero": 1} if g.opset >= 14 else {}
    return g.op("Reshape", x, g.op("Concat", *dims, axis=0), **allowzero)


def _reshape_to(g: Any, x: Any, shape: Any) -> Any:
    """Reshape to the 1-D int64 value ``shape`` (which may hold a 0: a zero batch)."""
    return g.op("Reshape", x, shape, **({"allowzero": 1} if g.opset >= 14 else {}))


def _tap_origins(g: Any, out_len: Any, taps: Any, stride: Any, pad: Any, dilation: Any) -> Any:
    """(taps, out_len) int64: ``o * stride - pad + k * dilation``, a tap's unshifted coordinate."""
    zero, one = _scalar(g, _i64(g, [0])), _scalar(g, _i64(g, [1]))
    starts = g.op("Mul", g.op("Range", zero, _scalar(g, out_len), one), _i64(g, stride))
    starts = g.op("Sub", starts, _i64(g, pad))
    steps = g.op("Mul", g.op("Range", zero, _scalar(g, taps), one), _i64(g, dilation))
    return g.op("Add", _reshape(g, steps, taps, _i64(g, [1])), starts)


def _sample_axis(g: Any, origins: Any, shift: Any, size: Any, like: Any) -> tuple[Any, Any]:
    """(-1 < coordinate < size, coordinate) for coordinates ``origins + shift`` along one axis,
    flattened to 1-D (layout T order): ONNX Runtime's elementwise ops take their fast paths on
    1-D tensors and scalars; on the 7-D layout with trailing ones they went element by element
    (a quarter of the body's time outside the loop, measured with ORT's profiler)."""
    coord = g.op("Reshape", g.op("Add", cast_like(g, origins, like), shift), _i64(g, [-1]))
    upper = cast_like(g, _scalar(g, size), like)
    inside = g.op(
        "And", g.op("Greater", coord, g.constant(-1.0, like=like)), g.op("Less", coord, upper)
    )
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
        values = g.op("Reshape", mask, _i64(g, [-1]))
        flat = g.op("Concat", values, ones, axis=0)
        # Shape of the flattened mask, not Size: ORT's CPU provider has no float16 Size kernel,
        # and its constant folding warns about that on stderr for every session
        size = g.op("Shape", values)
        used = g.op("Cast", _i64(g, [use_mask]), to=onnx.TensorProto.BOOL)
        start = g.op("Where", used, _i64(g, [0]), size)
        source = g.op("Slice", flat, start, g.op("Add", start, count))
    grouped = _reshape(g, source, dims["n"], dims["og"], dims["k"], dims["p"])
    return g.op("Reshape", g.op("Transpose", grouped, perm=[2, 0, 3, 1]), _i64(g, [-1]))


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
    p = g.op("Mul", ho, wo)
    dims = {"n": n, "og": og, "kh": kh, "kw": kw, "ho": ho, "wo": wo, "k": k, "p": p}

    # Shifts (K, 2, N, P, OG): y and x halves in layout T. (A 5-D Transpose: the 7-D one to
    # (kh, kw, N, Ho, Wo, OG, 2) cost ORT 3x more.) The origins broadcast over runs of Wo*OG:
    # y's (kh, 1, Ho, 1) over shifts (kh, kw*N, Ho, Wo*OG); x's (1, kw, 1, Wo*OG) over (kh, kw,
    # N*Ho, Wo*OG), x's origins repeated OG times first (a small tensor).
    shifts = g.op("Transpose", _reshape(g, offset, n, og, k, two, p), perm=[2, 3, 0, 4, 1])
    wog = g.op("Mul", wo, og)
    dy = _reshape(g, g.op("Slice", shifts, _i64(g, [0]), one, one), kh, g.op("Mul", kw, n), ho, wog)
    dx = _reshape(g, g.op("Slice", shifts, one, two, one), kh, kw, g.op("Mul", n, ho), wog)
    oy = _tap_origins(g, ho, kh, stride_h, pad_h, dilation_h)
    ox = _tap_origins(g, wo, kw, stride_w, pad_w, dilation_w)
    ox = g.op("Expand", _reshape(g, ox, kw, wo, one), g.op("Concat", kw, wo, og, axis=0))
    in_y, y = _sample_axis(g, _reshape(g, oy, kh, one, ho, one), dy, h, input)
    in_x, x = _sample_axis(g, _reshape(g, ox, one, kw, one, wog), dx, w, input)
    inside = g.op("And", in_y, in_x)
    zero_t, one_t = g.constant(0.0, like=input), g.constant(1.0, like=input)
    y, x = g.op("Where", inside, y, zero_t), g.op("Where", inside, x, zero_t)  # finite from here on
    floor_y, floor_x = g.op("Floor", y), g.op("Floor", x)
    ly, lx = g.op("Sub", y, floor_y), g.op("Sub", x, floor_x)
    hy = g.op(
        "Mul", g.op("Sub", one_t, ly), cast_like(g, inside, input)
    )  # zeroes all four weights outside
    hx = g.op("Sub", one_t, lx)
    modulation = _modulation(g, mask, use_mask, dims, input)
    if modulation is not None:  # the mask folds into the (small) bilinear weights, never into C
        hy, ly = g.op("Mul", hy, modulation), g.op("Mul", ly, modulation)

    # Rows of the zero-bordered image (N*OG*(H+2)*(W+2), C/OG) for corner (y0, x0): (K, 4, N*P*OG),
    # the four corners (top-left, top-right, bottom-left, bottom-right) of every tap.
    hp, wp = g.op("Add", h, two), g.op("Add", w, two)
    y0 = g.op("Cast", floor_y, to=onnx.TensorProto.INT64)  # 1-D, layout T
    x0 = g.op("Cast", floor_x, to=onnx.TensorProto.INT64)
    plane_ids = g.op(
        "Range", _scalar(g, _i64(g, [0])), _scalar(g, g.op("Mul", n, og)), _scalar(g, one)
    )
    planes = g.op("Mul", plane_ids, g.op("Mul", hp, wp))
    npog = g.op("Mul", g.op("Mul", n, p), og)
    # each sample's plane offset as one (N*P*OG,) run, added to all K taps' rows along long runs
    # (plain Reshapes with -1: no allowzero, whose opset-14 change would stop the lowering to 11)
    planes = g.op("Reshape", planes, g.op("Concat", _i64(g, [-1]), one, og, axis=0))
    planes = g.op(
        "Reshape", g.op("Expand", planes, g.op("Concat", n, p, og, axis=0)), _i64(g, [-1])
    )
    in_plane = g.op("Add", g.op("Mul", g.op("Add", y0, one), wp), g.op("Add", x0, one))
    four = _i64(g, [4])
    top_left = g.op("Add", _reshape(g, in_plane, k, npog), planes)  # (K, N*P*OG)
    steps = g.op("Concat", _i64(g, [0]), one, wp, g.op("Add", wp, one), axis=0)
    # Their bilinear weights (mask folded in). Corner-major layouts keep ONNX Runtime's
    # broadcasting and Concat on long contiguous runs (its per-element paths for short trailing
    # dims cost more than the sampling itself).
    products = [g.op("Mul", wy, wx) for wy, wx in ((hy, hx), (hy, lx), (ly, hx), (ly, lx))]

    # Half precision computes in float32 (ONNX Runtime's CPU provider has no bfloat16 Mul or
    # MatMul, and a loop body is not widened node by node); the result rounds once at the end.
    half = g.dtype(input) in (torch.float16, torch.bfloat16)
    compute = g.op("Cast", input, to=onnx.TensorProto.FLOAT) if half else input
    if half:
        products = [g.op("Cast", v, to=onnx.TensorProto.FLOAT) for v in products]
    cg = g.op("Div", c, og)
    padded = _zero_border(g, compute, n, c, h, w, g.constant(0.0, like=compute))
    image = g.op("Transpose", _reshape(g, padded, n, og, cg, hp, wp), perm=[0, 1, 3, 4, 2])
    image = _reshape(g, image, g.op("Mul", g.op("Mul", n, og), g.op("Mul", hp, wp)), cg)
    # (K, G, Cpg, Cog): the weight of one tap is one (G, Cpg, Cog) slab
    cog = g.op("Div", cout, grp)
    kernel = g.op("Transpose", _reshape(g, weight, grp, cog, cpg, k), perm=[3, 0, 2, 1])
    if half:
        kernel = g.op("Cast", kernel, to=onnx.TensorProto.FLOAT)
    count = g.op("Mul", n, p)
    ones = g.op("Expand", g.constant(1.0, like=compute), g.op("Concat", one, four, axis=0))

    taps = _static_taps(g, weight)
    if getattr(g, "exporter", None) == "function":
        # A Loop over chunks of output pixels, all taps at once (K is known at run time only)
        rows = g.op(
            "Transpose", _reshape(g, top_left, k, count, og), perm=[1, 0, 2]
        )  # (N*P, K, OG)
        rows = g.op(
            "Add",
            _reshape(g, rows, one, count, g.op("Mul", k, og)),
            _reshape(g, steps, four, one, one),
        )
        stacked = g.op("Concat", *(_reshape(g, v, one, k, count, og) for v in products), axis=0)
        weights = g.op("Transpose", stacked, perm=[0, 2, 1, 3])  # (4, N*P, K, OG)
        dense = _reshape(g, _dense_kernel(g, kernel, k, grp, c, cout), g.op("Mul", k, c), cout)
        out = _chunked_product(g, _Chunks(image, rows, weights, dense, ones, count, k, og, c, cout))
        out = g.op("Transpose", _reshape(g, out, n, p, cout), perm=[0, 2, 1])
    else:
        # Rows of the corners (K, 4, N*P*OG) and their weights (K, 4, N*P*OG, 1)
        rows = g.op("Add", _reshape(g, top_left, k, one, npog), _reshape(g, steps, one, four, one))
        weights = g.op("Concat", *(_reshape(g, v, k, one, npog, one) for v in products), axis=1)
        m = g.op("Mul", npog, cg)
        sources = _Sources(
            image,
            rows,
            weights,
            kernel,
            ones,
            g.op("Concat", k, four, m, axis=0),
            g.op("Concat", four, m, axis=0),
        )
        if taps is not None:  # unrolled, one tap's (N*P, C) columns at a time
            single = _static_groups(groups)
            shape = (
                (g.op("Concat", one, count, c, axis=0), None)
                if single
                else (
                    g.op("Concat", count, grp, cpg, axis=0),
                    g.op("Concat", grp, count, cpg, axis=0),
                )
            )
            out = g.op(
                "Expand", g.constant(0.0, like=compute), g.op("Concat", grp, count, cog, axis=0)
            )
            for tap in range(taps):
                out = g.op(
                    "Add", out, _tap_product(g, sources, _i64(g, np.int64(tap)), shape, single)
                )
        else:
            out = _all_taps_product(g, sources, k, g.op("Concat", k, count, grp, cpg, axis=0), cog)
        # (G, N, P, Cog) -> (N, G, Cog, P) in two Transposes: ORT moves G as whole (P, Cog) blocks
        # and transposes each (P, Cog) matrix on its fast 3-D path;
        # the one 4-D perm took 17x longer.
        out = g.op("Transpose", _reshape(g, out, grp, n, p, cog), perm=[1, 0, 2, 3])
        out = g.op("Transpose", _reshape(g, out, g.op("Mul", n, grp), p, cog), perm=[0, 2, 1])
    out = _reshape(g, out, n, cout, ho, wo)
    if half:
        out = cast_like(g, out, input)
    return g.op("Add", out, _reshape(g, bias, cout, one, one))


@dataclasses.dataclass(frozen=True)
class _Sources:
    """What every tap reads: ``image`` (rows, C/OG), ``rows`` (K, 4, N*P*OG) int64,
    ``weights`` (K, 4, N*P*OG, 1), ``kernel`` (K, G, Cpg, Cog); the corner sum's ``ones`` and the
    weighted corners' shapes."""

    image: Any
    rows: Any
    weights: Any
    kernel: Any
    ones: Any  # (1, 4)
    stacked: Any  # (K, 4, M), M = N*P*C
    stacked_tap: Any  # (4, M)


# Output pixels per chunk of the function body's Loop: about this many float32 corner values
# (4 * pixels * K * C) per iteration, 1 MiB (a core's L2 here). Paired CPU time at 1 thread on the
# benchmark shape (load ~10): 2^18 2.01x ORT's DeformConv, 2^19 2.37x, 2^20 2.53x; an earlier run
# at load ~7 put 2^17..2^21 within 1.90-2.05x. Warm-call memory: 12.8 MiB (2^18), 17 MiB (2^20).
CHUNK_VALUES = 1 << 18


@dataclasses.dataclass(frozen=True)
class _Chunks:
    """The function body's all-taps sampling: ``image`` (rows, C/OG), ``rows`` (4, N*P, K*OG)
    int64 and ``weights`` (4, N*P, K, OG) the four corners of every (pixel, tap, offset group),
    ``dense`` the (K*C, Cout) weight; ``ones`` (1, 4); 1-D sizes ``count`` (N*P), ``k``, ``og``,
    ``c``, ``cout``."""

    image: Any
    rows: Any
    weights: Any
    dense: Any
    ones: Any
    count: Any
    k: Any
    og: Any
    c: Any
    cout: Any


def _chunked_product(g: Any, src: _Chunks) -> Any:
    """(N*P, Cout): the convolution, a chunk of output pixels per Loop iteration. Each iteration
    gathers its pixels' corners for all taps (4, S, K*OG, C/OG), weights and sums them into
    (S, K*C) columns and multiplies by the (K*C, Cout) weight: one GEMM of depth K*C, no
    per-tap partial sums, and a chunk's corners stay in cache between the Gather, the Mul and
    the corner sum (the per-tap Loop streamed 4*N*P*C values through memory three times per
    tap). The pixels are padded (index 0, weight 0) to whole chunks for the Loop's stacked
    output."""
    one, four = _i64(g, [1]), _i64(g, [4])
    kc = g.op("Mul", src.k, src.c)
    # pixels per chunk, at least 1 (+ 1, not Max: opset 11's Max takes no int64)
    size = g.op("Add", g.op("Div", _i64(g, [CHUNK_VALUES]), g.op("Mul", four, kc)), one)
    chunks = g.op("Div", g.op("Sub", g.op("Add", src.count, size), one), size)
    total = g.op("Mul", chunks, size)
    extra = g.op("Sub", total, src.count)
    kog = g.op("Mul", src.k, src.og)
    rows = g.op(
        "Concat",
        src.rows,
        g.op("Expand", _i64(g, [0]), g.op("Concat", four, extra, kog, axis=0)),
        axis=1,
    )
    pad = g.op(
        "Expand",
        g.constant(0.0, like=src.weights),
        g.op("Concat", four, extra, src.k, src.og, axis=0),
    )
    weights = g.op("Concat", src.weights, pad, axis=1)
    # (4, chunks, S*K*OG): an iteration's rows and weights are one Gather each along axis 1
    # (fewer nodes per iteration than a Slice with its bounds computed from the iteration count)
    per_chunk = g.op("Mul", size, kog)
    rows = _reshape(g, rows, four, chunks, per_chunk)
    weights = _reshape(g, weights, four, chunks, per_chunk, one)
    stacked = g.op("Concat", four, g.op("Mul", size, kc), axis=0)
    columns = g.op("Concat", size, kc, axis=0)

    def body(sub: Any, i: Any, state: list[Any]) -> list[Any]:
        picked = sub.op("Gather", src.image, sub.op("Gather", rows, i, axis=1), axis=0)
        corners = sub.op("Mul", picked, sub.op("Gather", weights, i, axis=1))
        summed = sub.op("MatMul", src.ones, _reshape_to(sub, corners, stacked))
        return [sub.op("MatMul", _reshape_to(sub, summed, columns), src.dense)]

    (out,) = g.loop(_scalar(g, chunks), [], body, scans=1)
    out = _reshape(g, out, total, src.cout)
    return g.op("Slice", out, _i64(g, [0]), src.count, _i64(g, [0]))


def _static_taps(g: Any, weight: Any) -> int | None:
    shape = g.shape(weight)
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return None
    return int(shape[2] * shape[3])


def _sample(g: Any, src: _Sources, tap: Any) -> Any:
    """The taps ``tap`` picks (one: a 0-d index; all: None) sampled: (1, M) or (K, 1, M), M =
    N*P*C in (N, P, OG, C/OG) order. One Gather fetches the four corners (4, N*P*OG, C/OG), a Mul
    weights them, and a (1, 4) @ (4, M) MatMul sums them (measured in ONNX Runtime: faster than
    ReduceSum, a Sum of four Muls, or a batched (1, 4) @ (4, C/OG) MatMul; and the same op at
    every opset). Only these tensors hold C, and only for one tap."""

    def pick(x: Any) -> Any:
        return x if tap is None else g.op("Gather", x, tap, axis=0)

    corners = g.op("Mul", g.op("Gather", src.image, pick(src.rows), axis=0), pick(src.weights))
    return g.op(
        "MatMul", src.ones, _reshape_to(g, corners, src.stacked if tap is None else src.stacked_tap)
    )


def _static_groups(groups: Any) -> bool:
    """Whether ``groups`` is known (a translation, not a function body) to be 1."""
    return isinstance(groups, int) and groups == 1


def _dense_kernel(g: Any, kernel: Any, k: Any, grp: Any, c: Any, cout: Any) -> Any:
    """(K, C, Cout): each tap's (G, Cpg, Cog) weight as one block-diagonal matrix, so that a tap
    is one GEMM whatever the groups (no Transpose of the columns to (G, N*P, Cpg)). Groups > 1
    pay G times the GEMM's arithmetic on the zero blocks (a depthwise layer: C times), next to
    the sampling's memory traffic, which does not change with the groups."""
    one = _i64(g, [1])
    eye = g.op(
        "EyeLike", g.op("Expand", g.constant(0.0, like=kernel), g.op("Concat", grp, grp, axis=0))
    )
    eye = _reshape(g, eye, one, grp, one, grp, one)
    cpg, cog = g.op("Div", c, grp), g.op("Div", cout, grp)
    blocks = g.op("Mul", _reshape(g, kernel, k, grp, cpg, one, cog), eye)  # (K, G, Cpg, G, Cog)
    return _reshape(g, blocks, k, c, cout)


def _tap_product(g: Any, src: _Sources, tap: Any, shape: tuple[Any, Any], single: bool) -> Any:
    """(G, N*P, Cog): tap ``tap`` (a 0-d index) sampled, times its (G, Cpg, Cog) weight. ``shape``:
    (N*P, G, Cpg) and (G, N*P, Cpg); or ((1, N*P, C), None) when groups is known to be 1 (no
    transpose then)."""
    columns = _reshape_to(g, _sample(g, src, tap), shape[0])
    if not single:
        # The Reshape after the Transpose keeps ONNX Runtime from fusing the two into a
        # FusedMatMul, which divides by zero (SIGFPE) when N*P is 0 (ORT 1.31).
        columns = _reshape_to(g, g.op("Transpose", columns, perm=[1, 0, 2]), shape[1])
    return g.op("MatMul", columns, g.op("Gather", src.kernel, tap, axis=0))


def _all_taps_product(g: Any, src: _Sources, k: Any, shape: Any, cog: Any) -> Any:
    """(G, N*P, Cog) from all K taps at once (a translation whose weight shape is unknown):
    (K, N*P, G, Cpg) -> (G, N*P, K*Cpg) @ (G, K*Cpg, Cog), one GEMM per group (and no batch
    broadcasting, which ORT's MatMul gets wrong for a zero batch)."""
    sampled = _reshape_to(g, _sample(g, src, None), shape)
    grp, count, cpg = (_dim(g, shape, i) for i in (2, 1, 3))
    depth = g.op("Mul", k, cpg)
    columns = _reshape(g, g.op("Transpose", sampled, perm=[2, 1, 0, 3]), grp, count, depth)
    kernel = _reshape(g, g.op("Transpose", src.kernel, perm=[1, 0, 2, 3]), grp, depth, cog)
    return g.op("MatMul", columns, kernel)


deform_conv2d_decomposed.__doc__ = f"{DEFORM_CONV2D.op_name}{DEFORM_CONV2D.schema}"

"""Translations of ``onnx_custom::multi_scale_deformable_attn`` (spec: ``onnx_custom/ops/msda.py``).

- default (every opset): one custom node ``onnx_custom::MultiScaleDeformableAttn`` with the op's
  five inputs in mmcv's order and the INT attribute ``im2col_step``. Kernels: Python
  (``ort_kernels/msda.py``), native (``ort_kernels/native/msda.cpp``); function body: `msda_gather`.
- variant ``"mmdeploy"``: ``mmdeploy::MMCVMultiScaleDeformableAttention``, exactly the node
  mmdeploy's symbolic emits (inputs value, value_spatial_shapes, value_level_start_index,
  sampling_locations, attention_weights; INT attribute ``im2col_step``), so the file feeds
  mmdeploy's TensorRT plugin unchanged. onnx-custom's kernels serve that node too.
- variant ``"standard"``: standard ops only. From opset 16 `msda_grid_sample`: one ``GridSample``
  per level (mmcv's pure-PyTorch formulation). Below 16, for float64 (ONNX Runtime's CPU GridSample
  computes in float32) and when the number of levels is dynamic (nothing to unroll): `msda_gather`.
- variant ``"gather"``: `msda_gather` at every opset, for backends that mishandle GridSample
  (TensorRT #4813) and for the dynamo exporter (whose graphs start at opset 18).

`msda_gather` (opset 11+) computes all levels at once: each sample's four bilinear corners are
rows of value viewed as (bs*num_keys*num_heads, head_dim), found by one ``Gather`` of
``((b*num_keys + level_start + y*W + x)*num_heads + h)`` indices; corners outside their level (and
every corner of a non-finite location) get weight 0 through ``Where``, so they read row 0 and add
nothing. One batched ``MatMul`` of the (1, 4*L*P) weights with the gathered (4*L*P, head_dim)
rows then sums over levels, points and corners. Every size comes from ``Shape`` (dynamic batch,
queries, levels and spatial shapes as graph inputs), so it is also the node's function body.
float16/bfloat16 compute in float32 (ORT's CPU Floor/MatMul/GridSample lack them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from onnx_custom.errors import SymbolicError
from onnx_custom.ops.msda import MSDA, check_level_layout
from onnx_custom.spec import spec_translations
from onnx_custom.translate.builder import register_value_check
from onnx_custom.translate.registry import Registry

__all__ = [
    "GATHER_MIN_OPSET",
    "GRID_SAMPLE_OPSET",
    "MMDEPLOY_NODE",
    "check_constant_levels",
    "msda_gather",
    "msda_grid_sample",
    "msda_mmdeploy",
    "registry",
]

MMDEPLOY_NODE = "mmdeploy::MMCVMultiScaleDeformableAttention"
GATHER_MIN_OPSET = 11  # Range, Where on int64
GRID_SAMPLE_OPSET = 16
_HALF = ("torch.float16", "torch.bfloat16")


def msda_mmdeploy(
    g: Any,
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    *,
    im2col_step: Any,
) -> Any:
    return g.op(
        MMDEPLOY_NODE,
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        im2col_step=im2col_step,
    )


def _i64(g: Any, values: Any) -> Any:
    return g.constant(np.asarray(values, dtype=np.int64))


def _dim(g: Any, shape: Any, axis: int) -> Any:
    return g.op("Slice", shape, _i64(g, [axis]), _i64(g, [axis + 1]))


def _scalar(g: Any, vector: Any) -> Any:
    return g.op("Reshape", vector, _i64(g, np.zeros(0, dtype=np.int64)))


def _reshape(g: Any, x: Any, *dims: Any) -> Any:
    """Reshape to the concatenation of 1-D int64 ``dims``; a 0 stays 0
    (zero batch) from opset 14."""
    allowzero = {"allowzero": 1} if g.opset >= 14 else {}
    return g.op("Reshape", x, g.op("Concat", *dims, axis=0), **allowzero)


def _compute_type(g: Any, value: Any) -> tuple[Any, int | None]:
    """(the ONNX type to compute in, the type to cast the result back to or None)."""
    dtype = g.dtype(value)
    if dtype is not None and str(dtype) in _HALF:
        back = (
            onnx.TensorProto.FLOAT16 if str(dtype) == "torch.float16" else onnx.TensorProto.BFLOAT16
        )
        return onnx.TensorProto.FLOAT, back
    return None, None


def _in_float(g: Any, x: Any, compute: int | None) -> Any:
    return x if compute is None else g.op("Cast", x, to=compute)


def _check_opset(g: Any, needed: int, what: str) -> None:
    if g.opset < needed:
        raise SymbolicError(
            f"{g.target}: the {what} needs opset >= {needed}, got {g.opset}; fix: export at opset"
            f" >= {needed}."
        )


def msda_gather(
    g: Any,
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    *,
    im2col_step: Any,
) -> Any:
    """Standard ops (opset 11+), all levels at once: see the module docstring."""
    _check_opset(g, GATHER_MIN_OPSET, "gather decomposition of multi_scale_deformable_attn")
    np_float, onnx_float = _float_types(g, value)
    compute, back = _compute_type(g, value)
    value = _in_float(g, value, compute)
    loc = _in_float(g, sampling_locations, compute)
    attn = _in_float(g, attention_weights, compute)
    v_shape, l_shape = g.op("Shape", value), g.op("Shape", loc)
    bs, keys, heads, dim = (_dim(g, v_shape, i) for i in range(4))
    queries, levels, points = (_dim(g, l_shape, i) for i in (1, 3, 4))
    one = _i64(g, [1])
    zero_f, one_f, half_f = (g.constant(np.asarray(v, dtype=np_float)) for v in (0.0, 1.0, 0.5))

    # Per-level sizes broadcast over (bs, Q, M, L, P).
    level_dims = (one, one, one, levels, one)
    hs = _reshape(g, g.op("Gather", spatial_shapes, _i64(g, 0), axis=1), *level_dims)
    ws = _reshape(g, g.op("Gather", spatial_shapes, _i64(g, 1), axis=1), *level_dims)
    starts = _reshape(g, level_start_index, *level_dims)
    h_f, w_f = g.op("Cast", hs, to=onnx_float), g.op("Cast", ws, to=onnx_float)
    x = g.op("Sub", g.op("Mul", g.op("Gather", loc, _i64(g, 0), axis=5), w_f), half_f)
    y = g.op("Sub", g.op("Mul", g.op("Gather", loc, _i64(g, 1), axis=5), h_f), half_f)
    x0, y0 = g.op("Floor", x), g.op("Floor", y)
    lx, ly = g.op("Sub", x, x0), g.op("Sub", y, y0)
    hx, hy = g.op("Sub", one_f, lx), g.op("Sub", one_f, ly)

    # (b * keys + start) * M + h, broadcast: the part of a row index that is not (y*W + x) * M.
    zero_s, one_s = _scalar(g, _i64(g, [0])), _scalar(g, one)
    b_ids = _reshape(g, g.op("Range", zero_s, _scalar(g, bs), one_s), bs, one, one, one, one)
    h_ids = _reshape(g, g.op("Range", zero_s, _scalar(g, heads), one_s), one, one, heads, one, one)
    base = g.op("Add", g.op("Mul", g.op("Add", g.op("Mul", b_ids, keys), starts), heads), h_ids)

    rows, weights = [], []
    for dy, wy in ((0, hy), (1, ly)):
        for dx, wx in ((0, hx), (1, lx)):
            cx = x0 if dx == 0 else g.op("Add", x0, one_f)
            cy = y0 if dy == 0 else g.op("Add", y0, one_f)
            # Comparisons are False for NaN: a non-finite location has no corner inside.
            inside = g.op(
                "And",
                g.op("And", g.op("Not", g.op("Less", cx, zero_f)), g.op("Less", cx, w_f)),
                g.op("And", g.op("Not", g.op("Less", cy, zero_f)), g.op("Less", cy, h_f)),
            )
            cx_i = g.op("Cast", g.op("Where", inside, cx, zero_f), to=onnx.TensorProto.INT64)
            cy_i = g.op("Cast", g.op("Where", inside, cy, zero_f), to=onnx.TensorProto.INT64)
            offset = g.op("Mul", g.op("Add", g.op("Mul", cy_i, ws), cx_i), heads)
            rows.append(g.op("Where", inside, g.op("Add", base, offset), _i64(g, 0)))
            weights.append(g.op("Where", inside, g.op("Mul", g.op("Mul", wy, wx), attn), zero_f))
    # (bs, Q, M, 4*L*P) corner rows and weights; one Gather, one batched MatMul.
    n = g.op("Mul", g.op("Mul", bs, queries), heads)
    lp4 = g.op("Mul", g.op("Mul", levels, points), _i64(g, [4]))
    rows_all = _reshape(g, g.op("Concat", *rows, axis=3), n, lp4)
    weights_all = _reshape(g, g.op("Concat", *weights, axis=3), n, one, lp4)
    table = _reshape(g, value, g.op("Mul", g.op("Mul", bs, keys), heads), dim)
    gathered = g.op("Gather", table, rows_all, axis=0)  # (n, 4LP, D)
    out = _reshape(g, g.op("MatMul", weights_all, gathered), bs, queries, g.op("Mul", heads, dim))
    return out if back is None else g.op("Cast", out, to=back)


def _float_types(g: Any, value: Any) -> tuple[type[np.floating[Any]], int]:
    """(numpy, ONNX) type the math runs in: float64 for float64 ``value``, else float32."""
    dtype = g.dtype(value)
    if dtype is not None and str(dtype) == "torch.float64":
        return np.float64, onnx.TensorProto.DOUBLE
    return np.float32, onnx.TensorProto.FLOAT


def _static_levels(g: Any, spatial_shapes: Any, sampling_locations: Any) -> int | None:
    """The number of levels when the export knows it (one GridSample per level), else None."""
    for x, axis in ((spatial_shapes, 0), (sampling_locations, 3)):
        shape = g.shape(x)
        if shape is not None and len(shape) > axis and isinstance(shape[axis], int):
            return int(shape[axis])
    return None


def msda_grid_sample(
    g: Any,
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    *,
    im2col_step: Any,
) -> Any:
    """Opset 16+: mmcv's pure-PyTorch formulation, one GridSample per level. float64 (GridSample
    would round to float32) and a dynamic number of levels (nothing to unroll) take the gather
    form, also standard ops."""
    _check_opset(g, GRID_SAMPLE_OPSET, "GridSample form of multi_scale_deformable_attn")
    levels = _static_levels(g, spatial_shapes, sampling_locations)
    if levels is None or _float_types(g, value)[0] is np.float64:
        return msda_gather(
            g,
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
            im2col_step=im2col_step,
        )
    compute, back = _compute_type(g, value)
    value = _in_float(g, value, compute)
    loc = _in_float(g, sampling_locations, compute)
    attn = _in_float(g, attention_weights, compute)
    v_shape, l_shape = g.op("Shape", value), g.op("Shape", loc)
    bs, heads, dim = (_dim(g, v_shape, i) for i in (0, 2, 3))
    queries, points = _dim(g, l_shape, 1), _dim(g, l_shape, 4)
    one = _i64(g, [1])
    bm = g.op("Mul", bs, heads)
    two_f, one_f = g.constant(np.float32(2.0)), g.constant(np.float32(1.0))
    grids = g.op("Sub", g.op("Mul", loc, two_f), one_f)
    mode = "linear" if g.opset >= 20 else "bilinear"  # renamed at opset 20
    sampled = []
    for level in range(levels):
        hw = g.op("Gather", spatial_shapes, _i64(g, [level]), axis=0)  # (1, 2)
        h, w = g.op("Gather", hw, _i64(g, [0]), axis=1), g.op("Gather", hw, _i64(g, [1]), axis=1)
        h, w = _reshape(g, h, one), _reshape(g, w, one)
        start = g.op("Gather", level_start_index, _i64(g, [level]), axis=0)
        part = g.op(
            "Slice", value, start, g.op("Add", start, g.op("Mul", h, w)), one
        )  # (bs, HW, M, D)
        image = _reshape(g, g.op("Transpose", part, perm=[0, 2, 3, 1]), bm, dim, h, w)
        grid = g.op("Gather", grids, _i64(g, level), axis=3)  # (bs, Q, M, P, 2)
        grid = _reshape(
            g, g.op("Transpose", grid, perm=[0, 2, 1, 3, 4]), bm, queries, points, _i64(g, [2])
        )
        sampled.append(
            g.op("GridSample", image, grid, mode=mode, padding_mode="zeros", align_corners=0)
        )
    lp = g.op("Mul", points, _i64(g, [levels]))
    stacked = g.op("Concat", *sampled, axis=3) if levels > 1 else sampled[0]  # (bs*M, D, Q, L*P)
    stacked = g.op("Transpose", stacked, perm=[0, 2, 1, 3])  # (bs*M, Q, D, L*P)
    weights = _reshape(g, g.op("Transpose", attn, perm=[0, 2, 1, 3, 4]), bm, queries, lp, one)
    out = _reshape(g, g.op("MatMul", stacked, weights), bs, heads, queries, dim)  # (bs, M, Q, D)
    out = _reshape(
        g, g.op("Transpose", out, perm=[0, 2, 1, 3]), bs, queries, g.op("Mul", heads, dim)
    )
    return out if back is None else g.op("Cast", out, to=back)


def check_constant_levels(g: Any, value: Any, spatial_shapes: Any, level_start_index: Any) -> None:
    """At export, before anything is written: when ``spatial_shapes`` (and ``level_start_index``)
    are constants of the file, their values against each other and against value's static
    ``num_keys`` (`check_level_layout`: `MultiScaleDeformableAttnError` naming the fix). Level
    tensors that are graph inputs are checked by the kernels at run time (an ORT error status)."""
    shapes = g.constant_value(spatial_shapes)
    if shapes is None or shapes.ndim != 2 or shapes.shape[1] != 2:
        return  # a graph input, or a shape the fake kernel already refused
    starts = g.constant_value(level_start_index)
    if starts is not None and starts.shape != (shapes.shape[0],):
        starts = None
    value_shape = g.shape(value)
    keys = (
        value_shape[1]
        if value_shape is not None and len(value_shape) == 4 and isinstance(value_shape[1], int)
        else None
    )
    check_level_layout(shapes, starts, keys)


msda_gather.__doc__ = f"{msda_gather.__doc__}\n\n{MSDA.op_name}{MSDA.schema}"
registry: Registry = spec_translations(MSDA)
register_value_check(
    MSDA.name,
    lambda g, value, spatial_shapes, level_start_index, *_, **__: check_constant_levels(
        g, value, spatial_shapes, level_start_index
    ),
)

"""Standard nodes of a translation written for an older opset, kept to their old meaning.

A symbolic registered for opset N (``register_custom_op_symbolic(..., 11)``, mmcv's and
torchvision's) runs unchanged at a later export opset (the dynamo exporter records at 18 or
more). Most ops only gained types or moved attributes to inputs (`opset_upgrade`); a few changed
what the same node computes:

- ``RoiAlign`` 16: ``coordinate_transformation_mode`` appeared with default ``half_pixel``; the
  older op sampled as ``output_half_pixel``, which is written explicitly.
- ``Resize`` 11: inputs became ``(X, roi, scales, sizes)`` (10: ``(X, scales)``) and the default
  coordinate transform became ``half_pixel`` with ``round_prefer_floor`` nearest rounding; the
  opset-10 op is ``asymmetric`` with ``floor`` rounding, which is written explicitly and the
  scales move to input 2.
- ``Softmax``/``LogSoftmax``/``Hardmax`` 13: the older op flattened the input to 2-D at ``axis``
  (default 1) and normalised over everything after it; the newer one over ``axis`` alone
  (default -1). A last-axis node keeps its meaning (the axis is written explicitly); any other
  is written as ``Flatten(axis) -> op(axis=1) -> Reshape(Shape(x))``, the older definition.
- ``GridSample`` 20: ``mode`` values renamed (``bilinear`` -> ``linear``, ``bicubic`` ->
  ``cubic``): renamed.
- ``GroupNormalization`` 21: ``scale``/``bias`` per channel (18: per group): refused with the fix.

Every other change between versions is on `KEEPS_MEANING` (an attribute added with a default
that says what the older op did, or a type-only change); a test reads ``onnx.defs`` history so a
newer onnx with a new default change fails until it is classified here.
"""

from __future__ import annotations

import functools

import onnx.defs

__all__ = ["KEEPS_MEANING", "MEANING_CHANGES", "meaning_changes"]

# (op_type, since_version) -> what changed; `GraphBuilder` keeps the older meaning (see above).
MEANING_CHANGES: dict[tuple[str, int], str] = {
    ("RoiAlign", 16): "coordinate_transformation_mode appeared (default half_pixel; before:"
    " output_half_pixel)",
    ("Resize", 11): "inputs became (X, roi, scales, sizes) and the default coordinate transform"
    " half_pixel (before: (X, scales), asymmetric with floor rounding)",
    ("Softmax", 13): "normalises over axis alone (before: over the input flattened to 2-D at axis)",
    ("LogSoftmax", 13): "normalises over axis alone (before: over the input flattened at axis)",
    ("Hardmax", 13): "takes the max over axis alone (before: over the input flattened at axis)",
    ("GridSample", 20): "mode values renamed (bilinear -> linear, bicubic -> cubic)",
    ("GroupNormalization", 21): "scale and bias per channel (before: per group)",
}

# Attribute defaults added or changed between versions (as onnx.defs history shows them) whose
# default is what the older op did: lifting needs nothing. (op_type, since) -> attribute.
KEEPS_MEANING: dict[tuple[str, int], str] = {
    ("ArgMax", 12): "select_last_index",
    ("ArgMin", 12): "select_last_index",
    ("Attention", 25): "left_window_size, right_window_size",
    ("AveragePool", 7): "count_include_pad",
    ("AveragePool", 10): "ceil_mode",
    ("BatchNormalization", 14): "training_mode",
    ("Cast", 19): "saturate (float8 only)",
    ("Cast", 24): "round_mode (float8/4 only)",
    ("CastLike", 19): "saturate (float8 only)",
    ("CastLike", 24): "round_mode (float8/4 only)",
    ("DepthToSpace", 11): "mode (DCR, the older order)",
    ("DequantizeLinear", 13): "axis (the older op had per-tensor scales only)",
    ("DequantizeLinear", 21): "block_size",
    ("DequantizeLinear", 23): "output_dtype",
    ("GRU", 14): "layout",
    ("GatherND", 12): "batch_dims",
    ("LSTM", 14): "layout",
    ("LpPool", 18): "ceil_mode",
    ("MaxPool", 8): "storage_order",
    ("MaxPool", 10): "ceil_mode",
    ("QuantizeLinear", 13): "axis (the older op had per-tensor scales only)",
    ("QuantizeLinear", 19): "saturate (float8 only)",
    ("QuantizeLinear", 21): "output_dtype, block_size",
    ("QuantizeLinear", 23): "precision",
    ("RNN", 14): "layout",
    ("Range", 27): "stash_type",
    ("ReduceL1", 18): "noop_with_empty_axes",
    ("ReduceL2", 18): "noop_with_empty_axes",
    ("ReduceLogSum", 18): "noop_with_empty_axes",
    ("ReduceLogSumExp", 18): "noop_with_empty_axes",
    ("ReduceMax", 18): "noop_with_empty_axes",
    ("ReduceMean", 18): "noop_with_empty_axes",
    ("ReduceMin", 18): "noop_with_empty_axes",
    ("ReduceProd", 18): "noop_with_empty_axes",
    ("ReduceSum", 13): "noop_with_empty_axes",
    ("ReduceSumSquare", 18): "noop_with_empty_axes",
    ("Reshape", 14): "allowzero",
    ("Resize", 18): "keep_aspect_ratio_policy, antialias",
    ("ScatterElements", 16): "reduction",
    ("ScatterND", 16): "reduction",
    ("Shape", 15): "start",
    ("SpaceToDepth", 28): "mode (DCR, the older order)",
    ("TopK", 11): "sorted, largest",
}


@functools.cache
def _versions(op_type: str) -> tuple[int, ...]:
    return tuple(
        sorted(
            s.since_version
            for s in onnx.defs.get_all_schemas_with_history()
            if s.domain == "" and s.name == op_type
        )
    )


@functools.cache
def meaning_changes(op_type: str, written: int, opset: int) -> tuple[int, ...]:
    """The versions of default-domain ``op_type`` after ``written`` up to ``opset`` that changed
    what the same node computes (`MEANING_CHANGES`)."""
    if written >= opset:
        return ()
    return tuple(
        v for v in _versions(op_type) if written < v <= opset and (op_type, v) in MEANING_CHANGES
    )

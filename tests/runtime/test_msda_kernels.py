"""The kernels of ``onnx_custom::MultiScaleDeformableAttn`` and
``mmdeploy::MMCVMultiScaleDeformableAttention`` in ONNX Runtime: the native C++ kernel
(libonnx_custom_ops.so, plain ORT) and the Python kernel, against the independent grid_sample
reference, every dtype, zero sizes, non-finite locations, threads; bad input is an ORT error status
naming the problem, never a crash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from _msda_reference import grid_sample_msda, make_inputs
from _native_util import assert_close, node_model, run_native, run_python

from onnx_custom.runtime.native import native_ops

NODES = [
    ("onnx_custom", "MultiScaleDeformableAttn"),
    ("mmdeploy", "MMCVMultiScaleDeformableAttention"),
]
RUNNERS: dict[str, Callable[..., list[np.ndarray]]] = {"native": run_native, "python": run_python}
NAMES = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")


def _np(t: torch.Tensor, dtype: str) -> np.ndarray:
    if t.dtype == torch.int64:
        return t.numpy().copy()
    return t.double().numpy().astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def _model(node: tuple[str, str], dtype: str, arrays: dict[str, np.ndarray], **attrs: Any) -> Any:
    io = [(n, "int64" if n in NAMES[1:3] else dtype, None) for n in arrays]
    return node_model(node[1], node[0], io, [("output", dtype, None)], im2col_step=64, **attrs)


def _expected(inputs: tuple[torch.Tensor, ...], dtype: str) -> np.ndarray:
    value, shapes, _, loc, attn = (
        t if t.dtype == torch.int64 else torch.from_numpy(_np(t, dtype).astype(np.float64))
        for t in inputs
    )
    out = grid_sample_msda(value, shapes, loc, attn).numpy()
    return out.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def test_library_serves_both_nodes() -> None:
    assert {f"{d}::{o}" for d, o in NODES} <= set(native_ops())


SIZES = [
    (2, 5, 2, 3, 2, ((4, 5), (2, 3), (1, 1))),
    (1, 33, 8, 32, 4, ((16, 12), (8, 6), (4, 3), (2, 2))),
    (3, 1, 1, 1, 1, ((1, 1),)),
]


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("node", NODES, ids=lambda n: n[0])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "size", SIZES, ids=lambda s: f"bs{s[0]}-q{s[1]}-m{s[2]}-d{s[3]}-L{len(s[5])}"
)
def test_kernel_matches_grid_sample(
    runner: str, node: tuple[str, str], dtype: str, size: tuple[Any, ...]
) -> None:
    bs, q, m, d, p, levels = size
    inputs = make_inputs(bs, q, m, d, p, levels, dtype=torch.float64, seed=q)
    arrays = {n: _np(t, dtype) for n, t in zip(NAMES, inputs, strict=True)}
    (got,) = RUNNERS[runner](_model(node, dtype, arrays), arrays)
    assert got.shape == (bs, q, m * d)
    assert_close(
        got, _expected(inputs, dtype), dtype, scale=2.0 if dtype in ("float16", "bfloat16") else 1.0
    )


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_native_results_do_not_depend_on_threads(threads: int) -> None:
    inputs = make_inputs(2, 70, 2, 8, 3, dtype=torch.float32, seed=2)
    arrays = {n: _np(t, "float32") for n, t in zip(NAMES, inputs, strict=True)}
    (got,) = run_native(_model(NODES[0], "float32", arrays), arrays, threads=threads)
    (one,) = run_native(_model(NODES[0], "float32", arrays), arrays, threads=1)
    np.testing.assert_array_equal(got, one)


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_nonfinite_locations_contribute_zero(runner: str) -> None:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=4)
    bad = torch.zeros(loc.shape[:-1], dtype=torch.bool)
    bad[0, 1, 0, 0, 1] = bad[1, 3, 1, 2, 0] = True
    poisoned = loc.clone()
    poisoned[0, 1, 0, 0, 1, 0] = float("nan")
    poisoned[1, 3, 1, 2, 0, 1] = float("inf")
    arrays = {
        n: _np(t, "float64")
        for n, t in zip(NAMES, (value, shapes, starts, poisoned, attn), strict=True)
    }
    (got,) = RUNNERS[runner](_model(NODES[0], "float64", arrays), arrays)
    np.testing.assert_allclose(
        got, grid_sample_msda(value, shapes, loc, attn * ~bad).numpy(), rtol=1e-7, atol=1e-7
    )


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize(("bs", "queries"), [(0, 4), (2, 0)], ids=["bs0", "q0"])
def test_zero_size(runner: str, bs: int, queries: int) -> None:
    inputs = make_inputs(bs, queries, dtype=torch.float32)
    arrays = {n: _np(t, "float32") for n, t in zip(NAMES, inputs, strict=True)}
    (got,) = RUNNERS[runner](_model(NODES[0], "float32", arrays), arrays)
    assert got.shape == (bs, queries, 6)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_python_kernel_writes_into_the_given_output(dtype: str, layout: str) -> None:
    """The Python kernel computes into ORT's output buffer: directly when it is contiguous in the
    compute dtype (float32/float64), through one rounding copy otherwise (half types, strides);
    numbers outside the view stay untouched."""
    from onnx_custom.ops.msda import msda_ort_kernel

    inputs = make_inputs(2, 5, 2, 3, 2, dtype=torch.float64, seed=5)
    arrays = [_np(t, dtype) for t in inputs]
    storage = np.full((2, 5, 12), 7.0).astype(arrays[0].dtype)
    out = storage[..., ::2] if layout == "strided" else storage[..., :6].copy()
    assert out.flags.c_contiguous == (layout == "contiguous")
    assert msda_ort_kernel(*arrays, im2col_step=64, out=(out,)) is None  # type: ignore[func-returns-value]
    assert_close(
        out, _expected(inputs, dtype), dtype, scale=2.0 if dtype in ("float16", "bfloat16") else 1.0
    )
    if layout == "strided":
        assert (storage[..., 1::2].astype(np.float64) == 7.0).all()


def _bad(**changes: Any) -> dict[str, np.ndarray]:
    arrays = {
        n: _np(t, "float32") for n, t in zip(NAMES, make_inputs(dtype=torch.float32), strict=True)
    }
    for name, fn in changes.items():
        arrays[name] = fn(arrays[name])
    return arrays


BAD = [  # (id, arrays, what the native message says, what the Python kernel's says)
    ("keys-mismatch", _bad(value=lambda v: v[:, :-1]), "num_keys = 26", "num_keys = 26"),
    (
        "starts-wrong",
        _bad(level_start_index=lambda s: s + np.array([0, 1, 0])),
        "does not match spatial_shapes",
        "does not match spatial_shapes",
    ),
    (
        "negative-size",
        _bad(spatial_shapes=lambda s: s * np.array([[1, 1], [-1, -1], [1, 1]])),
        "invalid size",
        "negative size",
    ),
    (
        "locations-rank",
        _bad(sampling_locations=lambda s: s[..., 0]),
        "sampling_locations must be 6-D",
        "sampling_locations must be 6-D",
    ),
    (
        "heads-mismatch",
        _bad(sampling_locations=lambda s: s[:, :, :1]),
        "sampling_locations must be",
        "num_heads=2",
    ),
    (
        "weights-shape",
        _bad(attention_weights=lambda s: s[..., :1]),
        "attention_weights must have shape",
        "attention_weights must have shape",
    ),
    (
        "locations-rank1",
        _bad(sampling_locations=lambda s: s.reshape(-1)),
        "index 1 is out of range for a shape of rank 1",
        "sampling_locations must be 6-D",
    ),
    (
        "value-rank0",
        _bad(value=lambda v: v.reshape(-1)[:1].reshape(())),
        "out of range for a shape of rank 0",
        "value must be 4-D",
    ),
    (
        "int-value",
        _bad(value=lambda v: v.astype(np.int32)),
        (
            "input 'value' has dtype int32; the op spec declares float32, float64, float16,"
            " bfloat16; fix: cast it"
        ),
        "int32",
    ),
    # the int64 inputs are left undeclared to ORT so that our check, not ORT's bare "invalid",
    # speaks
    (
        "int32-shapes",
        _bad(spatial_shapes=lambda s: s.astype(np.int32)),
        (
            "input 'spatial_shapes' has dtype int32; the op spec declares int64; fix: cast it (e.g."
            " with a Cast node)"
        ),
        (
            "('spatial_shapes') 'spatial_shapes' of dtype int32; expected one of int64; fix: cast"
            " the input (a Cast node)"
        ),
    ),
    (
        "int32-starts",
        _bad(level_start_index=lambda s: s.astype(np.int32)),
        (
            "input 'level_start_index' has dtype int32; the op spec declares int64; fix: cast it"
            " (e.g. with a Cast node)"
        ),
        (
            "('level_start_index') 'level_start_index' of dtype int32; expected one of int64; fix:"
            " cast the input (a Cast node)"
        ),
    ),
]


@pytest.mark.parametrize("node", NODES, ids=lambda n: n[0])
@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize(
    ("arrays", "native_text", "python_text"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_is_an_error_status(
    runner: str,
    arrays: dict[str, np.ndarray],
    native_text: str,
    python_text: str,
    node: tuple[str, str],
) -> None:
    io = [(n, str(a.dtype), None) for n, a in arrays.items()]
    model = node_model(
        node[1], node[0], io, [("output", str(arrays["value"].dtype), None)], im2col_step=64
    )
    with pytest.raises(Exception, match=_re(native_text if runner == "native" else python_text)):
        RUNNERS[runner](model, arrays)


def test_native_refuses_non_positive_im2col_step() -> None:
    arrays = _bad()
    io = [(n, str(a.dtype), None) for n, a in arrays.items()]
    model = node_model(NODES[0][1], NODES[0][0], io, [("output", "float32", None)], im2col_step=0)
    with pytest.raises(Exception, match="im2col_step must be positive"):
        run_native(model, arrays)


def _re(text: str) -> str:
    import re

    return re.escape(text)

"""The native MSDA kernel is a user kernel: written against ``onnx_custom/kernel.h`` only, declared
by the op spec's ``native: {source, function}``, registered by code the user-spec generator writes
(checked in as ``msda_generated.cpp``, held current here), and buildable through
`build_native_library` exactly as a user's op is."""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
import torch
from _msda_reference import grid_sample_msda, make_inputs
from _native_util import assert_close, node_model

from onnx_custom.ops.msda import MSDA, NATIVE_FUNCTION
from onnx_custom.ort_kernels.msda import NATIVE_BINDING, native_binding
from onnx_custom.runtime.native import NativeLibrary, sources_dir
from onnx_custom.spec import NativeKernel, build_native_library

NAMES = ("value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights")


def test_spec_names_the_kernel_like_a_user_spec() -> None:
    assert MSDA.native == NativeKernel(str(sources_dir() / "msda.cpp"), NATIVE_FUNCTION)


def test_generated_registration_is_current() -> None:
    checked_in = (sources_dir() / NATIVE_BINDING).read_text(encoding="utf-8")
    assert checked_in == native_binding().text, "run: python -m onnx_custom.ort_kernels.msda"
    # both nodes, one generated kernel class
    assert '{"onnx_custom", "MultiScaleDeformableAttn",' in checked_in
    assert '{"mmdeploy", "MMCVMultiScaleDeformableAttention",' in checked_in


def test_kernel_source_uses_only_the_user_api() -> None:
    text = (sources_dir() / "msda.cpp").read_text(encoding="utf-8")
    includes = re.findall(r"^#include\s+(\S+)", text, re.M)
    assert "<onnx_custom/kernel.h>" in includes
    # the user API, the torch-free math it shares with the eager op (shipped on the same include
    # path as kernel.h), the standard library
    shipped = {"<onnx_custom/kernel.h>", "<onnx_custom/kernels/msda.h>"}
    assert all(i in shipped or re.fullmatch(r"<\w+>", i) for i in includes), includes
    assert "OrtApi" not in text and "oc::" not in text  # no ORT type, no library internals


def _np(t: torch.Tensor, dtype: str) -> np.ndarray:
    if t.dtype == torch.int64:
        return t.numpy().copy()
    return t.double().numpy().astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


@pytest.fixture(scope="module")
def user_library() -> NativeLibrary:
    """MSDA's spec built the way `onnx-custom build-library --spec` builds a user's
    (its own .so)."""
    return build_native_library([MSDA], name="msda_user_route")


def _run(lib: NativeLibrary, arrays: dict[str, np.ndarray], dtype: str, **attrs: Any) -> np.ndarray:
    io = [
        (n, "int64" if n in NAMES[1:3] else str(a.dtype) if a.dtype.kind in "iu" else dtype, None)
        for n, a in arrays.items()
    ]
    model = node_model(
        "MultiScaleDeformableAttn",
        "onnx_custom",
        io,
        [("output", io[0][1], None)],
        **{"im2col_step": 64, **attrs},
    )
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.register_custom_ops_library(str(lib.path))
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {
        k: v.astype(np.float32) if v.dtype == np.dtype(ml_dtypes.bfloat16) else v
        for k, v in arrays.items()
    }
    (out,) = sess.run(None, feeds)
    return out.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else out


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_user_route_library_matches_grid_sample(user_library: NativeLibrary, dtype: str) -> None:
    assert user_library.ops == ("onnx_custom::MultiScaleDeformableAttn",)
    inputs = make_inputs(2, 7, 2, 4, 3, ((5, 4), (3, 2)), dtype=torch.float64, seed=5)
    arrays = {n: _np(t, dtype) for n, t in zip(NAMES, inputs, strict=True)}
    got = _run(user_library, arrays, dtype)
    value, shapes, _, loc, attn = (
        t if t.dtype == torch.int64 else torch.from_numpy(_np(t, dtype).astype(np.float64))
        for t in inputs
    )
    expected = (
        grid_sample_msda(value, shapes, loc, attn)
        .numpy()
        .astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    )
    assert_close(got, expected, dtype, scale=2.0 if dtype in ("float16", "bfloat16") else 1.0)


@pytest.mark.parametrize(
    ("change", "attrs", "message"),
    [
        (
            {"value": lambda v: v[:, :-1]},
            {},
            "spatial_shapes cover sum(H*W) = 27 keys but value has num_keys = 26",
        ),
        (
            {"level_start_index": lambda s: s[::-1].copy()},
            {},
            "does not match spatial_shapes: expected [0, 20, 26]",
        ),
        ({}, {"im2col_step": -1}, "im2col_step must be positive; received -1"),
    ],
    ids=["keys", "starts", "im2col_step"],
)
def test_user_route_bad_input_is_an_error_status(
    user_library: NativeLibrary, change: dict[str, Any], attrs: dict[str, int], message: str
) -> None:
    inputs = make_inputs(dtype=torch.float32)
    arrays = {n: _np(t, "float32") for n, t in zip(NAMES, inputs, strict=True)}
    for name, fn in change.items():
        arrays[name] = fn(arrays[name])
    with pytest.raises(
        Exception,
        match=r"onnx-custom native kernel onnx_custom::MultiScaleDeformableAttn .*"
        + re.escape(message),
    ):
        _run(user_library, arrays, "float32", **attrs)


def test_shipped_ops_are_not_registered_twice() -> None:
    # MSDA's spec names a kernel of the shipped set: with include_shipped it is served once
    from onnx_custom.spec.native_library import _selected

    assert _selected([MSDA], include_shipped=True) == []
    assert _selected([MSDA], include_shipped=False) == [MSDA]

"""The native library's channels-last ``onnx_custom::DeformConv2d`` forward (>= 8 channels per
offset group): the kernels it shares with the eager op (``onnx_custom/kernels/deform_conv.h`` in
``onnx_custom/runtime/include``: the AVX-512 GEMM and sampler, the tap builder) and
its portable path (the compiler's sampling loop, the library's ``gemm()``), selected per kernel with
``ONNX_CUSTOM_NATIVE_DCN=portable``. Against the independent pure-torch reference at the blocks'
edges (the eager op's kernel-test cases: positions around the 6-row block and the 128-position tile,
output channels around 16 and 64, channel segments that are not multiples of 16, groups and offset
groups, masks, strided/dilated samples off the image); half types; dynamic sizes through one
session; 1 vs 2 intra-op threads; zero batch. On the AVX-512 path the native output is bit-identical
to the eager op's (one copy of the math)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _native_util import node_model
from test_deform_conv import Case
from test_deform_conv_forward_kernels import CASES
from test_deform_conv_reference import Geometry, reference_deform_conv2d

from onnx_custom.ops.deform_conv import load_extension
from onnx_custom.runtime.native import library_path
from onnx_custom.runtime.ort_log_level import quiet_session_options

OP = torch.ops.onnx_custom.deform_conv2d.default
NAMES = ("input", "weight", "offset", "mask", "bias")
TOL: dict[str, dict[str, Any]] = {"float32": {"rtol": 1e-5, "atol": 5e-5}, "float64": {}}


def _has_avx512() -> bool:
    ext = load_extension()
    ext.disable_avx512(False)
    return bool(ext.avx512())


@pytest.fixture(params=["avx512", "portable"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Sessions made inside the test run the AVX-512 kernels (where the CPU has them) or the
    portable path: the kernel reads ONNX_CUSTOM_NATIVE_DCN when ORT creates it."""
    if request.param == "avx512" and not _has_avx512():
        pytest.skip("this CPU has no AVX-512F: the float32 forward runs the portable path only")
    if request.param == "portable":
        monkeypatch.setenv("ONNX_CUSTOM_NATIVE_DCN", "portable")
    else:
        monkeypatch.delenv("ONNX_CUSTOM_NATIVE_DCN", raising=False)
        monkeypatch.delenv("ONNX_CUSTOM_NATIVE_ISA", raising=False)
    yield request.param


def _attrs(geo: Geometry) -> dict[str, int]:
    return dict(
        stride_h=geo.stride[0],
        stride_w=geo.stride[1],
        pad_h=geo.pad[0],
        pad_w=geo.pad[1],
        dilation_h=geo.dil[0],
        dilation_w=geo.dil[1],
        groups=geo.groups,
        offset_groups=geo.offset_groups,
        use_mask=int(geo.use_mask),
    )


def _session(geo: Geometry, dtype: str, threads: int = 2) -> ort.InferenceSession:
    """One DeformConv2d node with every dim dynamic (one session serves any size)."""
    io = [
        (name, dtype, [f"{name}{i}" for i in range(1 if name == "bias" else 4)]) for name in NAMES
    ]
    model: onnx.ModelProto = node_model(
        "DeformConv2d", "onnx_custom", io, [("y", dtype, None)], opset=11, **_attrs(geo)
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    quiet_session_options(so)
    so.register_custom_ops_library(str(library_path()))
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(sess: ort.InferenceSession, t: dict[str, torch.Tensor]) -> np.ndarray:
    """The node's output for torch tensors (bfloat16 crosses the graph boundary as float32)."""
    feeds = {
        k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
        for k, v in t.items()
        if k in NAMES
    }
    (out,) = sess.run(None, feeds)
    return np.asarray(out)


def _reference(case: Case, t: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = t["mask"] if case.geo.use_mask else None
    return reference_deform_conv2d(t["input"], t["weight"], t["offset"], mask, t["bias"], case.geo)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_block_edges_match_reference(case: Case, dtype: str, path: str) -> None:
    t = case.tensors(getattr(torch, dtype), seed=3)
    got = _run(_session(case.geo, dtype), t)
    expected = _reference(case, {k: v.double() for k, v in t.items()}).to(getattr(torch, dtype))
    torch.testing.assert_close(torch.from_numpy(got), expected, **TOL[dtype])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_avx512_path_is_the_eager_ops_math(case: Case) -> None:
    """Same kernels, same sum order: the native output equals the eager op's bit for bit."""
    if not _has_avx512():
        pytest.skip("this CPU has no AVX-512F")
    t = case.tensors(torch.float32, seed=4)
    with torch.inference_mode():
        eager = OP(*case.op_args(t))
    np.testing.assert_array_equal(_run(_session(case.geo, "float32"), t), eager.numpy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_round_the_float32_result(dtype: str, path: str) -> None:
    case = CASES[6]
    t = case.tensors(getattr(torch, dtype), seed=8)
    got = _run(_session(case.geo, dtype), t)
    widened = _run(_session(case.geo, "float32"), {k: v.float() for k, v in t.items()})
    want = widened.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    # one rounding of the float32 result (bfloat16 comes back widened to float32 by the graph)
    np.testing.assert_array_equal(got.astype(want.dtype), want)


def test_dynamic_sizes_through_one_session(path: str) -> None:
    """Scratch sized by one call serves the next, smaller or larger (thread-local buffers grow)."""
    geo = Geometry(pad=(1, 1), offset_groups=2)
    sess = _session(geo, "float32")
    for n, h, w in [(2, 9, 14), (1, 20, 17), (3, 4, 5), (1, 20, 17)]:
        case = Case(n, 32, h, w, 40, 3, 3, geo)
        t = case.tensors(torch.float32, seed=h)
        torch.testing.assert_close(
            torch.from_numpy(_run(sess, t)),
            _reference(case, {k: v.double() for k, v in t.items()}).float(),
            **TOL["float32"],
        )


@pytest.mark.parametrize(
    "case",
    [CASES[4], CASES[6], Case(5, 16, 11, 13, 24, 3, 3, Geometry(pad=(1, 1)))],
    ids=lambda c: c.id,
)
def test_one_and_two_threads_agree_bitwise(case: Case, path: str) -> None:
    t = case.tensors(torch.float32, seed=9)
    one, two = (_run(_session(case.geo, "float32", threads), t) for threads in (1, 2))
    np.testing.assert_array_equal(one, two)


def test_large_images_convert_pass_by_pass(path: str) -> None:
    """Images above the conversion pass's budget (0.5 MiB; here 0.51 MiB, one image per pass).
    Small weights keep the 1152-term sums' float32 rounding inside the tolerance."""
    case = Case(3, 128, 30, 30, 8, 3, 3, Geometry(pad=(1, 1)), offset_scale=2.0)
    t = case.tensors(torch.float32, seed=11)
    t["weight"] *= 0.05
    expected = _reference(case, {k: v.double() for k, v in t.items()}).float()
    torch.testing.assert_close(
        torch.from_numpy(_run(_session(case.geo, "float32"), t)), expected, **TOL["float32"]
    )


def test_zero_batch(path: str) -> None:
    case = Case(0, 16, 9, 9, 20, 3, 3, Geometry(pad=(1, 1)))
    assert _run(_session(case.geo, "float32"), case.tensors(torch.float32)).shape == (0, 20, 9, 9)

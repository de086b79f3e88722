"""Native kernels (libonnx_custom_ops.so) agree with the Python kernels of the same nodes.

Randomized inputs per op: broadcasting, zero-size and 0-d tensors, non-default attributes,
float16/bfloat16, int32/int64 indices; plus ONNX's own backend DeformConv cases run through
onnx_custom::DeformConv2d, and each GEMM/sampler code path (AVX-512, AVX2, portable C++,
ORT's Gemm).
"""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from _native_util import assert_close, node_model, run_native, run_python, run_script

from onnx_custom.ops.bev_pool import prepare_bev_ranks, synthetic_frustum
from onnx_custom.ops.deform_conv import deform_conv2d_op

RNG_SEED = 1234


def rand(dtype: str, shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.integers(0, 2, size=shape)).astype(bool)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(max(info.min, -100), min(info.max, 100), size=shape)).astype(
            dtype
        )
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    return np.asarray(rng.standard_normal(shape) * scale).astype(np_dtype)


def ids(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return "x".join(map(str, value)) or "scalar"
    return str(value)


# ---- onnx_custom::my_add -------------------------------------------------------------------------
MY_ADD_SHAPES = [
    ((4, 3), (4, 3)),
    ((4, 3), (3,)),
    ((3,), (2, 4, 3)),
    ((5, 1, 3), (1, 6, 1)),
    ((), ()),
    ((0, 3), (3,)),
    ((2, 0), (1,)),
    ((64, 1024), (64, 1024)),
    # several parallel chunks (2**16 elements each), boundaries inside broadcast rows
    ((3, 70001), (70001,)),
    ((5, 1, 40000), (1, 3, 1)),
]
MY_ADD_DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int32",
    "int64",
    "int8",
    "int16",
    "uint8",
]  # ops/seed.yaml


MY_ADD_CASES = [(d, s, 3.0) for d in MY_ADD_DTYPES for s in MY_ADD_SHAPES[:3]]
MY_ADD_CASES += [("float32", s, a) for s in MY_ADD_SHAPES[3:] for a in (None, 3.0)]
MY_ADD_CASES += [(d, MY_ADD_SHAPES[1], -0.75) for d in ("float32", "float16", "int32", "int8")]


@pytest.mark.parametrize(
    ("dtype", "shapes", "alpha"),
    MY_ADD_CASES,
    ids=[f"{d}-{ids(s[0])}+{ids(s[1])}-alpha{a}" for d, s, a in MY_ADD_CASES],
)
def test_my_add_matches_python(
    dtype: str, shapes: tuple[tuple[int, ...], ...], alpha: float | None
) -> None:
    sa, sb = shapes
    attrs = {} if alpha is None else {"alpha": alpha}
    m = node_model(
        "my_add",
        "onnx_custom",
        [("a", dtype, list(sa)), ("b", dtype, list(sb))],
        [("y", dtype, None)],
        **attrs,
    )
    feeds = {"a": rand(dtype, sa, 1), "b": rand(dtype, sb, 2)}
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert_close(native, python, dtype)


def test_my_add_output_shape_keeps_symbolic_dims() -> None:
    m = node_model(
        "my_add",
        "onnx_custom",
        [("a", "float32", ["batch", 1, 3]), ("b", "float32", [5, 1])],
        [("y", "float32", None)],
    )
    from _native_util import native_session

    sess = native_session(m)
    assert sess.get_outputs()[0].shape == ["batch", 5, 3]
    y = sess.run(None, {"a": rand("float32", (7, 1, 3), 0), "b": rand("float32", (5, 1), 1)})[0]
    assert y.shape == (7, 5, 3)


# ---- onnx_custom::multi_out ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int16", "uint8"]
)
@pytest.mark.parametrize(
    "shape", [(2, 5), (0, 4), (), (3, 1, 7), (2, 70001)], ids=ids
)  # the last: several parallel chunks
@pytest.mark.parametrize(
    "attrs", [{}, {"scale": -1.5, "shift": 0.25}], ids=["defaults", "custom-attrs"]
)
def test_multi_out_matches_python(
    dtype: str, shape: tuple[int, ...], attrs: dict[str, float]
) -> None:
    if dtype == "uint8" and attrs:
        attrs = {"scale": 1.5, "shift": 0.25}  # numpy refuses a negative scale for unsigned types
    m = node_model(
        "multi_out",
        "onnx_custom",
        [("x", dtype, list(shape))],
        [("s", dtype, None), ("t", dtype, None)],
        **attrs,
    )
    feeds = {"x": rand(dtype, shape, 3)}
    for native, python in zip(run_native(m, feeds), run_python(m, feeds), strict=True):
        assert_close(native, python, dtype)


# ---- onnx_custom::MultiOut3 ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("shape", "repeats"),
    [
        ((2, 3, 4), (2, 1, 3)),
        ((5,), (3,)),
        ((2, 0, 3), (1, 2, 1)),
        ((3, 2), (0, 2)),
        ((1, 300), (1, 1)),
    ],
    ids=lambda v: ids(tuple(v)),
)
def test_multi_out3_matches_python(
    dtype: str, shape: tuple[int, ...], repeats: tuple[int, ...]
) -> None:
    m = node_model(
        "MultiOut3",
        "onnx_custom",
        [("x", dtype, ["n", *shape[1:]])],
        [("a", dtype, None), ("b", dtype, None), ("c", dtype, None)],
        repeats=list(repeats),
        scale=0.3,
    )
    feeds = {"x": rand(dtype, shape, 4)}
    native, python = run_native(m, feeds), run_python(m, feeds)
    for out, (a, b) in enumerate(zip(native, python, strict=True)):
        # the sum (output 2) adds up to 300 terms: float16 rounding order differs slightly
        assert_close(a, b, dtype, scale=4.0 if out == 2 and dtype == "float16" else 1.0)


def test_multi_out3_shape_inference_symbolic() -> None:
    from _native_util import native_session

    m = node_model(
        "MultiOut3",
        "onnx_custom",
        [("x", "float32", ["batch", 3, 4])],
        [("a", "float32", None), ("b", "float32", None), ("c", "float32", None)],
        repeats=[1, 2, 3],
        scale=2.0,
    )
    shapes = [o.shape for o in native_session(m).get_outputs()]
    assert shapes == [["batch", 3, 4], ["batch", 6, 12], ["batch", 3]]
    m = node_model(
        "MultiOut3",
        "onnx_custom",
        [("x", "float32", ["batch", 3])],
        [("a", "float32", None), ("b", "float32", None), ("c", "float32", None)],
        repeats=[2, 1],
        scale=2.0,
    )
    tiled = native_session(m).get_outputs()[1].shape
    assert tiled[1] == 3 and tiled[0] != "batch"  # 2 * batch has no name: never claimed as "batch"


# ---- onnx_custom::CustomLinear -------------------------------------------------------------------
LINEAR_CASES = [
    ((4, 16), 8, True),
    ((16,), 8, False),
    ((2, 3, 5, 16), 7, True),
    ((0, 16), 8, True),
    ((3, 0), 4, True),
    ((130, 96), 70, True),
    ((2, 48), 200, False),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("x_shape", "out", "bias"),
    LINEAR_CASES,
    ids=lambda v: ids(v) if isinstance(v, tuple) else str(v),
)
def test_custom_linear_matches_python(
    dtype: str, x_shape: tuple[int, ...], out: int, bias: bool
) -> None:
    k = x_shape[-1]
    inputs = [
        ("x", dtype, ["n", *x_shape[1:]] if len(x_shape) > 1 else [k]),
        ("w", dtype, [out, k]),
    ]
    inputs.append(("b", dtype, [out]) if bias else ("", dtype, None))
    m = node_model("CustomLinear", "onnx_custom", inputs, [("y", dtype, None)])
    feeds = {"x": rand(dtype, x_shape, 5), "w": rand(dtype, (out, k), 6, scale=0.2)}
    if bias:
        feeds["b"] = rand(dtype, (out,), 7)
    (native,) = run_native(m, feeds)
    # independent reference: F.linear in float64, rounded once to the dtype
    t = {n: torch.from_numpy(v.astype(np.float64)) for n, v in feeds.items()}
    ref = (
        torch.nn.functional.linear(t["x"], t["w"], t.get("b"))
        .numpy()
        .astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    )
    # float16: native rounds once, so it is within half an ulp of the exact result
    assert_close(native, ref, dtype, scale=1.0 if dtype == "float16" else 10.0)
    (python,) = run_python(m, feeds)
    assert native.shape == python.shape and native.dtype == python.dtype
    if dtype != "float16":  # numpy's float16 matmul rounds every partial sum (less accurate)
        assert_close(native, python, dtype, scale=10.0)


# ---- onnx_custom::BEVPoolV2 ----------------------------------------------------------------------
def bev_case(
    index_dtype: torch.dtype,
    dtype: str,
    cameras: int = 2,
    channels: int = 5,
    grid: tuple[int, int, int] = (16, 16, 1),
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    depth_bins, hw = 7, (4, 6)
    coor = synthetic_frustum(1, cameras, depth_bins, hw)
    voxel = (102.4 / grid[0], 102.4 / grid[1], 8.0)
    ranks_bev, ranks_depth, ranks_feat, starts, lengths = prepare_bev_ranks(
        coor, (-51.2, -51.2, -5.0), voxel, grid, index_dtype=index_dtype
    )
    idx = "int32" if index_dtype == torch.int32 else "int64"
    shape = [1, 1, grid[1], grid[0], channels]
    names = [
        "depth",
        "feat",
        "ranks_depth",
        "ranks_feat",
        "ranks_bev",
        "interval_starts",
        "interval_lengths",
    ]
    inputs = [
        ("depth", dtype, [1, cameras, depth_bins, *hw]),
        ("feat", dtype, [1, cameras, *hw, channels]),
    ]
    inputs += [(n, idx, [None]) for n in names[2:]]
    m = node_model("BEVPoolV2", "onnx_custom", inputs, [("bev", dtype, None)], bev_feat_shape=shape)
    feeds = {
        "depth": rand(dtype, (1, cameras, depth_bins, *hw), 8),
        "feat": rand(dtype, (1, cameras, *hw, channels), 9),
        "ranks_depth": ranks_depth.numpy(),
        "ranks_feat": ranks_feat.numpy(),
        "ranks_bev": ranks_bev.numpy(),
        "interval_starts": starts.numpy(),
        "interval_lengths": lengths.numpy(),
    }
    return m, feeds


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_bev_pool_matches_python_and_eager(dtype: str, index_dtype: torch.dtype) -> None:
    from onnx_custom.ops.bev_pool import bev_pool_v2

    m, feeds = bev_case(index_dtype, dtype)
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert native.shape == (1, 5, 1, 16, 16)
    assert_close(native, python, dtype, scale=4.0)  # Python sums in float64, native in float32
    if dtype not in ("float16", "bfloat16"):  # (torch.from_numpy knows no ml_dtypes bfloat16)
        t = {k: torch.from_numpy(v) for k, v in feeds.items()}
        shape = [1, 1, 16, 16, 5]
        eager = bev_pool_v2(
            t["depth"],
            t["feat"],
            t["ranks_depth"],
            t["ranks_feat"],
            t["ranks_bev"],
            shape,
            t["interval_starts"],
            t["interval_lengths"],
        )
        torch.testing.assert_close(torch.from_numpy(native), eager)


# Channel counts around the native kernel's SIMD blocks (16 floats, 8 doubles) and tails; grids of
# more than one transpose tile (1024 cells); the Python kernel is the reference.
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "channels,grid",
    [(1, (40, 40, 1)), (16, (16, 16, 1)), (37, (48, 40, 1)), (80, (36, 36, 1))],
    ids=["C1-40x40", "C16-16x16", "C37-48x40", "C80-36x36"],
)
def test_bev_pool_simd_blocks_and_tiles(
    dtype: str, channels: int, grid: tuple[int, int, int]
) -> None:
    m, feeds = bev_case(torch.int32, dtype, cameras=3, channels=channels, grid=grid)
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert native.shape == (1, channels, 1, grid[1], grid[0])
    assert_close(native, python, dtype, scale=4.0)
    # two intervals aimed at one cell add up, through the SIMD path too
    starts, lengths = feeds["interval_starts"], feeds["interval_lengths"]
    twice = dict(
        feeds,
        interval_starts=np.concatenate([starts, starts[:3]]),
        interval_lengths=np.concatenate([lengths, lengths[:3]]),
    )
    (doubled,) = run_native(m, twice)
    (head,) = run_native(m, dict(feeds, interval_starts=starts[:3], interval_lengths=lengths[:3]))
    assert_close(doubled, native + head, dtype, scale=4.0)


def test_bev_pool_ignores_points_outside_intervals_and_sums_shared_cells() -> None:
    m, feeds = bev_case(torch.int64, "float64")
    starts, lengths = feeds["interval_starts"], feeds["interval_lengths"]
    keep = np.arange(0, len(starts), 2)  # drop every other interval: its points must not count
    feeds = dict(feeds, interval_starts=starts[keep], interval_lengths=lengths[keep])
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert_close(native, python, "float64", scale=10.0)
    # two intervals aimed at one cell add up (like the eager op's index_add_)
    twice = dict(
        feeds,
        interval_starts=np.concatenate([starts[:1], starts[:1]]),
        interval_lengths=np.concatenate([lengths[:1], lengths[:1]]),
    )
    (doubled,) = run_native(m, twice)
    (single,) = run_native(m, dict(twice, interval_starts=starts[:1], interval_lengths=lengths[:1]))
    np.testing.assert_allclose(doubled, 2 * single)


# ---- onnx_custom::DeformConv2d -------------------------------------------------------------------
DCN_CASES = [
    # N, C, H, W, Cout, kh, kw, stride, pad, dilation, groups, offset_groups, use_mask
    (2, 4, 9, 11, 6, 3, 3, 1, 1, 1, 1, 1, 1),
    (1, 8, 12, 10, 4, 3, 2, 2, 0, 2, 2, 2, 0),
    (3, 6, 7, 7, 6, 1, 1, 1, 0, 1, 3, 3, 1),
    (1, 3, 5, 40, 2, 2, 3, (1, 2), (0, 1), (2, 1), 1, 1, 1),
    (0, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1),
    (2, 16, 20, 33, 24, 3, 3, 1, 1, 1, 2, 4, 1),  # several tiles of output positions
    # >= 8 channels per offset group: the channels-last path (kernels/deform_conv.h), 2 tiles
    (2, 24, 13, 12, 20, 3, 3, 1, 1, 1, 1, 3, 1),
]


def pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else v


def dcn_case(
    case: tuple[Any, ...], dtype: str = "float32", seed: int = 0
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, int]]:
    n, c, h, w, cout, kh, kw, stride, pad, dil, groups, og, use_mask = case
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(pad), pair(dil)
    ho, wo = (
        (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1,
        (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1,
    )
    attrs = dict(
        stride_h=sh,
        stride_w=sw,
        pad_h=ph,
        pad_w=pw,
        dilation_h=dh,
        dilation_w=dw,
        groups=groups,
        offset_groups=og,
        use_mask=use_mask,
    )
    feeds = {
        "input": rand(dtype, (n, c, h, w), seed),
        "weight": rand(dtype, (cout, c // groups, kh, kw), seed + 1, 0.3),
        "offset": rand(dtype, (n, 2 * og * kh * kw, ho, wo), seed + 2, 2.0),
        "mask": (
            np.random.default_rng(seed + 3)
            .random((n, og * kh * kw, ho, wo))
            .astype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
        ),
        "bias": rand(dtype, (cout,), seed + 4),
    }
    names = ["input", "weight", "offset", "mask", "bias"]
    m = node_model(
        "DeformConv2d",
        "onnx_custom",
        [
            (
                k,
                dtype,
                (
                    ["N", *feeds[k].shape[1:]]
                    if k != "bias" and k != "weight"
                    else list(feeds[k].shape)
                ),
            )
            for k in names
        ],
        [("y", dtype, None)],
        opset=11,
        **attrs,
    )
    return m, feeds, attrs


def dcn_eager(
    feeds: dict[str, np.ndarray], attrs: dict[str, int], dtype: torch.dtype = torch.float64
) -> np.ndarray:
    t = [
        torch.from_numpy(np.asarray(feeds[k], dtype=np.float64)).to(dtype)
        for k in ("input", "weight", "offset", "mask", "bias")
    ]
    a = attrs
    with torch.inference_mode():
        return deform_conv2d_op(
            *t,
            a["stride_h"],
            a["stride_w"],
            a["pad_h"],
            a["pad_w"],
            a["dilation_h"],
            a["dilation_w"],
            a["groups"],
            a["offset_groups"],
            bool(a["use_mask"]),
        ).numpy()


@pytest.mark.parametrize(
    "case",
    DCN_CASES,
    ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}{c[6]}-s{c[7]}-g{c[10]}-og{c[11]}-m{c[12]}",
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_deform_conv_matches_python(case: tuple[Any, ...], dtype: str) -> None:
    m, feeds, attrs = dcn_case(case, dtype)
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert_close(native, python, dtype, scale=4.0)
    assert_close(native, dcn_eager(feeds, attrs).astype(dtype), dtype, scale=4.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", DCN_CASES[:3], ids=lambda c: "x".join(map(str, c[:5])))
def test_deform_conv_half_precision_accumulates_in_float32(
    case: tuple[Any, ...], dtype: str
) -> None:
    m, feeds, attrs = dcn_case(case, dtype)
    (native,) = run_native(m, feeds)
    assert native.dtype == feeds["input"].dtype
    exact = dcn_eager(feeds, attrs)  # float64 math on the same (rounded) inputs
    rounded = exact.astype(feeds["input"].dtype)
    # float32 accumulation then one rounding: at most one ulp from the correctly rounded value
    assert_close(native, rounded, dtype)


def test_deform_conv_optional_mask_and_bias_absent() -> None:
    m, feeds, attrs = dcn_case(DCN_CASES[0])
    attrs = dict(attrs, use_mask=0)
    names = [
        ("input", "float32", None),
        ("weight", "float32", None),
        ("offset", "float32", None),
        ("", "float32", None),
        ("", "float32", None),
    ]
    m = node_model(
        "DeformConv2d", "onnx_custom", names, [("y", "float32", None)], opset=11, **attrs
    )
    (native,) = run_native(m, {k: feeds[k] for k in ("input", "weight", "offset")})
    expected = dcn_eager(dict(feeds, bias=np.zeros_like(feeds["bias"])), attrs).astype(np.float32)
    assert_close(native, expected, "float32", scale=4.0)


def test_deform_conv_samples_outside_image_are_exactly_zero_even_next_to_inf() -> None:
    m, feeds, _attrs = dcn_case((1, 1, 4, 4, 1, 1, 1, 1, 0, 1, 1, 1, 0))
    feeds["input"][...] = np.inf
    feeds["weight"][...] = 1.0
    feeds["offset"][...] = 100.0  # every sample far outside the image: torchvision gives 0
    (native,) = run_native(m, feeds)
    np.testing.assert_array_equal(
        native, np.broadcast_to(feeds["bias"].reshape(1, -1, 1, 1), native.shape)
    )


def test_deform_conv_output_shape_inference() -> None:
    from _native_util import native_session

    m, _, _ = dcn_case(DCN_CASES[0])
    assert native_session(m).get_outputs()[0].shape == ["N", 6, 9, 11]


def backend_cases() -> list[Any]:
    import onnx.backend.test.case.node as cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cases.collect_testcases("DeformConv")


@pytest.mark.parametrize("case", backend_cases(), ids=lambda c: c.name)
def test_onnx_backend_deform_conv_cases(case: Any) -> None:
    """ONNX's DeformConv conformance cases, mapped onto onnx_custom::DeformConv2d's attributes."""
    node = case.model.graph.node[0]
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    pads, strides, dil = (
        a.get("pads", [0, 0, 0, 0]),
        a.get("strides", [1, 1]),
        a.get("dilations", [1, 1]),
    )
    assert pads[:2] == pads[2:], "onnx_custom::DeformConv2d pads symmetrically"
    inputs, (expected,) = case.data_sets[0]
    named = dict(zip(node.input, inputs, strict=False))
    x, w, off = inputs[:3]
    mask = named.get("mask")
    attrs = dict(
        stride_h=strides[0],
        stride_w=strides[1],
        pad_h=pads[0],
        pad_w=pads[1],
        dilation_h=dil[0],
        dilation_w=dil[1],
        groups=a.get("group", 1),
        offset_groups=a.get("offset_group", 1),
        use_mask=int(mask is not None),
    )
    bias = named.get("B", np.zeros(w.shape[0], np.float32))
    feeds = {
        "input": x,
        "weight": w,
        "offset": off,
        "mask": mask if mask is not None else np.zeros((1, 1), np.float32),
        "bias": bias,
    }
    m = node_model(
        "DeformConv2d",
        "onnx_custom",
        [(k, "float32", list(v.shape)) for k, v in feeds.items()],
        [("y", "float32", None)],
        opset=11,
        **attrs,
    )
    (native,) = run_native(m, feeds)
    (python,) = run_python(m, feeds)
    assert_close(native, expected, "float32")
    assert_close(python, expected, "float32")


# ---- every GEMM / sampling code path on this machine ---------------------------------------------
_PATHS_SCRIPT = """
import sys
import numpy as np
import onnx
import onnxruntime as ort
library, cases = sys.argv[1], np.load(sys.argv[2], allow_pickle=True)
for i in range(int(cases["count"])):
    model = onnx.load_from_string(cases[f"model{i}"].tobytes())
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(library)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [x.name for x in sess.get_inputs()]
    got = sess.run(None, {n: cases[f"in{i}_{n}"] for n in names})[0]
    want = cases[f"out{i}"]
    assert got.shape == want.shape, (i, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=4 * 1.3e-6, atol=4 * 1e-5, err_msg=f"case {i}")
assert "torch" not in sys.modules
print("ok")
"""


@pytest.fixture(scope="module")
def path_cases(tmp_path_factory: pytest.TempPathFactory) -> str:
    """DCN and linear cases with float64 eager references, saved for the subprocesses."""
    arrays: dict[str, Any] = {}
    i = 0
    for case in DCN_CASES:
        m, feeds, attrs = dcn_case(case)
        arrays[f"model{i}"] = np.frombuffer(m.SerializeToString(), np.uint8)
        arrays.update({f"in{i}_{k}": v for k, v in feeds.items()})
        arrays[f"out{i}"] = dcn_eager(feeds, attrs).astype(np.float32)
        i += 1
    for xs, out in [((130, 96), 70), ((3, 5, 40), 33)]:
        m = node_model(
            "CustomLinear",
            "onnx_custom",
            [("x", "float32", None), ("w", "float32", None), ("b", "float32", None)],
            [("y", "float32", None)],
        )
        f = {
            "x": rand("float32", xs, 1),
            "w": rand("float32", (out, xs[-1]), 2),
            "b": rand("float32", (out,), 3),
        }
        arrays[f"model{i}"] = np.frombuffer(m.SerializeToString(), np.uint8)
        arrays.update({f"in{i}_{k}": v for k, v in f.items()})
        arrays[f"out{i}"] = (
            f["x"].astype(np.float64) @ f["w"].T.astype(np.float64) + f["b"]
        ).astype(np.float32)
        i += 1
    path = tmp_path_factory.mktemp("paths") / "cases.npz"
    np.savez(path, count=i, **arrays)
    return str(path)


@pytest.mark.parametrize(
    "env",
    [
        {"ONNX_CUSTOM_NATIVE_ISA": "generic"},
        {"ONNX_CUSTOM_NATIVE_ISA": "avx2"},
        {"ONNX_CUSTOM_NATIVE_SAMPLER": "gather"},
        {"ONNX_CUSTOM_NATIVE_GEMM": "ort"},
        {"ONNX_CUSTOM_NATIVE_GEMM": "own"},
    ],
    ids=lambda e: "-".join(f"{k.rsplit('_', 1)[1].lower()}-{v}" for k, v in e.items()),
)
def test_every_code_path_matches_eager(env: dict[str, str], path_cases: str) -> None:
    """The ISA is picked once per process, so each path runs in its own interpreter."""
    from onnx_custom.runtime.native import library_path

    proc = run_script(_PATHS_SCRIPT, str(library_path()), path_cases, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]

"""Eager kernels, fake kernels, autograd and opcheck for the seed-article ops."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from onnx_custom.ops import extension
from onnx_custom.ops.bev_pool import (
    bev_pool_v2,
    check_bev_pool_inputs,
    prepare_bev_ranks,
    synthetic_frustum,
)
from onnx_custom.ops.custom_linear import custom_linear, linear_output_shape
from onnx_custom.ops.multi_out3 import fold_tiles, multi_out3, multi_out3_shapes
from onnx_custom.ops.numpy_sin import numpy_sin


@pytest.fixture(scope="session")
def my_ops_lib() -> str:
    ok, detail = extension.extension_available()
    if not ok:
        pytest.skip(detail)
    return detail


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def small_bev_inputs(
    dtype: torch.dtype = torch.float32, index_dtype: torch.dtype = torch.int32, channels: int = 5
) -> tuple[Any, ...]:
    """A 2-camera toy rig with a 8x8 BEV grid: small enough for opcheck and gradcheck."""
    g = _gen(1)
    coor = synthetic_frustum(batch=1, cameras=2, depth_bins=4, feat_hw=(3, 5), depth_range=(1, 12))
    rb, rd, rf, st, ln = prepare_bev_ranks(
        coor, (-12.8, -12.8, -5.0), (3.2, 3.2, 8.0), (8, 8, 1), index_dtype=index_dtype
    )
    depth = torch.rand(1, 2, 4, 3, 5, generator=g, dtype=dtype)
    feat = torch.randn(1, 2, 3, 5, channels, generator=g, dtype=dtype)
    return depth, feat, rd, rf, rb, [1, 1, 8, 8, channels], st, ln


def bev_loop_reference(
    depth: torch.Tensor,
    feat: torch.Tensor,
    rd: Any,
    rf: Any,
    rb: Any,
    shape: list[int],
    st: Any,
    ln: Any,
) -> torch.Tensor:
    """Literal transcription of BEVDet's CUDA kernel (one sum per interval, assigned)."""
    b, z, y, x, c = shape
    out = torch.zeros(b * z * y * x, c, dtype=feat.dtype)
    d_flat, f_rows = depth.reshape(-1), feat.reshape(-1, c)
    for start, length in zip(st.tolist(), ln.tolist(), strict=True):
        acc = torch.zeros(c, dtype=feat.dtype)
        for i in range(start, start + length):
            acc += d_flat[rd[i]] * f_rows[rf[i]]
        out[rb[start]] = acc
    return out.reshape(b, z, y, x, c).permute(0, 4, 1, 2, 3)


# --------------------------------------------------------------------------- opcheck (all ops)
def _my_add_sample() -> tuple[Any, ...]:
    g = _gen()
    return (torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(3, 4, generator=g))


OPCHECK_CASES: list[tuple[str, Callable[[], Any], Callable[[], tuple[Any, ...]]]] = [
    (
        "onnx_custom_ext::my_add-3x4",
        lambda: torch.ops.onnx_custom_ext.my_add.default,
        _my_add_sample,
    ),
    (
        "numpy_sin-2x5",
        lambda: torch.ops.onnx_custom.numpy_sin.default,
        lambda: (torch.randn(2, 5, generator=_gen(), requires_grad=True),),
    ),
    (
        "numpy_sin-f64-7",
        lambda: torch.ops.onnx_custom.numpy_sin.default,
        lambda: (torch.randn(7, generator=_gen(), dtype=torch.float64),),
    ),
    (
        "multi_out3-2x3x4-r213",
        lambda: torch.ops.onnx_custom.multi_out3.default,
        lambda: (torch.randn(2, 3, 4, generator=_gen(), requires_grad=True), [2, 1, 3], 0.5),
    ),
    (
        "custom_linear-5x3x8-w4x8-bias",
        lambda: torch.ops.onnx_custom.custom_linear.default,
        lambda: (
            torch.randn(5, 3, 8, generator=_gen(), requires_grad=True),
            torch.randn(4, 8, generator=_gen(1), requires_grad=True),
            torch.randn(4, generator=_gen(2), requires_grad=True),
        ),
    ),
    (
        "custom_linear-6x8-w4x8-nobias",
        lambda: torch.ops.onnx_custom.custom_linear.default,
        lambda: (torch.randn(6, 8, generator=_gen()), torch.randn(4, 8, generator=_gen(1)), None),
    ),
    (
        "bev_pool_v2-2cam-8x8-i32",
        lambda: torch.ops.onnx_custom.bev_pool_v2.default,
        small_bev_inputs,
    ),
    (
        "bev_pool_v2_backward-2cam-8x8",
        lambda: torch.ops.onnx_custom.bev_pool_v2_backward.default,
        lambda: _backward_sample(small_bev_inputs()),
    ),
    (
        "bev_pool_v2-2cam-8x8-i64-grad",
        lambda: torch.ops.onnx_custom.bev_pool_v2.default,
        lambda: _with_grad(small_bev_inputs(index_dtype=torch.int64)),
    ),
]


def _backward_sample(args: tuple[Any, ...]) -> tuple[Any, ...]:
    depth, feat, rd, rf, rb, _shape, st, ln = args
    grad = torch.randn(bev_pool_v2(*args).shape, generator=_gen(3))
    return (grad, depth, feat, rd, rf, rb, st, ln)


def _with_grad(args: tuple[Any, ...]) -> tuple[Any, ...]:
    depth, feat, *rest = args
    return (depth.requires_grad_(), feat.requires_grad_(), *rest)


@pytest.mark.parametrize(("name", "op", "sample"), OPCHECK_CASES, ids=[c[0] for c in OPCHECK_CASES])
def test_opcheck(
    name: str,
    op: Callable[[], Any],
    sample: Callable[[], tuple[Any, ...]],
    request: pytest.FixtureRequest,
) -> None:
    if name.startswith("onnx_custom_ext::"):
        request.getfixturevalue("my_ops_lib")
    torch.library.opcheck(op(), sample())


# -------------------------------------------------------------------------- onnx_custom_ext::my_add
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((3, 4), torch.float32),
        ((2, 3, 5), torch.float64),
        ((17,), torch.float16),
        ((0, 3), torch.float32),
    ],
    ids=["3x4-f32", "2x3x5-f64", "17-f16", "0x3-f32"],
)
def test_my_add_matches_reference(
    my_ops_lib: str, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    g = _gen()
    a = torch.randn(shape, generator=g).to(dtype)
    b = torch.randn(shape, generator=g).to(dtype)
    torch.testing.assert_close(extension.my_add(a, b), extension.my_add_reference(a, b))
    torch.testing.assert_close(
        extension.MyAddFunction.apply(a, b), extension.my_add_reference(a, b)
    )


def test_my_add_noncontiguous_and_autograd(my_ops_lib: str) -> None:
    g = _gen()
    a = torch.randn(4, 3, generator=g, dtype=torch.float64).t().requires_grad_()
    b = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(torch.ops.onnx_custom_ext.my_add(a, b), 2 * a + b)
    assert torch.autograd.gradcheck(torch.ops.onnx_custom_ext.my_add, (a, b))
    assert torch.autograd.gradcheck(extension.MyAddFunction.apply, (a, b))


@pytest.mark.parametrize(
    ("a", "b", "error", "match"),
    [
        (
            torch.zeros(2, 3),
            torch.zeros(3, 2),
            ValueError,
            r"same shape, got a \[2, 3\] and b \[3, 2\]",
        ),
        (torch.zeros(2), torch.zeros(2, dtype=torch.float64), TypeError, "same dtype"),
        (
            torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool),
            TypeError,
            (
                "expects tensors of float32, float64, float16, bfloat16, int8, int16, int32, int64"
                " or uint8"
            ),
        ),
    ],
    ids=["shape-2x3-vs-3x2", "dtype-f32-vs-f64", "bool"],
)
def test_my_add_validation_same_in_cpp_and_fake(
    my_ops_lib: str, a: torch.Tensor, b: torch.Tensor, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        torch.ops.onnx_custom_ext.my_add(a, b)  # the C++ kernel
    with FakeTensorMode() as mode, pytest.raises(error, match=match):
        torch.ops.onnx_custom_ext.my_add(mode.from_tensor(a), mode.from_tensor(b))
    with pytest.raises(error, match=match):
        extension.my_add_reference(a, b)


# --------------------------------------------------------------------------- numpy_sin
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((2, 5), torch.float32),
        ((3, 1, 4), torch.float64),
        ((8,), torch.float16),
        ((6,), torch.bfloat16),
    ],
    ids=["2x5-f32", "3x1x4-f64", "8-f16", "6-bf16"],
)
def test_numpy_sin_matches_torch(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, generator=_gen()) * 3).to(dtype)
    out = numpy_sin(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, torch.sin(x.float()).to(dtype))


def test_numpy_sin_backward_is_grad_times_cos() -> None:
    x = torch.randn(4, 3, generator=_gen(), dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 3, generator=_gen(1), dtype=torch.float64)
    numpy_sin(x).backward(grad)
    torch.testing.assert_close(x.grad, grad * torch.cos(x.detach()))
    assert torch.autograd.gradcheck(numpy_sin, (x.detach().requires_grad_(),))


def test_numpy_sin_registers_cuda_kernel_without_gpu() -> None:
    assert torch._C._dispatch_has_kernel_for_dispatch_key("onnx_custom::numpy_sin", "CUDA")
    meta = numpy_sin(torch.empty(3, 2, device="meta"))
    assert meta.shape == (3, 2) and meta.device.type == "meta"


def test_numpy_sin_rejects_integers_in_eager_and_fake() -> None:
    x = torch.arange(4)
    with pytest.raises(TypeError, match=r"floating-point tensor, got torch\.int64"):
        numpy_sin(x)
    with (
        FakeTensorMode() as mode,
        pytest.raises(TypeError, match=r"floating-point tensor, got torch\.int64"),
    ):
        numpy_sin(mode.from_tensor(x))


# --------------------------------------------------------------------------- multi_out3
MULTI_CASES = [((2, 3, 4), [2, 1, 3], 0.5), ((5,), [4], -2.0), ((1, 2), [1, 1], 0.0)]


@pytest.mark.parametrize(
    ("shape", "repeats", "scale"), MULTI_CASES, ids=["2x3x4-r213", "5-r4", "1x2-r11"]
)
def test_multi_out3_outputs_and_fake_shapes(
    shape: tuple[int, ...], repeats: list[int], scale: float
) -> None:
    x = torch.randn(shape, generator=_gen())
    scaled, tiled, summed = multi_out3(x, repeats, scale)
    torch.testing.assert_close(scaled, x * scale)
    torch.testing.assert_close(tiled, x.tile(repeats))
    torch.testing.assert_close(summed, x.sum(-1))
    with FakeTensorMode() as mode:
        fakes = multi_out3(mode.from_tensor(x), repeats, scale)
    assert [list(f.shape) for f in fakes] == list(multi_out3_shapes(shape, repeats))


def test_fold_tiles_is_the_adjoint_of_tile() -> None:
    x = torch.randn(2, 3, generator=_gen(), dtype=torch.float64)
    g = torch.randn(6, 3, generator=_gen(1), dtype=torch.float64)
    # <tile(x), g> == <x, fold(g)>
    torch.testing.assert_close((x.tile((3, 1)) * g).sum(), (x * fold_tiles(g, [3, 1])).sum())


@pytest.mark.parametrize(
    ("x", "repeats", "error", "match"),
    [
        (
            torch.zeros(2, 3),
            [2],
            ValueError,
            r"x has shape \[2, 3\] \(2 dims\) but repeats is \[2\]",
        ),
        (torch.zeros(2, 3), [1, 0], ValueError, "repeats >= 1"),
        (torch.zeros(2, dtype=torch.int32), [1], TypeError, "floating-point x"),
    ],
    ids=["2x3-r2", "2x3-r10", "int32"],
)
def test_multi_out3_validation_same_in_eager_and_fake(
    x: torch.Tensor, repeats: list[int], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        multi_out3(x, repeats, 1.0)
    with FakeTensorMode() as mode, pytest.raises(error, match=match):
        multi_out3(mode.from_tensor(x), repeats, 1.0)


# --------------------------------------------------------------------------- custom_linear
LINEAR_CASES = [
    ((4, 8), (3, 8), True),
    ((2, 5, 8), (6, 8), False),
    ((8,), (2, 8), True),
    ((0, 8), (3, 8), True),
]


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "bias"),
    LINEAR_CASES,
    ids=["4x8-w3x8-b", "2x5x8-w6x8", "8-w2x8-b", "0x8-w3x8-b"],
)
def test_custom_linear_matches_f_linear_and_meta(
    x_shape: tuple[int, ...], w_shape: tuple[int, ...], bias: bool
) -> None:
    g = _gen()
    x, w = torch.randn(x_shape, generator=g), torch.randn(w_shape, generator=g)
    b = torch.randn(w_shape[0], generator=g) if bias else None
    torch.testing.assert_close(custom_linear(x, w, b), F.linear(x, w, b))
    # The meta function alone gives F.linear's shape (the NPU article's point).
    meta_b = None if b is None else b.to("meta")
    out = custom_linear(x.to("meta"), w.to("meta"), meta_b)
    assert out.device.type == "meta"
    assert list(out.shape) == linear_output_shape(x_shape, w_shape) == list(F.linear(x, w, b).shape)
    assert out.dtype == x.dtype


@pytest.mark.parametrize(
    ("x", "w", "b", "error", "match"),
    [
        (
            torch.zeros(4, 8),
            torch.zeros(3, 7),
            None,
            ValueError,
            r"x \[4, 8\] has 8 input features but weight \[3, 7\] expects 7",
        ),
        (
            torch.zeros(4, 8),
            torch.zeros(3, 8, 1),
            None,
            ValueError,
            r"2-D weight \[out, in\], got shape \[3, 8, 1\]",
        ),
        (
            torch.zeros(4, 8),
            torch.zeros(3, 8),
            torch.zeros(4),
            ValueError,
            r"bias of shape \[3\], got \[4\]",
        ),
        (torch.zeros(4, 8), torch.zeros(3, 8, dtype=torch.float64), None, TypeError, "one dtype"),
    ],
    ids=["4x8-w3x7", "w3x8x1", "bias4-for-out3", "f32-vs-f64"],
)
def test_custom_linear_validation_same_in_eager_and_meta(
    x: torch.Tensor, w: torch.Tensor, b: Any, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        custom_linear(x, w, b)
    with pytest.raises(error, match=match):
        custom_linear(x.to("meta"), w.to("meta"), None if b is None else b.to("meta"))


def test_custom_linear_gradcheck() -> None:
    g = _gen()
    args = [
        torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
        for s in ((2, 3, 4), (5, 4), (5,))
    ]
    assert torch.autograd.gradcheck(custom_linear, tuple(args))


# --------------------------------------------------------------------------- bev_pool_v2
@pytest.mark.parametrize(
    ("dtype", "index_dtype"),
    [(torch.float32, torch.int32), (torch.float64, torch.int64)],
    ids=["f32-i32", "f64-i64"],
)
def test_bev_pool_matches_cuda_loop_reference(dtype: torch.dtype, index_dtype: torch.dtype) -> None:
    args = small_bev_inputs(dtype, index_dtype)
    out = bev_pool_v2(*args)
    assert out.shape == (1, 5, 1, 8, 8) and out.is_contiguous()
    torch.testing.assert_close(out, bev_loop_reference(*args))


def test_bev_pool_ignores_points_outside_intervals() -> None:
    depth, feat, rd, rf, rb, shape, st, ln = small_bev_inputs()
    keep = torch.arange(0, st.numel(), 2)  # drop every other interval, as the CUDA kernel would
    args = (depth, feat, rd, rf, rb, shape, st[keep], ln[keep])
    torch.testing.assert_close(bev_pool_v2(*args), bev_loop_reference(*args))


def test_bev_pool_gradcheck() -> None:
    depth, feat, *rest = small_bev_inputs(torch.float64, channels=2)
    assert torch.autograd.gradcheck(
        lambda d, f: bev_pool_v2(d, f, *rest), (depth.requires_grad_(), feat.requires_grad_())
    )


def test_prepare_bev_ranks_realistic_rig() -> None:
    coor = synthetic_frustum()  # 6 cameras, 59 bins, 16x44
    assert coor.shape == (1, 6, 59, 16, 44, 3)
    rb, rd, rf, st, ln = prepare_bev_ranks(
        coor, (-51.2, -51.2, -5.0), (0.8, 0.8, 8.0), (128, 128, 1)
    )
    assert rb.dtype == torch.int32 and rb.shape == rd.shape == rf.shape
    assert bool((rb[1:] >= rb[:-1]).all()), "ranks_bev must be sorted"
    assert int(ln.sum()) == rb.numel() and int(st[0]) == 0
    assert bool((rb[st.long()][1:] != rb[st.long()][:-1]).all()), "one interval per BEV cell"
    assert rd.numel() > 0.5 * coor[..., 0].numel()  # most frustum points land in the grid
    assert math.isclose(float(rd.max()), coor[..., 0].numel() - 1, rel_tol=0.01)


def _bev_bad(**changes: Any) -> tuple[Any, ...]:
    names = ("depth", "feat", "rd", "rf", "rb", "shape", "st", "ln")
    args = dict(zip(names, small_bev_inputs(), strict=True))
    args.update(changes)
    return tuple(args[n] for n in names)


BEV_BAD = [
    ("depth-4d", _bev_bad(depth=torch.zeros(1, 2, 4, 3)), ValueError, r"depth \(B, N, D, fH, fW\)"),
    (
        "feat-fH-mismatch",
        _bev_bad(feat=torch.zeros(1, 2, 4, 5, 5)),
        ValueError,
        r"disagree on \(B, N, fH, fW\)",
    ),
    ("shape-C-mismatch", _bev_bad(shape=[1, 1, 8, 8, 3]), ValueError, r"end with C=5"),
    ("ranks-float", _bev_bad(rd=torch.zeros(3)), TypeError, r"ranks_depth as a 1-D int32/int64"),
    ("ranks-length", _bev_bad(rf=torch.zeros(2, dtype=torch.int32)), ValueError, r"one length P"),
    (
        "f64-depth",
        _bev_bad(depth=torch.zeros(1, 2, 4, 3, 5, dtype=torch.float64)),
        TypeError,
        "one dtype",
    ),
]


@pytest.mark.parametrize(
    ("args", "error", "match"), [c[1:] for c in BEV_BAD], ids=[c[0] for c in BEV_BAD]
)
def test_bev_pool_validation_same_in_eager_and_fake(
    args: tuple[Any, ...], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        bev_pool_v2(*args)
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(error, match=match):
        bev_pool_v2(*args)
    with pytest.raises(error, match=match):
        check_bev_pool_inputs(*args)


def test_bev_pool_out_of_range_rank_is_named() -> None:
    depth, feat, rd, rf, rb, shape, st, ln = small_bev_inputs()
    rd = rd.clone()
    rd[0] = depth.numel()
    with pytest.raises(ValueError, match=r"ranks_depth must lie in \[0, 120\)"):
        bev_pool_v2(depth, feat, rd, rf, rb, shape, st, ln)

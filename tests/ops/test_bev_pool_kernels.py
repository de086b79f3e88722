"""bev_pool_v2's C++ eager kernels and the node's NumPy kernel against a slow loop over intervals.

The reference is a literal float64 loop: for every non-empty interval, every point adds
``depth * feat_row`` to the interval's cell. Gradients are checked against autograd through that
loop. Inputs cover what the fast paths special-case: non-contiguous tensors, int32/int64/mixed
ranks, empty intervals (also at the very end), points outside every interval, intervals sharing a
cell, overlapping intervals, no points at all, and every dtype the op accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from onnx_custom.ops.bev_pool import (
    bev_pool_v2,
    bev_pool_v2_backward,
    prepare_bev_ranks,
    synthetic_frustum,
)
from onnx_custom.ort_kernels.bev_pool import bev_pool_v2 as bev_kernel
from onnx_custom.ort_kernels.bev_pool import bev_pool_v2_numpy

SHAPE = [1, 1, 8, 8, 6]  # B, Z, Y, X, C
Case = tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    list[int],
    torch.Tensor,
    torch.Tensor,
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rig(index_dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, ...]:
    """A 2-camera toy rig, 4 depth bins, 3x5 features, 8x8 grid: (rb, rd, rf, starts, lengths)."""
    coor = synthetic_frustum(batch=1, cameras=2, depth_bins=4, feat_hw=(3, 5), depth_range=(1, 12))
    return prepare_bev_ranks(
        coor, (-12.8, -12.8, -5.0), (3.2, 3.2, 8.0), (8, 8, 1), index_dtype=index_dtype
    )


def _values(dtype: torch.dtype, channels: int = SHAPE[4]) -> tuple[torch.Tensor, torch.Tensor]:
    depth = torch.rand(1, 2, 4, 3, 5, generator=_gen(1), dtype=torch.float64).to(dtype)
    feat = torch.randn(1, 2, 3, 5, channels, generator=_gen(2), dtype=torch.float64).to(dtype)
    return depth, feat


def _case(dtype: torch.dtype = torch.float32, index_dtype: torch.dtype = torch.int32) -> Case:
    rb, rd, rf, st, ln = _rig(index_dtype)
    depth, feat = _values(dtype)
    return depth, feat, rd, rf, rb, list(SHAPE), st, ln


def _non_contiguous(dtype: torch.dtype) -> Case:
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype)
    depth = (
        depth.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
    )  # same values, other strides
    feat = torch.cat((feat, feat), dim=-1)[..., ::2].clone()
    feat = torch.stack((feat, torch.zeros_like(feat)), dim=-1)[..., 0]  # channel stride 2
    rd, rf = (torch.stack((r, -r), dim=1)[:, 0] for r in (rd, rf))  # stride 2
    assert not (depth.is_contiguous() or feat.is_contiguous() or rd.is_contiguous())
    return depth, feat, rd, rf, rb, shape, st, ln


def _with_empty_intervals(dtype: torch.dtype) -> Case:
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype)
    points = rd.numel()
    st = torch.cat(
        (st[:3], st[3:4], st[3:], torch.tensor([points], dtype=st.dtype))
    )  # empty at 3 and at the end
    ln = torch.cat((ln[:3], torch.zeros(1, dtype=ln.dtype), ln[3:], torch.zeros(1, dtype=ln.dtype)))
    return depth, feat, rd, rf, rb, shape, st, ln


def _every_other_interval(dtype: torch.dtype) -> Case:
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype)
    keep = torch.arange(0, st.numel(), 2)
    return depth, feat, rd, rf, rb, shape, st[keep], ln[keep]


def _shared_cells_and_overlaps(dtype: torch.dtype) -> Case:
    """Interval 0 split in two (both write its cell) and interval 1 listed twice (same points)."""
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype, torch.int64)
    first, half = int(st[0]), int(ln[0]) // 2
    assert half > 0
    starts = torch.cat((torch.tensor([first, first + half]), st[1:], st[1:2]))
    lengths = torch.cat((torch.tensor([half, int(ln[0]) - half]), ln[1:], ln[1:2]))
    return depth, feat, rd, rf, rb, shape, starts, lengths


def _mixed_index_dtypes(dtype: torch.dtype) -> Case:
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype)
    return depth, feat, rd, rf.long(), rb, shape, st.long(), ln


def _no_points(dtype: torch.dtype) -> Case:
    depth, feat = _values(dtype)
    empty = torch.zeros(0, dtype=torch.int32)
    return depth, feat, empty, empty, empty, list(SHAPE), empty, empty


def _no_intervals(dtype: torch.dtype) -> Case:
    depth, feat, rd, rf, rb, shape, st, ln = _case(dtype)
    return depth, feat, rd, rf, rb, shape, st[:0], ln[:0]


CASES: list[tuple[str, Callable[[torch.dtype], Case]]] = [
    ("2cam-8x8-i32", lambda dt: _case(dt)),
    ("2cam-8x8-i64", lambda dt: _case(dt, torch.int64)),
    ("non-contiguous", _non_contiguous),
    ("empty-intervals", _with_empty_intervals),
    ("points-outside-intervals", _every_other_interval),
    ("shared-cells-overlaps", _shared_cells_and_overlaps),
    ("mixed-i32-i64", _mixed_index_dtypes),
    ("no-points", _no_points),
    ("no-intervals", _no_intervals),
]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def reference(
    depth: torch.Tensor,
    feat: torch.Tensor,
    rd: Any,
    rf: Any,
    rb: Any,
    shape: list[int],
    st: Any,
    ln: Any,
) -> torch.Tensor:
    """Float64 loop over intervals (differentiable: autograd gives the reference gradients)."""
    b, z, y, x, c = shape
    d_flat, f_rows = depth.double().reshape(-1), feat.double().reshape(-1, c)
    cells: list[torch.Tensor] = [torch.zeros(c, dtype=torch.float64) for _ in range(b * z * y * x)]
    for start, length in zip(st.tolist(), ln.tolist(), strict=True):
        if length <= 0:
            continue
        cell = int(rb[start])
        for i in range(start, start + length):
            cells[cell] = cells[cell] + d_flat[int(rd[i])] * f_rows[int(rf[i])]
    untouched = 0 * (
        d_flat.sum() + f_rows.sum()
    )  # keeps the graph (zero gradients) when nothing pools
    return (torch.stack(cells) + untouched).reshape(b, z, y, x, c).permute(0, 4, 1, 2, 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "make"), CASES, ids=[c[0] for c in CASES])
def test_eager_forward_matches_the_loop(
    name: str, make: Callable[[torch.dtype], Case], dtype: torch.dtype
) -> None:
    args = make(dtype)
    out = bev_pool_v2(*args)
    assert out.dtype == dtype and out.shape == (1, SHAPE[4], 1, 8, 8) and out.is_contiguous()
    torch.testing.assert_close(out, reference(*args).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "make"), CASES, ids=[c[0] for c in CASES])
def test_eager_backward_matches_autograd_through_the_loop(
    name: str, make: Callable[[torch.dtype], Case], dtype: torch.dtype
) -> None:
    depth, feat, *rest = make(dtype)
    grad = torch.randn(1, SHAPE[4], 1, 8, 8, generator=_gen(3), dtype=torch.float64).to(dtype)
    d64, f64 = depth.double().requires_grad_(), feat.double().requires_grad_()
    reference(d64, f64, *rest).backward(grad.double())
    assert d64.grad is not None and f64.grad is not None
    depth_g, feat_g = (
        depth.detach().clone().requires_grad_(),
        feat.detach().clone().requires_grad_(),
    )
    bev_pool_v2(depth_g, feat_g, *rest).backward(grad)
    assert depth_g.grad is not None and feat_g.grad is not None
    torch.testing.assert_close(depth_g.grad, d64.grad.to(dtype))
    torch.testing.assert_close(feat_g.grad, f64.grad.to(dtype))


@pytest.mark.parametrize(("name", "make"), CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_gradcheck_float64(name: str, make: Callable[[torch.dtype], Case]) -> None:
    depth, feat, *rest = make(torch.float64)
    assert torch.autograd.gradcheck(
        lambda d, f: bev_pool_v2(d, f, *rest),
        (depth.detach().requires_grad_(), feat.detach().requires_grad_()),
    )


def test_thread_count_does_not_change_a_bit() -> None:
    """Intervals run in parallel; a backward this small is one chunk: same sums in the same order.
    (Large backwards split per thread; tests/ops/test_bev_pool_backward_chunks.py covers those.)"""
    args = _shared_cells_and_overlaps(torch.float32)
    grad = torch.randn(1, SHAPE[4], 1, 8, 8, generator=_gen(4))
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append((bev_pool_v2(*args), *bev_pool_v2_backward(grad, *args[:5], *args[6:])))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)


def _numpy(args: Case) -> tuple[np.ndarray, ...]:
    depth, feat, rd, rf, rb, _shape, st, ln = args
    return tuple(t.contiguous().numpy() for t in (depth, feat, rd, rf, rb, st, ln))


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=str)
@pytest.mark.parametrize(("name", "make"), CASES, ids=[c[0] for c in CASES])
def test_numpy_kernel_matches_the_loop(
    name: str, make: Callable[[torch.dtype], Case], dtype: torch.dtype
) -> None:
    args = make(dtype)
    out = bev_pool_v2_numpy(*_numpy(args), args[5])
    assert out.dtype == _numpy(args)[1].dtype and out.shape == (1, SHAPE[4], 1, 8, 8)
    torch.testing.assert_close(torch.from_numpy(out), reference(*args).to(dtype))


def test_numpy_kernel_splits_long_intervals_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk size 4: every interval spans several pieces and chunks; sums must not change."""
    import onnx_custom.ort_kernels.bev_pool as bev

    args = _shared_cells_and_overlaps(torch.float64)
    monkeypatch.setattr(bev, "_CHUNK_POINTS", 4)
    out = bev.bev_pool_v2_numpy(*_numpy(args), args[5])
    torch.testing.assert_close(torch.from_numpy(out), reference(*args))


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=str)
def test_node_kernel_writes_into_the_output_buffer(dtype: torch.dtype) -> None:
    args = _with_empty_intervals(dtype)
    buffer = np.full((1, SHAPE[4], 1, 8, 8), np.nan, dtype=_numpy(args)[1].dtype)
    assert bev_kernel(*_numpy(args), bev_feat_shape=args[5], out=(buffer,)) is None
    torch.testing.assert_close(torch.from_numpy(buffer), reference(*args).to(dtype))
    returned = bev_kernel(*_numpy(args), bev_feat_shape=args[5])
    assert returned is not None
    np.testing.assert_array_equal(returned, buffer)


def _bad(**changes: Any) -> Case:
    names = ("depth", "feat", "rd", "rf", "rb", "shape", "st", "ln")
    args: dict[str, Any] = dict(zip(names, _case(torch.float32, torch.int64), strict=True))
    for key, edit in changes.items():
        args[key] = edit(args[key].clone())
    return tuple(args[n] for n in names)  # type: ignore[return-value]


def _set(index: int, value: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(t: torch.Tensor) -> torch.Tensor:
        t[index] = value
        return t

    return edit


BAD = [
    ("ranks_depth", _bad(rd=_set(0, 10_000)), r"ranks_depth must lie in \[0, 120\)"),
    ("ranks_feat", _bad(rf=_set(5, -1)), r"ranks_feat must lie in \[0, 30\)"),
    ("ranks_bev", _bad(rb=_set(0, 64)), r"ranks_bev must lie in \[0, 64\)"),
    ("negative-length", _bad(ln=_set(1, -2)), r"interval_lengths must be >= 0"),
    (
        "past-the-end",
        _bad(st=_set(-1, 10_000)),
        r"interval points must lie in|intervals must lie within",
    ),
]


@pytest.mark.parametrize(("args", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_out_of_range_indices_are_named(args: Case, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bev_pool_v2(*args)
    grad = torch.zeros(1, SHAPE[4], 1, 8, 8)
    with pytest.raises(ValueError, match=match):
        bev_pool_v2_backward(grad, *args[:5], *args[6:])
    with pytest.raises(ValueError, match=match.replace("bev_pool_v2", "BEVPoolV2")):
        bev_kernel(*_numpy(args), bev_feat_shape=args[5])


def test_node_kernel_leaves_index_checks_to_the_cpp_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the C++ kernels the node runs no NumPy pass over the indices (they check every index
    they read inline, test_out_of_range_indices_are_named); only the NumPy path checks first."""
    import onnx_custom.ort_kernels.bev_pool as bev

    def fail(*args: Any) -> None:
        raise AssertionError("a NumPy index check ran before the C++ kernels")

    monkeypatch.setattr(bev, "_check_intervals", fail)
    monkeypatch.setattr(bev, "_check_ranks", fail)
    args = _with_empty_intervals(torch.float32)
    out = bev_kernel(*_numpy(args), bev_feat_shape=args[5])
    assert out is not None
    torch.testing.assert_close(torch.from_numpy(out), reference(*args).to(torch.float32))


@pytest.mark.parametrize(("args", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_numpy_path_of_the_node_names_bad_indices(
    monkeypatch: pytest.MonkeyPatch, args: Case, match: str
) -> None:
    import onnx_custom.ort_kernels.bev_pool as bev

    monkeypatch.setattr(bev, "_native_into", lambda *a: False)  # as without a C++ compiler
    with pytest.raises(ValueError, match=match.replace("bev_pool_v2", "BEVPoolV2")):
        bev_kernel(*_numpy(args), bev_feat_shape=args[5])

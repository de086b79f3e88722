"""bev_pool_v2's C++ backward at sizes where it splits the intervals into per-thread chunks.

The backward walks intervals in contiguous ranges, one per thread (at least 256 intervals per
range), each accumulating into its own gradient buffers that are summed at the end; it reads the
channels-first grad through 64-cell tiles. The small cases of ``test_bev_pool_kernels.py`` run as
one chunk, so this file covers what only large inputs reach: several chunks (1-3 threads), a
batch of 2 (tiles must not cross a batch), a grid whose cell count is not a multiple of the tile,
intervals out of cell order (tiles reloaded), and every dtype. float32 runs twice: on the AVX-512
kernels (where the CPU has AVX-512F) and on the portable path, also at channel counts that fill
the AVX-512 blocks differently. The reference is autograd through the plain PyTorch math
(``index_add_``) in float64: independent of the C++ kernels.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _avx512_paths import PATHS, kernel_path

from onnx_custom.ops.bev_pool import (
    bev_pool_v2_backward,
    bev_pool_v2_math,
    load_extension,
    prepare_bev_ranks,
    synthetic_frustum,
)

# (B, N, D, fH, fW) rig and (X, Y) grid: ~1,400 non-empty intervals, 2,500 cells per batch item.
B, N, D, FEAT_HW = 2, 3, 12, (8, 22)
GRID = (50, 50, 1)
C = 19  # two 8-lane blocks and a 3-channel tail
TOLERANCES = {  # (rtol, atol): the kernels accumulate in float32 (float64 for float64), round once
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@pytest.fixture
def threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.fixture(params=PATHS)
def kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once on the float32 AVX-512 backward (where the CPU has it) and once on the
    portable path; restores the default afterwards."""
    with kernel_path(load_extension(), request.param, "the float32 backward") as path:
        yield path


def _args(dtype: torch.dtype, shuffle: bool, channels: int = C) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    coor = synthetic_frustum(batch=B, cameras=N, depth_bins=D, feat_hw=FEAT_HW)
    rb, rd, rf, starts, lengths = prepare_bev_ranks(
        coor, (-40.0, -40.0, -5.0), (1.6, 1.6, 8.0), GRID
    )
    if shuffle:  # intervals are independent: any order is valid input
        order = torch.randperm(starts.numel(), generator=g)
        starts, lengths = starts[order], lengths[order]
    depth = torch.rand(B, N, D, *FEAT_HW, generator=g, dtype=torch.float64).to(dtype)
    feat = torch.randn(B, N, *FEAT_HW, channels, generator=g, dtype=torch.float64).to(dtype)
    grad = torch.randn(B, channels, 1, GRID[1], GRID[0], generator=g, dtype=torch.float64).to(dtype)
    return grad, depth, feat, rd, rf, rb, starts, lengths


def _reference(
    grad: torch.Tensor, depth: torch.Tensor, feat: torch.Tensor, *ranks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    rd, rf, rb, starts, lengths = ranks
    d64 = depth.double().requires_grad_()
    f64 = feat.double().requires_grad_()
    shape = [grad.shape[0], 1, GRID[1], GRID[0], grad.shape[1]]
    bev_pool_v2_math(d64, f64, rd, rf, rb, shape, starts, lengths).backward(grad.double())
    assert d64.grad is not None and f64.grad is not None
    return d64.grad, f64.grad


@pytest.mark.parametrize("shuffle", [False, True], ids=["cell-order", "shuffled-intervals"])
@pytest.mark.parametrize("dtype", list(TOLERANCES), ids=str)
@pytest.mark.parametrize("n_threads", [1, 2, 3], ids=lambda n: f"{n}threads")
def test_chunked_backward_matches_the_math(
    threads: None, kernels: str, n_threads: int, dtype: torch.dtype, shuffle: bool
) -> None:
    if kernels == "avx512" and dtype != torch.float32:
        pytest.skip("only float32 has an AVX-512 backward")
    args = _args(dtype, shuffle)
    assert args[-2].numel() >= 3 * 256, "too few intervals to split into chunks"
    torch.set_num_threads(n_threads)
    grad_depth, grad_feat = bev_pool_v2_backward(*args)
    again = bev_pool_v2_backward(*args)
    assert torch.equal(grad_depth, again[0]) and torch.equal(grad_feat, again[1]), "not repeatable"
    assert (grad_depth.dtype, grad_feat.dtype) == (dtype, dtype)
    want_depth, want_feat = _reference(*args)
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(grad_depth.double(), want_depth, rtol=rtol, atol=atol)
    torch.testing.assert_close(grad_feat.double(), want_feat, rtol=rtol, atol=atol)


# Channels: 3 (a masked AVX-512 block only, no 8x8 tile blocks), 16 (one whole block), 19 (a block
# and a masked tail; 8x8 tile blocks and 3 scalar channels), 80 (BEVDet's: an odd block count),
# 104 (6 blocks and a tail of 8).
@pytest.mark.parametrize("channels", [3, 16, 19, 80, 104], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("n_threads", [1, 2], ids=lambda n: f"{n}threads")
def test_float32_paths_match_the_math(
    threads: None, kernels: str, n_threads: int, channels: int
) -> None:
    args = _args(torch.float32, shuffle=False, channels=channels)
    torch.set_num_threads(n_threads)
    grad_depth, grad_feat = bev_pool_v2_backward(*args)
    want_depth, want_feat = _reference(*args)
    torch.testing.assert_close(grad_depth.double(), want_depth, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_feat.double(), want_feat, rtol=1e-5, atol=1e-5)


def _many_points(layout: str) -> tuple[torch.Tensor, ...]:
    """~25k points (more than one 16,384-point batch of gathered points): BEVDet's intervals, or
    every point in one interval (a batch larger than the batch size), or that interval split in
    a long one and a short one writing the same cell."""
    g = torch.Generator().manual_seed(5)
    coor = synthetic_frustum(batch=1, cameras=6, depth_bins=12, feat_hw=(16, 22))
    rb, rd, rf, starts, lengths = prepare_bev_ranks(
        coor, (-40.0, -40.0, -5.0), (1.6, 1.6, 8.0), GRID, index_dtype=torch.int64
    )
    points = rd.numel()
    assert points > 16384, "too few points for two batches"
    if layout != "rig":
        rb = torch.full_like(rb, 1234)
        cut = [points] if layout == "one-interval" else [points - 7, 7]
        starts = torch.tensor([0, *cut[:-1]], dtype=torch.int64)
        lengths = torch.tensor(cut, dtype=torch.int64)
    depth = torch.rand(1, 6, 12, 16, 22, generator=g)
    feat = torch.randn(1, 6, 16, 22, C, generator=g)
    grad = torch.randn(1, C, 1, GRID[1], GRID[0], generator=g)
    return grad, depth, feat, rd, rf, rb, starts, lengths


@pytest.mark.parametrize("layout", ["rig", "one-interval", "long-and-short"])
def test_more_points_than_one_batch(threads: None, kernels: str, layout: str) -> None:
    args = _many_points(layout)
    torch.set_num_threads(1)  # one chunk: every point through the batches of one walk
    grad_depth, grad_feat = bev_pool_v2_backward(*args)
    want_depth, want_feat = _reference(*args)
    torch.testing.assert_close(grad_depth.double(), want_depth, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_feat.double(), want_feat, rtol=1e-5, atol=1e-4)


def test_non_contiguous_grad(threads: None) -> None:
    """A grad that arrives channels-last (as after a permute in the user's model)."""
    grad, *rest = _args(torch.float32, shuffle=False)
    channels_last = grad.permute(0, 2, 3, 4, 1).contiguous().permute(0, 4, 1, 2, 3)
    assert not channels_last.is_contiguous()
    torch.set_num_threads(2)
    got = bev_pool_v2_backward(channels_last, *rest)
    want = _reference(grad, *rest)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)

"""The channels-last forward's kernels of ``onnx_custom::deform_conv2d`` (>= 8 channels per offset
group): the AVX-512 GEMM (6 positions x up to 64 output channels per register block) and sampler
(16 channels per vector, masked remainder) against the portable path (at::addmm, compiler loops)
and the independent pure-torch reference, at the blocks' edges: position counts around the 6-row
block and the 128-position tile, output channels per group around 16 and 64, channel segments
that are not multiples of 16; channels-last and sliced inputs; 1 vs 2 threads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _avx512_paths import PATHS, has_avx512, kernel_path
from test_deform_conv import Case
from test_deform_conv_reference import Geometry, reference_deform_conv2d

from onnx_custom.ops.deform_conv import load_extension

OP = torch.ops.onnx_custom.deform_conv2d.default
TOL: dict[torch.dtype, dict[str, Any]] = {
    torch.float32: {"rtol": 1e-5, "atol": 5e-5},
    torch.float64: {},
}


def _has_avx512() -> bool:
    return has_avx512(load_extension())


@pytest.fixture(params=PATHS)
def kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once on the AVX-512 kernels (where the CPU has them) and once on the portable
    path; restores the default afterwards."""
    with kernel_path(load_extension(), request.param, "the float32 forward") as path:
        yield path


# Positions P = Ho*Wo: 1 (below one 6-row block), 5, 7 (a block and a remainder row), 126, 128,
# 129 (one tile, one tile plus a row), 156 (a tile and a partial one). Output channels per group:
# 5, 16, 20, 33, 48, 64, 70 (register blocks of 1..4 vectors, a 64-block plus a remainder).
# Channels per segment: 8, 24, 40 (masked sampler remainders), 16, 32 (whole vectors).
CASES = [
    Case(1, 8, 3, 3, 5, 3, 3, Geometry()),  # P = 1
    Case(2, 16, 5, 1, 16, 1, 1, Geometry()),  # P = 5, 1x1 kernel
    Case(1, 24, 7, 1, 20, 3, 1, Geometry(pad=(1, 0), use_mask=False)),  # P = 7
    Case(1, 16, 9, 14, 33, 3, 3, Geometry(pad=(1, 1)), offset_scale=2.0),  # P = 126
    Case(2, 32, 16, 8, 48, 3, 3, Geometry(pad=(1, 1), offset_groups=2)),  # P = 128, 16 per og
    Case(1, 40, 129, 1, 64, 1, 1, Geometry()),  # P = 129
    Case(2, 16, 13, 12, 70, 3, 3, Geometry(pad=(1, 1))),  # P = 156, 70 = 64 + 6
    # groups: cout_g 10 (one 16-wide block), cin_g 24 split in 3 offset groups of 8 each
    Case(1, 48, 11, 9, 20, 3, 3, Geometry(pad=(1, 1), groups=2, offset_groups=6), offset_scale=3.0),
    # strided, dilated, mostly off the image (zero columns)
    Case(2, 16, 15, 13, 64, 3, 3, Geometry((2, 2), (2, 2), (2, 2)), offset_scale=8.0),
]


def _reference(case: Case, t: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = t["mask"] if case.geo.use_mask else None
    return reference_deform_conv2d(t["input"], t["weight"], t["offset"], mask, t["bias"], case.geo)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_block_edges_match_reference(case: Case, dtype: torch.dtype, kernels: str) -> None:
    t = case.tensors(dtype, seed=3)
    got = OP(*case.op_args(t))
    torch.testing.assert_close(got, _reference(case, t).to(dtype), **TOL[dtype])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_zero_offsets_give_conv2d(case: Case, kernels: str) -> None:
    # F.conv2d (oneDNN) is a second independent implementation of the GEMM half.
    t = case.tensors(torch.float32, seed=4)
    t["offset"].zero_()
    t["mask"].fill_(1.0)
    g = case.geo
    expected = F.conv2d(t["input"], t["weight"], t["bias"], g.stride, g.pad, g.dil, g.groups)
    torch.testing.assert_close(OP(*case.op_args(t)), expected, **TOL[torch.float32])


def test_kernels_agree_with_portable_path() -> None:
    if not _has_avx512():
        pytest.skip("this CPU has no AVX-512F: only the portable path exists")
    ext = load_extension()
    case = CASES[6]
    t = case.tensors(torch.float32, seed=5)
    fast = OP(*case.op_args(t))
    ext.disable_avx512(True)
    try:
        portable = OP(*case.op_args(t))
    finally:
        ext.disable_avx512(False)
    torch.testing.assert_close(fast, portable, **TOL[torch.float32])


LAYOUTS = {
    "channels_last": lambda x: x.contiguous(memory_format=torch.channels_last),
    # every other column of a twice-as-wide tensor: last stride 2
    "sliced": lambda x: torch.stack([x, torch.zeros_like(x)], dim=-1).flatten(-2)[..., ::2],
    "permuted_view": lambda x: x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_non_contiguous_inputs(layout: str, kernels: str) -> None:
    case = CASES[6]
    t = case.tensors(torch.float32, seed=7)
    expected = OP(*case.op_args(t))
    moved = {k: LAYOUTS[layout](v) if v.dim() == 4 else v for k, v in t.items()}
    assert not moved["input"].is_contiguous()
    got = OP(*case.op_args(moved))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # same math, another layout
    torch.testing.assert_close(got, _reference(case, t).float(), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_round_the_float32_result(dtype: torch.dtype, kernels: str) -> None:
    case = CASES[6]
    t = case.tensors(dtype, seed=8)
    got = OP(*case.op_args(t))
    assert got.dtype == dtype
    widened = OP(*case.op_args({k: v.float() for k, v in t.items()}))
    torch.testing.assert_close(got, widened.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("case", [CASES[4], CASES[6]], ids=lambda c: c.id)
def test_one_and_two_threads_agree_bitwise(case: Case, kernels: str) -> None:
    t = case.tensors(torch.float32, seed=9)
    previous = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            outs.append(OP(*case.op_args(t)))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], outs[2])


def test_zero_batch(kernels: str) -> None:
    case = Case(0, 16, 9, 9, 20, 3, 3, Geometry(pad=(1, 1)))
    t = case.tensors(torch.float32)
    assert OP(*case.op_args(t)).shape == (0, 20, 9, 9)

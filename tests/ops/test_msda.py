"""``onnx_custom::multi_scale_deformable_attn`` in eager: forward and gradients against the
independent grid_sample formulation (``msda_reference.py``) and finite differences, every dtype,
every memory layout, borders, out-of-range and non-finite locations, zero sizes, bad input,
opcheck and torch.compile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _msda_reference import grid_sample_msda, level_start, make_inputs

from onnx_custom.errors import MultiScaleDeformableAttnDtypeError, MultiScaleDeformableAttnError
from onnx_custom.ops import multi_scale_deformable_attn

OP = torch.ops.onnx_custom.multi_scale_deformable_attn.default
TOL = {
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
GRAD_TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def _call(value, shapes, starts, loc, attn):  # type: ignore[no-untyped-def]
    return OP(value, shapes, starts, loc, attn, 64)


# ------------------------------------------------------------------------------------ forward
SIZES = [  # (bs, queries, heads, dim, points, levels)
    (2, 5, 2, 3, 2, ((4, 5), (2, 3), (1, 1))),
    (1, 7, 1, 1, 1, ((3, 3),)),
    (3, 4, 4, 8, 4, ((8, 6), (4, 3), (2, 2), (1, 1))),
    (1, 1, 8, 32, 4, ((16, 16), (8, 8))),
]


@pytest.mark.parametrize(
    "size", SIZES, ids=lambda s: f"bs{s[0]}-q{s[1]}-m{s[2]}-d{s[3]}-p{s[4]}-L{len(s[5])}"
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_forward_matches_grid_sample(size: tuple[Any, ...], dtype: torch.dtype) -> None:
    bs, q, m, d, p, levels = size
    value, shapes, starts, loc, attn = make_inputs(
        bs, q, m, d, p, levels, dtype=dtype, seed=len(levels)
    )
    got = _call(value, shapes, starts, loc, attn)
    assert got.shape == (bs, q, m * d) and got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(
        got, grid_sample_msda(value, shapes, loc, attn), rtol=TOL[dtype][0], atol=TOL[dtype][1]
    )


def _border_locations(levels: tuple[tuple[int, int], ...], queries: int) -> torch.Tensor:
    """Locations on the lines grid_sample treats specially: pixel centres, the image edge (0, 1),
    the last lines with any weight (x = -1 and x = W in pixel units) and just beyond them."""
    h, w = levels[0]
    xs = [0.0, 1.0, 0.5 / w, -0.5 / w, (w + 0.5) / w, -0.5 / w - 1e-3, (w + 0.5) / w + 1e-3, 0.37]
    ys = [0.0, 1.0, 0.5 / h, -0.5 / h, (h + 0.5) / h, 0.61, -0.5 / h - 1e-3, (h + 0.5) / h + 1e-3]
    pairs = torch.tensor([(x, y) for x in xs for y in ys], dtype=torch.float64)[:queries]
    return pairs


def test_borders_and_outside_points_match_grid_sample() -> None:
    levels = ((3, 4),)
    pairs = _border_locations(levels, 64)
    value, shapes, starts, _, _ = make_inputs(1, 64, 1, 2, 1, levels, dtype=torch.float64)
    loc = pairs.view(1, 64, 1, 1, 1, 2)
    attn = torch.ones(1, 64, 1, 1, 1, dtype=torch.float64)
    got = _call(value, shapes, starts, loc, attn)
    torch.testing.assert_close(got, grid_sample_msda(value, shapes, loc, attn))
    far = torch.tensor([-5.0, 7.0, 1e30, -1e30], dtype=torch.float64)  # far outside: exactly 0
    loc_far = torch.stack(torch.meshgrid(far, far, indexing="ij"), -1).view(1, 16, 1, 1, 1, 2)
    out = _call(value, shapes, starts, loc_far, torch.ones(1, 16, 1, 1, 1, dtype=torch.float64))
    assert torch.equal(out, torch.zeros_like(out))


def test_nonfinite_locations_contribute_zero_and_get_zero_gradients() -> None:
    """The documented behaviour: a NaN/Inf location's sample is 0 and all its gradients are 0."""
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=3)
    bad = torch.zeros(loc.shape[:-1], dtype=torch.bool)
    bad[0, 1, 0, 0, 1] = bad[1, 2, 1, 2, 0] = bad[0, 4, 1, 1, 1] = True
    poisoned = loc.clone()
    poisoned[..., 0][bad] = float("nan")
    poisoned[1, 2, 1, 2, 0, 1] = float("inf")
    poisoned[0, 4, 1, 1, 1, 1] = float("-inf")
    expected = grid_sample_msda(value, shapes, loc, attn * ~bad)  # the sample removed
    leaves = [t.clone().requires_grad_() for t in (value, poisoned, attn)]
    got = _call(leaves[0], shapes, starts, leaves[1], leaves[2])
    torch.testing.assert_close(got, expected)
    gv, gl, ga = torch.autograd.grad(got.square().sum(), leaves)
    assert torch.isfinite(gv).all() and torch.isfinite(gl).all() and torch.isfinite(ga).all()
    assert (gl[bad] == 0).all() and (ga[bad] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_round_the_float32_result_once(dtype: torch.dtype) -> None:
    value, shapes, starts, loc, attn = make_inputs(2, 6, 2, 8, 3, dtype=dtype, seed=4)
    got = _call(value, shapes, starts, loc, attn)
    assert got.dtype == dtype
    expected = grid_sample_msda(value.double(), shapes, loc.double(), attn.double()).to(dtype)
    torch.testing.assert_close(got, expected, rtol=TOL[dtype][0] * 2, atol=TOL[dtype][1])


# ---------------------------------------------------------------------------------- layouts
def _permuted(t: torch.Tensor) -> torch.Tensor:  # same values, reversed memory order
    dims = list(range(t.dim()))[::-1]
    return t.permute(dims).contiguous().permute(dims)


def _sliced(t: torch.Tensor) -> torch.Tensor:  # every other element of a twice-as-wide buffer
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "permuted": _permuted,
    "sliced": _sliced,
    "channels_last_like": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_any_memory_layout_forward_and_backward(layout: str) -> None:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=5)
    change = LAYOUTS[layout]
    strided = [change(t).requires_grad_() for t in (value, loc, attn)]
    assert not any(t.is_contiguous() for t in strided)
    dense = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    grad = torch.randn(2, 5, 6, dtype=torch.float64)
    got = _call(strided[0], shapes, starts, strided[1], strided[2])
    expected = _call(dense[0], shapes, starts, dense[1], dense[2])
    torch.testing.assert_close(got, expected)
    for a, b in zip(
        torch.autograd.grad(got, strided, grad),
        torch.autograd.grad(expected, dense, grad),
        strict=True,
    ):
        torch.testing.assert_close(a, b)


def test_expanded_inputs() -> None:
    """Broadcast views (stride 0): one attention pattern shared by the batch, as users build it."""
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=6)
    loc_x = loc[:1].expand_as(loc)
    attn_x = attn[:1].expand_as(attn)
    torch.testing.assert_close(
        _call(value, shapes, starts, loc_x, attn_x),
        grid_sample_msda(value, shapes, loc_x.contiguous(), attn_x.contiguous()),
    )


def test_level_tensors_may_be_strided() -> None:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=7)
    shapes_t = shapes.t().contiguous().t()  # (L, 2) stored column-major
    starts_s = torch.stack([starts, starts], 1)[:, 0]
    assert not shapes_t.is_contiguous() and not starts_s.is_contiguous()
    torch.testing.assert_close(
        _call(value, shapes_t, starts_s, loc, attn), _call(value, shapes, starts, loc, attn)
    )


# -------------------------------------------------------------------------------- zero sizes
@pytest.mark.parametrize(
    ("bs", "queries", "points"), [(0, 5, 2), (2, 0, 2), (2, 5, 0)], ids=["bs0", "q0", "p0"]
)
def test_zero_size(bs: int, queries: int, points: int) -> None:
    value, shapes, starts, loc, attn = make_inputs(bs, queries, 2, 3, points, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    out = _call(leaves[0], shapes, starts, leaves[1], leaves[2])
    assert out.shape == (bs, queries, 6) and not out.any()
    grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
    assert all(
        g is not None and g.shape == t.shape and not g.any()
        for g, t in zip(grads, leaves, strict=True)
    )


def test_empty_level() -> None:
    """A level with H*W = 0 (a 0-wide feature map) contributes nothing."""
    value, shapes, starts, loc, attn = make_inputs(
        levels=((4, 5), (0, 3), (1, 1)), dtype=torch.float64
    )
    expected = grid_sample_msda(
        value,
        shapes,
        loc,
        attn * torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64).view(1, 1, 1, 3, 1),
    )
    torch.testing.assert_close(_call(value, shapes, starts, loc, attn), expected)


# --------------------------------------------------------------------------------- gradients
def test_gradcheck_fp64() -> None:
    value, shapes, starts, loc, attn = make_inputs(2, 3, 2, 2, 2, dtype=torch.float64, seed=8)
    leaves = tuple(t.requires_grad_() for t in (value, loc, attn))
    assert torch.autograd.gradcheck(
        lambda v, sl, a: _call(v, shapes, starts, sl, a), leaves, eps=1e-6, atol=1e-5
    )


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
def test_gradients_match_grid_sample(dtype: torch.dtype) -> None:
    value, shapes, starts, loc, attn = make_inputs(2, 6, 2, 4, 3, dtype=dtype, seed=9)
    ours = [t.clone().requires_grad_() for t in (value, loc, attn)]
    ref = [t.double().requires_grad_() for t in (value, loc, attn)]
    grad = torch.randn(2, 6, 8, dtype=torch.float64)
    got = torch.autograd.grad(
        _call(ours[0], shapes, starts, ours[1], ours[2]), ours, grad.to(dtype)
    )
    expected = torch.autograd.grad(grid_sample_msda(ref[0], shapes, ref[1], ref[2]), ref, grad)
    rtol, atol = GRAD_TOL[dtype]
    for name, a, b in zip(
        ("value", "sampling_locations", "attention_weights"), got, expected, strict=True
    ):
        assert a.dtype == dtype
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(
            a.double(), b, rtol=rtol, atol=atol * scale, msg=f"grad {name} ({dtype})"
        )


def test_border_gradients_match_grid_sample() -> None:
    """On x = -1 / x = W the value is 0 but the derivative is grid_sample's (one-sided inside)."""
    levels = ((3, 4),)
    pairs = _border_locations(levels, 64)
    value, shapes, starts, _, _ = make_inputs(1, 64, 1, 2, 1, levels, dtype=torch.float64)
    base = (value, pairs.view(1, 64, 1, 1, 1, 2), torch.rand(1, 64, 1, 1, 1, dtype=torch.float64))
    ours = [t.clone().requires_grad_() for t in base]
    ref = [t.clone().requires_grad_() for t in base]
    got = torch.autograd.grad(_call(ours[0], shapes, starts, ours[1], ours[2]).sum(), ours)
    expected = torch.autograd.grad(grid_sample_msda(ref[0], shapes, ref[1], ref[2]).sum(), ref)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_backward_is_deterministic() -> None:
    value, shapes, starts, loc, attn = make_inputs(
        1, 64, 1, 8, 4, levels=((2, 2),), seed=10
    )  # heavy overlap
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    out = _call(leaves[0], shapes, starts, leaves[1], leaves[2])
    first = torch.autograd.grad(out.sum(), leaves, retain_graph=True)
    for _ in range(3):
        assert all(
            torch.equal(a, b)
            for a, b in zip(
                first, torch.autograd.grad(out.sum(), leaves, retain_graph=True), strict=True
            )
        )


THREAD_SIZES = [  # (bs, queries, heads, dim, points, levels)
    # dims in chunks of 32 plus a remainder (40, 70) or exactly two chunks (64). At 2 threads:
    # one (b, h) pair splits its 7 queries unevenly across private value-gradient buffers; two
    # images take one work item each; one image's 3 heads split into blocks of 1 and 2 heads.
    (1, 7, 1, 40, 3, ((5, 4), (2, 3))),
    (2, 5, 3, 64, 2, ((4, 4), (1, 2))),
    (1, 9, 3, 70, 2, ((3, 5),)),
]


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"threads{t}")
@pytest.mark.parametrize(
    "size", THREAD_SIZES, ids=lambda s: f"bs{s[0]}-q{s[1]}-m{s[2]}-d{s[3]}-p{s[4]}-L{len(s[5])}"
)
def test_chunked_dims_and_thread_splits(size: tuple[Any, ...], threads: int) -> None:
    """Forward and gradients against grid_sample, and run-to-run identical gradients, for head
    dims that are / are not multiples of the kernels' 32-wide chunks, at 1 and 2 threads."""
    bs, q, m, d, p, levels = size
    value, shapes, starts, loc, attn = make_inputs(
        bs, q, m, d, p, levels, dtype=torch.float64, seed=12
    )
    ours = [t.clone().requires_grad_() for t in (value, loc, attn)]
    ref = [t.clone().requires_grad_() for t in (value, loc, attn)]
    grad = torch.randn(
        bs, q, m * d, dtype=torch.float64, generator=torch.Generator().manual_seed(13)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = _call(ours[0], shapes, starts, ours[1], ours[2])
        got = torch.autograd.grad(out, ours, grad, retain_graph=True)
        again = torch.autograd.grad(out, ours, grad)
    finally:
        torch.set_num_threads(before)
    expected_out = grid_sample_msda(ref[0], shapes, ref[1], ref[2])
    torch.testing.assert_close(out, expected_out)
    expected = torch.autograd.grad(expected_out, ref, grad)
    for name, a, b, c in zip(
        ("value", "sampling_locations", "attention_weights"), got, expected, again, strict=True
    ):
        torch.testing.assert_close(a, b, msg=f"grad {name}")
        assert torch.equal(a, c), f"grad {name} differs between runs"


FLOAT_DIMS = [8, 16, 24, 32, 40, 64, 72, 12]  # float32 backward: 8-wide vector path when D % 8 == 0


@pytest.mark.parametrize("dim", FLOAT_DIMS, ids=lambda d: f"d{d}")
def test_float32_gradients_every_head_dim(dim: int) -> None:
    """float32 gradients against the fp64 grid_sample reference for head dims the backward
    processes as 8-wide vectors (whole 32-wide chunks, a 8/16/24 tail) or not (D % 8 != 0), with
    many samples on the same keys (a 3x3 level) and samples outside [0, 1] (spread 0.3); 1 and 2
    threads give bit-identical gradients (each value-gradient row is summed in query order)."""
    value, shapes, starts, loc, attn = make_inputs(
        2, 23, 3, dim, 4, ((3, 3), (5, 7), (1, 2)), dtype=torch.float64, seed=dim, spread=0.3
    )
    grad = torch.randn(
        2, 23, 3 * dim, dtype=torch.float64, generator=torch.Generator().manual_seed(dim + 1)
    )
    ref = [t.clone().requires_grad_() for t in (value, loc, attn)]
    expected = torch.autograd.grad(grid_sample_msda(ref[0], shapes, ref[1], ref[2]), ref, grad)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ours = [t.float().requires_grad_() for t in (value, loc, attn)]
            results.append(
                torch.autograd.grad(
                    _call(ours[0], shapes, starts, ours[1], ours[2]), ours, grad.float()
                )
            )
    finally:
        torch.set_num_threads(before)
    for name, a, b, c in zip(
        ("value", "sampling_locations", "attention_weights"),
        results[0],
        expected,
        results[1],
        strict=True,
    ):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * scale, msg=f"grad {name}")
        assert torch.equal(a, c), f"grad {name}: 1 and 2 threads differ"


def test_all_samples_on_one_key() -> None:
    """Every sample of every query at the same pixel centre: all their value gradients land on
    one key per level (the longest accumulation chain), float32 vector path and fp64."""
    for dtype in (torch.float32, torch.float64):
        value, shapes, starts, _, attn = make_inputs(
            1, 40, 2, 32, 4, ((4, 4), (2, 2)), dtype=torch.float64, seed=21
        )
        loc = torch.full(
            (1, 40, 2, 2, 4, 2), 0.375, dtype=torch.float64
        )  # pixel (1, 1) of the 4x4 level
        grad = torch.randn(
            1, 40, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(22)
        )
        ref = [t.clone().requires_grad_() for t in (value, loc, attn)]
        expected = torch.autograd.grad(grid_sample_msda(ref[0], shapes, ref[1], ref[2]), ref, grad)
        ours = [t.to(dtype).requires_grad_() for t in (value, loc, attn)]
        got = torch.autograd.grad(
            _call(ours[0], shapes, starts, ours[1], ours[2]), ours, grad.to(dtype)
        )
        for name, a, b in zip(
            ("value", "sampling_locations", "attention_weights"), got, expected, strict=True
        ):
            scale = max(1.0, b.abs().max().item())
            tol = 1e-5 if dtype == torch.float32 else 1e-7
            torch.testing.assert_close(
                a.double(), b, rtol=tol, atol=tol * scale, msg=f"grad {name} ({dtype})"
            )


# --------------------------------------------------------------------- the mmcv-style wrapper
def test_wrapper_casts_locations_and_weights_like_mmcv() -> None:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=11)
    got = multi_scale_deformable_attn(value.half(), shapes, starts, loc.float(), attn.float(), 64)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, _call(value.half(), shapes, starts, loc.half(), attn.half()))


# --------------------------------------------------------------------------------- bad input
def _bad(**changes: Any) -> dict[str, Any]:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32)
    args = {
        "value": value,
        "spatial_shapes": shapes,
        "level_start_index": starts,
        "sampling_locations": loc,
        "attention_weights": attn,
        "im2col_step": 64,
    }
    for name, fn in changes.items():
        args[name] = fn(args[name]) if callable(fn) else fn
    return args


BAD = [
    (
        "int-value",
        _bad(value=lambda v: v.int()),
        MultiScaleDeformableAttnDtypeError,
        "value has dtype torch.int32",
    ),
    (
        "mixed-dtypes",
        _bad(sampling_locations=lambda t: t.double()),
        MultiScaleDeformableAttnDtypeError,
        "type_as",
    ),
    (
        "int32-shapes",
        _bad(spatial_shapes=lambda t: t.int()),
        MultiScaleDeformableAttnDtypeError,
        "spatial_shapes.long()",
    ),
    (
        "float-starts",
        _bad(level_start_index=lambda t: t.float()),
        MultiScaleDeformableAttnDtypeError,
        "expected int64",
    ),
    (
        "value-3d",
        _bad(value=lambda v: v.flatten(2)),
        MultiScaleDeformableAttnError,
        "value must be 4-D",
    ),
    (
        "locations-5d",
        _bad(sampling_locations=lambda t: t.flatten(4)),
        MultiScaleDeformableAttnError,
        "sampling_locations must be 6-D",
    ),
    (
        "locations-xyz",
        _bad(sampling_locations=lambda t: torch.cat([t, t[..., :1]], -1)),
        MultiScaleDeformableAttnError,
        "(x, y)",
    ),
    (
        "locations-heads",
        _bad(sampling_locations=lambda t: t[:, :, :1]),
        MultiScaleDeformableAttnError,
        "num_heads=2",
    ),
    (
        "locations-levels",
        _bad(sampling_locations=lambda t: t[:, :, :, :2]),
        MultiScaleDeformableAttnError,
        "num_levels=3",
    ),
    (
        "weights-shape",
        _bad(attention_weights=lambda t: t[:, :, :, :, :1]),
        MultiScaleDeformableAttnError,
        "attention_weights must have shape",
    ),
    (
        "shapes-3-cols",
        _bad(spatial_shapes=lambda t: torch.cat([t, t[:, :1]], 1)),
        MultiScaleDeformableAttnError,
        "(num_levels, 2)",
    ),
    (
        "starts-len",
        _bad(level_start_index=lambda t: t[:2]),
        MultiScaleDeformableAttnError,
        "level_start_index must have shape",
    ),
    (
        "keys-mismatch",
        _bad(value=lambda v: v[:, :-1]),
        MultiScaleDeformableAttnError,
        "num_keys = 26",
    ),
    (
        "shapes-mismatch",
        _bad(spatial_shapes=lambda t: t[[1, 0, 2]]),
        MultiScaleDeformableAttnError,
        "level_start_index [0, 20, 26] does not match",
    ),
    (
        "negative-size",
        _bad(spatial_shapes=lambda t: t * torch.tensor([[1, 1], [-1, -1], [1, 1]])),
        MultiScaleDeformableAttnError,
        "negative size",
    ),
    (
        "starts-wrong",
        _bad(level_start_index=torch.tensor([0, 19, 26])),
        MultiScaleDeformableAttnError,
        "expected [0, 20, 26]",
    ),
    (
        "im2col-0",
        _bad(im2col_step=0),
        MultiScaleDeformableAttnError,
        "im2col_step must be positive",
    ),
]


@pytest.mark.parametrize(("args", "error", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_typed_errors(
    args: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=_escape(match)) as info:
        OP(**args)
    assert isinstance(info.value, RuntimeError)  # what mmcv's compiled op raises, for drop-in code


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_fake_kernel_raises_eagers_shape_errors() -> None:
    """The validator is shared: under FakeTensorMode (export, compile) the same message."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    real = _bad(sampling_locations=lambda t: t[:, :, :1])
    with FakeTensorMode() as mode:
        args = {
            k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in real.items()
        }
        with pytest.raises(MultiScaleDeformableAttnError, match="num_heads=2"):
            OP(**args)


# ------------------------------------------------------------------------- opcheck and compile
def test_opcheck() -> None:
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float64, seed=12)
    args = (value.requires_grad_(), shapes, starts, loc.requires_grad_(), attn.requires_grad_(), 64)
    torch.library.opcheck(OP, args)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_forward_and_backward(dynamic: bool) -> None:
    torch._dynamo.reset()

    def step(
        value: torch.Tensor,
        shapes: torch.Tensor,
        starts: torch.Tensor,
        loc: torch.Tensor,
        attn: torch.Tensor,
    ) -> torch.Tensor:
        return (
            multi_scale_deformable_attn(
                value * 2, shapes, starts, loc.clamp(-0.1, 1.1), attn.softmax(-1)
            )
            .square()
            .sum()
        )

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for bs, queries in ((2, 5), (3, 7)):  # the second call is not the first compile's size
        value, shapes, starts, loc, attn = make_inputs(bs, queries, seed=bs)
        leaves = [t.requires_grad_() for t in (value, loc, attn)]
        expected = step(leaves[0], shapes, starts, leaves[1], leaves[2])
        got = compiled(leaves[0], shapes, starts, leaves[1], leaves[2])
        torch.testing.assert_close(got, expected)
        for a, b in zip(
            torch.autograd.grad(got, leaves), torch.autograd.grad(expected, leaves), strict=True
        ):
            torch.testing.assert_close(a, b)


@pytest.mark.slow  # inductor compiles C++ per graph
def test_compile_inductor() -> None:
    torch._dynamo.reset()
    value, shapes, starts, loc, attn = make_inputs(seed=13)
    leaves = [t.requires_grad_() for t in (value, loc, attn)]

    def step(v: torch.Tensor, sl: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return multi_scale_deformable_attn(v, shapes, starts, sl, a).square().sum()

    got = torch.compile(step, fullgraph=True)(*leaves)
    expected = step(*leaves)
    torch.testing.assert_close(got, expected)
    for a, b in zip(
        torch.autograd.grad(got, leaves), torch.autograd.grad(expected, leaves), strict=True
    ):
        torch.testing.assert_close(a, b)


def test_level_start_helper_is_the_exclusive_cumsum() -> None:
    assert level_start(torch.tensor([[4, 5], [2, 3], [1, 1]])).tolist() == [0, 20, 26]

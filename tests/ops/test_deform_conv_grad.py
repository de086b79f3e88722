"""deform_conv2d's forward and five gradients against the independent float64 reference
(``test_deform_conv_reference.py``): every tensor in every memory layout, boundary coordinates,
the zero-offset + padding-1 DCN case with hand-derived border gradients, non-finite offsets.

Layouts are applied by differentiable transforms of contiguous leaves, so the op sees the
non-contiguous tensor and its gradient flows back through the transform to the leaf; the
reference runs on the same values. "Against the contiguous result" means the same transform
followed by ``.contiguous()``: the op must give bit-identical output and gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from test_deform_conv import Case
from test_deform_conv_reference import Geometry, reference_deform_conv2d

from onnx_custom.ops.deform_conv import load_extension

OP = torch.ops.onnx_custom.deform_conv2d.default
NAMES = ("input", "weight", "offset", "mask", "bias")


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


CASES = [
    Case(2, 4, 7, 6, 3, 3, 3, Geometry(pad=(1, 1)), offset_scale=1.3),
    Case(2, 4, 6, 5, 4, 2, 3, Geometry((2, 1), (1, 1), (1, 2), groups=2, offset_groups=2), 1.3),
    Case(1, 4, 5, 6, 2, 2, 2, Geometry(offset_groups=4, use_mask=False), offset_scale=2.5),
]


# -- layouts: (leaf from the contiguous tensor, differentiable transform to the op's input) -------

Layout = Callable[[torch.Tensor], torch.Tensor]
# The dim each tensor is expanded along (stride 0): images share pixels, output channels share
# filters, rows share offsets, taps share one mask, channels share one bias.
EXPAND_DIM = {"input": 0, "weight": 0, "offset": 3, "mask": 1, "bias": 0, "grad": 2}


def _permuted(t: torch.Tensor) -> torch.Tensor:
    order = tuple(reversed(range(t.dim())))
    return t.permute(order).contiguous().permute(order)  # storage in reversed dim order


def _sliced(t: torch.Tensor) -> torch.Tensor:
    # Every stride doubled (a gap after each element) and a non-zero storage offset.
    padded = torch.cat([t.new_zeros(1, *t.shape[1:]), t])[1:]
    return torch.stack([padded, torch.zeros_like(padded)], dim=-1)[..., 0]


LAYOUTS: dict[str, Layout] = {
    "contiguous": lambda t: t,
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "permuted": _permuted,
    "sliced": _sliced,
    "expanded": lambda t: t,  # the expand itself happens in `prepare` (the leaf is smaller)
}


def applicable(name: str, layout: str) -> bool:
    return not (name == "bias" and layout in ("channels_last", "permuted"))


def prepare(full: torch.Tensor, name: str, layout: str) -> tuple[torch.Tensor, Layout]:
    """The leaf and the transform producing the op's input in ``layout`` from it."""
    if layout != "expanded":
        return full.clone(), LAYOUTS[layout]
    dim = EXPAND_DIM[name]
    shape = full.shape
    return full.narrow(dim, 0, 1).clone(), lambda t: t.expand(shape)


def run(
    fn: Callable[..., torch.Tensor],
    case: Case,
    leaves: dict[str, torch.Tensor],
    transforms: dict[str, Layout],
    dense: bool = False,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Output and leaf gradients of ``fn`` fed the transformed leaves
    (``.contiguous()`` if dense)."""
    xs = {k: v.detach().clone().requires_grad_(k != "grad") for k, v in leaves.items()}

    def op_input(k: str) -> torch.Tensor:
        t = transforms[k](xs[k])
        return t.contiguous() if dense else t

    args = [op_input(k) for k in NAMES]
    if not case.geo.use_mask:
        args[3] = xs["input"].new_zeros(case.n, 1).detach()
    out = fn(*args, case.geo)
    out.backward(op_input("grad"))
    grads = {k: xs[k].grad for k in NAMES if k != "mask" or case.geo.use_mask}
    return out.detach(), grads


def ours(input, weight, offset, mask, bias, geo: Geometry) -> torch.Tensor:
    return OP(input, weight, offset, mask, bias, *geo.params())


def reference(input, weight, offset, mask, bias, geo: Geometry) -> torch.Tensor:
    return reference_deform_conv2d(input, weight, offset, mask if geo.use_mask else None, bias, geo)


def check_against_reference_and_dense(case: Case, layouts: dict[str, str], seed: int = 0) -> None:
    full = case.tensors(seed=seed)
    leaves, transforms = {}, {}
    for name, t in full.items():
        leaves[name], transforms[name] = prepare(t, name, layouts.get(name, "contiguous"))
    out, grads = run(ours, case, leaves, transforms)
    ref_out, ref_grads = run(reference, case, leaves, transforms)
    torch.testing.assert_close(out, ref_out)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")
    dense_out, dense_grads = run(ours, case, leaves, transforms, dense=True)
    assert torch.equal(out, dense_out)
    for name in grads:
        assert torch.equal(grads[name], dense_grads[name]), name


ONE_TENSOR = [
    pytest.param(case, name, layout, id=f"{case.id}-{name}-{layout}")
    for case in CASES
    for name in (*NAMES, "grad")
    for layout in LAYOUTS
    if layout != "contiguous" and applicable(name, layout) and (name != "mask" or case.geo.use_mask)
]


@pytest.mark.parametrize(("case", "name", "layout"), ONE_TENSOR)
def test_one_tensor_in_layout(case: Case, name: str, layout: str) -> None:
    check_against_reference_and_dense(case, {name: layout})


ALL_AT_ONCE = {
    # Every tensor non-contiguous in the same call (bias has no channels-last/permuted form).
    "channels_last": (
        {n: "channels_last" for n in ("input", "weight", "offset", "mask", "grad")}
        | {"bias": "sliced"}
    ),
    "permuted": (
        {n: "permuted" for n in ("input", "weight", "offset", "mask", "grad")}
        | {"bias": "expanded"}
    ),
    "sliced": {n: "sliced" for n in (*NAMES, "grad")},
    "expanded": {n: "expanded" for n in (*NAMES, "grad")},
}


@pytest.mark.parametrize("layouts", ALL_AT_ONCE.values(), ids=ALL_AT_ONCE.keys())
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_contiguous_and_all_tensors_in_layout(case: Case, layouts: dict[str, str]) -> None:
    check_against_reference_and_dense(case, layouts, seed=1)
    check_against_reference_and_dense(case, {}, seed=1)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: c.id)
def test_gradcheck_in_layout(case: Case, layout: str) -> None:
    full = case.tensors(seed=2)
    names = [n for n in NAMES if n != "mask" or case.geo.use_mask]
    prepared = {
        n: prepare(full[n], n, layout if applicable(n, layout) else "sliced") for n in names
    }
    leaves = tuple(prepared[n][0].requires_grad_() for n in names)
    placeholder = full["input"].new_zeros(case.n, 1)

    def fn(*xs: torch.Tensor) -> torch.Tensor:
        args = {n: prepared[n][1](x) for n, x in zip(names, xs, strict=True)}
        return OP(
            args["input"],
            args["weight"],
            args["offset"],
            args.get("mask", placeholder),
            args["bias"],
            *case.geo.params(),
        )

    assert torch.autograd.gradcheck(fn, leaves, fast_mode=True)


# -- boundary coordinates ----------------------------------------------------------------------


def boundary_targets(h: int, w: int) -> tuple[list[float], list[float]]:
    """Sample rows/columns on and around every boundary line, and far away."""

    def around(size: int) -> list[float]:
        return [
            -1e6,
            -2.0,
            -1.5,
            -1.0,
            -0.5,
            0.0,
            0.5,
            1.0,
            size - 1.5,
            size - 1.0,
            size - 0.5,
            float(size),
            size + 0.5,
            1e6,
        ]

    return around(h), around(w)


def boundary_offsets(case: Case) -> torch.Tensor:
    """Offsets moving every (group, tap, position) sample onto a (y, x) pair of targets; the
    pairs cycle through the whole cartesian product."""
    ys, xs = boundary_targets(case.h, case.w)
    pairs = [(y, x) for y in ys for x in xs]
    ho, wo = case.out_hw()
    g, k = case.geo, case.kh * case.kw
    offset = torch.empty(case.n, 2 * g.offset_groups * k, ho, wo, dtype=torch.float64)
    counter = 0
    for n in range(case.n):
        for og in range(g.offset_groups):
            for tap in range(k):
                i, j = divmod(tap, case.kw)
                for oh in range(ho):
                    for ow in range(wo):
                        y, x = pairs[counter % len(pairs)]
                        counter += 15  # co-prime with 14 and 196: every pair, neighbours differ
                        base_y = oh * g.stride[0] - g.pad[0] + i * g.dil[0]
                        base_x = ow * g.stride[1] - g.pad[1] + j * g.dil[1]
                        offset[n, 2 * (og * k + tap), oh, ow] = y - base_y
                        offset[n, 2 * (og * k + tap) + 1, oh, ow] = x - base_x
    return offset


BOUNDARY_CASES = [
    Case(2, 4, 7, 6, 3, 3, 3, Geometry(pad=(1, 1))),
    Case(2, 4, 7, 6, 4, 2, 3, Geometry((2, 1), (1, 1), (1, 2), groups=2, offset_groups=2)),
    Case(3, 2, 4, 5, 2, 3, 3, Geometry(pad=(2, 2), use_mask=False)),
]


@pytest.mark.parametrize("case", BOUNDARY_CASES, ids=lambda c: c.id)
def test_samples_on_boundary_lines_match_reference(case: Case) -> None:
    full = case.tensors(seed=3)
    full["offset"] = boundary_offsets(case)
    leaves = dict(full)
    transforms: dict[str, Layout] = {k: LAYOUTS["contiguous"] for k in leaves}
    out, grads = run(ours, case, leaves, transforms)
    ref_out, ref_grads = run(reference, case, leaves, transforms)
    torch.testing.assert_close(out, ref_out)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")
    # Not vacuous: dy gradients of samples exactly on the lines y = -1 and y = H-1 (x inside)
    # are non-zero, as are dx gradients on x = -1 and x = W-1.
    offset = full["offset"]
    g, k = case.geo, case.kh * case.kw
    ho, wo = case.out_hw()
    tap = torch.arange(g.offset_groups * k).remainder(k)
    rows = (torch.arange(ho) * g.stride[0] - g.pad[0])[None, :, None] + (tap // case.kw * g.dil[0])[
        :, None, None
    ]
    cols = (torch.arange(wo) * g.stride[1] - g.pad[1])[None, None, :] + (tap % case.kw * g.dil[1])[
        :, None, None
    ]
    y, x = offset[:, 0::2] + rows, offset[:, 1::2] + cols
    x_inside, y_inside = (x >= 0) & (x <= case.w - 1), (y >= 0) & (y <= case.h - 1)
    for line in (-1.0, case.h - 1.0):
        on_line = (y == line) & x_inside
        assert on_line.sum() >= 2 and (grads["offset"][:, 0::2][on_line] != 0).all()
    for line in (-1.0, case.w - 1.0):
        on_line = (x == line) & y_inside
        assert on_line.sum() >= 2 and (grads["offset"][:, 1::2][on_line] != 0).all()


# -- zero offsets + padding 1: the usual DCN start, with hand-derived gradients -------------------

DCN_START = Case(2, 1, 7, 6, 1, 3, 3, Geometry(pad=(1, 1)))


def _zero_offset_start(mask_value: float) -> tuple[Any, ...]:
    shapes = DCN_START.shapes()
    x = torch.ones(shapes["input"], dtype=torch.float64, requires_grad=True)
    w = torch.ones(shapes["weight"], dtype=torch.float64, requires_grad=True)
    offset = torch.zeros(shapes["offset"], dtype=torch.float64, requires_grad=True)
    mask = torch.full(shapes["mask"], mask_value, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(shapes["bias"], dtype=torch.float64, requires_grad=True)
    OP(x, w, offset, mask, b, *DCN_START.geo.params()).sum().backward()
    return x, w, offset, mask, b


def test_zero_offset_padding1_hand_derived_gradients() -> None:
    # Ones image, ones 3x3 filter, mask 0.5, gradient 1 everywhere. Tap (i, j) at output (oh, ow)
    # samples y = oh - 1 + i, x = ow - 1 + j on the integer grid. By torchvision's rule (the
    # derivative of the interpolation on the cell [y, y+1] x [x, x+1], zeros outside):
    #   d/dy = m * (img(y+1, x) - img(y, x)): +m on row y = -1, -m on row y = H-1, 0 elsewhere
    #          (and 0 unless 0 <= x <= W-1: on columns -1 and W the cell weighs only outside);
    #   d/dx likewise on columns -1 and W-1;  d/dmask = img(y, x) = 1 inside, 0 in the padding;
    #   d/dimg(y, x) = m * (taps reading it) = m * 9 inside, 6 on edges, 4 at corners;
    #   d/dweight[i, j] = m * N * (rows inside) * (cols inside)
    #                   = 0.5 * 2 * (H - |i-1|) * (W - |j-1|).
    m, n, h, w = 0.5, DCN_START.n, DCN_START.h, DCN_START.w
    x, weight, offset, mask, bias = _zero_offset_start(m)
    ho, wo = DCN_START.out_hw()
    expect_dy = torch.zeros(n, 9, ho, wo, dtype=torch.float64)
    expect_dx = torch.zeros_like(expect_dy)
    expect_mask = torch.zeros_like(expect_dy)
    for tap in range(9):
        i, j = divmod(tap, 3)
        for oh in range(ho):
            for ow in range(wo):
                y, xx = oh - 1 + i, ow - 1 + j
                row_in, col_in = 0 <= y <= h - 1, 0 <= xx <= w - 1
                if col_in:
                    expect_dy[:, tap, oh, ow] = m * ((y == -1) - (y == h - 1))
                if row_in:
                    expect_dx[:, tap, oh, ow] = m * ((xx == -1) - (xx == w - 1))
                expect_mask[:, tap, oh, ow] = float(row_in and col_in)
    counts = torch.tensor(
        [[3 - (r in (0, h - 1)) for r in range(h)]], dtype=torch.float64
    ).T * torch.tensor([[3 - (c in (0, w - 1)) for c in range(w)]], dtype=torch.float64)
    expect_weight = torch.tensor(
        [[m * n * (h - abs(i - 1)) * (w - abs(j - 1)) for j in range(3)] for i in range(3)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(offset.grad[:, 0::2], expect_dy)
    torch.testing.assert_close(offset.grad[:, 1::2], expect_dx)
    torch.testing.assert_close(mask.grad, expect_mask)
    torch.testing.assert_close(x.grad, (m * counts).expand(n, 1, h, w))
    torch.testing.assert_close(weight.grad, expect_weight.view(1, 1, 3, 3))
    torch.testing.assert_close(bias.grad, torch.tensor([float(n * ho * wo)], dtype=torch.float64))
    # The entries on the lines y = -1 / x = -1 are the ones a skip-outside rule zeroes: 70 of the
    # 1512 offset-gradient entries here (what was measured).
    on_minus_one = (expect_dy > 0).sum() + (expect_dx > 0).sum()
    assert (on_minus_one, offset.grad.numel()) == (70, 2 * 9 * 2 * ho * wo)


def test_zero_offset_padding1_random_image_is_conv2d_plus_forward_differences() -> None:
    # Same start on a random multi-channel image: input, weight and bias gradients are F.conv2d's
    # (zero offsets make it a conv), the offset gradient is the masked, filter-weighted forward
    # difference of the zero-padded image, the mask gradient the filter-weighted samples.
    case = Case(2, 3, 7, 6, 4, 3, 3, Geometry(pad=(1, 1)))
    t = case.tensors(seed=4)
    t["offset"].zero_()
    leaves = {k: v.clone().requires_grad_() for k, v in t.items() if k != "grad"}
    OP(*(leaves[k] for k in NAMES), *case.geo.params()).backward(t["grad"])
    n, h, w = case.n, case.h, case.w
    ho, wo = case.out_hw()
    xp = F.pad(t["input"], (1, 1, 1, 1))
    xpp = F.pad(t["input"], (1, 2, 1, 2))  # one more zero row/column for forward differences
    gcol = torch.einsum("ock,nohw->nckhw", t["weight"].flatten(2), t["grad"])  # (N, C, 9, Ho, Wo)
    expect_dy, expect_dx, expect_mask = (
        torch.zeros(n, 9, ho, wo, dtype=torch.float64) for _ in range(3)
    )
    expect_x = torch.zeros_like(xp)
    for tap in range(9):
        i, j = divmod(tap, 3)
        sample = xp[:, :, i : i + ho, j : j + wo]
        below = xpp[:, :, i + 1 : i + 1 + ho, j : j + wo]
        right = xpp[:, :, i : i + ho, j + 1 : j + 1 + wo]
        mk = t["mask"][:, tap : tap + 1]
        expect_dy[:, tap] = (mk * gcol[:, :, tap] * (below - sample)).sum(1)
        expect_dx[:, tap] = (mk * gcol[:, :, tap] * (right - sample)).sum(1)
        expect_mask[:, tap] = (gcol[:, :, tap] * sample).sum(1)
        expect_x[:, :, i : i + ho, j : j + wo] += mk * gcol[:, :, tap]
    torch.testing.assert_close(leaves["offset"].grad[:, 0::2], expect_dy)
    torch.testing.assert_close(leaves["offset"].grad[:, 1::2], expect_dx)
    torch.testing.assert_close(leaves["mask"].grad, expect_mask)
    torch.testing.assert_close(leaves["input"].grad, expect_x[:, :, 1 : 1 + h, 1 : 1 + w])
    # With mask 1 everywhere the input, weight and bias gradients are exactly F.conv2d's.
    ones = {k: v.clone().requires_grad_() for k, v in t.items() if k != "grad"}
    with torch.no_grad():
        ones["mask"].fill_(1.0)
    OP(*(ones[k] for k in NAMES), *case.geo.params()).backward(t["grad"])
    conv = {k: t[k].clone().requires_grad_() for k in ("input", "weight", "bias")}
    F.conv2d(conv["input"], conv["weight"], conv["bias"], padding=1).backward(t["grad"])
    for k in ("input", "weight", "bias"):
        torch.testing.assert_close(ones[k].grad, conv[k].grad, msg=lambda msg, k=k: f"{k}: {msg}")


# -- non-finite offsets ------------------------------------------------------------------------

NON_FINITE = [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_offsets_have_documented_gradients(bad: float, dtype: torch.dtype) -> None:
    # Documented result: a sample whose coordinate is NaN or +-Inf reads 0 in the forward (as
    # torchvision's bilinear_interpolate), and in the backward contributes nothing to the input
    # and weight gradients and gets offset and mask gradients of exactly 0 -- the same as a sample
    # far outside the image. No crash, no out-of-bounds read, nothing non-finite.
    case = CASES[0]
    t = {k: v.to(dtype) for k, v in case.tensors(seed=5).items()}
    poisoned, far = t["offset"].clone(), t["offset"].clone()
    poisoned[:, 0::5, 1::2] = bad  # a mix of dy and dx channels at every other row
    far[:, 0::5, 1::2] = -1e6

    def grads(offset: torch.Tensor) -> list[torch.Tensor]:
        xs = {
            k: v.clone().requires_grad_() for k, v in {**t, "offset": offset}.items() if k != "grad"
        }
        OP(*(xs[k] for k in NAMES), *case.geo.params()).backward(t["grad"])
        return [xs[k].grad for k in NAMES]  # type: ignore[misc]

    got, expected = grads(poisoned), grads(far)
    for name, a, b in zip(NAMES, got, expected, strict=True):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, msg=lambda m, n=name: f"{n}: {m}")
    assert (got[2][:, 0::5, 1::2] == 0).all()


# -- threads: images split across threads are summed privately, in a fixed order ----------------

THREAD_CASES = [
    # One image, many tiles: every thread holds a part of it (the private-sum path).
    Case(1, 2, 23, 19, 2, 3, 3, Geometry(pad=(1, 1))),
    # Three images over two or three threads: whole images and split ones in one call.
    Case(3, 2, 17, 16, 2, 3, 3, Geometry(pad=(1, 1), groups=2, offset_groups=2)),
]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("case", THREAD_CASES, ids=lambda c: c.id)
def test_thread_counts_agree_with_reference(case: Case, threads: int) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_against_reference_and_dense(case, {}, seed=6)
        full = case.tensors(seed=6)
        transforms = {k: LAYOUTS["contiguous"] for k in full}
        first = run(ours, case, full, transforms)
        again = run(ours, case, full, transforms)
    finally:
        torch.set_num_threads(previous)
    # Deterministic for a given thread count: bit-identical on a second call.
    assert torch.equal(first[0], again[0])
    for name in first[1]:
        assert torch.equal(first[1][name], again[1][name]), name


# -- opcheck with non-contiguous, grad-requiring inputs; zero-size tensors ------------------------


@pytest.mark.parametrize("layout", ["channels_last", "permuted", "sliced"])
def test_opcheck_with_grad_in_layout(layout: str) -> None:
    case = CASES[1]
    t = {k: v.float() for k, v in case.tensors(seed=8).items()}
    args = [LAYOUTS[layout](t[k]) if t[k].dim() == 4 else t[k] for k in NAMES]
    args = [a.detach().requires_grad_() for a in args]
    assert not args[0].is_contiguous() and not args[3].is_contiguous()
    torch.library.opcheck(OP, (*args, *case.geo.params()))


ZERO_SIZE = [
    pytest.param(0, 4, 6, id="n0_c4_co6"),
    pytest.param(2, 4, 0, id="n2_c4_co0"),
]


@pytest.mark.parametrize(("n", "c", "cout"), ZERO_SIZE)
def test_zero_size_batch_or_out_channels(n: int, c: int, cout: int) -> None:
    geo = Geometry(pad=(1, 1))
    x = torch.randn(n, c, 5, 4, requires_grad=True)
    w = torch.randn(cout, c, 3, 3, requires_grad=True)
    offset = torch.randn(n, 18, 5, 4, requires_grad=True)
    mask = torch.rand(n, 9, 5, 4, requires_grad=True)
    b = torch.randn(cout, requires_grad=True)
    out = OP(x, w, offset, mask, b, *geo.params())
    assert tuple(out.shape) == (n, cout, 5, 4)
    out.sum().backward()
    for leaf in (x, w, offset, mask, b):
        assert leaf.grad is not None and leaf.grad.shape == leaf.shape
        assert not leaf.grad.any()

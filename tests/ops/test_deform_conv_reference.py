"""An independent, slow, pure-torch reference of torchvision's ``deform_conv2d`` and its own checks.

The reference shares no code with ``onnx_custom/ops/csrc/deform_conv.cpp``: it samples with
vectorized gathers on the unpadded image (the C++ kernel uses im2col on a zero-bordered copy) and
gets every gradient from autograd through the forward (the C++ kernel has hand-written adjoints).

Why autograd gives torchvision's gradients exactly: a sample at ``(y, x)`` interpolates on the
cell ``[floor(y), floor(y)+1] x [floor(x), floor(x)+1]`` with zeros outside the image. ``floor``
has no gradient, so the offset gradient is the derivative of that cell's interpolation, the
one-sided derivative from above that torchvision's ``get_coordinate_weight`` computes, at integer
coordinates too (non-zero at exactly -1 and at H-1 / W-1). The forward needs no ``-1 < y < H``
test: on the boundary lines the cell puts all weight on rows or columns outside the image.
Finite coordinates only (``floor`` of NaN has no index); non-finite offsets are tested against
documented results in ``test_deform_conv_grad.py``.

The checks here validate the reference itself against other independent sources: ``F.conv2d``
(integer offsets), ONNX's backend test cases, hand values and finite differences.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.nn.functional as F

__all__ = ["Geometry", "reference_deform_conv2d", "reference_grads", "sample_bilinear"]


def sample_bilinear(plane: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of ``plane`` (C, H, W) at coordinates ``y``, ``x`` (same shape S): (C, *S).

    Corners outside the image read as 0. Differentiable in ``plane``, ``y`` and ``x``.
    """
    c, h, w = plane.shape
    y0, x0 = torch.floor(y).detach(), torch.floor(x).detach()
    ly, lx = y - y0, x - x0
    flat = plane.reshape(c, h * w)
    out = plane.new_zeros((c, *y.shape))
    for dy, wy in ((0, 1 - ly), (1, ly)):
        for dx, wx in ((0, 1 - lx), (1, lx)):
            yy, xx = (y0 + dy).long(), (x0 + dx).long()
            valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            index = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).reshape(-1)
            corner = flat[:, index].reshape(c, *y.shape) * valid
            out = out + wy * wx * corner
    return out


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The scalar arguments of ``deform_conv2d`` (torchvision's schema order)."""

    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dil: tuple[int, int] = (1, 1)
    groups: int = 1
    offset_groups: int = 1
    use_mask: bool = True

    def params(self) -> tuple[Any, ...]:
        return (*self.stride, *self.pad, *self.dil, self.groups, self.offset_groups, self.use_mask)

    def out_hw(self, h: int, w: int, kh: int, kw: int) -> tuple[int, int]:
        ho = (h + 2 * self.pad[0] - self.dil[0] * (kh - 1) - 1) // self.stride[0] + 1
        wo = (w + 2 * self.pad[1] - self.dil[1] * (kw - 1) - 1) // self.stride[1] + 1
        return ho, wo


def reference_deform_conv2d(
    input: torch.Tensor,
    weight: torch.Tensor,
    offset: torch.Tensor,
    mask: torch.Tensor | None,
    bias: torch.Tensor,
    geo: Geometry,
) -> torch.Tensor:
    """torchvision's deform_conv2d by explicit sampling (one gather per offset group and tap)."""
    n, c, h, w = input.shape
    cout, cin_g, kh, kw = weight.shape
    ho, wo = geo.out_hw(h, w, kh, kw)
    k_taps, cpog = kh * kw, c // geo.offset_groups
    base_y = (torch.arange(ho, dtype=input.dtype) * geo.stride[0] - geo.pad[0])[:, None]
    base_x = (torch.arange(wo, dtype=input.dtype) * geo.stride[1] - geo.pad[1])[None, :]
    images = []
    for b in range(n):
        taps = []  # per offset group: (cpog, K, ho, wo)
        for og in range(geo.offset_groups):
            per_tap = []
            for k in range(k_taps):
                i, j = divmod(k, kw)
                ch = og * k_taps + k
                y = base_y + i * geo.dil[0] + offset[b, 2 * ch]
                x = base_x + j * geo.dil[1] + offset[b, 2 * ch + 1]
                v = sample_bilinear(input[b, og * cpog : (og + 1) * cpog], y, x)
                if geo.use_mask:
                    assert mask is not None
                    v = v * mask[b, ch]
                per_tap.append(v)
            taps.append(torch.stack(per_tap, dim=1))
        columns = torch.cat(taps, dim=0)  # (C, K, ho, wo)
        outs = []
        for grp in range(geo.groups):
            cols = columns[grp * cin_g : (grp + 1) * cin_g].reshape(cin_g * k_taps, ho * wo)
            wg = weight[grp * (cout // geo.groups) : (grp + 1) * (cout // geo.groups)]
            outs.append(wg.reshape(wg.shape[0], -1) @ cols)
        images.append(torch.cat(outs).reshape(cout, ho, wo) + bias[:, None, None])
    return torch.stack(images)


def reference_grads(
    tensors: dict[str, torch.Tensor], geo: Geometry, grad_out: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(output, gradients of ``(output * grad_out).sum()``) in float64 by autograd."""
    leaves = {k: v.detach().double().clone().requires_grad_() for k, v in tensors.items()}
    out = reference_deform_conv2d(
        leaves["input"], leaves["weight"], leaves["offset"], leaves.get("mask"), leaves["bias"], geo
    )
    out.backward(grad_out.double())
    return out.detach(), {k: v.grad for k, v in leaves.items()}  # type: ignore[misc]


# -- checks of the reference itself -------------------------------------------------------------


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CONV_CASES = [
    pytest.param(Geometry(pad=(1, 1)), (2, 4, 7, 6), (6, 4, 3, 3), id="n2c4_7x6_k3x3_p1"),
    pytest.param(
        Geometry((2, 1), (1, 0), (2, 1), groups=2),
        (1, 4, 9, 7),
        (4, 2, 3, 2),
        id="n1c4_9x7_k3x2_s21_p10_d21_g2",
    ),
]


@pytest.mark.parametrize(("geo", "x_shape", "w_shape"), CONV_CASES)
def test_integer_offsets_are_a_shifted_conv2d(geo: Geometry, x_shape, w_shape) -> None:
    # An offset of (+1, -2) on every tap samples the image shifted by (1, -2): conv2d of the
    # shifted image (zeros shifted in), which F.conv2d computes without any sampling code.
    x, w, bias = _randn(*x_shape, seed=0), _randn(*w_shape, seed=1), _randn(w_shape[0], seed=2)
    ho, wo = geo.out_hw(x_shape[2], x_shape[3], w_shape[2], w_shape[3])
    k = w_shape[2] * w_shape[3]
    offset = torch.zeros(x_shape[0], 2 * k, ho, wo, dtype=torch.float64)
    offset[:, 0::2], offset[:, 1::2] = 1.0, -2.0
    mask = torch.ones(x_shape[0], k, ho, wo, dtype=torch.float64)
    # Sample (y, x) reads x[y + 1, x - 2]: a conv2d without padding over a zero-framed copy
    # whose window starts at row 1 - pad_h and column -2 - pad_w.
    m = 4
    framed = F.pad(x, (m, m, m, m))[:, :, m + 1 - geo.pad[0] :, m - 2 - geo.pad[1] :]
    expected = F.conv2d(framed, w, bias, geo.stride, 0, geo.dil, geo.groups)[:, :, :ho, :wo]
    torch.testing.assert_close(reference_deform_conv2d(x, w, offset, mask, bias, geo), expected)


def test_onnx_backend_cases_agree() -> None:
    from test_deform_conv import onnx_backend_cases, op_args_from_onnx

    checked = 0
    for case in onnx_backend_cases():
        _node, inputs, outputs = case.values
        args = op_args_from_onnx(_node, inputs)
        if args is None:
            continue
        x, w, offset, mask, bias = (a.double() for a in args[:5])
        geo = Geometry(args[5:7], args[7:9], args[9:11], args[11], args[12], args[13])
        got = reference_deform_conv2d(x, w, offset, mask, bias, geo)
        torch.testing.assert_close(got, torch.from_numpy(outputs[0]).double(), rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked >= 3


BOUNDARY_VALUES = [
    # (y, expected sample, d/dy) on a 1x3 column [a, b, c] = [2, 3, 5], x = 0 exactly.
    pytest.param(-1.5, 0.0, 0.0, id="y=-1.5_outside"),
    pytest.param(-1.0, 0.0, 2.0, id="y=-1_from_above_is_a"),
    pytest.param(-0.25, 0.75 * 2.0, 2.0, id="y=-0.25"),
    pytest.param(0.0, 2.0, 1.0, id="y=0_from_above_b-a"),
    pytest.param(1.5, 4.0, 2.0, id="y=1.5"),
    pytest.param(2.0, 5.0, -5.0, id="y=H-1_from_above_0-c"),
    pytest.param(2.5, 2.5, -5.0, id="y=H-0.5"),
    pytest.param(3.0, 0.0, 0.0, id="y=H_outside"),
]


@pytest.mark.parametrize(("y", "value", "slope"), BOUNDARY_VALUES)
def test_hand_values_at_boundaries(y: float, value: float, slope: float) -> None:
    plane = torch.tensor([[[2.0], [3.0], [5.0]]], dtype=torch.float64)
    yt = torch.tensor([y], dtype=torch.float64, requires_grad=True)
    out = sample_bilinear(plane, yt, torch.zeros(1, dtype=torch.float64))
    assert out.item() == pytest.approx(value)
    out.sum().backward()
    assert yt.grad is not None and yt.grad.item() == pytest.approx(slope)


def test_reference_gradients_match_finite_differences() -> None:
    geo = Geometry((1, 2), (1, 1), (2, 1), groups=2, offset_groups=2)
    x, w, bias = _randn(1, 2, 4, 5, seed=3), _randn(2, 1, 2, 3, seed=4), _randn(2, seed=5)
    ho, wo = geo.out_hw(4, 5, 2, 3)
    offset, mask = (
        _randn(1, 24, ho, wo, seed=6) * 1.7,
        torch.rand(1, 12, ho, wo, dtype=torch.float64),
    )
    leaves = tuple(t.requires_grad_() for t in (x, w, offset, mask, bias))
    # fast_mode compares random projections of the whole Jacobian (the full one takes ~15 s).
    assert torch.autograd.gradcheck(
        lambda x, w, o, m, b: reference_deform_conv2d(x, w, o, m, b, geo), leaves, fast_mode=True
    )

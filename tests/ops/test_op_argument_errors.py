"""None and wrong-rank inputs to every shipped op are `InvalidArgumentError`s naming the argument,
called the way users call them: ``torch.ops.<ns>.<op>(...)`` positionally,
and the ``onnx_custom.ops`` drop-ins; and torchvision's own ``test_wrong_sizes`` expectations
(``RuntimeError`` with "the shape of the offset" / "mask.shape[1] is not valid") against our
``DeformConv2d``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import onnx_custom.errors
import onnx_custom.ops.bev_pool
import onnx_custom.ops.custom_linear
import onnx_custom.ops.deform_conv
import onnx_custom.ops.multi_out3
import onnx_custom.ops.numpy_sin
import onnx_custom.ops.seed
from onnx_custom.errors import DeformConv2dError, InvalidArgumentError
from onnx_custom.ops import DeformConv2d, deform_conv2d

torch.manual_seed(0)
X = torch.randn(2, 3)
W = torch.randn(4, 3)
INDEX = torch.zeros(4, dtype=torch.int32)


def _bev(**override: Any) -> Any:
    args = {
        "depth": torch.rand(1, 1, 2, 2, 2),
        "feat": torch.rand(1, 1, 2, 2, 3),
        "ranks_depth": INDEX,
        "ranks_feat": INDEX,
        "ranks_bev": INDEX,
        "bev_feat_shape": [1, 1, 2, 2, 3],
        "interval_starts": torch.zeros(1, dtype=torch.int32),
        "interval_lengths": torch.full((1,), 4, dtype=torch.int32),
    }
    args.update(override)
    return torch.ops.onnx_custom.bev_pool_v2(*args.values())


def _dcn_raw(**override: Any) -> Any:
    """The registered op itself, as exported graphs and mmcv-style code call it."""
    args: dict[str, Any] = {
        "input": torch.rand(1, 2, 4, 4),
        "weight": torch.rand(3, 2, 3, 3),
        "offset": torch.zeros(1, 18, 2, 2),
        "mask": torch.ones(1, 9, 2, 2),
        "bias": torch.zeros(3),
    }
    args.update(override)
    return torch.ops.onnx_custom.deform_conv2d(*args.values(), 1, 1, 0, 0, 1, 1, 1, 1, True)


# (id, call, argument the message must name)
CASES: list[Any] = [
    ("my_add/a-None", lambda: torch.ops.onnx_custom.my_add(None, X), "'a'"),
    ("my_add/b-None", lambda: torch.ops.onnx_custom.my_add(X, None), "'b'"),
    ("my_add/b-rank1", lambda: torch.ops.onnx_custom.my_add(X, X[0]), "a and b"),
    ("multi_out/x-None", lambda: torch.ops.onnx_custom.multi_out(None), "'x'"),
    ("multi_out3/x-None", lambda: torch.ops.onnx_custom.multi_out3(None, [1, 1], 1.0), "'x'"),
    (
        "multi_out3/x-0d",
        lambda: torch.ops.onnx_custom.multi_out3(torch.tensor(1.0), [], 1.0),
        "x with at least 1 dimension",
    ),
    (
        "multi_out3/repeats-rank",
        lambda: torch.ops.onnx_custom.multi_out3(X, [1], 1.0),
        "one repeat per dimension of x",
    ),
    # numpy_sin has device kernels only (cpu, cuda): a call with no tensor has no dispatch key
    ("numpy_sin/x-None", lambda: torch.ops.onnx_custom.numpy_sin(None), "'x'"),
    ("numpy_sin/x-None-kw", lambda: torch.ops.onnx_custom.numpy_sin(x=None), "'x'"),
    ("custom_linear/x-None", lambda: torch.ops.onnx_custom.custom_linear(None, W, None), "'x'"),
    (
        "custom_linear/weight-None",
        lambda: torch.ops.onnx_custom.custom_linear(X, None, None),
        "'weight'",
    ),
    (
        "custom_linear/weight-1d",
        lambda: torch.ops.onnx_custom.custom_linear(X, W[0], None),
        "2-D weight",
    ),
    (
        "custom_linear/x-0d",
        lambda: torch.ops.onnx_custom.custom_linear(torch.tensor(1.0), W, None),
        "x with at least 1 dimension",
    ),
    ("bev_pool_v2/depth-None", lambda: _bev(depth=None), "'depth'"),
    ("bev_pool_v2/ranks_bev-None", lambda: _bev(ranks_bev=None), "'ranks_bev'"),
    (
        "bev_pool_v2/interval_lengths-None",
        lambda: _bev(interval_lengths=None),
        "'interval_lengths'",
    ),
    ("bev_pool_v2/depth-4d", lambda: _bev(depth=torch.rand(1, 2, 2, 2)), "depth (B, N, D, fH, fW)"),
    ("deform_conv2d-op/mask-None-use_mask", lambda: _dcn_raw(mask=None), "'mask'"),
    ("deform_conv2d-op/input-None", lambda: _dcn_raw(input=None), "'input'"),
    (
        "deform_conv2d-op/offset-3d",
        lambda: _dcn_raw(offset=torch.zeros(18, 2, 2)),
        "offset must be 4-D",
    ),
    (
        "deform_conv2d/input-None",
        lambda: deform_conv2d(None, torch.zeros(1, 18, 2, 2), torch.rand(3, 2, 3, 3)),
        "input must be a torch.Tensor",
    ),
    (
        "deform_conv2d/offset-None",
        lambda: deform_conv2d(torch.rand(1, 2, 4, 4), None, torch.rand(3, 2, 3, 3)),
        "offset must be a torch.Tensor",
    ),
    (
        "deform_conv2d/input-3d",
        lambda: deform_conv2d(
            torch.rand(2, 4, 4), torch.zeros(1, 18, 2, 2), torch.rand(3, 2, 3, 3)
        ),
        "input, weight and offset must be 4-D",
    ),
    (
        "deform_conv2d/mask-3d",
        lambda: deform_conv2d(
            torch.rand(1, 2, 4, 4),
            torch.zeros(1, 18, 2, 2),
            torch.rand(3, 2, 3, 3),
            mask=torch.ones(9, 2, 2),
        ),
        "mask must be 4-D",
    ),
]


def _row(case: Any) -> Any:
    if hasattr(case, "marks"):  # a pytest.param row
        return pytest.param(*case.values[1:], id=case.values[0], marks=case.marks)
    return pytest.param(*case[1:], id=case[0])


@pytest.mark.parametrize(("call", "names"), [_row(c) for c in CASES])
def test_bad_op_input_is_typed_and_named(call: Callable[[], Any], names: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert names in str(info.value)
    # InvalidArgumentError is both TypeError and ValueError: `except ValueError` code keeps working
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("cls", [DeformConv2dError, onnx_custom.errors.DeformConv2dDtypeError])
def test_deform_conv_errors_are_runtime_errors_like_torchvision(cls: type[BaseException]) -> None:
    assert issubclass(cls, RuntimeError) and issubclass(cls, InvalidArgumentError)


def _vision_fn_args(batch_sz: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The argument set of torchvision's TestDeformConv.get_fn_args (test/test_ops.py): 6 input
    channels, 2 weight groups, 3 offset groups, kernel (3, 2), stride (2, 1), pad (1, 0), dilation
    (2, 1).
    """
    in_h, in_w, kh, kw = 5, 4, 3, 2
    out_h = (in_h + 2 * 1 - (2 * (kh - 1) + 1)) // 2 + 1
    out_w = (in_w + 2 * 0 - (1 * (kw - 1) + 1)) // 1 + 1
    x = torch.rand(batch_sz, 6, in_h, in_w, dtype=dtype, requires_grad=True)
    offset = torch.randn(batch_sz, 3 * 2 * kh * kw, out_h, out_w, dtype=dtype, requires_grad=True)
    mask = torch.randn(batch_sz, 3 * kh * kw, out_h, out_w, dtype=dtype, requires_grad=True)
    return x, offset, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torchvision_wrong_sizes(dtype: torch.dtype) -> None:
    """torchvision's TestDeformConv.test_wrong_sizes, written against onnx_custom.ops."""
    x, offset, mask = _vision_fn_args(batch_sz=10, dtype=dtype)
    layer = DeformConv2d(6, 2, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 1), groups=2).to(
        dtype
    )
    assert layer(x, offset, mask).shape == (10, 2, 2, 3)  # the right sizes run
    with pytest.raises(RuntimeError, match="the shape of the offset"):
        wrong_offset = torch.rand_like(offset[:, :2])
        layer(x, wrong_offset)
    with pytest.raises(RuntimeError, match=r"mask.shape\[1\] is not valid"):
        wrong_mask = torch.rand_like(mask[:, :2])
        layer(x, offset, wrong_mask)


def test_skip_reason_says_what_is_missing() -> None:
    """Skips name the real cause: torchvision absent, or present with ops that do not load."""
    import importlib.util

    from onnx_custom.ops.deform_conv import torchvision_unavailable_reason

    reason = torchvision_unavailable_reason()
    if importlib.util.find_spec("torchvision") is None:
        assert reason is not None and reason.startswith("torchvision is not installed"), reason
    elif reason is not None:
        assert (
            "is installed but its compiled ops do not load" in reason or "fails to import" in reason
        ), reason


def test_skip_reason_when_torchvision_is_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from onnx_custom.ops.deform_conv import torchvision_unavailable_reason

    monkeypatch.setitem(sys.modules, "torchvision", None)  # what Python does for a missing package
    assert (torchvision_unavailable_reason() or "").startswith("torchvision is not installed")

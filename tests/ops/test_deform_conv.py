"""Eager ``onnx_custom::deform_conv2d``: ONNX backend cases, ORT/ReferenceEvaluator cross-checks,
autograd, opcheck, input validation and non-finite offsets."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator
from test_deform_conv_reference import Geometry, reference_deform_conv2d

from onnx_custom.ops.deform_conv import deform_conv2d, deform_conv2d_op, load_extension

OP = torch.ops.onnx_custom.deform_conv2d.default


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()  # cached under ~/.cache/onnx_custom after the first build


# -- ONNX's own backend cases ----------------------------------------------------------------


def onnx_backend_cases() -> list[Any]:
    """Collect (name, node, inputs, outputs) from onnx/backend/test/case/node/deformconv.py."""
    from onnx.backend.test.case.node import deformconv

    cases: list[Any] = []

    def collect(node, inputs, outputs, name, **_):
        cases.append(pytest.param(node, inputs, outputs, id=name))

    original = deformconv.expect
    deformconv.expect = collect  # type: ignore[assignment]
    try:
        for name in dir(deformconv.DeformConv):
            if name.startswith("export"):
                getattr(deformconv.DeformConv, name)()
    finally:
        deformconv.expect = original
    return cases


def node_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def op_args_from_onnx(node: onnx.NodeProto, inputs: list[np.ndarray]) -> tuple[Any, ...] | None:
    """Map a DeformConv node to our op's arguments; None when pads are asymmetric."""
    a = node_attrs(node)
    x, w, offset = (torch.from_numpy(v) for v in inputs[:3])
    bias = torch.from_numpy(inputs[3]) if len(inputs) > 3 and inputs[3].size else None
    mask = torch.from_numpy(inputs[4]) if len(inputs) > 4 else None
    top, left, bottom, right = a.get("pads", [0, 0, 0, 0])
    if (top, left) != (bottom, right):
        return None
    sh, sw = a.get("strides", [1, 1])
    dh, dw = a.get("dilations", [1, 1])
    if bias is None:
        bias = torch.zeros(w.shape[0], dtype=x.dtype)
    use_mask = mask is not None
    if mask is None:
        mask = torch.zeros((x.shape[0], 1), dtype=x.dtype)
    return (
        x,
        w,
        offset,
        mask,
        bias,
        sh,
        sw,
        top,
        left,
        dh,
        dw,
        a.get("group", 1),
        a.get("offset_group", 1),
        use_mask,
    )


@pytest.mark.parametrize(("node", "inputs", "outputs"), onnx_backend_cases())
def test_onnx_backend_case(node, inputs, outputs) -> None:
    args = op_args_from_onnx(node, inputs)
    if args is None:
        pytest.skip("asymmetric pads: torchvision's schema has one pad per axis")
    torch.testing.assert_close(OP(*args), torch.from_numpy(outputs[0]))


def test_onnx_offset_layout_matches_torchvision() -> None:
    # ONNX's case moves the w-coordinate of kernel tap [1, 0] (k = 2) with channel 5 = 2*k + 1;
    # in torchvision's layout channel 2*k + 1 is dx of tap k: the layouts agree.
    x = torch.arange(9.0).reshape(1, 1, 3, 3)
    w = torch.ones(1, 1, 2, 2)
    offset = torch.zeros(1, 8, 2, 2)
    offset[0, 5, 0, 1] = -0.1  # tap (1, 0) at output (0, 1) samples x[1, 0.9] instead of x[1, 1]
    y = deform_conv2d(x, offset, w)
    assert y[0, 0, 0, 1].item() == pytest.approx(1 + 2 + 3.9 + 5, abs=1e-5)


# -- random cross-checks against ORT and onnx.reference ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One deform_conv2d configuration (shared by every DCN test file)."""

    n: int
    c: int
    h: int
    w: int
    cout: int
    kh: int
    kw: int
    geo: Geometry = dataclasses.field(default_factory=Geometry)
    offset_scale: float = 1.0

    @property
    def id(self) -> str:
        g = self.geo
        return (
            f"n{self.n}c{self.c}_{self.h}x{self.w}_co{self.cout}_k{self.kh}x{self.kw}"
            f"_s{g.stride[0]}{g.stride[1]}_p{g.pad[0]}{g.pad[1]}_d{g.dil[0]}{g.dil[1]}"
            f"_g{g.groups}_og{g.offset_groups}{'_mask' if g.use_mask else ''}"
            f"_off{self.offset_scale:g}"
        )

    def out_hw(self) -> tuple[int, int]:
        return self.geo.out_hw(self.h, self.w, self.kh, self.kw)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the five inputs and of the output ("grad": an output gradient)."""
        ho, wo = self.out_hw()
        k, og = self.kh * self.kw, self.geo.offset_groups
        return {
            "input": (self.n, self.c, self.h, self.w),
            "weight": (self.cout, self.c // self.geo.groups, self.kh, self.kw),
            "offset": (self.n, 2 * og * k, ho, wo),
            "mask": (self.n, og * k, ho, wo),
            "bias": (self.cout,),
            "grad": (self.n, self.cout, ho, wo),
        }

    def tensors(self, dtype: torch.dtype = torch.float64, seed: int = 0) -> dict[str, torch.Tensor]:
        """N(0, 1) values (offsets scaled by ``offset_scale``, the mask U(0, 1)),
        drawn in float64."""
        g = torch.Generator().manual_seed(seed)
        out = {}
        for name, shape in self.shapes().items():
            if name == "mask":
                t = torch.rand(shape, generator=g, dtype=torch.float64)
            else:
                t = torch.randn(shape, generator=g, dtype=torch.float64)
            out[name] = (t * self.offset_scale if name == "offset" else t).to(dtype)
        return out

    def op_args(self, t: dict[str, torch.Tensor]) -> tuple[Any, ...]:
        mask = t["mask"] if self.geo.use_mask else t["input"].new_zeros(self.n, 1)
        return (t["input"], t["weight"], t["offset"], mask, t["bias"], *self.geo.params())

    def onnx_model(self, dtype: torch.dtype) -> onnx.ModelProto:
        elem = {torch.float32: onnx.TensorProto.FLOAT, torch.float64: onnx.TensorProto.DOUBLE}[
            dtype
        ]
        g = self.geo
        names = ["input", "weight", "offset", "bias"] + (["mask"] if g.use_mask else [])
        node = helper.make_node(
            "DeformConv",
            names,
            ["y"],
            kernel_shape=[self.kh, self.kw],
            strides=list(g.stride),
            pads=[*g.pad, *g.pad],
            dilations=list(g.dil),
            group=g.groups,
            offset_group=g.offset_groups,
        )
        ranks = {"bias": 1}
        graph = helper.make_graph(
            [node],
            "deformconv",
            [helper.make_tensor_value_info(n, elem, [None] * ranks.get(n, 4)) for n in names],
            [helper.make_tensor_value_info("y", elem, [None] * 4)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
        onnx.checker.check_model(model)
        return model


CASES = [
    Case(2, 4, 8, 8, 6, 3, 3, Geometry(pad=(1, 1))),
    Case(2, 4, 9, 7, 4, 3, 2, Geometry((2, 2), (1, 1), (2, 2), groups=2, offset_groups=2)),
    Case(1, 8, 7, 10, 4, 1, 3, Geometry((2, 1), (0, 1), (1, 2), offset_groups=4, use_mask=False)),
    Case(2, 6, 6, 5, 6, 2, 3, Geometry(pad=(1, 0), groups=3, offset_groups=3), offset_scale=4.0),
    Case(
        1, 2, 5, 5, 2, 3, 3, Geometry(pad=(2, 2)), offset_scale=10.0
    ),  # most samples off the image
]
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_ort_and_reference(case: Case, dtype: torch.dtype) -> None:
    t = case.tensors(dtype)
    got = OP(*case.op_args(t))
    model = case.onnx_model(dtype)
    feeds = {
        k: v.numpy() for k, v in t.items() if k != "grad" and (k != "mask" or case.geo.use_mask)
    }
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected_ort = torch.from_numpy(sess.run(None, feeds)[0])
    expected_ref = torch.from_numpy(ReferenceEvaluator(model).run(None, feeds)[0])  # type: ignore[index]
    # fp32: the GEMM sums C*kh*kw products in another order than ORT/numpy; values are O(10), so
    # allow a few ulps of the sum magnitude beyond the default atol.
    fp32_tol = {"rtol": 1e-5, "atol": 5e-5}
    torch.testing.assert_close(got, expected_ort, **(fp32_tol if dtype == torch.float32 else {}))
    # onnx.reference samples through GridSample, which un-normalizes coordinates in float32
    # (op_grid_sample.py), so it is only float32-accurate even for float64 inputs.
    torch.testing.assert_close(got, expected_ref, **fp32_tol)


# >= 8 channels per offset group take the channels-last forward (the rows above, the gather
# one); these cover it. 13x12 = 156 positions: a full 128-position tile and a partial one.
CHANNELS_LAST_CASES = [
    Case(2, 16, 13, 12, 8, 3, 3, Geometry(pad=(1, 1))),
    Case(
        1,
        32,
        15,
        17,
        6,
        3,
        2,
        Geometry((2, 1), (1, 1), (1, 2), groups=2, offset_groups=2),
        offset_scale=3.0,
    ),
    # one offset group spanning four convolution groups of 6 channels: each sample's channel
    # vector is split across the groups' column blocks
    Case(2, 24, 9, 10, 4, 2, 3, Geometry(pad=(1, 0), groups=4, use_mask=False)),
    Case(1, 16, 12, 12, 4, 3, 3, Geometry(pad=(2, 2), dil=(2, 2)), offset_scale=10.0),  # mostly off
    Case(1, 8, 11, 12, 4, 3, 3, Geometry(pad=(1, 1))),  # exactly the threshold (8 per group)
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CHANNELS_LAST_CASES, ids=lambda c: c.id)
def test_channels_last_forward_matches_ort_and_reference(case: Case, dtype: torch.dtype) -> None:
    t = case.tensors(dtype)
    got = OP(*case.op_args(t))
    feeds = {
        k: v.numpy() for k, v in t.items() if k != "grad" and (k != "mask" or case.geo.use_mask)
    }
    sess = ort.InferenceSession(
        case.onnx_model(dtype).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    tol = {"rtol": 1e-5, "atol": 5e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(got, torch.from_numpy(sess.run(None, feeds)[0]), **tol)
    mask = t["mask"] if case.geo.use_mask else None
    expected = reference_deform_conv2d(
        t["input"], t["weight"], t["offset"], mask, t["bias"], case.geo
    )
    torch.testing.assert_close(got, expected, **tol)
    t["offset"].zero_()
    t["mask"].fill_(1.0)
    g = case.geo
    conv = F.conv2d(t["input"], t["weight"], t["bias"], g.stride, g.pad, g.dil, g.groups)
    torch.testing.assert_close(OP(*case.op_args(t)), conv, **tol)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c.id)
def test_zero_offset_is_conv2d(case: Case) -> None:
    t = case.tensors(torch.float64)
    t["offset"].zero_()
    t["mask"].fill_(1.0)
    got = OP(*case.op_args(t))
    g = case.geo
    expected = F.conv2d(t["input"], t["weight"], t["bias"], g.stride, g.pad, g.dil, g.groups)
    torch.testing.assert_close(got, expected)


def test_wrapper_defaults_match_op() -> None:
    case = CASES[0]
    t = case.tensors(torch.float64)
    ones = torch.ones_like(t["mask"])
    got = deform_conv2d(t["input"], t["offset"], t["weight"], padding=1)
    args = case.op_args({**t, "mask": ones, "bias": torch.zeros_like(t["bias"])})
    torch.testing.assert_close(got, OP(*args))
    got = deform_conv2d(t["input"], t["offset"], t["weight"], t["bias"], 1, (1, 1), 1, t["mask"])
    torch.testing.assert_close(got, OP(*case.op_args(t)))


# -- autograd and opcheck ---------------------------------------------------------------------

GRAD_CASES = [
    Case(1, 2, 5, 5, 2, 3, 3, Geometry(pad=(1, 1)), offset_scale=1.3),
    Case(
        2,
        4,
        5,
        4,
        4,
        2,
        3,
        Geometry((2, 1), (1, 1), (1, 2), groups=2, offset_groups=2),
        offset_scale=1.3,
    ),
    Case(1, 4, 4, 6, 2, 2, 2, Geometry(offset_groups=4, use_mask=False), offset_scale=2.5),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradcheck(case: Case) -> None:
    t = case.tensors(torch.float64, seed=1)
    args = list(case.op_args(t))
    for i in range(5 if case.geo.use_mask else 3):
        args[i] = args[i].requires_grad_()
    args[4].requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: OP(*a, *args[5:]), tuple(args[:5]))


@pytest.mark.parametrize("case", GRAD_CASES[:2], ids=lambda c: c.id)
def test_opcheck(case: Case) -> None:
    t = case.tensors(torch.float32, seed=2)
    args = list(case.op_args(t))
    torch.library.opcheck(OP, tuple(args))
    for i in range(5):
        args[i] = args[i].clone().requires_grad_()
    torch.library.opcheck(OP, tuple(args))


# -- validation -------------------------------------------------------------------------------


def _bad(**changes: Any) -> tuple[Any, ...]:
    case = CASES[1]  # groups=2, offset_groups=2
    args = list(case.op_args(case.tensors(torch.float32)))
    names = [
        "input",
        "weight",
        "offset",
        "mask",
        "bias",
        "stride_h",
        "stride_w",
        "pad_h",
        "pad_w",
        "dilation_h",
        "dilation_w",
        "groups",
        "offset_groups",
        "use_mask",
    ]
    for key, value in changes.items():
        i = names.index(key)
        args[i] = value(args[i]) if callable(value) else value
    return tuple(args)


ERRORS = [
    (
        "offset_channels",
        _bad(offset=lambda o: o[:, :-2]),
        ValueError,
        r"offset must have shape .*got \(2, 22, 4, 4\)",
    ),
    (
        "mask_shape",
        _bad(mask=lambda m: m[:, :, :-1]),
        ValueError,
        r"mask must have shape .*got \(2, 12, 3, 4\)",
    ),
    (
        "groups_not_dividing",
        _bad(groups=3),
        ValueError,
        r"input channels 4 .* weight.shape\[1\] \* groups",
    ),
    (
        "offset_groups_not_dividing",
        _bad(offset_groups=3),
        ValueError,
        r"not divisible by offset_groups=3",
    ),
    ("zero_stride", _bad(stride_h=0), ValueError, r"stride_h must be positive, got 0"),
    ("negative_dilation", _bad(dilation_w=-1), ValueError, r"dilation_w must be positive, got -1"),
    ("negative_pad", _bad(pad_h=-1), ValueError, r"padding must be non-negative"),
    (
        "input_3d",
        _bad(input=lambda x: x[0]),
        ValueError,
        r"input must be 4-D .*got shape \(4, 9, 7\)",
    ),
    (
        "weight_dtype",
        _bad(weight=lambda w: w.double()),
        TypeError,
        r"weight has dtype torch.float64 but input has torch.float32",
    ),
    (
        "int_input",
        _bad(input=lambda x: x.int()),
        TypeError,
        r"supports float32, float64, float16, bfloat16 input, got torch.int32",
    ),
    (
        "bias_shape",
        _bad(bias=lambda b: b[:-1]),
        ValueError,
        r"bias shape \(3,\) does not match out channels 4",
    ),
    ("too_small", _bad(input=lambda x: x[:, :, :1, :1]), ValueError, r"too small"),
]


@pytest.mark.parametrize(("args", "exc", "match"), [pytest.param(*e[1:], id=e[0]) for e in ERRORS])
def test_bad_input_eager_and_fake(args: tuple[Any, ...], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        OP(*args)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        with pytest.raises(exc, match=match):
            OP(*fake)


def test_wrapper_rejects_bad_offset_channels() -> None:
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    with pytest.raises(ValueError, match=r"offset channels 17 .* multiple of 2\*kh\*kw = 18"):
        deform_conv2d(x, torch.zeros(1, 17, 3, 3), w)


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("inf"), -float("inf"), 1e30, -1e30],
    ids=["nan", "inf", "-inf", "1e30", "-1e30"],
)
def test_non_finite_offsets_contribute_zero(bad: float) -> None:
    case = CASES[0]
    t = case.tensors(torch.float32)
    poisoned = t["offset"].clone()
    poisoned[:, 0::7] = bad  # a mix of dy and dx channels
    far = t["offset"].clone()
    far[:, 0::7] = -1e6  # plainly outside the image: zero contribution
    got = OP(*case.op_args({**t, "offset": poisoned}))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, OP(*case.op_args({**t, "offset": far})))
    # Backward must not index out of bounds either.
    args = list(case.op_args({**t, "offset": poisoned.requires_grad_()}))
    OP(*args).sum().backward()
    assert torch.isfinite(args[2].grad).all()


def test_backward_matches_through_custom_op_registration() -> None:
    assert deform_conv2d_op._opoverload is OP


def test_build_failure_is_an_extension_build_error(tmp_path, monkeypatch) -> None:
    from onnx_custom.common.native_build import KernelModule
    from onnx_custom.errors import ExtensionBuildError
    from onnx_custom.ops import deform_conv as module

    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv("ONNX_CUSTOM_CACHE_DIR", str(blocker))
    kernels = KernelModule(
        module._EXTENSION, module._SOURCE, module._cflags, headers=module._headers
    )  # not loaded yet
    with pytest.raises(ExtensionBuildError, match="ONNX_CUSTOM_CACHE_DIR"):
        kernels.load()
    monkeypatch.undo()
    assert kernels.load() is module.load_extension()  # a failed build is not remembered


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("channels", [1, 4, 16], ids=lambda c: f"c{c}")  # gather path below 8
def test_off_image_samples_are_exactly_zero_next_to_non_finite_pixels(
    channels: int, dtype: torch.dtype, value: float
) -> None:
    """torchvision gives 0 for a sample outside the image without reading a pixel; the first
    pixel of every plane being Inf/NaN must not leak into samples far off the image."""
    x = torch.zeros(2, channels, 5, 6, dtype=dtype)
    x[:, :, 0, 0] = value
    weight = torch.ones(3, channels, 3, 3, dtype=dtype)
    offset = torch.full((2, 18, 5, 6), 100.0, dtype=dtype)  # every sample far outside
    mask = torch.ones(2, 9, 5, 6, dtype=dtype)
    bias = torch.tensor([1.0, -2.0, 0.5], dtype=dtype)
    with torch.inference_mode():
        got = OP(x, weight, offset, mask, bias, 1, 1, 1, 1, 1, 1, 1, 1, True)
    torch.testing.assert_close(got, bias.view(1, 3, 1, 1).expand(2, 3, 5, 6), rtol=0, atol=0)

"""deform_conv2d in float16 and bfloat16 (float32 accumulation): eager forward and backward, fake,
opcheck, both exporters (ONNX ``DeformConv`` at opset 19 where ONNX Runtime runs the dtype, the
``onnx_custom::DeformConv2d`` node and its kernel below), one dtype list per op, and bad input."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_deform_conv import Case
from test_deform_conv_grad import NAMES, run
from test_deform_conv_reference import Geometry, reference_deform_conv2d
from torch._subclasses.fake_tensor import FakeTensorMode

import onnx_custom
from onnx_custom.errors import OnnxCustomError, SymbolicError
from onnx_custom.ops import DeformConv2d
from onnx_custom.ops.deform_conv import (
    DTYPES,
    DeformConv2dDtypeError,
    DeformConv2dError,
    load_extension,
)
from onnx_custom.ort_kernels import deform_conv as deform_conv_kernels
from onnx_custom.symbolics import deform_conv as deform_conv_symbolics

OP = torch.ops.onnx_custom.deform_conv2d.default
HALF = [torch.float16, torch.bfloat16]
# torch.testing's defaults per dtype; the op rounds each result once from float32, so its error
# is about half an ulp of the result (float16 ulp 2^-10, bfloat16 2^-7 relative).
TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


CASES = [
    Case(2, 8, 9, 7, 6, 3, 3, Geometry(pad=(1, 1))),
    Case(1, 8, 7, 8, 4, 2, 3, Geometry((2, 1), (1, 1), (1, 2), groups=2, offset_groups=2)),
    Case(2, 4, 6, 6, 4, 3, 3, Geometry(pad=(1, 1), use_mask=False)),
]


def _half_tensors(case: Case, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in case.tensors(seed=7).items()}


def _ours(*args: Any) -> torch.Tensor:
    *tensors, geo = args
    return OP(*tensors, *geo.params())


def _contiguous() -> dict[str, Any]:
    return {k: lambda t: t for k in (*NAMES, "grad")}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_half_is_the_float32_computation_rounded_once(case: Case, dtype: torch.dtype) -> None:
    # float32 accumulation, observably: the half result (forward and every gradient) is exactly
    # the float32 op's on the same (widened) values, rounded to the half type.
    t = _half_tensors(case, dtype)
    out, grads = run(_ours, case, t, _contiguous())
    wide_out, wide_grads = run(_ours, case, {k: v.float() for k, v in t.items()}, _contiguous())
    assert out.dtype == dtype and torch.equal(out, wide_out.to(dtype))
    for name, g in grads.items():
        assert g.dtype == dtype and torch.equal(g, wide_grads[name].to(dtype)), name


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_half_matches_float64_reference(case: Case, dtype: torch.dtype, layout: str) -> None:
    t = _half_tensors(case, dtype)

    def reference(input, weight, offset, mask, bias, geo: Geometry) -> torch.Tensor:
        mask = mask.double() if geo.use_mask else None
        return reference_deform_conv2d(
            input.double(), weight.double(), offset.double(), mask, bias.double(), geo
        )

    to_layout = (
        (lambda x: x.contiguous(memory_format=torch.channels_last))
        if layout != "contiguous"
        else (lambda x: x)
    )
    transforms = {k: to_layout if t[k].dim() == 4 else (lambda x: x) for k in (*NAMES, "grad")}
    out, grads = run(_ours, case, t, transforms)
    ref_out, ref_grads = run(reference, case, {k: v.double() for k, v in t.items()}, transforms)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref_out, rtol=rtol, atol=atol)
    for name, g in grads.items():
        # Gradients are sums of many float32 products: allow rtol relative to the gradient's
        # scale as well (cancellation leaves entries far below it).
        expected = ref_grads[name]
        scale = float(expected.abs().max())
        torch.testing.assert_close(
            g.double(),
            expected,
            rtol=rtol,
            atol=atol + rtol * scale * 1e-2,
            msg=lambda m, n=name: f"{n}: {m}",
        )


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_fake_and_opcheck(dtype: torch.dtype) -> None:
    case = CASES[1]
    t = _half_tensors(case, dtype)
    args = [t[k] for k in NAMES]
    with FakeTensorMode() as mode:
        fake = OP(*(mode.from_tensor(a) for a in args), *case.geo.params())
    assert fake.dtype == dtype and tuple(fake.shape) == case.shapes()["grad"]
    torch.library.opcheck(OP, (*args, *case.geo.params()))
    grads = [a.clone().requires_grad_() for a in args]
    torch.library.opcheck(OP, (*grads, *case.geo.params()))


# -- one dtype list: eager op, fake, custom-node kernel -----------------------------------------


def test_kernel_dtypes_are_the_eager_dtypes() -> None:
    spec = deform_conv_kernels.kernels[f"onnx_custom::{deform_conv_kernels.NODE_TYPE}"]
    names = tuple(str(d).removeprefix("torch.") for d in DTYPES)
    assert {p.name: p.dtypes for p in spec.inputs} == dict.fromkeys(NAMES, names)
    assert all(p.dtypes == names for p in spec.outputs)
    for dtype in DTYPES:  # and the eager op really accepts each of them
        t = {k: v.to(dtype) for k, v in CASES[2].tensors().items()}
        assert OP(*(t[k] for k in NAMES), *CASES[2].geo.params()).dtype == dtype


# -- exporters ----------------------------------------------------------------------------------


class OneDeformConv(torch.nn.Module):
    """The drop-in module alone, so every node of the file is the op under test."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = DeformConv2d(8, 6, 3, padding=1, groups=2)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.conv(x, offset, mask)


def _export_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 8, 9, 7, generator=g)
    offset = torch.randn(2, 18, 9, 7, generator=g) * 1.5
    mask = torch.rand(2, 9, 9, 7, generator=g)
    return tuple(t.to(dtype) for t in (x, offset, mask))


EXPORTS = [
    pytest.param(
        dtype, exporter, opset, id=f"{str(dtype).removeprefix('torch.')}-{exporter}-opset{opset}"
    )
    for dtype in HALF
    for exporter in ("torchscript", "dynamo")
    for opset in (11, 19)
    if not (dtype == torch.bfloat16 and opset >= 19)
]


@pytest.mark.parametrize(("dtype", "exporter", "opset"), EXPORTS)
def test_half_exports_and_runs(dtype: torch.dtype, exporter: str, opset: int) -> None:
    model = OneDeformConv().to(dtype).eval()
    args = _export_inputs(dtype)
    proto = onnx_custom.export(model, args, exporter=exporter, opset=opset)
    node_types = {n.op_type for n in proto.graph.node}
    assert ("DeformConv" if opset >= 19 else "DeformConv2d") in node_types
    elem = ELEM[dtype]
    assert proto.graph.output[0].type.tensor_type.elem_type == elem
    if dtype == torch.float16:
        # The product's verifier: default float16 tolerances, example and redrawn inputs.
        assert onnx_custom.verify(model, args, proto, trials=3).passed
    # Both sides round one float32 result to the half type: equal up to one ulp. (By hand for
    # bfloat16: ONNX Runtime's numpy feeds, which verify() uses, have no bfloat16.)
    (got,) = _run_ort(proto, args)
    with torch.no_grad():
        expected = model(*args)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got, expected, rtol=2 * rtol, atol=atol)


ELEM = {torch.float16: 10, torch.bfloat16: 16}  # onnx.TensorProto.FLOAT16 / BFLOAT16


def _run_ort(proto: Any, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Run with OrtValues: ONNX Runtime's numpy feed path has no bfloat16 (ml_dtypes arrays are
    refused with "Numpy_type 256 can't be converted to MLDataType"), so feed raw 16-bit words."""
    import onnxruntime as ort

    sess = onnx_custom.InferenceSession(proto)
    names = [i.name for i in sess.get_inputs()]
    values = [
        ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            a.contiguous().view(torch.int16).numpy(), onnx_element_type=ELEM[a.dtype]
        )
        for a in args
    ]
    outs = sess.run_with_ort_values(None, dict(zip(names, values, strict=True)))
    return [_words(o).view(args[0].dtype) for o in outs]


def _words(value: Any) -> torch.Tensor:
    """An OrtValue's 16-bit elements, copied (OrtValue.numpy() has no bfloat16 either)."""
    import ctypes

    shape = value.shape()
    count = int(torch.Size(shape).numel())
    buffer = (ctypes.c_int16 * count).from_address(value.data_ptr())
    return torch.frombuffer(bytearray(buffer), dtype=torch.int16).reshape(shape)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_bfloat16_deformconv_at_opset19_names_the_alternatives(exporter: str) -> None:
    model = OneDeformConv().to(torch.bfloat16).eval()
    with pytest.raises(SymbolicError) as info:
        onnx_custom.export(model, _export_inputs(torch.bfloat16), exporter=exporter, opset=19)
    message = str(info.value)
    for part in (
        "cannot run bfloat16",
        "float32, float64 and float16",
        "opset 18 or lower",
        "onnx_custom::DeformConv2d",
        "model.half() / model.float()",
    ):
        assert part in message, part


def test_deformconv_dtypes_are_what_ort_runs() -> None:
    # The symbolic's list against ONNX Runtime itself: each listed dtype runs, bfloat16 doesn't.
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def session(elem: int) -> Any:
        names = ["X", "W", "offset", "B"]
        node = helper.make_node("DeformConv", names, ["Y"], kernel_shape=[1, 1])
        graph = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info(n, elem, [None] * (1 if n == "B" else 4))
                for n in names
            ],
            [helper.make_tensor_value_info("Y", elem, [None] * 4)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    elems = {
        torch.float32: TensorProto.FLOAT,
        torch.float64: TensorProto.DOUBLE,
        torch.float16: TensorProto.FLOAT16,
        torch.bfloat16: TensorProto.BFLOAT16,
    }
    for dtype, elem in elems.items():
        if dtype in deform_conv_symbolics.DEFORMCONV_DTYPES:
            session(elem)
        else:
            with pytest.raises(Exception, match="bfloat16"):
                session(elem)


# -- bad input -----------------------------------------------------------------------------------


def _args(dtype: torch.dtype = torch.float16, **changes: Any) -> tuple[Any, ...]:
    case = CASES[1]  # groups=2, offset_groups=2: mask (1, 12, 4, 6)
    t = _half_tensors(case, dtype)
    for name, fn in changes.items():
        t[name] = fn(t[name])
    return (*(t[k] for k in NAMES), *case.geo.params())


BAD = [
    (
        "fp16_input_fp32_weight",
        _args(weight=lambda w: w.float()),
        DeformConv2dDtypeError,
        ["weight has dtype torch.float32 but input has torch.float16", "weight.to(torch.float16)"],
    ),
    (
        "bf16_input_fp16_mask",
        _args(torch.bfloat16, mask=lambda m: m.half()),
        DeformConv2dDtypeError,
        ["mask has dtype torch.float16 but input has torch.bfloat16", "mask.to(torch.bfloat16)"],
    ),
    (
        "fp16_input_fp32_offset_bias",
        _args(offset=lambda o: o.float(), bias=lambda b: b.float()),
        DeformConv2dDtypeError,
        ["offset has dtype torch.float32 but input has torch.float16"],
    ),
    (
        "fp32_input_bf16_bias",
        _args(torch.float32, bias=lambda b: b.bfloat16()),
        DeformConv2dDtypeError,
        ["bias has dtype torch.bfloat16 but input has torch.float32", "bias.to(torch.float32)"],
    ),
    (
        "int8_input",
        _args(torch.float16, input=lambda x: x.to(torch.int8)),
        DeformConv2dDtypeError,
        ["supports float32, float64, float16, bfloat16 input, got torch.int8", ".float()"],
    ),
    (
        "mask_channels_last_order",
        _args(mask=lambda m: m.permute(0, 2, 3, 1).contiguous()),
        DeformConv2dError,
        [
            "mask must have shape (N, offset_groups*kh*kw, Ho, Wo) = (1, 12, 4, 6)",
            "got (1, 4, 6, 12)",
            "pass t.permute(0, 3, 1, 2)",
        ],
    ),
    (
        "offset_channels_last_order",
        _args(offset=lambda o: o.permute(0, 2, 3, 1).contiguous()),
        DeformConv2dError,
        [
            "offset must have shape (N, 2*offset_groups*kh*kw, Ho, Wo) = (1, 24, 4, 6)",
            "got (1, 4, 6, 24)",
            "pass t.permute(0, 3, 1, 2)",
        ],
    ),
    (
        "mask_one_offset_group_short",
        _args(mask=lambda m: m[:, :6]),
        DeformConv2dError,
        ["= (1, 12, 4, 6)", "got (1, 6, 4, 6)"],
    ),
    (
        "mask_spatial_size",
        _args(mask=lambda m: m[:, :, :, :-1]),
        DeformConv2dError,
        ["= (1, 12, 4, 6)", "got (1, 12, 4, 5)"],
    ),
    (
        "mask_3d",
        _args(mask=lambda m: m[0]),
        DeformConv2dError,
        ["mask must be 4-D", "got shape (12, 4, 6)"],
    ),
]


@pytest.mark.parametrize(("args", "exc", "parts"), [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_bad_input_is_a_typed_error(args: tuple[Any, ...], exc: type, parts: list[str]) -> None:
    for fake in (False, True):
        with pytest.raises(exc) as info:
            if fake:
                with FakeTensorMode() as mode:
                    OP(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
            else:
                OP(*args)
        assert isinstance(info.value, OnnxCustomError)
        for part in parts:
            assert part in str(info.value), part

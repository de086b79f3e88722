"""The standard-op deform_conv2d (symbolics/deform_conv_decomposed.py), both as the function body of
``onnx_custom::DeformConv2d`` and as the ``"standard"`` variant translation below opset 19, against
ONNX's backend DeformConv cases and against the eager op on random configurations (strides,
pads, dilations, groups, offset groups, mask on/off, non-square, boundary-crossing and non-finite
offsets, float64, zero batch), run at sizes other than the export size."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_deform_conv import onnx_backend_cases, op_args_from_onnx

import onnx_custom
import onnx_custom.ops.deform_conv  # defines onnx_custom::deform_conv2d
from onnx_custom.errors import SymbolicError
from onnx_custom.function_bodies import embed_functions

OP = torch.ops.onnx_custom.deform_conv2d
NAMES = ["x", "w", "offset", "mask", "bias"]
ATTRS = (
    "stride_h",
    "stride_w",
    "pad_h",
    "pad_w",
    "dilation_h",
    "dilation_w",
    "groups",
    "offset_groups",
    "use_mask",
)
ELEM = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE}


@dataclasses.dataclass(frozen=True)
class Config:
    n: int
    c: int
    hw: tuple[int, int]
    cout: int
    k: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pad: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    offset_groups: int = 1
    mask: bool = True
    offsets: str = "normal"  # normal | far (many samples cross or leave the image) | nonfinite
    dtype: torch.dtype = torch.float32

    @property
    def id(self) -> str:
        s, p, d = (f"{a}x{b}" for a, b in (self.stride, self.pad, self.dilation))
        return (
            f"n{self.n}c{self.c}-{self.hw[0]}x{self.hw[1]}-k{self.k[0]}x{self.k[1]}-s{s}-p{p}-d{d}"
            f"-g{self.groups}og{self.offset_groups}-{'mask' if self.mask else 'nomask'}-"
            f"{self.offsets}-{str(self.dtype)[6:]}"
        )

    def params(self) -> tuple[int, ...]:
        return (
            *self.stride,
            *self.pad,
            *self.dilation,
            self.groups,
            self.offset_groups,
            int(self.mask),
        )

    def out_hw(self, h: int, w: int) -> tuple[int, int]:
        return tuple(  # type: ignore[return-value]
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip(
                (h, w), self.k, self.stride, self.pad, self.dilation, strict=True
            )
        )

    def tensors(self, n: int, h: int, w: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        kh, kw = self.k
        ho, wo = self.out_hw(h, w)
        taps = self.offset_groups * kh * kw
        x = torch.randn(n, self.c, h, w, generator=g, dtype=self.dtype)
        weight = torch.randn(
            self.cout, self.c // self.groups, kh, kw, generator=g, dtype=self.dtype
        )
        offset = torch.randn(n, 2 * taps, ho, wo, generator=g, dtype=self.dtype) * 1.5
        if self.offsets == "far":  # integers, edges and far outside: every branch of the sampler
            offset = offset * 2 * max(h, w)
            offset[:, ::3] = torch.round(offset[:, ::3])
            offset[:, 1::5] = -1.0 - torch.arange(
                wo, dtype=self.dtype
            )  # lands exactly on y = -1 ...
        elif self.offsets == "nonfinite":
            flat = offset.view(-1)
            flat[::7], flat[3::11], flat[5::13] = float("inf"), float("-inf"), float("nan")
        mask = (
            torch.rand(n, taps, ho, wo, generator=g, dtype=self.dtype)
            if self.mask
            else torch.zeros(n, 1, dtype=self.dtype)
        )
        bias = torch.randn(self.cout, generator=g, dtype=self.dtype)
        return x, weight, offset, mask, bias

    def eager(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return OP(*tensors, *self.params())


CONFIGS = [
    Config(2, 4, (9, 9), 6, (3, 3), pad=(1, 1)),
    Config(
        1,
        4,
        (9, 7),
        4,
        (3, 2),
        stride=(2, 1),
        pad=(1, 0),
        dilation=(2, 1),
        groups=2,
        offset_groups=2,
    ),
    Config(2, 6, (8, 8), 3, (1, 1), mask=False),
    Config(1, 8, (11, 10), 8, (5, 5), pad=(2, 2), offset_groups=4, mask=False, offsets="far"),
    Config(2, 4, (12, 12), 4, (3, 3), stride=(3, 3), dilation=(3, 3), groups=4),  # depthwise
    Config(1, 3, (7, 9), 5, (3, 3), pad=(1, 2), offsets="far"),
    Config(2, 4, (6, 6), 4, (3, 3), pad=(1, 1), offsets="nonfinite"),
    Config(2, 4, (8, 9), 6, (2, 3), stride=(1, 2), pad=(1, 1), groups=2, dtype=torch.float64),
]
QUICK = [CONFIGS[0], CONFIGS[1], CONFIGS[3], CONFIGS[6]]  # the default suite's share of the table


def _assert_close(got: np.ndarray, expected: torch.Tensor) -> None:
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), expected)


def _plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# -- the function body ------------------------------------------------------------------------


def body_model(params: tuple[int, ...], dtype: torch.dtype, opset: int) -> onnx.ModelProto:
    """One onnx_custom::DeformConv2d node (inputs with symbolic dims) and its embedded body."""
    node = helper.make_node(
        "DeformConv2d",
        NAMES,
        ["y"],
        domain="onnx_custom",
        name="dcn",
        **dict(zip(ATTRS, params, strict=True)),
    )
    elem = ELEM[dtype]
    shapes = [["N", "C", "H", "W"], ["Co", "Cg", "kh", "kw"], ["N", "O", "Ho", "Wo"], None, ["Co"]]
    inputs = [helper.make_tensor_value_info(n, elem, s) for n, s in zip(NAMES, shapes, strict=True)]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(
        graph,
        ir_version=8,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("onnx_custom", 1)],
    )
    return embed_functions(model)


@pytest.mark.parametrize(
    "opset", [11, 13, 18]
)  # EyeLike attribute reads + Cast; Constant refs; CastLike
@pytest.mark.parametrize(("node", "inputs", "outputs"), onnx_backend_cases())
def test_body_on_onnx_backend_cases(node: Any, inputs: Any, outputs: Any, opset: int) -> None:
    args = op_args_from_onnx(node, inputs)
    if args is None:
        pytest.skip("asymmetric pads: torchvision's schema has one pad per axis")
    model = body_model(tuple(int(a) for a in args[5:]), torch.float32, opset)
    feeds = {n: t.numpy() for n, t in zip(NAMES, args[:5], strict=True)}
    _assert_close(_plain_session(model).run(None, feeds)[0], torch.from_numpy(outputs[0]))
    _assert_close(ReferenceEvaluator(model).run(None, feeds)[0], torch.from_numpy(outputs[0]))  # type: ignore[index]


def _sizes(cfg: Config) -> list[tuple[int, int, int]]:
    """The config's own size, then a larger batch and image, then a zero batch."""
    h, w = cfg.hw
    return [(cfg.n, h, w), (cfg.n + 2, h + 3, w + 2), (0, h, w)]


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.id)
def test_body_matches_eager(cfg: Config, opset: int) -> None:
    model = body_model(cfg.params(), cfg.dtype, opset)
    session = _plain_session(model)
    for seed, (n, h, w) in enumerate(_sizes(cfg)):
        if n == 0 and opset < 14:
            continue  # Reshape reads a 0 as "copy this dim" before allowzero (opset 14)
        tensors = cfg.tensors(n, h, w, seed)
        (got,) = session.run(None, {k: t.numpy() for k, t in zip(NAMES, tensors, strict=True)})
        _assert_close(got, cfg.eager(tensors))


def test_body_in_onnx_reference_matches_eager() -> None:
    cfg = CONFIGS[1]
    tensors = cfg.tensors(cfg.n, *cfg.hw)
    feeds = {k: t.numpy() for k, t in zip(NAMES, tensors, strict=True)}
    for opset in (11, 18):
        _assert_close(
            ReferenceEvaluator(body_model(cfg.params(), cfg.dtype, opset)).run(None, feeds)[0],  # type: ignore[index]
            cfg.eager(tensors),
        )


# -- the "standard" variant translation -------------------------------------------------------


class _Op(torch.nn.Module):
    def __init__(self, params: tuple[int, ...]) -> None:
        super().__init__()
        self.params = params

    def forward(self, x, w, offset, mask, bias):  # type: ignore[no-untyped-def]
        return OP(x, w, offset, mask, bias, *self.params)


STANDARD = onnx_custom.default_registry().with_variants("standard")


def export_standard(
    params: tuple[int, ...],
    tensors: tuple[torch.Tensor, ...],
    exporter: str,
    opset: int,
    dynamic: bool = True,
) -> onnx.ModelProto:
    auto = torch.export.Dim.AUTO
    spatial = {0: auto, 2: auto, 3: auto}
    shapes = (
        (spatial, None, spatial, spatial if params[-1] else {0: auto}, None) if dynamic else None
    )
    proto = onnx_custom.export(
        _Op(params),
        tensors,
        exporter=exporter,
        opset=opset,
        registry=STANDARD,
        input_names=NAMES,
        dynamic_shapes=shapes,
    )
    assert not [n for n in proto.graph.node if n.domain or n.op_type == "DeformConv"]
    return proto


def _run_standard(proto: onnx.ModelProto, tensors: tuple[torch.Tensor, ...]) -> np.ndarray:
    session = _plain_session(proto)
    feeds = dict(zip(NAMES, (t.numpy() for t in tensors), strict=True))
    # an unused mask (use_mask=False) may be pruned from the graph inputs
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize(("node", "inputs", "outputs"), onnx_backend_cases())
def test_standard_variant_on_onnx_backend_cases(
    node: Any, inputs: Any, outputs: Any, opset: int, exporter: str
) -> None:
    args = op_args_from_onnx(node, inputs)
    if args is None:
        pytest.skip("asymmetric pads: torchvision's schema has one pad per axis")
    proto = export_standard(
        tuple(int(a) for a in args[5:]), args[:5], exporter, opset, dynamic=False
    )
    _assert_close(_run_standard(proto, args[:5]), torch.from_numpy(outputs[0]))


def _check_standard(cfg: Config, exporter: str, opset: int) -> None:
    h, w = cfg.hw
    # export at batch >= 2 (torch.export specialises a batch of 1), run there and at batch 1
    # with another image size
    sizes = [(cfg.n + 1, h, w), (1, h + 3, w + 2)]
    proto = export_standard(cfg.params(), cfg.tensors(*sizes[0]), exporter, opset)
    for seed, size in enumerate(sizes):
        tensors = cfg.tensors(*size, seed=seed)
        _assert_close(_run_standard(proto, tensors), cfg.eager(tensors))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("cfg", QUICK, ids=lambda c: c.id)
def test_standard_variant_matches_eager(cfg: Config, exporter: str) -> None:
    _check_standard(cfg, exporter, 11 if exporter == "torchscript" else 18)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("opset", list(range(11, 19)))
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.id)
def test_standard_variant_matches_eager_every_opset(cfg: Config, opset: int, exporter: str) -> None:
    _check_standard(cfg, exporter, opset)


def test_standard_variant_is_opt_in_and_stops_at_opset_19() -> None:
    cfg = CONFIGS[0]
    tensors = cfg.tensors(cfg.n, *cfg.hw)
    default = onnx_custom.export(_Op(cfg.params()), tensors, exporter="torchscript", opset=11)
    assert [n.op_type for n in default.graph.node if n.domain] == ["DeformConv2d"]
    at19 = onnx_custom.export(
        _Op(cfg.params()), tensors, exporter="torchscript", opset=19, registry=STANDARD
    )
    assert [n.op_type for n in at19.graph.node if n.op_type.startswith("Deform")] == ["DeformConv"]


def test_standard_variant_below_opset_11_is_refused() -> None:
    cfg = CONFIGS[0]
    with pytest.raises(
        SymbolicError,
        match=r"standard-op deform_conv2d needs opset >= 11, got 10.*fix: export at opset >= 11",
    ):
        onnx_custom.export(
            _Op(cfg.params()),
            cfg.tensors(cfg.n, *cfg.hw),
            exporter="torchscript",
            opset=10,
            registry=STANDARD,
        )

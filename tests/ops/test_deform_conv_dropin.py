"""``onnx_custom.ops.DeformConv2d`` / ``deform_conv2d`` as drop-ins for torchvision's: signatures,
parameter init, TorchScript, an article-style DCN model exported by changing only its import
line, and (where torchvision's compiled ops load) identical results to torchvision."""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest
import torch
from test_deform_conv_reference import Geometry, reference_deform_conv2d

import onnx_custom
from onnx_custom.ops import DeformConv2d, deform_conv2d
from onnx_custom.ops.deform_conv import (
    DeformConv2dError,
    load_extension,
    torchvision_unavailable_reason,
)
from onnx_custom.symbolics.deform_conv import torchvision_ops_available

needs_torchvision = pytest.mark.skipif(
    not torchvision_ops_available(),
    reason=torchvision_unavailable_reason() or "torchvision's ops load",
)


@pytest.fixture(scope="module", autouse=True)
def _extension() -> None:
    load_extension()


# torchvision.ops' signatures, written out (torchvision's ops do not load here, and the point is
# that user code written against these names and defaults keeps working).
TORCHVISION_FUNCTION = [
    "input",
    "offset",
    "weight",
    "bias",
    "stride",
    "padding",
    "dilation",
    "mask",
]
TORCHVISION_DEFAULTS = {
    "bias": None,
    "stride": (1, 1),
    "padding": (0, 0),
    "dilation": (1, 1),
    "mask": None,
}
TORCHVISION_MODULE = [
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "bias",
]
TORCHVISION_MODULE_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "bias": True}


def test_signatures_are_torchvisions() -> None:
    fn = inspect.signature(deform_conv2d).parameters
    assert list(fn) == TORCHVISION_FUNCTION
    assert {k: fn[k].default for k in TORCHVISION_DEFAULTS} == TORCHVISION_DEFAULTS
    init = inspect.signature(DeformConv2d.__init__).parameters
    assert list(init)[1:] == TORCHVISION_MODULE
    assert {k: init[k].default for k in TORCHVISION_MODULE_DEFAULTS} == TORCHVISION_MODULE_DEFAULTS
    assert list(inspect.signature(DeformConv2d.forward).parameters) == [
        "self",
        "input",
        "offset",
        "mask",
    ]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        pytest.param((8, 6, 3), {}, id="c8_co6_k3"),
        pytest.param(
            (8, 4, (3, 2)),
            {"stride": 2, "padding": (1, 0), "dilation": (2, 1), "groups": 2},
            id="c8_co4_k3x2_s2_p10_d21_g2",
        ),
        pytest.param((4, 4, 1), {"bias": False}, id="c4_co4_k1_nobias"),
    ],
)
def test_parameters_and_init_are_conv2ds(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # torchvision initializes DeformConv2d exactly as nn.Conv2d (kaiming_uniform_(a=sqrt(5)),
    # bias uniform(+-1/sqrt(fan_in))): with one seed both modules draw identical parameters.
    torch.manual_seed(3)
    ours = DeformConv2d(*args, **kwargs)
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(*args, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in conv.named_parameters()]
    for (name, p), (_, q) in zip(ours.named_parameters(), conv.named_parameters(), strict=True):
        assert torch.equal(p, q), name
    for attr in (
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "groups",
        "in_channels",
        "out_channels",
    ):
        assert getattr(ours, attr) == getattr(conv, attr), attr


def test_constructor_rejects_groups_not_dividing() -> None:
    with pytest.raises(
        DeformConv2dError, match=r"in_channels=6 and out_channels=4 .* groups=4; pick"
    ):
        DeformConv2d(6, 4, 3, groups=4)


# -- TorchScript ---------------------------------------------------------------------------------

SCRIPT_CASES = [
    pytest.param(True, (1, 1), (1, 1), True, id="mask_bias_tuple_args"),
    pytest.param(False, 1, 1, True, id="nomask_bias_int_args"),
    pytest.param(True, (2, 1), (0, 1), False, id="mask_nobias_s21_p01"),
]


@pytest.mark.parametrize(("use_mask", "stride", "padding", "bias"), SCRIPT_CASES)
def test_scripted_function_and_module_match_eager(use_mask, stride, padding, bias) -> None:
    torch.manual_seed(0)
    module = DeformConv2d(4, 6, 3, stride=stride, padding=padding, bias=bias)
    scripted_module = torch.jit.script(module)
    scripted_fn = torch.jit.script(deform_conv2d)
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    ho, wo = (7 + 2 * ph - 3) // sh + 1, (6 + 2 * pw - 3) // sw + 1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 7, 6, generator=g, requires_grad=True)
    offset = torch.randn(2, 18, ho, wo, generator=g).requires_grad_()
    mask = torch.rand(2, 9, ho, wo, generator=g).requires_grad_() if use_mask else None
    eager = module(x, offset, mask)
    expected = reference_deform_conv2d(
        x.detach(),
        module.weight.detach(),
        offset.detach(),
        None if mask is None else mask.detach(),
        module.bias.detach() if module.bias is not None else torch.zeros(6),
        Geometry((sh, sw), (ph, pw), use_mask=use_mask),
    )
    torch.testing.assert_close(eager.detach(), expected, rtol=1e-5, atol=1e-5)
    leaves = [t for t in (x, offset, mask, module.weight) if t is not None]
    eager_grads = torch.autograd.grad(eager.sum(), leaves)
    for out in (
        scripted_module(x, offset, mask),
        scripted_fn(x, offset, module.weight, module.bias, stride, padding, 1, mask),
    ):
        assert torch.equal(out, eager)
        # Gradients flow through the scripted call exactly as through the eager one.
        grads = torch.autograd.grad(out.sum(), leaves)
        for got, want in zip(grads, eager_grads, strict=True):
            assert torch.equal(got, want)


def test_scripted_function_raises_the_wrappers_error() -> None:
    scripted = torch.jit.script(deform_conv2d)
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    with pytest.raises(torch.jit.Error, match=r"DeformConv2dError: .*offset channels 17 .* = 18"):
        scripted(x, torch.zeros(1, 17, 3, 3), w)
    with pytest.raises(DeformConv2dError, match=r"offset channels 17 .* = 18"):
        deform_conv2d(x, torch.zeros(1, 17, 3, 3), w)


@pytest.mark.parametrize("opset", [11, 19])
def test_scripted_module_exports_with_torchscript_exporter(opset: int) -> None:
    model = torch.jit.script(_OneConv().eval())
    args = _one_conv_inputs()
    proto = onnx_custom.export(model, args, exporter="torchscript", opset=opset)
    assert [n.op_type for n in proto.graph.node if "Deform" in n.op_type] == (
        ["DeformConv"] if opset >= 19 else ["DeformConv2d"]
    )
    assert onnx_custom.verify(_OneConv().eval(), args, proto, trials=2).passed


class _OneConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = DeformConv2d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.conv(x, offset, mask)


def _one_conv_inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    return (
        torch.randn(2, 4, 7, 6, generator=g),
        torch.randn(2, 18, 7, 6, generator=g),
        torch.rand(2, 9, 7, 6, generator=g),
    )


# -- an article-style DCN model: only its import line changes -----------------------------------

ARTICLE_SOURCE = '''
import torch
import torch.nn as nn
from torchvision.ops import DeformConv2d


class DeformableConvBlock(nn.Module):
    """DCNv2 block: a plain conv predicts offsets and modulation masks for a DeformConv2d."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=1):
        super().__init__()
        k = kernel_size * kernel_size
        self.offset_conv = nn.Conv2d(in_channels, 3 * k, kernel_size, stride, padding)
        nn.init.constant_(self.offset_conv.weight, 0.0)
        nn.init.constant_(self.offset_conv.bias, 0.0)
        self.deform_conv = DeformConv2d(in_channels, out_channels, kernel_size, stride, padding)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.offset_conv(x)
        o1, o2, mask = torch.chunk(out, 3, dim=1)
        offset = torch.cat((o1, o2), dim=1)
        mask = torch.sigmoid(mask)
        return self.relu(self.bn(self.deform_conv(x, offset, mask)))


class DCNNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True))
        self.block1 = DeformableConvBlock(16, 32, stride=2)
        self.block2 = DeformableConvBlock(32, 32)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.block2(self.block1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))
'''
TORCHVISION_IMPORT = "from torchvision.ops import DeformConv2d"
OUR_IMPORT = "from onnx_custom.ops import DeformConv2d"


def _load_article(source: str) -> types.ModuleType:
    module = types.ModuleType("article_dcn")
    exec(compile(source, "<article_dcn>", "exec"), module.__dict__)
    return module


def _trained_article_model(module: types.ModuleType) -> torch.nn.Module:
    torch.manual_seed(0)
    model = module.DCNNet()
    with torch.no_grad():  # as after training: offsets of about a pixel, non-trivial batch norm
        for block in (model.block1, model.block2):
            block.offset_conv.weight.normal_(0.0, 0.05)
            block.bn.running_mean.uniform_(-0.1, 0.1)
            block.bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


def test_article_source_changes_one_line() -> None:
    ported = ARTICLE_SOURCE.replace(TORCHVISION_IMPORT, OUR_IMPORT)
    changed = [
        (a, b)
        for a, b in zip(ARTICLE_SOURCE.splitlines(), ported.splitlines(), strict=True)
        if a != b
    ]
    assert changed == [(TORCHVISION_IMPORT, OUR_IMPORT)]


@pytest.mark.parametrize(
    ("exporter", "opset"),
    [("torchscript", 11), ("torchscript", 19), ("dynamo", 18), ("dynamo", 19)],
)
def test_article_model_exports_by_changing_its_import(exporter: str, opset: int) -> None:
    module = _load_article(ARTICLE_SOURCE.replace(TORCHVISION_IMPORT, OUR_IMPORT))
    model = _trained_article_model(module)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    proto = onnx_custom.export(model, (x,), exporter=exporter, opset=opset)
    deform = [n.op_type for n in proto.graph.node if "Deform" in n.op_type]
    assert deform == (["DeformConv"] * 2 if opset >= 19 else ["DeformConv2d"] * 2)
    report = onnx_custom.verify(model, (x,), proto, trials=3)
    assert report.passed


# -- torchvision itself, where its compiled ops load --------------------------------------------


@needs_torchvision
@pytest.mark.parametrize("use_mask", [True, False], ids=["mask", "nomask"])
def test_identical_to_torchvision_on_the_same_weights(use_mask: bool) -> None:
    import torchvision

    torch.manual_seed(5)
    theirs = torchvision.ops.DeformConv2d(8, 6, 3, stride=1, padding=1, groups=2)
    torch.manual_seed(5)
    ours = DeformConv2d(8, 6, 3, stride=1, padding=1, groups=2)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(p, q), name  # same init, same draws
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 8, 9, 7, generator=g, dtype=torch.float64)
    offset = torch.randn(2, 36, 9, 7, generator=g, dtype=torch.float64) * 1.5
    offset[:, :, ::3] = offset[:, :, ::3].round()  # samples on integer lines, -1 and H-1 included
    mask = torch.rand(2, 18, 9, 7, generator=g, dtype=torch.float64) if use_mask else None
    ours.double()
    theirs.double()
    results = []
    for module in (ours, theirs):
        leaves = [t.clone().requires_grad_() for t in (x, offset) + ((mask,) if use_mask else ())]  # type: ignore[union-attr]
        out = module(leaves[0], leaves[1], leaves[2] if use_mask else None)
        grads = torch.autograd.grad(out.sum(), [*leaves, module.weight, module.bias])
        results.append((out, grads))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b)


@needs_torchvision
def test_article_model_matches_torchvision_original() -> None:
    original = _trained_article_model(_load_article(ARTICLE_SOURCE))
    ported = _trained_article_model(
        _load_article(ARTICLE_SOURCE.replace(TORCHVISION_IMPORT, OUR_IMPORT))
    )
    ported.load_state_dict(original.state_dict())
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(ported(x), original(x))

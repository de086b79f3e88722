"""A user's own op named like the tutorials' (``mylib::my_add``, ``bev::bev_pool_v2``, nodes in
``custom::``) works beside ``import onnx_custom``: onnx-custom's shipped example ops live in its
own namespaces (torch ``onnx_custom::`` / ``onnx_custom_ext::``, ONNX domain ``onnx_custom``),
so nothing of ours is in the way. Two *user* registrations of one name still collide, loudly.

The user code below is written the way the torch custom-op tutorial writes it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.common.builtins import KERNEL_MODULES, SYMBOLIC_MODULES
from onnx_custom.runtime.registry import user_kernel_registry
from onnx_custom.translate.registry import default_registry

# Namespaces a user is taught to write (torch tutorials, mmcv/mmdeploy, BEVDet, the articles).
MMDEPLOY_MSDA = "mmdeploy::MMCVMultiScaleDeformableAttention"
TUTORIAL_NAMESPACES = (
    "mylib",
    "my_ops",
    "custom",
    "bev",
    "npu",
    "extension_cpp",
    "mmcv",
    "mmdeploy",
)
OURS = {"onnx_custom", "onnx_custom_ext"}
# The names onnx-custom used to ship under; a user's own op of that name must be the only one.
FORMERLY_SHIPPED = (
    "mylib::my_add",
    "mylib::multi_out",
    "mylib::multi_out3",
    "bev::bev_pool_v2",
    "npu::custom_linear",
    "my_ops::my_add",
)


def test_nothing_shipped_sits_in_a_tutorial_namespace() -> None:
    """Every built-in translation target, kernel, ONNX schema domain and native-library node is
    in our own namespace (or is torch's/torchvision's own op that we translate)."""
    import importlib

    import onnx.defs

    from onnx_custom.runtime.native import native_ops

    targets = {str(t).split("::")[0] for t in default_registry().targets() if t.name is not None}
    assert targets <= OURS | {"aten", "torchvision"}, targets
    # The one deliberate exception: msda's `mmdeploy` variant emits mmdeploy's own node, exactly as
    # their TensorRT plugin reads it, and we serve that node too (documented in the README).
    # What the built-in kernel modules ship (the default registry also holds what users, other
    # tests and the compile backend registered in this process).
    shipped = {
        name
        for module in KERNEL_MODULES
        for name in importlib.import_module(module).kernels.names()
    }
    names = shipped - {MMDEPLOY_MSDA}
    assert {name.split("::")[0] for name in names} == {"onnx_custom"}, names
    native = set(native_ops()) - {MMDEPLOY_MSDA}
    assert {name.split("::")[0] for name in native} == {"onnx_custom"}, native
    for module in (*SYMBOLIC_MODULES, *KERNEL_MODULES):
        importlib.import_module(module)
    # Only schemas of op types we ship: tests earlier in the same process register users' schemas
    # (a README example's custom::ScaleAdd), which is exactly what users may do.
    ours = {name.split("::")[1] for name in shipped}
    schemas = {
        f"{s.domain}::{s.name}" for s in onnx.defs.get_all_schemas_with_history() if s.name in ours
    } - {MMDEPLOY_MSDA}
    schema_domains = {name.split("::")[0] for name in schemas}
    assert not schema_domains & set(TUTORIAL_NAMESPACES), schema_domains & set(TUTORIAL_NAMESPACES)
    import pkgutil

    import onnx_custom.models

    for info in pkgutil.iter_modules(onnx_custom.models.__path__):
        importlib.import_module(f"onnx_custom.models.{info.name}")  # every example model's ops
    defined = set(torch._C._dispatch_get_all_op_names())
    assert not defined & set(FORMERLY_SHIPPED), defined & set(FORMERLY_SHIPPED)


def _forget(name: str) -> None:
    """Take a ``torch.library.custom_op`` back out of torch (what torch does on redefinition)."""
    from torch._library import custom_ops

    custom_ops.OPDEF_TO_LIB.pop(name)._destroy()


@pytest.fixture
def user_my_add() -> Iterator[object]:
    """The tutorial's op, defined after ``import onnx_custom``, with its translation (a custom
    node in the user's domain) and its ONNX Runtime kernel; all taken back afterwards."""
    import onnx_custom  # first, as a user script would

    @torch.library.custom_op("mylib::my_add", mutates_args=())
    def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + 3 * b  # not our 2a + b: a wrong lookup shows up in the numbers

    @my_add.register_fake
    def _(a, b):
        return torch.empty_like(a)

    @onnx_custom.symbolic("mylib::my_add", opset=9)
    def my_add_onnx(g, a, b):
        return g.op("mylib::my_add", a, b, beta=3.0)

    @onnx_custom.kernel(
        "mylib::my_add",
        inputs=["a", "b"],
        outputs=["y"],
        attrs={"beta": "float"},
        shape_fn="like:a",
    )
    def my_add_kernel(a, b, *, beta):
        return (a + np.asarray(beta, dtype=a.dtype) * b).astype(a.dtype)

    try:
        yield my_add
    finally:
        default_registry().remove("mylib::my_add", opset=9)
        user_kernel_registry().remove("mylib::my_add")
        _forget("mylib::my_add")


class UsesMyAdd(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.mylib.my_add(a.relu(), b) * 2


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.relu() + 3 * b) * 2  # independent of the op under test


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_user_mylib_my_add_exports_verifies_and_runs(
    user_my_add: object, exporter: str, tmp_path: Path
) -> None:
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    path = tmp_path / f"user_{exporter}.onnx"
    onnx_custom.export(
        UsesMyAdd(),
        (a, b),
        path,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        dynamic_shapes={"a": {0: "batch"}, "b": {0: "batch"}},
    )
    report = onnx_custom.verify(UsesMyAdd(), (a, b), path, trials=3)
    assert report.passed, report
    import onnx

    nodes = [
        (n.domain, n.op_type) for n in onnx.load(path).graph.node if n.domain not in ("", "ai.onnx")
    ]
    assert nodes == [("mylib", "my_add")]
    # Another batch size and a non-contiguous input, in our session with the user's kernel.
    big = torch.randn(5, 7).t()[:, :5]  # (7, 5) view with strides (1, 5)
    other = torch.randn(7, 5)
    (got,) = onnx_custom.InferenceSession(path).run(None, {"a": big.numpy(), "b": other.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), _reference(big, other))


@pytest.fixture
def user_bev_pool() -> Iterator[None]:
    """BEVDet's op name, defined by the user (here a toy sum-pool: only the name matters)."""

    @torch.library.custom_op("bev::bev_pool_v2", mutates_args=())
    def bev_pool_v2(depth: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return (depth.unsqueeze(-1) * feat).sum(dim=1)

    @bev_pool_v2.register_fake
    def _(depth, feat):
        return feat.new_empty(feat.shape[0], feat.shape[2])

    @onnx_custom.symbolic("bev::bev_pool_v2", opset=13)
    def bev_pool_v2_onnx(g, depth, feat):
        weighted = g.op("Mul", g.op("Unsqueeze", depth, g.constant([-1])), feat)
        return g.op("ReduceSum", weighted, g.constant([1]), keepdims=0)

    try:
        yield
    finally:
        default_registry().remove("bev::bev_pool_v2", opset=13)
        _forget("bev::bev_pool_v2")


class UsesBevPool(torch.nn.Module):
    def forward(self, depth: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return torch.ops.bev.bev_pool_v2(depth, feat)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_user_bev_pool_v2_name_is_the_users(
    user_bev_pool: None, exporter: str, tmp_path: Path
) -> None:
    depth, feat = torch.rand(2, 4), torch.randn(2, 4, 3)
    path = tmp_path / "bev.onnx"
    onnx_custom.export(UsesBevPool(), (depth, feat), path, exporter=exporter, opset=18)
    assert onnx_custom.verify(UsesBevPool(), (depth, feat), path).passed


# -- two user registrations of one name still collide -----------------------------------------


def _first(g, a, b):
    return g.op("Add", a, b)


def _second(g, a, b):
    return g.op("Sub", a, b)


def _kernel_one(a, b):
    return a + b


def _kernel_two(a, b):
    return a - b


COLLISIONS = [
    (
        "translation",
        onnx_custom.SymbolicError,
        [
            "A different translation for mylib::my_add at opset 9",
            "_first",
            "received",
            "_second",
            "Fix: pass replace=True",
        ],
    ),
    (
        "kernel",
        onnx_custom.KernelError,
        [
            "kernel 'mylib::my_add' is already registered",
            "_kernel_one",
            "received",
            "_kernel_two",
            "fix: pass replace=True",
        ],
    ),
]


@pytest.mark.parametrize(("what", "error", "phrases"), COLLISIONS, ids=[c[0] for c in COLLISIONS])
def test_two_user_registrations_of_one_name_collide(
    what: str, error: type, phrases: list[str]
) -> None:
    if what == "translation":
        register = functools.partial(onnx_custom.symbolic, "mylib::my_add", opset=9)
        first, second, undo = (
            _first,
            _second,
            functools.partial(default_registry().remove, "mylib::my_add", opset=9),
        )
    else:
        register = functools.partial(
            onnx_custom.kernel, "mylib::my_add", inputs=["a", "b"], outputs=["y"]
        )
        first, second, undo = (
            _kernel_one,  # type: ignore[assignment]
            _kernel_two,  # type: ignore[assignment]
            functools.partial(user_kernel_registry().remove, "mylib::my_add"),
        )
    register()(first)
    try:
        with pytest.raises(error) as info:
            register()(second)
    finally:
        undo()
    for phrase in phrases:
        assert phrase in str(info.value), (phrase, str(info.value))

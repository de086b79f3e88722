"""KernelRegistry / KernelSpec / default registry: declaration rules and typed errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import onnx_custom.runtime as rt
from onnx_custom.errors import KernelError, SymbolicError
from onnx_custom.runtime import KernelRegistry, KernelSpec, TensorInfo, broadcast_shapes
from onnx_custom.runtime import registry as kernel_mod


def _add(a, b, *, alpha):
    return alpha * a + b


@pytest.mark.parametrize("name", ["custom::Foo", "com.example::Foo", "a.b.c::op_1", "my-lib::X"])
def test_valid_names(name: str) -> None:
    reg = KernelRegistry()
    reg.kernel(name, inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)
    spec = reg[name]
    assert f"{spec.domain}::{spec.op_type}" == name


@pytest.mark.parametrize(
    "name",
    [
        "Foo",
        "custom:Foo",
        "::Foo",
        "custom::",
        "custom::1x",
        "com..x::Foo",
        "ai.onnx::Relu",
        "::Relu",
        "com.microsoft::Gelu",
        3,
    ],
)
def test_bad_names_raise_symbolic_error(name: object) -> None:
    reg = KernelRegistry()
    with pytest.raises(SymbolicError, match="domain"):
        reg.kernel(name, inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)  # type: ignore[arg-type]


def test_duplicate_raises_unless_replace() -> None:
    reg = KernelRegistry()
    reg.kernel("t::A", inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)
    with pytest.raises(KernelError, match="already registered.*replace=True"):
        reg.kernel("t::A", inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)
    reg.kernel(
        "t::A", inputs=["a", "b"], outputs=["y"], attrs={"alpha": ("float", 1.0)}, replace=True
    )(_add)
    assert not reg["t::A"].attrs[0].required


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attrs": {"alpha": "double"}}, "expected one of int, float"),
        ({"attrs": {"alpha": ("float", "x")}}, "default of attribute 'alpha' must be a float"),
        ({"attrs": {"beta": "float"}}, "does not accept attribute"),
        ({"inputs": ["a", "b b"]}, "bad input name"),
        ({"inputs": ["a*", "b"]}, "variadic input 'a\\*' must be the last"),
        ({"inputs": ["a", "a"]}, "duplicate"),
        ({"outputs": []}, "at least one output"),
        ({"dtypes": ["float128"]}, "unknown dtype"),
        ({"dtypes": {"zz": ["float32"]}}, "not inputs/outputs"),
        ({"shape_fn": "nope"}, "shape_fn"),
        ({"tensor_type": "jax"}, "tensor_type"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_malformed_declarations(kwargs: dict, match: str) -> None:
    decl = {"inputs": ["a", "b"], "outputs": ["y"], "attrs": {"alpha": "float"}, **kwargs}
    with pytest.raises(SymbolicError, match=match):
        KernelRegistry().kernel("t::Bad", **decl)(_add)


def test_spec_is_frozen_and_renamable() -> None:
    reg = KernelRegistry()
    reg.kernel(
        "t::A",
        inputs=["a", "mask?", "rest*"],
        outputs=["y"],
        attrs={"alpha": "float"},
        dtypes={"a": ["float32"]},
    )(_add)
    spec = reg["t::A"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "x::Y"  # type: ignore[misc]
    assert [p.kind for p in spec.inputs] == ["required", "optional", "variadic"]
    assert spec.inputs[0].dtypes == ("float32",)
    alias = reg.alias("com.acme::MyA", "t::A")
    assert alias.fn is spec.fn and alias.domain == "com.acme" and alias.op_type == "MyA"


def test_copy_update_and_lookup() -> None:
    a = KernelRegistry()
    a.kernel("t::A", inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)
    b = a.copy()
    b.kernel("t::B", inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"})(_add)
    assert "t::B" not in a and len(b) == 2
    assert b.lookup("t", "A") is a["t::A"]
    with pytest.raises(KernelError, match="already registered"):
        b.update(KernelRegistry([dataclasses.replace(a["t::A"], doc="x")]))
    b.update(KernelRegistry([dataclasses.replace(a["t::A"], doc="x")]), replace=True)
    assert b["t::A"].doc == "x"
    with pytest.raises(KernelError, match="no kernel registered for 'nope::X'.*t::A"):
        a["nope::X"]


def test_default_registry_has_seed_and_user_kernels() -> None:
    reg = rt.default_kernel_registry()
    assert {"onnx_custom::my_add", "onnx_custom::multi_out"} <= set(reg.names())
    assert reg["onnx_custom::my_add"].out_mode and reg["onnx_custom::my_add"].function is not None
    try:
        rt.kernel("testuser::Twice", inputs=["x"], outputs=["y"])(lambda x: 2 * x)
        assert "testuser::Twice" in rt.default_kernel_registry()
        with pytest.raises(KernelError, match="built-in kernel"):
            rt.kernel(
                "onnx_custom::my_add", inputs=["a", "b"], outputs=["y"], attrs={"alpha": "float"}
            )(_add)
        # a copy: mutating it leaves the default alone
        reg2 = rt.default_kernel_registry()
        reg2.remove("onnx_custom::my_add")
        assert "onnx_custom::my_add" in rt.default_kernel_registry()
    finally:
        kernel_mod._user.remove("testuser::Twice")


def test_shape_rules_and_symbolic_broadcast() -> None:
    assert broadcast_shapes(("N", 3), (3,)) == ("N", 3)
    assert broadcast_shapes(("N", 1), (1, 4)) == ("N", 4)
    assert broadcast_shapes(("N", 3), None) is None
    assert broadcast_shapes(("N",), ("M",)) == (None,)
    with pytest.raises(ValueError, match="do not broadcast"):
        broadcast_shapes((2,), (3,))
    reg = KernelRegistry()
    reg.kernel(
        "t::B", inputs=["a", "b"], outputs=["y", "z"], shape_fn="broadcast", dtypes=["float32"]
    )(lambda a, b: (a, b))
    spec: KernelSpec = reg["t::B"]
    out = spec.infer([TensorInfo(np.float32, ("N", 1)), TensorInfo(np.float32, (4,))], {})
    assert out == [TensorInfo(np.float32, ("N", 4))] * 2
    with pytest.raises(
        KernelError, match="input 0 \\('a'\\) has dtype int64; expected one of float32"
    ):
        spec.infer([TensorInfo(np.int64, (1,)), None], {})

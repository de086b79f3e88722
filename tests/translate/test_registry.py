from __future__ import annotations

import pytest

from onnx_custom import Registry, UnsupportedOpError, default_registry, symbolic
from onnx_custom.errors import SymbolicError


def _fn_a(g, x):  # type: ignore[no-untyped-def]
    return x


def _fn_b(g, x):  # type: ignore[no-untyped-def]
    return x


def test_highest_opset_not_above_export_opset_wins() -> None:
    reg = Registry()
    reg.symbolic("mylib::foo", opset=9)(_fn_a)
    reg.symbolic("mylib::foo", opset=13)(_fn_b)
    assert reg.lookup("mylib::foo", 9).fn is _fn_a
    assert reg.lookup("mylib::foo", 12).fn is _fn_a
    assert reg.lookup("mylib::foo", 13).fn is _fn_b
    assert reg.lookup("mylib::foo", 20).fn is _fn_b


def test_below_every_opset_names_the_available_opsets() -> None:
    reg = Registry()
    reg.symbolic("mylib::foo", opset=9)(_fn_a)
    with pytest.raises(UnsupportedOpError, match=r"opset 7.*from opset \[9\]") as info:
        reg.lookup("mylib::foo", 7, exporter="torchscript")
    assert info.value.missing == ("mylib::foo",)
    with pytest.raises(UnsupportedOpError, match="No translation registered"):
        reg.lookup("mylib::bar", 18)


def test_duplicate_raises_unless_replace() -> None:
    reg = Registry()
    reg.symbolic("mylib::foo", opset=9)(_fn_a)
    with pytest.raises(SymbolicError, match="already registered.*replace=True"):
        reg.symbolic("mylib::foo", opset=9)(_fn_b)
    reg.symbolic("mylib::foo", opset=9, replace=True)(_fn_b)
    assert reg.lookup("mylib::foo", 9).fn is _fn_b


def test_same_definition_twice_is_harmless() -> None:
    # What a module imported twice (under two names) does.
    reg = Registry()
    reg.symbolic("mylib::foo", opset=9)(_fn_a)
    reg.symbolic("mylib::foo", opset=9)(_fn_a)
    assert len(reg) == 1


def test_overload_falls_back_to_op_entries() -> None:
    reg = Registry()
    reg.symbolic("mylib::foo", opset=1)(_fn_a)
    assert reg.lookup("mylib::foo.default", 18).fn is _fn_a
    reg.symbolic("mylib::foo.default", opset=1)(_fn_b)
    assert reg.lookup("mylib::foo.default", 18).fn is _fn_b


def test_variants() -> None:
    reg = Registry()
    reg.symbolic("mylib::foo", opset=1)(_fn_a)
    reg.symbolic("mylib::foo", opset=1, variant="custom")(_fn_b)
    assert reg.lookup("mylib::foo", 18).fn is _fn_a
    assert reg.with_variants("custom").lookup("mylib::foo", 18).fn is _fn_b
    with pytest.raises(SymbolicError, match="Unknown variant"):
        reg.with_variants("nope")


def test_copy_does_not_touch_default() -> None:
    default = default_registry()
    before = len(default)
    mine = default.copy()
    symbolic("mylib::only_in_copy", opset=1, registry=mine)(_fn_a)
    assert len(default) == before
    assert "mylib::only_in_copy" in mine and "mylib::only_in_copy" not in default


@pytest.mark.parametrize("opset", [0, -1, "9", True])
def test_bad_opset(opset: object) -> None:
    with pytest.raises(SymbolicError, match="opset must be a positive int"):
        Registry().symbolic("mylib::foo", opset=opset)(_fn_a)  # type: ignore[arg-type]


def test_not_callable() -> None:
    with pytest.raises(SymbolicError, match="must be callable"):
        Registry().symbolic("mylib::foo")(42)  # type: ignore[arg-type]


def test_default_registry_has_builtins() -> None:
    reg = default_registry()
    assert "aten::asinh" in reg
    assert reg.lookup("aten::asinh", 9).opset == 9

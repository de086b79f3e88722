"""The registry keeps its entries sorted and grouped once (lookups no longer sort every entry):
every change (add, replace, remove, a copy's own additions) is seen by the next lookup."""

from __future__ import annotations

from typing import Any

import pytest

from onnx_custom import Registry, UnsupportedOpError
from onnx_custom.translate.names import normalize_target
from onnx_custom.translate.registry import SymbolicEntry


def _fn_a(g: Any, x: Any) -> Any:
    return g.op("Neg", x)


def _fn_b(g: Any, x: Any) -> Any:
    return g.op("Abs", x)


def _fn_c(g: Any, x: Any) -> Any:
    return g.op("Relu", x)


def test_lookups_see_every_change() -> None:
    reg = Registry()
    reg.symbolic("vsnap::f", opset=9)(_fn_a)
    assert reg.lookup("vsnap::f", 17).fn is _fn_a  # builds the grouped view
    reg.symbolic("vsnap::f", opset=13)(_fn_b)
    assert reg.lookup("vsnap::f", 17).fn is _fn_b
    assert reg.lookup("vsnap::f", 12).fn is _fn_a
    reg.symbolic("vsnap::f", opset=13, replace=True)(_fn_c)
    assert reg.lookup("vsnap::f", 17).fn is _fn_c
    reg.remove("vsnap::f", opset=13)
    assert reg.lookup("vsnap::f", 17).fn is _fn_a
    assert [e.opset for e in reg.entries_for("vsnap::f")] == [9]
    reg.remove("vsnap::f", opset=9)
    with pytest.raises(UnsupportedOpError, match="No translation registered for vsnap::f"):
        reg.lookup("vsnap::f", 17)
    assert list(reg) == [] and reg.targets() == []


def test_iteration_is_sorted_and_overloads_fall_back() -> None:
    reg = Registry()
    reg.symbolic("vsnap::z", opset=11)(_fn_a)
    reg.symbolic("vsnap::a", opset=13)(_fn_b)
    reg.symbolic("vsnap::a", opset=9)(_fn_c)
    assert [(str(e.target), e.opset) for e in reg] == [
        ("vsnap::a", 9),
        ("vsnap::a", 13),
        ("vsnap::z", 11),
    ]
    assert [str(t) for t in reg.targets()] == ["vsnap::a", "vsnap::z"]
    assert reg.lookup("vsnap::a.default", 17).fn is _fn_b  # ns::op.overload -> ns::op entries
    assert "vsnap::z" in reg and "vsnap::q" not in reg


def test_entries_for_returns_a_copy_and_copies_are_independent() -> None:
    reg = Registry()
    reg.symbolic("vsnap::f", opset=9)(_fn_a)
    listed = reg.entries_for("vsnap::f")
    listed.clear()  # the caller's list, not the registry's grouped view
    assert [e.fn for e in reg.entries_for("vsnap::f")] == [_fn_a]
    other = reg.copy()
    other.add(SymbolicEntry(normalize_target("vsnap::f"), 13, _fn_b))
    assert reg.lookup("vsnap::f", 17).fn is _fn_a and other.lookup("vsnap::f", 17).fn is _fn_b

"""Every error type a user may catch lives in `onnx_custom.errors` and is reachable from
`onnx_custom`."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import onnx_custom
import onnx_custom.errors as errors

# Subclasses onnxruntime's own Fail so code catching ORT's errors keeps working: it needs ORT.
OUTSIDE_THE_CATALOG = {"onnx_custom.runtime.failures.KernelRunError"}


def _all_error_classes() -> set[type]:
    for info in pkgutil.walk_packages(onnx_custom.__path__, "onnx_custom."):
        if info.name.endswith((".cli", ".__main__")):
            continue
        importlib.import_module(info.name)
    found: set[type] = set()
    todo: list[type] = [errors.OnnxCustomError]
    while todo:
        cls = todo.pop()
        sub: type
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("onnx_custom") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_error_class_is_in_the_catalog() -> None:
    strays = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in _all_error_classes()
        if c.__module__ != "onnx_custom.errors"
        and f"{c.__module__}.{c.__qualname__}" not in OUTSIDE_THE_CATALOG
    )
    assert not strays, (
        f"define these in onnx_custom/errors.py (and re-export where they were): {strays}"
    )


@pytest.mark.parametrize("name", sorted(errors.__all__))
def test_catalog_names_are_errors_reachable_from_the_package(name: str) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, errors.OnnxCustomError)
    assert getattr(onnx_custom, name) is cls


def test_kernel_run_error_is_reachable_from_the_package() -> None:
    from onnx_custom.runtime.failures import KernelRunError

    assert onnx_custom.KernelRunError is KernelRunError
    assert issubclass(KernelRunError, errors.KernelError)

"""`quiet_torch` silences torch's exporter loggers below ERROR inside the block and restores
them exactly after; it changes levels without clearing every logger's cache, so
these check what ``logging`` answers (``isEnabledFor``, whose results loggers cache) before,
inside and after, for existing loggers, loggers created inside the block and user loggers."""

from __future__ import annotations

import logging
import warnings

import pytest

from onnx_custom.common.torch_chatter import quiet_torch

QUIETED = [
    "torch.onnx",
    "torch.onnx._internal.exporter._core",
    "onnxscript.optimizer",
    "onnx_ir.passes",
]
UNTOUCHED = ["torch._dynamo", "my_project.export", "onnx_custom"]


@pytest.mark.parametrize(
    "parent_level",
    [logging.NOTSET, logging.DEBUG, logging.CRITICAL],
    ids=["notset", "debug", "critical"],
)
def test_levels_inside_and_after(parent_level: int) -> None:
    parent = logging.getLogger("torch.onnx")
    before = parent.level
    parent.setLevel(parent_level)
    try:
        expected_after = {
            n: logging.getLogger(n).isEnabledFor(logging.WARNING) for n in QUIETED + UNTOUCHED
        }  # fills the caches
        with quiet_torch():
            for name in QUIETED:
                assert not logging.getLogger(name).isEnabledFor(logging.WARNING), name
                assert logging.getLogger(name).isEnabledFor(logging.CRITICAL), name
            fresh = logging.getLogger("torch.onnx._internal.created_inside_the_block")
            assert not fresh.isEnabledFor(logging.WARNING)
            for name in UNTOUCHED:
                assert (
                    logging.getLogger(name).isEnabledFor(logging.WARNING) == expected_after[name]
                ), name
        assert parent.level == parent_level
        for name, enabled in expected_after.items():
            assert logging.getLogger(name).isEnabledFor(logging.WARNING) == enabled, name
        assert fresh.isEnabledFor(logging.WARNING) == (parent_level <= logging.WARNING)
    finally:
        parent.setLevel(before)


def test_levels_restored_when_the_block_raises() -> None:
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    with pytest.raises(RuntimeError, match="inside"), quiet_torch():
        raise RuntimeError("inside")
    assert [logger.level for logger in loggers] == levels
    assert logging.getLogger("torch.onnx._internal.exporter").isEnabledFor(logging.WARNING) == (
        logging.getLogger("torch.onnx._internal.exporter").getEffectiveLevel() <= logging.WARNING
    )


def test_a_logger_that_replaced_its_placeholder_is_quieted() -> None:
    """``logging`` first registers a parent of a new logger as a PlaceHolder and later replaces it
    in place by the Logger (the count of loggers stays the same): that Logger's cached answer
    must still be cleared inside the block."""
    logging.getLogger("torch.onnx._quiet_test_parent.child")  # the parent is a PlaceHolder now
    with quiet_torch():  # remembers the quieted family as it is
        pass
    parent = logging.getLogger("torch.onnx._quiet_test_parent")  # replaces the PlaceHolder
    expected = parent.isEnabledFor(logging.WARNING)  # fills its cache outside the block
    with quiet_torch():
        assert not parent.isEnabledFor(logging.WARNING)
    assert parent.isEnabledFor(logging.WARNING) == expected


def _filterwarnings_result(before: list[object]) -> list[object]:
    """The filters the three public calls `quiet_torch` stands for would leave (reference)."""
    import torch

    from onnx_custom.common.torch_chatter import LIBRARY_MODULES, OUR_CALLERS

    with warnings.catch_warnings():
        warnings.filters[:] = before  # type: ignore[index]
        warnings.filterwarnings("ignore", module=LIBRARY_MODULES)
        warnings.filterwarnings("ignore", module=OUR_CALLERS)
        warnings.filterwarnings(
            "ignore", category=torch.jit.TracerWarning, module=r"onnx_custom\.ops\."
        )
        return list(warnings.filters)


def _comparable(filters: list[object]) -> list[tuple[object, ...]]:
    return [tuple(getattr(f, "pattern", f) for f in entry) for entry in filters]  # type: ignore[attr-defined]


@pytest.mark.parametrize("user_filters", [0, 2], ids=["no-user-filters", "two-user-filters"])
def test_warning_filters_as_filterwarnings_writes_them(user_filters: int) -> None:
    """The precompiled filters are the public calls' result, in front of the user's, and the
    user's filters are back after the block (also the ones added inside it are gone)."""
    with warnings.catch_warnings():
        for i in range(user_filters):
            warnings.filterwarnings("error", message=f"user filter {i}")
        before = list(warnings.filters)
        with quiet_torch():
            inside = list(warnings.filters)
            warnings.filterwarnings("ignore", message="added inside")
        assert _comparable(inside) == _comparable(_filterwarnings_result(before))
        assert warnings.filters == before


def test_library_warning_silenced_inside_only() -> None:
    """A warning attributed to a torch module is dropped inside the block, shown outside."""

    def warn_as_torch() -> None:
        warnings.warn_explicit(
            "torch chatter", UserWarning, "torch/onnx/x.py", 1, module="torch.onnx.x", registry={}
        )

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_torch():
            warn_as_torch()
        assert not seen
        warn_as_torch()
        assert [str(w.message) for w in seen] == ["torch chatter"]

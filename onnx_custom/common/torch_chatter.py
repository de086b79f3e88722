"""Torch's exporter chatter silenced during *our* exports, never the user's own warnings.

A zoo run printed 104 "torchvision is not installed. Skipping torchvision::..." lines (torch's
dynamo exporter logs them on every export), FutureWarnings/DeprecationWarnings from torch
internals, and, on any TorchScript export error, a full "Torch IR graph at exception" dump on
stderr (torch 2.13's ``setup_onnx_logging`` tests a function object for truth, so its log is
always on). Inside `quiet_torch`:

- warnings *attributed to* torch, onnxscript, onnx_ir, onnx or onnxruntime modules (or to our
  adapters, the callers torch's warnings point at) are ignored;
  a warning raised by the user's model or translation is attributed to the user's module and
  still reaches them (TracerWarnings point at the user's line too, so they stay);
- the ``torch.onnx``, ``onnxscript`` and ``onnx_ir`` loggers drop records below ERROR;
- the TorchScript exporter's ONNX log is on only with ``verbose=True``.

Everything is restored on exit, also when the export raises.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from onnx_custom.common.torch_onnx import optional_torchscript_exporter

__all__ = ["LIBRARY_MODULES", "OUR_CALLERS", "drop_fake_tensor_logs_of_typed_errors", "quiet_torch"]

# Modules whose own warnings are implementation chatter during an export.
# copy/copyreg: torch's pytree warns from inside deepcopy, attributed to the stdlib module.
LIBRARY_MODULES = r"(torch|onnxscript|onnx_ir|onnx|onnxruntime|torchvision|copy|copyreg)(\..*)?$"
# Our modules that call torch's exporter APIs: torch warns with a stacklevel pointing at its
# caller (e.g. "You are using the legacy TorchScript-based ONNX export"), which is one of these;
# they raise no warnings of their own.
OUR_CALLERS = r"onnx_custom\.exporter\.\w+$"  # every module of the export stage
_LOGGERS = ("torch.onnx", "onnxscript", "onnx_ir")


class _TypedErrorFilter(logging.Filter):
    """Drops a log record carrying one of our typed errors: it is raised to the caller anyway."""

    def filter(self, record: logging.LogRecord) -> bool:
        from onnx_custom.errors import OnnxCustomError

        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, OnnxCustomError)


_FILTER = _TypedErrorFilter()


def drop_fake_tensor_logs_of_typed_errors() -> None:
    """torch's FakeTensorMode logs every TypeError a fake kernel raises ("fake tensor raised
    TypeError" and a traceback, at ERROR) and then re-raises it. Our `InvalidArgumentError` is a
    TypeError, so a bad argument seen while exporting printed a screenful before the one-line
    error; only records carrying our typed errors are dropped (idempotent)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


@contextlib.contextmanager
def _onnx_log_only_when_verbose(verbose: bool = False) -> Iterator[None]:
    was = bool(torch._C._jit_is_onnx_log_enabled())
    torch._C._jit_set_onnx_log_enabled(was or bool(verbose))
    try:
        yield
    finally:
        torch._C._jit_set_onnx_log_enabled(was)


_ts_utils: Any = optional_torchscript_exporter("utils")


@contextlib.contextmanager
def _patched_onnx_logging() -> Iterator[None]:
    if _ts_utils is None:  # pragma: no cover - other torch versions
        yield
        return
    original: Any = _ts_utils.setup_onnx_logging
    _ts_utils.setup_onnx_logging = _onnx_log_only_when_verbose
    try:
        yield
    finally:
        _ts_utils.setup_onnx_logging = original


# The filters `quiet_torch` puts in front, as warnings.filterwarnings("ignore", ...) writes them
# (action, message, category, module, lineno), in the order it would leave them. Compiled once:
# three filterwarnings calls (a regex-cache lookup, a scan for a duplicate and a list insert
# each) cost time on every export, with the caches cold after torch's own export.
_FILTERS = [
    # Our shipped ops' modules branch on static sizes while torch traces them (msda's 2- or
    # 4-value reference points, as mmcv's module does); the trace keeps them as constants,
    # which is right, and torch's TracerWarning about it says nothing the user can act on.
    ("ignore", None, torch.jit.TracerWarning, re.compile(r"onnx_custom\.ops\."), 0),
    ("ignore", None, Warning, re.compile(OUR_CALLERS), 0),
    ("ignore", None, Warning, re.compile(LIBRARY_MODULES), 0),
]


def _ignore_library_warnings() -> None:
    """Put `_FILTERS` in front of the current filters (inside ``catch_warnings``)."""
    mutated = getattr(warnings, "_filters_mutated", None)  # CPython's cache invalidation
    if mutated is None:  # pragma: no cover - another implementation: the public calls
        for _, _, category, module, _ in reversed(_FILTERS):
            warnings.filterwarnings("ignore", category=category, module=module.pattern)
        return
    filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list in every CPython
    filters[:0] = _FILTERS
    mutated()


def _quieted_loggers() -> list[logging.Logger]:
    """The `_LOGGERS` (getLogger takes logging's lock on every call; a logger, once made, stays)."""
    known = logging.Logger.manager.loggerDict
    loggers = [known.get(name) for name in _LOGGERS]
    if all(isinstance(logger, logging.Logger) for logger in loggers):
        return loggers  # type: ignore[return-value]
    return [logging.getLogger(name) for name in _LOGGERS]


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Silence torch's exporter warnings, logs and graph dumps inside the block (see module doc)."""
    loggers = _quieted_loggers()
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), _patched_onnx_logging():
        _ignore_library_warnings()
        _set_levels(loggers, [max(logger.getEffectiveLevel(), logging.ERROR) for logger in loggers])
        try:
            yield
        finally:
            _set_levels(loggers, levels)


# (how many loggers existed, every entry in the trees of _LOGGERS: Loggers and PlaceHolders):
# loggers are only ever added, but a PlaceHolder is replaced by its Logger in place (same count),
# so the entries are checked by identity too
_family: tuple[int, list[tuple[str, object]]] = (-1, [])


def _family_of_quieted() -> list[logging.Logger]:
    global _family
    registered = logging.Logger.manager.loggerDict
    count, entries = _family
    if count != len(registered) or any(
        registered.get(name) is not entry for name, entry in entries
    ):
        prefixes = tuple(f"{name}." for name in _LOGGERS)
        entries = [
            (name, entry)
            for name, entry in list(registered.items())  # a copy: other threads may add loggers
            if name in _LOGGERS or name.startswith(prefixes)
        ]
        _family = (len(registered), entries)
    return [entry for _, entry in entries if isinstance(entry, logging.Logger)]


def _set_levels(loggers: list[logging.Logger], levels: list[int]) -> None:
    """``logger.setLevel(level)`` for each pair, but clearing only the level caches that can
    change: those of the `_LOGGERS` trees. ``setLevel`` clears the cache of every logger in the
    process (300 once torch's exporters ran, refilled as torch logs), which was a quarter of a
    small export's own overhead."""
    for logger, level in zip(loggers, levels, strict=True):
        logger.level = level
    for logger in _family_of_quieted():
        cache = getattr(logger, "_cache", None)  # CPython's per-logger isEnabledFor cache
        if not isinstance(cache, dict):  # another logging implementation: its own (full) clear
            loggers[-1].setLevel(levels[-1])
            return
        cache.clear()

"""What a TorchScript export knew about where the file's nodes came from, kept with the file.

torch's tracer warns when the model's Python code turns a tensor into a Python value ("Converting
a tensor to a Python boolean might cause the trace to be incorrect", "Using len to get tensor
shape"): the trace fixed a decision the model makes from data, so the file computes what the
example inputs made the code do. When a file later disagrees with the model, those warnings are
the first suspects, so `recorded` collects them during the export (the user still sees them as
before) and `write` stores them, deduplicated with their file:line and count, in the file's
``metadata_props["onnx_custom.tracer_warnings"]``: `read` gives them back to whoever checks the
file, in this process or another.

The tracer also knows the Python line that called each op: the export asks torch for it (its
``verbose`` doc strings) and `keep_sources` moves it into each node's
``metadata_props["onnx_custom.source"]``, the model code's frames innermost first
(``"/path/modeling.py:207;/path/modeling.py:1580"``, torch's own frames left out), so a
localization can pair the file's values with the eager model's by the line and module that
made them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import onnx
import torch

from onnx_custom.common.torch_onnx import optional_torchscript_exporter

__all__ = [
    "METADATA_KEY",
    "SOURCE_KEY",
    "TracerWarningRecord",
    "keep_sources",
    "read",
    "recorded",
    "source_frames",
    "sources_requested",
    "write",
]

METADATA_KEY = "onnx_custom.tracer_warnings"
SOURCE_KEY = "onnx_custom.source"
_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): \S+$")

# Code whose warnings are not the user's: torch's own modules and ours (quiet_torch drops them).
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (torch.__file__, os.path.dirname(__file__))  # torch/, onnx_custom/
    if path
)


@dataclasses.dataclass(frozen=True)
class TracerWarningRecord:
    """One distinct TracerWarning: where the model's code raised it, what it said, how often."""

    file: str
    line: int
    message: str
    count: int = 1

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def describe(self) -> str:
        times = f" (x{self.count})" if self.count > 1 else ""
        return f"{self.where}: {self.message}{times}"


@contextlib.contextmanager
def recorded() -> Iterator[list[TracerWarningRecord]]:
    """Collect the TracerWarnings raised inside the block (deduplicated when it exits).

    Every TracerWarning raised by the model's code is recorded, also one the user's filters
    ignore or Python's once-per-line registry would hide on a second export of the same model;
    those the filters would show still go on to ``warnings.showwarning``.
    """
    raw: list[tuple[str, int, str]] = []
    found: list[TracerWarningRecord] = []
    previous = warnings.showwarning
    filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list in every CPython
    before = list(filters)

    def show(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if not issubclass(category, torch.jit.TracerWarning):
            previous(message, category, filename, lineno, *rest)
            return
        if _library(filename):
            return
        text = str(message).strip().splitlines()[0] if str(message).strip() else ""
        raw.append((filename, int(lineno), text.split(". ")[0].rstrip(".") + "."))
        if _shown(before, category, filename, str(message)):
            previous(message, category, filename, lineno, *rest)

    # in front: every TracerWarning reaches `show`, which passes on what the filters would show
    always = ("always", None, torch.jit.TracerWarning, None, 0)
    filters.insert(0, always)
    _filters_mutated()
    warnings.showwarning = show  # type: ignore[assignment]
    try:
        yield found
    finally:
        warnings.showwarning = previous
        with contextlib.suppress(ValueError):
            filters.remove(always)
        _filters_mutated()
        found.extend(_deduplicated(raw))


def _shown(filters: list[Any], category: type[Warning], filename: str, text: str) -> bool:
    """Would the first filter matching this warning show it? (The module is known here only
    by its file's name, so a filter naming a module matches that name's last part.)"""
    module = os.path.splitext(os.path.basename(filename))[0]
    for action, message, kind, mod, _line in filters:
        if not issubclass(category, kind):
            continue
        if message is not None and not message.match(text):
            continue
        if mod is not None and not (mod.match(module) or mod.pattern.endswith(module)):
            continue
        return action != "ignore"
    return True


def _filters_mutated() -> None:
    mutated = getattr(warnings, "_filters_mutated", None)  # CPython's cache invalidation
    if mutated is not None:
        mutated()


def _library(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def _deduplicated(raw: list[tuple[str, int, str]]) -> list[TracerWarningRecord]:
    counts: dict[tuple[str, int, str], int] = {}
    for key in raw:
        counts[key] = counts.get(key, 0) + 1
    return [TracerWarningRecord(f, line, m, n) for (f, line, m), n in counts.items()]


def write(model: onnx.ModelProto, found: list[TracerWarningRecord]) -> None:
    """Store ``found`` in ``model``'s metadata (replacing an earlier entry; none when empty)."""
    for i, entry in enumerate(model.metadata_props):
        if entry.key == METADATA_KEY:
            del model.metadata_props[i]
            break
    if found:
        payload = json.dumps([dataclasses.asdict(r) for r in found])
        model.metadata_props.add(key=METADATA_KEY, value=payload)


def read(model: onnx.ModelProto) -> list[TracerWarningRecord]:
    """The TracerWarnings stored in ``model``'s metadata (empty when none or unreadable)."""
    for entry in model.metadata_props:
        if entry.key == METADATA_KEY:
            try:
                return [TracerWarningRecord(**r) for r in json.loads(entry.value)]
            except (ValueError, TypeError):
                return []
    return []


@contextlib.contextmanager
def sources_requested(log: bool) -> Iterator[None]:
    """Inside the block ``torch.onnx.export(..., verbose=True)`` writes each node's source frames
    in its doc string without printing the graph (unless ``log``: the user's own ``verbose``)."""
    utils = optional_torchscript_exporter("utils")
    if utils is None:  # pragma: no cover - a torch without the TorchScript exporter
        yield
        return
    original = utils.setup_onnx_logging
    utils.setup_onnx_logging = lambda verbose: original(log)
    try:
        yield
    finally:
        utils.setup_onnx_logging = original


def keep_sources(model: onnx.ModelProto, *, keep_doc_strings: bool = False) -> None:
    """Each node's doc string (torch's source frames) -> its ``onnx_custom.source`` metadata."""
    for node in model.graph.node:
        if not node.doc_string:
            continue
        frames = source_frames(node.doc_string)
        if frames:
            node.metadata_props.add(key=SOURCE_KEY, value=";".join(frames))
        if not keep_doc_strings:
            node.doc_string = ""


def source_frames(doc_string: str) -> list[str]:
    """``file:line`` of the model code's frames in a TorchScript doc string, innermost first."""
    frames = []
    for line in doc_string.splitlines():
        match = _FRAME.match(line.strip())
        if match is None:
            continue
        if _library(match["file"]):
            continue
        frames.append(f"{match['file']}:{match['line']}")
    return frames

"""Progress of long work (exports and verifies of real models take tens of seconds).

On a terminal (stderr is a TTY) one live line on stderr says the stage (``export: torchscript
trace of Model``, ``verify: trial 2/5: onnxruntime``), rewritten in place and cleared when the
work ends. Nothing is written when stderr is not a terminal (a pipe, a file, a CI log), when
``ONNX_CUSTOM_PROGRESS=0``, or when the caller passes ``progress=False``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["ProgressArg", "TerminalProgress", "progress_for"]

ProgressArg = Callable[[str], None] | bool | None


class TerminalProgress:
    """One live status line on a terminal stream (``\\r`` + erase to the end of the line)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    def __call__(self, text: str) -> None:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            columns = 0
        columns = columns if columns > 20 else 100  # a terminal that reports no size
        line = text if len(text) < columns else text[: max(columns - 4, 10)] + "..."
        self.stream.write(f"\r\x1b[K{line}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        """Erase the line (the terminal is left as it was before the work)."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _enabled() -> bool:
    return os.environ.get("ONNX_CUSTOM_PROGRESS", "1").strip().lower() not in ("0", "false", "no")


def progress_for(progress: ProgressArg = None) -> Callable[[str], None] | None:
    """What to report progress to: the caller's callable; None for ``False`` (quiet); for None,
    a `TerminalProgress` on stderr when it is a terminal (and progress is not turned off)."""
    if progress is False:
        return None
    if callable(progress):
        return progress
    stream: Any = sys.stderr
    try:
        terminal = bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        terminal = False
    return TerminalProgress(stream) if terminal and _enabled() else None


def close(progress: Callable[[str], None] | None) -> None:
    """Erase a `TerminalProgress` line (nothing for other reporters)."""
    if isinstance(progress, TerminalProgress):
        progress.close()

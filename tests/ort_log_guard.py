"""A pytest plugin: a test that lets an ONNX Runtime log line reach stderr fails.

Our sessions log nothing by default (`onnx_custom.runtime.ort_log_level`): a failure reaches the
caller once, as a typed error. A line like ``[E:onnxruntime:, sequential_executor.cc:677
ExecuteKernel]`` on stderr therefore means a session was built without our quiet options, in the
library or in a test. This plugin inspects, for every phase (setup, call, teardown) of every test:

- the phase's captured stderr (pytest's default ``--capture=fd`` catches ORT's C++ logger, which
  writes to file descriptor 2, and the stderr of child processes that inherit it);
- the output of every child process the test captured itself (``subprocess.run(...,
  capture_output=True)``, ``check_output``, ``Popen.communicate``: both streams, since tests may
  merge stderr into stdout),

and turns a passing phase that printed an ORT log line into a failure naming the lines. A test
that asks ORT for its logs on purpose (``$ONNX_CUSTOM_ORT_LOG_SEVERITY``, a session with its own
``log_severity_level``) opts out with ``@pytest.mark.ort_logs``. Under ``-s``/``--capture=no``
nothing is captured and the guard sees only child processes' captured output.

Loaded by ``tests/conftest.py``; ``pytest -p ort_log_guard`` loads it elsewhere (its own test does).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["ORT_LOG_LINE", "ort_log_lines"]

# ORT's logger prefixes every line with "[<severity letter>:onnxruntime:<logger id>, <file:line>":
# V(erbose), I(nfo), W(arning), E(rror), F(atal); coloured lines start with an ANSI escape first.
ORT_LOG_LINE = re.compile(r"\[[VIWEF]:onnxruntime:")
MARKER = "ort_logs"

_child_output_lines: list[
    str
] = []  # ORT log lines seen in captured child-process output, this phase
_original_communicate = subprocess.Popen.communicate


def ort_log_lines(text: str | bytes | None) -> list[str]:
    """The lines of ``text`` that ORT's logger wrote."""
    if not text:
        return []
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [line for line in text.splitlines() if ORT_LOG_LINE.search(line)]


def _communicate_and_inspect(
    self: subprocess.Popen[Any], *args: Any, **kwargs: Any
) -> tuple[Any, Any]:
    out, err = _original_communicate(self, *args, **kwargs)
    _child_output_lines.extend(ort_log_lines(out) + ort_log_lines(err))
    return out, err


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: the test asks ONNX Runtime for its log lines on purpose; the ORT log guard "
        "(tests/ort_log_guard.py) lets them reach stderr",
    )
    subprocess.Popen.communicate = _communicate_and_inspect  # type: ignore[method-assign]


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen.communicate = _original_communicate  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    title = f"Captured stderr {report.when}"
    lines = [
        line for name, text in report.sections if name == title for line in ort_log_lines(text)
    ]
    lines += _child_output_lines
    _child_output_lines.clear()
    if not lines or item.get_closest_marker(MARKER) is not None:
        return
    shown = "\n".join(f"    {line.strip()}" for line in lines[:10])
    message = (
        f"ONNX Runtime log lines reached stderr during {report.when} ({len(lines)}"
        f" line(s)):\n{shown}\nA session was created without onnx_custom's quiet options"
        " (onnx_custom.runtime.ort_log_level.quiet_session_options). Build it with them, or mark"
        " the test @pytest.mark.ort_logs if it asks ORT for its logs on purpose."
    )
    if report.passed:
        report.outcome = "failed"
        report.longrepr = message
    else:
        report.sections.append(("ORT log guard", message))

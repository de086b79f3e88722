"""Progress of export and verify: one live line on a terminal's stderr (stage, trial i/n,
backend), nothing when stderr is a pipe, nothing when turned off."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.common.progress import TerminalProgress, progress_for

SCRIPT = textwrap.dedent(
    """
    import torch, onnx_custom

    class Small(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(2, 3)
    model = Small()
    proto = onnx_custom.export(model, (x,), exporter="torchscript", dynamic_shapes={"x": {0: "b"}})
    report = onnx_custom.verify(model, (x,), proto, backends=("onnxruntime", "reference"))
    print("passed" if report.passed else "failed")
    """
)


def _run(tmp_path: Any, *, terminal: bool, env: dict[str, str] | None = None) -> tuple[str, str]:
    """(stdout, stderr) of the script; stderr a pseudo-terminal or a pipe."""
    script = tmp_path / "progress_script.py"
    script.write_text(SCRIPT)
    environ = dict(os.environ, **(env or {}))
    if not terminal:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=environ, timeout=300
        )
        return done.stdout, done.stderr
    controller, device = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=device, env=environ
        )
        os.close(device)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the other side closed (Linux raises EIO)
                break
            if not chunk:
                break
            chunks.append(chunk)
        stdout = process.communicate(timeout=300)[0].decode()
    finally:
        os.close(controller)
    return stdout, b"".join(chunks).decode(errors="replace")


def test_a_terminal_shows_stage_trial_and_backend(tmp_path: Any) -> None:
    stdout, stderr = _run(tmp_path, terminal=True)
    assert stdout.strip() == "passed"
    assert "export: torchscript export of Small" in stderr
    assert "verify: opening sessions (onnxruntime, reference)" in stderr
    assert "verify: trial 1/" in stderr
    assert ": reference" in stderr and ": onnxruntime" in stderr
    assert stderr.rstrip("\r\n").endswith("\x1b[K")  # the line is erased at the end


@pytest.mark.parametrize(
    "terminal,env",
    [(False, {}), (True, {"ONNX_CUSTOM_PROGRESS": "0"})],
    ids=["stderr-a-pipe", "terminal-progress-off"],
)
def test_nothing_when_not_a_terminal_or_turned_off(
    tmp_path: Any, terminal: bool, env: dict[str, str]
) -> None:
    stdout, stderr = _run(tmp_path, terminal=terminal, env=env)
    assert stdout.strip() == "passed"
    assert "verify:" not in stderr and "export:" not in stderr and "\x1b[K" not in stderr


def test_progress_false_and_callables(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal:
        def __init__(self) -> None:
            self.text = ""

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            raise OSError

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("ONNX_CUSTOM_PROGRESS", raising=False)
    assert isinstance(progress_for(None), TerminalProgress)
    assert progress_for(False) is None
    lines: list[str] = []
    assert progress_for(lines.append) == lines.append
    model, x = torch.nn.ReLU(), torch.randn(2, 3)
    proto = onnx_custom.export(model, (x,), exporter="torchscript", progress=False)
    onnx_custom.verify(model, (x,), proto, progress=False)
    assert terminal.text == ""
    onnx_custom.verify(model, (x,), proto, progress=lines.append, trials=2)
    assert lines == ["verify: trial 1/2", "verify: trial 2/2"]  # a callable: one line a trial
    assert terminal.text == ""

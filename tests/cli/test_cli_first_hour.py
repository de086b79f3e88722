"""A new user's first hour at the command line: argument and path
mistakes are answered before torch is imported; an import error names the file that failed; a
model given inputs of the wrong rank fails with one line, not "unexpected RuntimeError".
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("onnx-custom"))

# Each row is a mistake the command line must answer without importing torch.
FAST_CASES = [
    (
        "verify/missing-onnx",
        ["verify", "my_add", "nosuch.onnx"],
        "ONNX file 'nosuch.onnx' does not exist",
    ),
    ("verify/onnx-is-dir", ["verify", "my_add", "."], "is a directory"),
    (
        "verify/missing-model-file",
        ["verify", "nosuch.py:M", "{onnx}"],
        "file 'nosuch.py' does not exist",
    ),
    (
        "verify/missing-import",
        ["verify", "my_add", "{onnx}", "--import", "nosuch_specs.yaml"],
        "--import: file 'nosuch_specs.yaml' does not exist",
    ),
    (
        "verify/rtol-alone",
        ["verify", "my_add", "{onnx}", "--rtol", "1e-3"],
        "expected both --rtol and --atol",
    ),
    (
        "export/missing-model-file",
        ["export", "nosuch.py:M", "-o", "{tmp}/o.onnx"],
        "file 'nosuch.py' does not exist",
    ),
    (
        "export/missing-out-dir",
        ["export", "my_add", "-o", "{tmp}/no/such/o.onnx"],
        "does not exist",
    ),
    (
        "export/missing-import",
        ["export", "my_add", "-o", "{tmp}/o.onnx", "--import", "./nosuch.py"],
        "--import: file './nosuch.py' does not exist",
    ),
    ("check/missing-model-file", ["check", "nosuch.py:M"], "file 'nosuch.py' does not exist"),
    ("inspect/missing-onnx", ["inspect", "nosuch.onnx"], "ONNX file 'nosuch.onnx' does not exist"),
]


@pytest.mark.parametrize(
    ("argv", "message"), [c[1:] for c in FAST_CASES], ids=[c[0] for c in FAST_CASES]
)
def test_path_and_flag_mistakes_fail_before_torch_loads(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In a fresh interpreter: the error comes back and torch was never imported."""
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"")  # exists; the row's mistake is elsewhere
    argv = [a.format(tmp=tmp_path, onnx=onnx) for a in argv]
    code = textwrap.dedent(f"""
        import sys
        from onnx_custom.cli.main import main
        rc = main({argv!r})
        print("torch imported:", "torch" in sys.modules, file=sys.stderr)
        sys.exit(rc)
        """)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "torch imported: False", proc.stderr
    assert len(lines) == 2 and message in lines[0], proc.stderr


def test_missing_file_answers_fast(tmp_path: Path) -> None:
    """`onnx-custom verify nosuch.onnx` took 3.4 s (torch first). The budget is 0.5 s on an idle
    machine; the assertion allows a loaded CI box 6x that, and torch alone takes longer."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run(
            [EXE, "verify", "my_add", "nosuch.onnx"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        best = min(best, time.perf_counter() - start)
        assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert best < 3.0, f"{best:.2f} s"


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


MODEL = """
    import torch
    import helper_{tag}

    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2
"""

# (id, text of the module the model file imports, what the one-line error must name)
IMPORT_CASES = [
    ("syntax-error", "def f(:\n    pass\n", "SyntaxError: invalid syntax"),
    (
        "raises-at-import",
        "VALUE = 1\nraise RuntimeError('helper is broken')\n",
        "RuntimeError: helper is broken",
    ),
    ("bad-torch-call", "import torch\nT = torch.zeros('a')\n", "TypeError: zeros()"),
]


@pytest.mark.parametrize(
    ("helper", "error"), [c[1:] for c in IMPORT_CASES], ids=[c[0] for c in IMPORT_CASES]
)
def test_import_error_blames_the_module_that_failed(
    helper: str, error: str, tmp_path: Path
) -> None:
    tag = error.split(":")[0].lower()
    model = _write(tmp_path, f"model_{tag}.py", MODEL.format(tag=tag))
    broken = _write(tmp_path, f"helper_{tag}.py", helper)
    proc = subprocess.run(
        [EXE, "export", f"{model}:M", "-o", str(tmp_path / "o.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"failed in {broken}, line " in line and error in line, line
    assert f"fix: correct {broken}" in line, line


def test_syntax_error_in_the_model_file_itself_names_it(tmp_path: Path) -> None:
    model = _write(tmp_path, "model_self.py", "def f(:\n    pass\n")
    proc = subprocess.run(
        [EXE, "export", f"{model}:M", "-o", str(tmp_path / "o.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert f"Importing {model} failed: SyntaxError: invalid syntax (line 1)" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["export", "deform_conv", "--input", "2x3"],
            "forward failed on the --input values ([2, 3]:float32): RuntimeError: Expected 3D",
        ),
        (
            ["export", "my_add", "--input", "2x3x4", "--input", "3"],
            "onnx_custom::my_add: expected a and b of the same shape",
        ),
    ],
    ids=["deform_conv-rank2", "my_add-ranks-differ"],
)
def test_export_with_wrong_rank_input_is_one_clear_line(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [EXE, *argv, "-o", str(tmp_path / "o.onnx")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, no torch log dump
    assert message in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
    assert not (tmp_path / "o.onnx").exists()

"""Bad command-line input: every case exits 2 with ONE line on stderr naming what was received,
what was expected and the fix (no traceback; ``--debug`` adds it).

Cases run in-process through ``main`` (a subprocess costs a torch import each); the cases that
used to print raw tracebacks also run as real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from onnx_custom.cli import main

USER_MODELS = {
    "syntax.py": "def broken(:\n    pass\n",
    "dependency.py": "import no_such_dependency_xyz\n",
    "raises.py": "raise RuntimeError('model file refuses to load')\n",
    "mymodel.py": textwrap.dedent("""
        import torch

        class MyModel(torch.nn.Module):
            def forward(self, x):
                return x + 1

        class NeedsArgs(torch.nn.Module):
            def __init__(self, width):
                super().__init__()
                self.width = width

            def forward(self, x):
                return x * self.width

        def returns_class():
            return MyModel

        def returns_function():
            return torch.relu

        def raises_on_build():
            raise ValueError("bad hyper-parameter 7")

        NUMBER = 3

        def example_inputs():
            return (torch.randn(2, 3),)
    """),
    "noexamples.py": textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return x
    """),
    "badexamples.py": textwrap.dedent("""
        import torch

        class Model(torch.nn.Module):
            def forward(self, x):
                return x

        def example_inputs():
            raise KeyError("no data")
    """),
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_bad_input")
    for name, text in USER_MODELS.items():
        (root / name).write_text(text)
    (root / "garbage.onnx").write_bytes(b"\x00this is not a protobuf\xff" * 8)
    (root / "bad_key.yaml").write_text('- op_name: "ytest::x"\n  op_type: 3\n')
    (root / "broken.yaml").write_text("a: [\n")
    (root / "a_folder").mkdir()
    return root


@pytest.fixture(scope="module")
def asinh_file(workdir: Path) -> Path:
    path = workdir / "asinh.onnx"
    assert (
        main(
            [
                "export",
                "asinh",
                "--exporter",
                "torchscript",
                "--opset",
                "17",
                "--dynamic",
                "-o",
                str(path),
            ]
        )
        == 0
    )
    return path


# (id, argv, text that must appear: the received value and the expected thing). {dir} is the
# module's work folder, {asinh} a valid exported file.
CASES: list[tuple[str, list[str], tuple[str, ...]]] = [
    (
        "missing-model-file",
        ["export", "nope.py:Model", "-o", "{dir}/x.onnx"],
        ("nope.py", "does not exist"),
    ),
    (
        "model-file-syntax-error",
        ["export", "syntax.py:Model", "-o", "{dir}/x.onnx"],
        ("syntax.py", "SyntaxError", "line 1"),
    ),
    (
        "model-file-missing-dependency",
        ["export", "dependency.py:Model", "-o", "{dir}/x.onnx"],
        ("no_such_dependency_xyz", "not installed"),
    ),
    (
        "model-file-raises",
        ["export", "raises.py:Model", "-o", "{dir}/x.onnx"],
        ("raises.py", "model file refuses to load"),
    ),
    (
        "module-spec-from-cwd",
        ["export", "mymodel:MyModel", "-o", "{dir}/x.onnx"],
        ("'mymodel:MyModel'", "mymodel.py:MyModel"),
    ),
    (
        "missing-attribute",
        ["export", "mymodel.py:Nope", "-o", "{dir}/x.onnx"],
        ("'Nope'", "MyModel"),
    ),
    (
        "class-needs-arguments",
        ["export", "mymodel.py:NeedsArgs", "-o", "{dir}/x.onnx"],
        ("NeedsArgs", "width", "without arguments"),
    ),
    (
        "factory-returns-class",
        ["export", "mymodel.py:returns_class", "-o", "{dir}/x.onnx"],
        ("class MyModel", "instance"),
    ),
    (
        "factory-returns-function",
        ["export", "mymodel.py:returns_function", "-o", "{dir}/x.onnx"],
        ("built a builtin_function_or_method", "torch.nn.Module"),
    ),
    (
        "spec-names-a-number",
        ["export", "mymodel.py:NUMBER", "-o", "{dir}/x.onnx"],
        ("names a int", "nn.Module class"),
    ),
    (
        "factory-raises",
        ["export", "mymodel.py:raises_on_build", "-o", "{dir}/x.onnx"],
        ("ValueError", "bad hyper-parameter 7"),
    ),
    (
        "missing-module",
        ["export", "no_such_pkg.mod:Model", "-o", "{dir}/x.onnx"],
        ("no_such_pkg", "installed module"),
    ),
    (
        "bad-input-shape",
        ["export", "asinh", "--input", "2y3", "-o", "{dir}/x.onnx"],
        ("'2y3'", "DIMS[:DTYPE]"),
    ),
    (
        "bad-input-dtype",
        ["export", "asinh", "--input", "2x3:float99", "-o", "{dir}/x.onnx"],
        ("float99", "float32"),
    ),
    (
        "input-count",
        ["export", "asinh", "--input", "2x3", "--input", "2x3", "-o", "{dir}/x.onnx"],
        ("got 2 --input(s)", "forward(x) takes 1"),
    ),
    (
        "input-too-large",
        ["export", "asinh", "--input", "100000x100000", "-o", "{dir}/x.onnx"],
        ("100000x100000", "at most"),
    ),
    (
        "no-example-inputs",
        ["export", "noexamples.py:Model", "-o", "{dir}/x.onnx"],
        ("no example_inputs()", "--input"),
    ),
    (
        "example-inputs-raise",
        ["export", "badexamples.py:Model", "-o", "{dir}/x.onnx"],
        ("KeyError", "no data"),
    ),
    (
        "output-folder-missing",
        ["export", "asinh", "-o", "{dir}/no/such/folder/x.onnx"],
        ("no/such/folder", "does not exist"),
    ),
    (
        "output-is-a-folder",
        ["export", "asinh", "-o", "{dir}/a_folder"],
        ("a_folder", "is a directory"),
    ),
    (
        "unknown-variant",
        ["export", "asinh", "--variant", "fastest", "-o", "{dir}/x.onnx"],
        ("'fastest'", "custom"),
    ),
    (
        "dynamic-without-dynamic-shapes",
        ["export", "mymodel.py:MyModel", "--dynamic", "-o", "{dir}/x.onnx"],
        ("--dynamic", "dynamic_shapes"),
    ),
    (
        "bad-exporter",
        ["export", "asinh", "--exporter", "onnxscript", "-o", "{dir}/x.onnx"],
        ("'onnxscript'", "choose from"),
    ),
    (
        "opset-above-dynamo-maximum",
        ["export", "asinh", "--opset", "99", "-o", "{dir}/x.onnx"],
        ("opset=99", "supports opsets"),
    ),
    (
        "opset-above-torchscript-maximum",
        ["check", "asinh", "--exporter", "torchscript", "--opset", "99"],
        ("99", "supports opsets"),
    ),
    (
        "opset-zero",
        ["export", "asinh", "--opset", "0", "-o", "{dir}/x.onnx"],
        ("--opset", "positive integer"),
    ),
    (
        "negative-seed",
        ["export", "asinh", "--seed", "-3", "-o", "{dir}/x.onnx"],
        ("-3", "seed in [0, 2**63)"),
    ),
    ("missing-output-flag", ["export", "asinh"], ("-o/--output", "required")),
    (
        "missing-onnx-file",
        ["verify", "asinh", "{dir}/missing.onnx"],
        ("missing.onnx", "does not exist"),
    ),
    ("onnx-is-a-folder", ["verify", "asinh", "{dir}/a_folder"], ("a_folder", "is a directory")),
    (
        "corrupt-onnx-file",
        ["verify", "asinh", "{dir}/garbage.onnx"],
        ("garbage.onnx", "not a valid ONNX model"),
    ),
    (
        "trials-zero",
        ["verify", "asinh", "{asinh}", "--trials", "0"],
        ("--trials", "positive integer, got 0"),
    ),
    (
        "rtol-alone",
        ["verify", "asinh", "{asinh}", "--rtol", "1e-3"],
        ("--rtol", "both --rtol and --atol"),
    ),
    (
        "negative-tolerance",
        ["verify", "asinh", "{asinh}", "--rtol", "-1", "--atol", "0"],
        ("'-1'", "non-negative"),
    ),
    (
        "shape-without-size",
        ["verify", "asinh", "{asinh}", "--shape", "batch"],
        ("'batch'", "NAME=SIZE"),
    ),
    (
        "shape-not-a-number",
        ["verify", "asinh", "{asinh}", "--shape", "batch=many"],
        ("'many'", "integer"),
    ),
    (
        "shape-unknown-dim",
        ["verify", "asinh", "{asinh}", "--shape", "height=5"],
        ("height", "batch"),
    ),
    (
        "shape-and-no-shape-trials",
        ["verify", "asinh", "{asinh}", "--shape", "batch=5", "--no-shape-trials"],
        ("--no-shape-trials", "one of them"),
    ),
    (
        "report-extension",
        ["verify", "asinh", "{asinh}", "--report", "{dir}/r.txt"],
        ("r.txt", ".md"),
    ),
    (
        "missing-import-file",
        ["inspect", "{asinh}", "--import", "{dir}/my_kernels.py"],
        ("my_kernels.py", "does not exist"),
    ),
    (
        "missing-import-module",
        ["ops", "--import", "no_such_kernels_pkg"],
        ("no_such_kernels_pkg", "installed module"),
    ),
    (
        "import-not-python",
        ["check", "asinh", "--import", "{dir}/garbage.onnx"],
        ("garbage.onnx", "Python"),
    ),
    ("inspect-missing-file", ["inspect", "{dir}/missing.onnx"], ("missing.onnx", "does not exist")),
    ("unknown-zoo-model", ["zoo", "no_such_model"], ("no_such_model", "asinh")),
    ("zoo-report-extension", ["zoo", "--report", "{dir}/z.txt"], ("z.txt", ".md")),
    ("empty-model-spec", ["check", ""], ("Empty model spec", "zoo name")),
    ("spec-without-module", ["check", ":Model"], ("':Model'", "no module before")),
    (
        "spec-attribute-not-a-name",
        ["check", "asinh:Not-A-Name"],
        ("'Not-A-Name'", "not a Python name"),
    ),
    (
        "seed-not-a-number",
        ["export", "asinh", "--seed", "abc", "-o", "{dir}/x.onnx"],
        ("'abc'", "integer seed"),
    ),
    (
        "unknown-backend",
        ["verify", "asinh", "{asinh}", "--backend", "tensorrt"],
        ("'tensorrt'", "choose from"),
    ),
    ("import-empty-name", ["ops", "--import", ""], ("empty name", "module path")),
    (
        "import-yaml-missing",
        ["ops", "--import", "{dir}/missing.yaml"],
        ("missing.yaml", "does not exist"),
    ),
    (
        "import-yaml-bad-key",
        ["ops", "--import", "{dir}/bad_key.yaml"],
        ("op_type", "received int 3"),
    ),
    (
        "import-yaml-not-yaml",
        ["ops", "--import", "{dir}/broken.yaml"],
        ("broken.yaml", "not valid YAML"),
    ),
    (
        "inspect-corrupt-file",
        ["inspect", "{dir}/garbage.onnx"],
        ("garbage.onnx", "not a valid ONNX model"),
    ),
    (
        "build-library-output-not-a-folder",
        ["build-library", "-o", "{dir}/mymodel.py/sub"],
        ("mymodel.py/sub", "writable folder"),
    ),
    ("unknown-command", ["exprot", "asinh"], ("'exprot'", "choose from")),
]


def _argv(argv: list[str], workdir: Path, asinh: Path | None) -> list[str]:
    return [a.format(dir=workdir, asinh=asinh) for a in argv]


def _assert_one_line(err: str, expected: tuple[str, ...]) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    for text in expected:  # what was received, and what was expected
        assert text in line, f"{text!r} missing from: {line}"
    assert "fix" in line.lower(), line
    assert "Traceback" not in line
    return line


@pytest.mark.parametrize(("argv", "expected"), [pytest.param(a, e, id=i) for i, a, e in CASES])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str],
    expected: tuple[str, ...],
    workdir: Path,
    request: pytest.FixtureRequest,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asinh = request.getfixturevalue("asinh_file") if any("{asinh}" in a for a in argv) else None
    capsys.readouterr()
    monkeypatch.chdir(workdir)
    assert main(_argv(argv, workdir, asinh)) == 2
    captured = capsys.readouterr()
    _assert_one_line(captured.err, expected)


def test_cases_cover_at_least_twenty_inputs() -> None:
    assert len(CASES) >= 20 and len({i for i, _, _ in CASES}) == len(CASES)


def test_every_case_message_has_no_raw_traceback_with_debug_off(
    workdir: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)
    assert main(["export", "raises.py:Model", "-o", str(workdir / "x.onnx"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1].startswith(
        "onnx-custom export: error:"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["export", "syntax.py:Model", "-o", "x.onnx"], ("SyntaxError",), id="syntax-error"
        ),
        pytest.param(
            ["export", "mymodel:MyModel", "-o", "x.onnx"],
            ("mymodel.py:MyModel",),
            id="module-spec-from-cwd",
        ),
        pytest.param(
            ["export", "mymodel.py:returns_class", "-o", "x.onnx"],
            ("instance",),
            id="class-not-instance",
        ),
    ],
)
def test_real_process_prints_one_line(
    argv: list[str], expected: tuple[str, ...], workdir: Path
) -> None:
    exe = Path(sys.executable).with_name("onnx-custom")
    env = dict(os.environ, PYTHONWARNINGS="default")
    result = subprocess.run(
        [str(exe), *argv], capture_output=True, text=True, cwd=workdir, env=env, timeout=300
    )
    assert result.returncode == 2, result
    _assert_one_line(result.stderr, expected)
    assert result.stdout == ""


def test_failed_verification_writes_nothing(tmp_path: Path) -> None:
    """`export --verify` verifies before writing: a mismatch leaves the previous file as it was.

    A real process: the wrong translation must not stay in this process's default registry.
    """
    out = tmp_path / "m.onnx"
    out.write_bytes(b"previous")
    (tmp_path / "wrong.py").write_text(
        textwrap.dedent("""
        import torch
        import onnx_custom

        # Wrong on purpose: asinh exported as sinh.
        onnx_custom.symbolic("aten::asinh", opset=9, variant="wrong")(lambda g, x: g.op("Sinh", x))

        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.asinh(x)

        def example_inputs():
            return (torch.randn(3, 4),)
    """)
    )
    exe = Path(sys.executable).with_name("onnx-custom")
    argv = [
        "export",
        "wrong.py",
        "--exporter",
        "torchscript",
        "--opset",
        "17",
        "--variant",
        "wrong",
        "--verify",
        "-o",
        str(out),
    ]
    result = subprocess.run(
        [str(exe), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 1, result
    assert "Verification FAILED" in result.stdout and "was not written" in result.stderr
    assert out.read_bytes() == b"previous"


def test_report_path_is_checked_before_the_run(tmp_path: Path) -> None:
    """A --report that cannot be written fails at once (exit 2), not after a long zoo run."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnx_custom.cli",
            "zoo",
            "asinh",
            "--report",
            str(blocker / "zoo.md"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "is a file, not a folder" in result.stderr and "[1/" not in result.stdout

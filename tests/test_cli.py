"""The onnx-custom command line, run in-process (plus one real subprocess for the entry point)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import onnx
import pytest

from onnx_custom.cli import main


def test_export_then_verify(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "asinh.onnx"
    assert main(["export", "models/asinh.py:Model", "--exporter", "torchscript", "--opset", "9", "-o", str(out), "--verify"]) == 0
    assert [n.op_type for n in onnx.load(str(out)).graph.node if n.op_type != "Constant"] == ["Asinh", "Mul"]
    assert main(["verify", "asinh", str(out), "--trials", "3"]) == 0
    assert "Verification PASSED" in capsys.readouterr().out


def test_export_custom_variant_with_input_specs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "my_add.onnx"
    code = main(["export", "onnx_custom.models.my_add:Model", "--input", "2x4:float32", "--input", "2x4", "--variant", "custom", "-o", str(out)])
    assert code == 0
    assert ("custom", "my_add") in {(n.domain, n.op_type) for n in onnx.load(str(out)).graph.node}


def test_dynamic_export(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "d.onnx"
    assert main(["export", "asinh", "--dynamic", "-o", str(out)]) == 0
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_param


def test_ops_lists_registry(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "aten::asinh" in out and "custom::my_add" in out


def test_zoo_subset(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["zoo", "asinh"]) == 0
    out = capsys.readouterr().out
    assert "asinh" in out and "torchscript-opset9" in out and "0 failed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "models/nope.py:Model", "-o", "x.onnx"], "does not exist"),
        (["export", "asinh:Nope", "-o", "x.onnx"], "has no attribute 'Nope'"),
        (["export", "no_such_pkg.mod:Model", "-o", "x.onnx"], "Cannot import model spec"),
        (["export", "asinh", "--input", "2y3", "-o", "x.onnx"], "Bad input spec"),
        (["export", "asinh", "--input", "2x3:float99", "-o", "x.onnx"], "Unknown dtype"),
        (["verify", "asinh", "missing.onnx"], "does not exist"),
        (["zoo", "no_such_model"], "Unknown zoo model"),
    ],
    ids=["missing-file", "missing-attr", "missing-module", "bad-shape", "bad-dtype", "missing-onnx", "unknown-zoo"],
)
def test_bad_input_exits_2_with_message(argv: list[str], message: str, capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path) if argv[1].startswith("models/nope") else None
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_console_script_entry_point() -> None:
    exe = shutil.which("onnx-custom") or str(__import__("pathlib").Path(sys.executable).parent / "onnx-custom")
    result = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "zoo" in result.stdout

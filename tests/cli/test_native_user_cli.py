"""build-library --spec / package: bad command lines exit 2 with one line naming the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).parent / "onnx-custom")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["build-library", "--name", "acme"], "--name needs --spec"),
        (["build-library", "--cmake", "{dir}/cm"], "--cmake needs --spec"),
        (
            ["build-library", "--spec", "{dir}/missing.yaml"],
            "op spec file '{dir}/missing.yaml' does not exist",
        ),
        (["build-library", "--spec", "{dir}/plain.yaml", "-o", "{dir}/dist"], "have no C++ kernel"),
        (["package", "{dir}/missing.onnx", "-o", "{dir}/pkg"], "does not exist"),
        (["package", "{dir}/plain.onnx", "-o", "{dir}/pkg"], "has no custom nodes"),
    ],
    ids=[
        "name-without-spec",
        "cmake-without-spec",
        "missing-spec",
        "spec-without-native",
        "missing-model",
        "no-custom-nodes",
    ],
)
def test_bad_command_lines(tmp_path: Path, args: list[str], expected: str) -> None:
    import onnx
    from onnx import TensorProto, helper

    (tmp_path / "plain.yaml").write_text(
        '- {op_name: "p::q", op_type: Q, input_desc: [{name: x}], output_desc: [{name: y, shape:'
        ' "like:x"}]}\n'
    )
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(graph), tmp_path / "plain.onnx")
    proc = subprocess.run(
        [EXE, *(a.format(dir=tmp_path) for a in args)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert expected.format(dir=tmp_path) in proc.stderr, proc.stderr
    assert (
        not (tmp_path / "dist").exists()
        and not (tmp_path / "pkg").exists()
        and not (tmp_path / "cm").exists()
    )

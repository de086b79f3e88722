"""examples/run_model.c: the DCN model (opset 11, onnx_custom::DeformConv2d) run from plain C.

The test builds the program with the system C compiler, exports models/deform_conv.py with
onnx_custom.export (dynamic batch/height/width), runs the program at a size other than the
export size with ONNX Runtime's own libonnxruntime.so (from the wheel) and our library, and
compares its output file with PyTorch eager using the verifier's (torch.testing) tolerances.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import onnx_custom
from onnx_custom.models import deform_conv as dcn
from onnx_custom.runtime.native import library_path
from onnx_custom.runtime.shim_build import abi_include_dir

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "examples" / "run_model.c"


def write_tensor(path: Path, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a, dtype="<f4")
    path.write_bytes(
        b"OCTENSOR" + struct.pack("<Q", a.ndim) + np.asarray(a.shape, "<i8").tobytes() + a.tobytes()
    )


def read_tensor(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    assert raw[:8] == b"OCTENSOR"
    rank = struct.unpack("<Q", raw[8:16])[0]
    dims = np.frombuffer(raw[16 : 16 + 8 * rank], "<i8")
    return np.frombuffer(raw[16 + 8 * rank :], "<f4").reshape(dims)


def ort_library() -> Path:
    folder = Path(onnxruntime.__file__).parent / "capi"
    found = sorted(folder.glob("libonnxruntime.so*"))
    if not found:
        pytest.skip(f"no libonnxruntime.so in {folder}")
    return found[-1]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip(f"C compiler {cc!r} not found")
    out = tmp_path_factory.mktemp("example") / "run_model"
    cmd = [
        cc,
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        f"-I{abi_include_dir()}",
        str(SOURCE),
        "-ldl",
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


# The dynamo exporter cannot lower dynamic shapes below opset 15 (it says so): static at 11.
@pytest.mark.parametrize(
    ("exporter", "opset", "dynamic"),
    [("torchscript", 11, True), ("dynamo", 11, False), ("dynamo", 18, True)],
)
def test_c_program_runs_the_dcn_model_like_eager(
    program: Path, tmp_path: Path, exporter: str, opset: int, dynamic: bool
) -> None:
    model = dcn.Model().eval()
    onnx_path = tmp_path / "dcn.onnx"
    proto = onnx_custom.export(
        model,
        dcn.example_inputs(),
        onnx_path,
        exporter=exporter,
        opset=opset,
        dynamic_shapes=dcn.dynamic_shapes if dynamic else None,
    )
    assert [n.op_type for n in proto.graph.node if n.domain == "onnx_custom"] == [
        "DeformConv2d"
    ] * 2
    # a size other than the export size when the file allows it
    shape = (3, 3, 40, 48) if dynamic else tuple(dcn.example_inputs()[0].shape)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    write_tensor(tmp_path / "x.tensor", x.numpy())
    proc = subprocess.run(
        [
            str(program),
            str(ort_library()),
            str(library_path()),
            str(onnx_path),
            str(tmp_path / "y.tensor"),
            str(tmp_path / "x.tensor"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ONNX_CUSTOM_THREADS": "2"},
    )
    assert proc.returncode == 0, proc.stderr
    with torch.inference_mode():
        expected = model(x)
    torch.testing.assert_close(
        torch.from_numpy(read_tensor(tmp_path / "y.tensor").copy()), expected
    )


def test_c_program_reports_errors(program: Path, tmp_path: Path) -> None:
    write_tensor(tmp_path / "x.tensor", np.zeros((1, 3, 8, 8), np.float32))
    missing = subprocess.run(
        [
            str(program),
            str(ort_library()),
            str(tmp_path / "nope.so"),
            "m.onnx",
            str(tmp_path / "y"),
            str(tmp_path / "x.tensor"),
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "registering the custom-op library" in missing.stderr
    (tmp_path / "bad.tensor").write_bytes(b"garbage")
    bad = subprocess.run(
        [
            str(program),
            str(ort_library()),
            str(library_path()),
            "m.onnx",
            str(tmp_path / "y"),
            str(tmp_path / "bad.tensor"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "not a valid tensor file" in bad.stderr
    usage = subprocess.run([str(program)], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr

"""``onnx-custom package`` carries a model's external data: the packaged folder alone (the original
export deleted) runs in plain ONNX Runtime with the packaged library and matches eager."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines onnx_custom::my_add
from onnx_custom.cli.package_model import package_model
from onnx_custom.errors import ModelLoadError

EXPORTERS = ("torchscript", "dynamo")


class WeightedAdd(torch.nn.Module):
    """my_add with a weight well above the 1 KiB that goes to external data."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4 * 512).reshape(4, 512))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x * self.weight, x)


RUN = """
import sys, glob, numpy as np, onnxruntime as ort
so = ort.SessionOptions()
so.register_custom_ops_library(glob.glob("./*.so")[0])
sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
np.save("out.npy", sess.run(None, {sess.get_inputs()[0].name: np.load("x.npy")})[0])
"""


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_packaged_external_data_runs_without_the_original(exporter: str, tmp_path: Path) -> None:
    model = WeightedAdd().eval()
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(0))
    source = tmp_path / "export"
    source.mkdir()
    registry = onnx_custom.default_registry().with_variants("custom")
    onnx_custom.export(
        model, (x,), source / "m.onnx", exporter=exporter, registry=registry, external_data=True
    )
    assert (
        onnx.load(str(source / "m.onnx"), load_external_data=False)
        .graph.initializer[0]
        .external_data
    )  # really external
    written = package_model(source / "m.onnx", tmp_path / "pkg")
    data = [p for p in written if p.name.endswith(".data")]
    assert len(data) == 1 and data[0].parent == tmp_path / "pkg", written
    shutil.rmtree(source)  # the package must not lean on the original folder
    np.save(tmp_path / "pkg" / "x.npy", x.numpy())
    proc = subprocess.run(
        [sys.executable, "-c", RUN, "m.onnx"],
        cwd=tmp_path / "pkg",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = model(x).detach()
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "pkg" / "out.npy")), expected)


def test_data_outside_the_models_folder_is_refused(tmp_path: Path) -> None:
    model = WeightedAdd().eval()
    x = torch.randn(4, 512)
    registry = onnx_custom.default_registry().with_variants("custom")
    proto = onnx_custom.export(model, (x,), exporter="torchscript", registry=registry)
    (tmp_path / "sub").mkdir()
    # onnx.save refuses '..' itself; hand-written files (or other tools) can still point there
    onnx.save(
        proto,
        str(tmp_path / "sub" / "m.onnx"),
        save_as_external_data=True,
        location="outside.bin",
        size_threshold=0,
    )
    (tmp_path / "sub" / "outside.bin").rename(tmp_path / "outside.bin")
    pointer = onnx.load(str(tmp_path / "sub" / "m.onnx"), load_external_data=False)
    for tensor in pointer.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../outside.bin"
    (tmp_path / "sub" / "m.onnx").write_bytes(pointer.SerializeToString())
    with pytest.raises(ModelLoadError, match=r"outside the model's folder.*fix"):
        package_model(tmp_path / "sub" / "m.onnx", tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()

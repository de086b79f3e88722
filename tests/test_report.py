"""Reports: environment, per-output statistics, log-scale error histograms, localization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # defines mylib::my_add and mylib::multi_out
from onnx_custom.cli import main
from onnx_custom.errors import OnnxCustomError
from onnx_custom.report import environment, histogram, render_markdown, report_to_dict, write_report


class AddOne(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.mylib.my_add(a.relu(), b) + 1.0


def _broken_report() -> onnx_custom.VerificationReport:
    registry = onnx_custom.default_registry().copy()
    registry.symbolic("mylib::my_add", opset=1, replace=True)(lambda g, a, b: g.op("Add", a, b))
    args = (torch.randn(2, 4, generator=torch.Generator().manual_seed(0)), torch.randn(2, 4))
    proto = onnx_custom.export(AddOne(), args, exporter="dynamo", registry=registry)
    return onnx_custom.verify(AddOne(), args, proto, trials=2, localize=True, registry=registry, raise_on_mismatch=False, atol=1e-4, rtol=1e-4)


def test_histogram_bins() -> None:
    hist = histogram(np.array([0.0, 0.0, 1e-13, 3e-7, 1e-6, 0.5, 2.0]), nonfinite_mismatch=1)
    assert hist["0"] == 2 and hist["(0, 1e-12)"] == 1
    assert hist["[1e-07, 1e-06)"] == 1 and hist["[1e-06, 1e-05)"] == 1
    assert hist["[1e-01, 1e+00)"] == 1 and hist[">= 1e+00"] == 1 and hist["non-finite mismatch"] == 1
    assert sum(hist.values()) == 8 and len(hist) == 16
    assert sum(histogram(None).values()) == 0


def test_environment_has_versions() -> None:
    env = environment()
    for key in ("torch", "onnx", "onnxruntime", "onnxscript", "python", "platform"):
        assert env[key]


def test_markdown_and_json_reports(tmp_path: Any) -> None:
    report = _broken_report()
    assert not report.passed
    md = write_report(tmp_path / "r.md", report)
    text = Path(md).read_text()
    assert "FAILED" in text and "## Environment" in text and "| onnxruntime |" in text
    assert "user override" in text and "## Localization" in text and "mylib::my_add" in text
    write_report(tmp_path / "sub" / "r.json", report)
    data = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert data["kind"] == "verify" and data["passed"] is False and data["environment"]["torch"]
    assert len(data["outputs"]) == 2 and sum(data["outputs"][0]["histogram"].values()) == data["outputs"][0]["total"]
    assert data["outputs"][0]["tolerance_source"] == "user override"
    assert data["localization"]["first"] == "my_add" and data["localization"]["method"] == "names"
    with pytest.raises(OnnxCustomError, match=r"must end in \.md .* or \.json"):
        write_report(tmp_path / "r.txt", report)


def test_infinite_diffs_stay_valid_json(tmp_path: Any) -> None:
    from onnx_custom.verify import VerificationReport, compare_arrays

    c = compare_arrays(torch.zeros(2), np.zeros(3, np.float32), name="y", trial=0)
    path = write_report(tmp_path / "inf.json", VerificationReport([c], 1))
    assert json.loads(Path(path).read_text())["outputs"][0]["max_abs_diff"] == "inf"
    assert "inf" in render_markdown(VerificationReport([c], 1))


def test_cli_zoo_report_and_progress(tmp_path: Any, capsys: Any) -> None:
    path = tmp_path / "zoo.json"
    assert main(["zoo", "multi_output", "--report", str(path)]) == 0
    captured = capsys.readouterr()
    assert "[1] multi_output" in captured.err  # progress on stderr
    data = json.loads(path.read_text())
    assert data["kind"] == "zoo" and data["passed"] and len(data["results"]) >= 2
    verified = [r for r in data["results"] if r["verification"]]
    assert verified and "histogram" in verified[0]["verification"][0]
    assert report_to_dict([])["results"] == []

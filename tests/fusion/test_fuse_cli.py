"""``onnx-custom export --fuse``: the export fuses what the model file registered and prints
the fusion report."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import fusion_cases
import onnx
from fusion_cases import op_counts

from onnx_custom.cli.main import main
from onnx_custom.fusion import fusion_report

MODEL = textwrap.dedent("""
    import torch
    from fusion_cases import FunctionModel, inputs, my_msda

    import onnx_custom.fusion

    onnx_custom.fusion.register_fusion(my_msda)

    def Net():
        return FunctionModel().eval()

    def example_inputs():
        return inputs()
""")


def test_export_fuse_prints_the_report(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    shutil.copy(fusion_cases.__file__, tmp_path / "fusion_cases.py")
    (tmp_path / "net.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "net.onnx"
    argv = ["export", "net.py:Net", "-o", str(out), "--fuse", "--variant", "custom", "--verify"]
    try:
        assert main(argv) == 0
    finally:
        import onnx_custom.fusion

        for rule in onnx_custom.fusion.registered_fusions():
            onnx_custom.fusion.unregister_fusion(rule.target)
    printed = capsys.readouterr().out
    assert "fusion: 1 fused, 0 recognised but not fused" in printed
    assert "fused: fusion_cases.my_msda" in printed
    proto = onnx.load(out)
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1
    assert fusion_report(proto) is not None

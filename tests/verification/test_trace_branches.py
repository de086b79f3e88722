"""A TorchScript file the trace got wrong: a data-dependent Python branch the tracer fixed.

verify names the export's TracerWarning (file:line, from the file's metadata, so also for a
file loaded from disk), and localize pairs the file's values with eager's by module and code
line: it names the first diverging line, the line the trace ran that eager did not, and the
TracerWarning raised in the code that produced it.
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import onnx
import pytest
import torch

import onnx_custom
from onnx_custom.exporter import trace_provenance
from onnx_custom.verification.localization_report import Localization


class SignBranch(torch.nn.Module):
    """Doubles positive batches and shifts the others: the trace keeps one of the two."""

    def __init__(self) -> None:
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            self.fc = torch.nn.Linear(4, 3)
        finally:
            torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        if y.sum() > 0:  # the branch line  # noqa: SIM108
            z = y * 2  # the traced line
        else:
            z = y - 1
        return self.fc(torch.tanh(z))  # the first diverging line


def _line(marker: str) -> int:
    lines, start = inspect.getsourcelines(SignBranch.forward)
    return start + next(i for i, text in enumerate(lines) if marker in text)


HERE = os.path.basename(__file__)


def _export(tmp_path: Any) -> tuple[SignBranch, torch.Tensor, str]:
    model = SignBranch().eval()
    x = torch.rand(2, 4) + 0.1  # positive: the trace takes the doubling branch
    path = str(tmp_path / "sign_branch.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        onnx_custom.export(model, (x,), path, exporter="torchscript")
    return model, x, path


def _negated(trial: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (-args[0],)


def test_the_file_keeps_the_exports_tracer_warnings(tmp_path: Any) -> None:
    _, _, path = _export(tmp_path)
    found = trace_provenance.read(onnx.load(path))
    assert [(os.path.basename(w.file), w.line) for w in found] == [(HERE, _line("branch line"))]
    assert found[0].message.startswith("Converting a tensor to a Python boolean")
    nodes = onnx.load(path).graph.node
    sources = [p.value for n in nodes for p in n.metadata_props if p.key == "onnx_custom.source"]
    assert any(f"{HERE}:{_line('traced line')}" in s for s in sources)


def test_verify_names_the_warning_and_localize_the_first_diverging_line(tmp_path: Any) -> None:
    model, x, path = _export(tmp_path)
    report = onnx_custom.verify(
        model,
        (x,),
        path,  # from disk: the warnings come from the file's metadata
        trials=2,
        input_generator=_negated,
        localize=True,
        raise_on_mismatch=False,
    )
    assert not report.passed
    assert [r.status for r in report.shapes_tried] == ["passed", "failed"]
    text = str(report)
    branch = f"{HERE}:{_line('branch line')}: Converting a tensor to a Python boolean"
    assert branch in text
    localization = report.localization
    assert isinstance(localization, Localization), localization
    assert localization.method == "source"
    first = localization.first
    assert first is not None
    assert f"{HERE}:{_line('first diverging line')}" in first.fx_name
    assert first.torch_op == "tanh"
    assert f"TracerWarning at {HERE}:{_line('branch line')}" in first.stack
    assert f"{HERE}:{_line('traced line')}" in localization.note  # run by the file, not by eager
    assert "TracerWarnings raised in the code that produced" in localization.note
    # the Linear after it diverges too, but downstream of a diverging input: not an origin
    downstream = [n for n in localization.diverging if n is not first]
    assert downstream and all(not n.origin for n in downstream)


def test_a_passing_file_shows_no_warning_lines(tmp_path: Any) -> None:
    model, x, path = _export(tmp_path)
    report = onnx_custom.verify(model, (x,), path, shapes=())
    assert report.passed
    assert len(report.tracer_warnings) == 1
    assert "TracerWarning" not in str(report)


@pytest.mark.parametrize("exports", [1, 2], ids=["first-export", "second-export-same-lines"])
def test_every_export_records_its_warnings(exports: int) -> None:
    """Python shows a warning once per line; the second export of a model must still record it."""
    model, x = SignBranch().eval(), torch.rand(2, 4) + 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        for _ in range(exports):
            proto = onnx_custom.export(model, (x,), exporter="torchscript")
    assert len(trace_provenance.read(proto)) == 1


def _rt_detr_v2() -> tuple[torch.nn.Module, torch.Tensor]:
    """transformers' RTDetrV2Model from a small config (random weights, seeded, no download)."""
    transformers = pytest.importorskip("transformers")

    class Outputs(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.m = model

        def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.m(pixels, return_dict=True)
            return out["last_hidden_state"], out["init_reference_points"]

    backbone = transformers.ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_indices=[2, 3, 4],
    )
    config = transformers.RTDetrV2Config(
        backbone_config=backbone,
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        encoder_in_channels=[32, 64, 128],
        encoder_hidden_dim=32,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        d_model=32,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_n_points=2,
        num_queries=10,
        num_denoising=0,
    )
    torch.manual_seed(0)
    model = Outputs(transformers.RTDetrV2Model(config)).eval()
    return model, torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
def test_rt_detr_v2_torchscript_file_is_localized_with_its_warnings(tmp_path: Any) -> None:
    model, pixels = _rt_detr_v2()
    path = str(tmp_path / "rt_detr_v2.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_custom.export(model, (pixels,), path, exporter="torchscript")
        report = onnx_custom.verify(
            model, (pixels,), path, shapes=(), localize=True, raise_on_mismatch=False
        )
    assert not report.passed  # the trace is wrong on the example itself
    assert any(w.where.startswith("modeling_rt_detr_v2.py:") for w in report.tracer_warnings)
    assert "modeling_rt_detr_v2.py:" in str(report) and "TracerWarning" in str(report)
    localization = report.localization
    assert isinstance(localization, Localization), localization
    first = localization.first
    assert first is not None and first.origin
    assert "modeling_rt_detr_v2.py:" in first.fx_name
    assert first.onnx_nodes  # the file's nodes, by name
    assert all(i.passed for i in first.inputs)  # its inputs still agree: it is where it starts
    assert "TracerWarning at modeling_rt_detr_v2.py:" in first.stack


def test_a_raw_torch_export_with_doc_strings_is_localized_from_the_file(capsys: Any) -> None:
    """torch.onnx.export(verbose=True) keeps the source lines in the nodes' doc strings."""
    import io

    from onnx_custom.verification.localize import localize

    model, x = SignBranch().eval(), torch.rand(2, 4) + 0.1
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buffer, dynamo=False, verbose=True)
    proto = onnx.load_from_string(buffer.getvalue())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        localization = localize(model, (-x,), proto)  # torch.export refuses the branch
    assert localization.method == "source"
    first = localization.first
    assert first is not None and f"{HERE}:{_line('first diverging line')}" in first.fx_name

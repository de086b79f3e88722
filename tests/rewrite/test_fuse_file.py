"""fuse_file / ``onnx-custom fuse`` on files raw ``torch.onnx.export`` wrote from the
pure-PyTorch (grid_sample) multi-scale deformable attention: both exporters, opsets 16-21,
static and symbolic dims; the fused file's ORT outputs are compared with PyTorch eager."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from _mmcv_style import (
    ExtraLevel,
    Pyramid,
    Standalone,
    Volume,
    export_raw,
    standalone_inputs,
)

import onnx_custom
from onnx_custom.cli.main import main
from onnx_custom.errors import FuseProofError, InvalidArgumentError, ModelLoadError

NAMES = ("value", "loc", "attn")
BATCH = {name: {0: "batch"} for name in NAMES}

CASES = [
    pytest.param("torchscript", 16, id="torchscript-opset16-batchxkeys"),
    pytest.param("torchscript", 18, id="torchscript-opset18-batchxkeys"),
    pytest.param("torchscript", 21, id="torchscript-opset21-batchxkeys"),
    pytest.param("dynamo", 18, id="dynamo-opset18-batchxkeys"),
    pytest.param("dynamo", 16, id="dynamo-opset16-batchxkeys", marks=pytest.mark.slow),
    pytest.param("dynamo", 20, id="dynamo-opset20-batchxkeys", marks=pytest.mark.slow),
    pytest.param("dynamo", 21, id="dynamo-opset21-batchxkeys", marks=pytest.mark.slow),
]


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _run(model: onnx.ModelProto | Path, feeds: dict[str, torch.Tensor]) -> list[np.ndarray]:
    session = onnx_custom.InferenceSession(model)
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


def _export_standalone(tmp_path: Path, exporter: str, opset: int, **options: object) -> Path:
    torch.manual_seed(0)
    model = Standalone(**options)
    return export_raw(
        model,
        standalone_inputs(),
        tmp_path / f"{exporter}{opset}.onnx",
        exporter=exporter,
        opset=opset,
        names=NAMES,
        dynamic=BATCH,
    )


@pytest.mark.parametrize(("exporter", "opset"), CASES)
def test_fuses_both_exporters(tmp_path: Path, exporter: str, opset: int) -> None:
    path = _export_standalone(tmp_path, exporter, opset)
    original = onnx.load(str(path))
    out = tmp_path / "fused.onnx"
    fused, report = onnx_custom.fuse_file(path, output=out)

    assert report.count == 1 and report.proven and report.near_misses == []
    written = onnx.load(str(out))
    assert written == fused
    assert "GridSample" not in _ops(fused)
    assert _ops(fused).count("MultiScaleDeformableAttn") == 1
    assert ("onnx_custom", 1) in {(o.domain, o.version) for o in fused.opset_import}
    # every node kept is the original node, in the original order; initializers kept unchanged
    new = {n.name for n in fused.graph.node} - {n.name for n in original.graph.node}
    kept = [n for n in fused.graph.node if n.name not in new]
    by_name = {n.name: n for n in original.graph.node}
    assert all(by_name[n.name] == n for n in kept)
    order = [n.name for n in original.graph.node]
    positions = [order.index(n.name) for n in kept]
    assert positions == sorted(positions)
    inits = {t.name: t for t in original.graph.initializer}
    assert all(inits[t.name] == t for t in fused.graph.initializer if t.name in inits)
    assert [i.name for i in fused.graph.input] == [i.name for i in original.graph.input]
    assert list(fused.graph.output) == list(original.graph.output)

    # the fused file against PyTorch eager, at another batch than the export's
    torch.manual_seed(0)
    model = Standalone().eval()
    args = standalone_inputs(bs=3, seed=1)
    with torch.no_grad():
        expected = model(*args)
    (got,) = _run(out, dict(zip(NAMES, args, strict=True)))
    torch.testing.assert_close(torch.from_numpy(got), expected)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_symbolic_level_shapes_read_at_run_time(tmp_path: Path, exporter: str) -> None:
    """(H, W) of every level follows the input image: the fused node reads them at run time."""
    torch.manual_seed(0)
    model = Pyramid().eval()
    x = torch.randn(2, 8, 16, 12)
    path = tmp_path / "pyramid.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            h, w = torch.export.Dim("h", min=2, max=64), torch.export.Dim("w", min=2, max=64)
            shapes = ({0: torch.export.Dim("batch"), 2: 4 * h, 3: 4 * w},)
            torch.onnx.export(
                model, (x,), str(path), dynamo=True, input_names=["feat"], dynamic_shapes=shapes
            )
        else:
            axes = {"feat": {0: "batch", 2: "h", 3: "w"}}
            torch.onnx.export(
                model,
                (x,),
                str(path),
                dynamo=False,
                opset_version=17,
                input_names=["feat"],
                dynamic_axes=axes,
            )
    fused, report = onnx_custom.fuse_file(path, dims={"h": 8, "w": 12, "batch": 2})
    assert report.count == 1 and not report.fused[0].static_shapes and report.proven
    assert "GridSample" not in _ops(fused)
    other = torch.randn(3, 8, 20, 8)
    with torch.no_grad():
        expected = model(other)
    (got,) = _run(fused, {"feat": other})
    torch.testing.assert_close(torch.from_numpy(got), expected)


def test_mmdeploy_variant_runs_with_our_kernels(tmp_path: Path) -> None:
    path = _export_standalone(tmp_path, "torchscript", 17)
    fused, report = onnx_custom.fuse_file(path, variant="mmdeploy")
    nodes = [n for n in fused.graph.node if n.domain == "mmdeploy"]
    assert [n.op_type for n in nodes] == ["MMCVMultiScaleDeformableAttention"]
    assert report.proven and "GridSample" not in _ops(fused)
    torch.manual_seed(0)
    args = standalone_inputs(bs=1, seed=2)
    with torch.no_grad():
        expected = Standalone().eval()(*args)
    (got,) = _run(fused, dict(zip(NAMES, args, strict=True)))
    torch.testing.assert_close(torch.from_numpy(got), expected)


NEAR = [
    pytest.param({"padding_mode": "border"}, "padding_mode='border'", id="padding-border"),
    pytest.param({"align_corners": True}, "align_corners=1", id="align-corners"),
    pytest.param({"mode": "nearest"}, "mode='nearest'", id="mode-nearest"),
    pytest.param({"affine": False}, "2 * loc - 1", id="grid-not-2loc-1"),
    pytest.param({"reverse": True}, "out of order", id="levels-stacked-in-reverse"),
]


@pytest.mark.parametrize(("options", "reason"), NEAR)
def test_near_miss_leaves_the_file_unchanged(tmp_path: Path, options: dict, reason: str) -> None:
    path = _export_standalone(tmp_path, "torchscript", 17, **options)
    out = tmp_path / "out.onnx"
    fused, report = onnx_custom.fuse_file(path, output=out)
    assert report.count == 0
    assert len(report.near_misses) == 1 and reason in report.near_misses[0].reason
    assert len(report.near_misses[0].nodes) == 3  # one GridSample per level
    assert out.read_bytes() == path.read_bytes()
    assert fused == onnx.load(str(path))
    assert "near-miss" in str(report) and "unchanged" in str(report)


def test_near_miss_five_d_grid(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    args = (
        torch.randn(1, 16, 2, 3, generator=gen),
        torch.rand(1, 4, 2, 2, 2, 3, generator=gen),
        torch.rand(1, 4, 2, 2, 2, generator=gen),
    )
    # TorchScript refuses 5-D GridSample; the dynamo exporter writes it from opset 20
    path = export_raw(Volume(), args, tmp_path / "v.onnx", exporter="dynamo", opset=20, names=NAMES)
    _, report = onnx_custom.fuse_file(path)
    assert report.count == 0
    assert any("5-D GridSample" in m.reason for m in report.near_misses), str(report)


def test_failed_proof_writes_nothing(tmp_path: Path) -> None:
    """Locations with a level more than value has match the pattern but fuse wrong: refused."""
    torch.manual_seed(0)
    path = export_raw(
        ExtraLevel(),
        standalone_inputs(),
        tmp_path / "x.onnx",
        exporter="torchscript",
        opset=17,
        names=NAMES,
    )
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous")
    with pytest.raises(FuseProofError) as info:
        onnx_custom.fuse_file(path, output=out)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx", "x.onnx"]
    assert info.value.report.count == 1  # type: ignore[attr-defined]


def test_outputs_beyond_the_tolerance_are_refused(tmp_path: Path) -> None:
    """GridSample and the fused kernel sum in another order: with no tolerance at all the proof
    sees the float32 rounding difference and refuses."""
    path = _export_standalone(tmp_path, "torchscript", 17)
    out = tmp_path / "out.onnx"
    with pytest.raises(FuseProofError, match="differ") as info:
        onnx_custom.fuse_file(path, output=out, rtol=0.0, atol=0.0)
    assert not out.exists()
    report = info.value.report
    assert report.count == 1 and not report.proven  # type: ignore[attr-defined]
    assert max(d.max_abs_diff for d in report.proof) < 1e-5  # type: ignore[attr-defined]


def test_the_fused_value_itself_is_compared(tmp_path: Path) -> None:
    """A zero output projection hides the attention from the graph output; the proof compares
    the fused node's own value too, so a difference there is still seen."""
    torch.manual_seed(0)
    model = Standalone()
    torch.nn.init.zeros_(model.output_proj.weight)
    path = export_raw(
        model,
        standalone_inputs(),
        tmp_path / "z.onnx",
        exporter="torchscript",
        opset=17,
        names=NAMES,
        dynamic=BATCH,
    )
    _, report = onnx_custom.fuse_file(path)
    graph_output = onnx.load(str(path)).graph.output[0].name
    diffs = {d.output: d.max_abs_diff for d in report.proof if d.trial == 0}
    assert diffs[graph_output] == 0.0 and diffs[report.fused[0].output] > 0.0
    with pytest.raises(FuseProofError):
        onnx_custom.fuse_file(path, rtol=0.0, atol=0.0)


def test_no_match_returns_the_model(tmp_path: Path) -> None:
    path = tmp_path / "linear.onnx"
    export_raw(
        torch.nn.Linear(3, 2),
        (torch.randn(2, 3),),
        path,
        exporter="torchscript",
        opset=17,
        names=("x",),
    )
    out = tmp_path / "out.onnx"
    _, report = onnx_custom.fuse_file(path, output=out)
    assert report.count == 0 and report.near_misses == [] and "unchanged" in str(report)
    assert out.read_bytes() == path.read_bytes()


def test_external_data(tmp_path: Path) -> None:
    path = _export_standalone(tmp_path, "torchscript", 17)
    model = onnx.load(str(path))
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save(
        model,
        str(folder / "m.onnx"),
        save_as_external_data=True,
        size_threshold=0,
        location="m.data",
    )
    out = folder / "fused.onnx"
    _, report = onnx_custom.fuse_file(folder / "m.onnx", output=out)
    assert report.count == 1 and report.proven
    args = standalone_inputs(bs=1)
    assert np.allclose(
        _run(out, dict(zip(NAMES, args, strict=True)))[0],
        _run(path, dict(zip(NAMES, args, strict=True)))[0],
        rtol=1e-5,
        atol=1e-6,
    )
    detached = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    with pytest.raises(ModelLoadError, match="external data"):
        onnx_custom.fuse_file(detached)


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="variant"):
        onnx_custom.fuse_file(tmp_path / "x.onnx", variant="tensorrt")
    with pytest.raises(InvalidArgumentError, match="prove=False"):
        onnx_custom.fuse_file(tmp_path / "x.onnx", output=tmp_path / "y.onnx", prove=False)


def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _export_standalone(tmp_path, "torchscript", 18)
    out = tmp_path / "fused.onnx"
    assert main(["fuse", str(path), "-o", str(out), "--variant", "mmdeploy"]) == 0
    printed = capsys.readouterr().out
    assert "fused 1" in printed and "proven" in printed and str(out) in printed
    assert "MMCVMultiScaleDeformableAttention" in _ops(onnx.load(str(out)))

    torch.manual_seed(0)
    bad = export_raw(
        ExtraLevel(),
        standalone_inputs(),
        tmp_path / "bad.onnx",
        exporter="torchscript",
        opset=17,
        names=NAMES,
    )
    assert main(["fuse", str(bad), "-o", str(tmp_path / "never.onnx")]) == 1
    assert "nothing written" in capsys.readouterr().out
    assert not (tmp_path / "never.onnx").exists()
    assert main(["fuse", str(tmp_path / "missing.onnx"), "-o", str(out)]) == 2

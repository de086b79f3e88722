"""The zoo itself: its rows (every custom variant also with a dynamic batch under both exporters),
what a dynamic row must prove, native-build detection, streaming and the console."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from onnx_custom.cli.zoo_console import ZooConsole, clock
from onnx_custom.zoo import (
    MIN_OTHER_SIZES,
    MODULE_ROW,
    NATIVE_BUILDS,
    ZooCase,
    ZooResult,
    discover,
    pending_builds,
    run_case,
    run_zoo,
)


def _modules() -> dict[str, Any]:
    found = {}
    for short, name in discover().items():
        try:
            found[short] = importlib.import_module(name)
        except Exception:  # a C++ extension that cannot build here: the zoo skips the model
            continue
    return found


def test_every_custom_row_also_runs_with_a_dynamic_batch_under_both_exporters() -> None:
    for short, module in _modules().items():
        rows = list(module.ZOO)
        custom = [
            c for c in rows if c.variant == "custom" or (short == "deform_conv" and c.opset < 19)
        ]
        for exporter in {c.exporter for c in custom}:
            dynamic = [c for c in rows if c.exporter == exporter and c.dynamic]
            refused = [c for c in custom if c.exporter == exporter and c.expect_error]
            assert dynamic or refused, (
                f"{short}: no dynamic {exporter} row next to its custom-node rows"
            )
        for case in rows:
            if case.dynamic and not case.skip:
                assert getattr(module, "dynamic_shapes", None) is not None, f"{short} {case.label}"
        assert all(case.skip.strip() for case in rows if case.skip is not None), short


def test_bev_pool_documents_its_fixed_batch() -> None:
    bev = importlib.import_module("onnx_custom.models.bev_pool")
    skipped = [c for c in bev.ZOO if c.skip]
    assert {c.exporter for c in skipped} == {"torchscript", "dynamo"} and all(
        c.dynamic for c in skipped
    )
    assert all("bev_feat_shape" in c.skip for c in skipped)
    result = run_case("bev_pool", bev, skipped[0])
    assert (result.status, result.detail) == ("skip", skipped[0].skip)


class Doubles(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _fake_module(model: type[torch.nn.Module], dynamic_shapes: Any) -> types.ModuleType:
    module = types.ModuleType("fake_zoo_model")
    module.Model = model  # type: ignore[attr-defined]
    module.example_inputs = lambda: (torch.randn(2, 3),)  # type: ignore[attr-defined]
    module.dynamic_shapes = dynamic_shapes  # type: ignore[attr-defined]
    return module


def test_a_dynamic_row_fails_unless_three_other_sizes_verify() -> None:
    """A batch limited to 2..3 leaves one other size to try: not enough for a dynamic row."""
    narrow = _fake_module(Doubles, ({0: torch.export.Dim("batch", min=2, max=3)},))
    result = run_case("fake", narrow, ZooCase("torchscript", 17, dynamic=True))
    assert result.status == "fail" and result.report is not None and result.report.passed
    assert f"verified at 1 other size(s), expected at least {MIN_OTHER_SIZES}" in result.detail
    wide = _fake_module(Doubles, ({0: torch.export.Dim("batch")},))
    result = run_case("fake", wide, ZooCase("torchscript", 17, dynamic=True))
    assert result.status == "pass" and result.summary.endswith("also at batch 1,3,4"), result.detail


def test_a_dynamic_row_without_dynamic_shapes_fails() -> None:
    module = _fake_module(Doubles, None)
    result = run_case("fake", module, ZooCase("torchscript", 17, dynamic=True))
    assert result.status == "fail" and "has no dynamic_shapes" in result.detail


def test_pending_builds_with_an_empty_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONNX_CUSTOM_CACHE_DIR", str(tmp_path))
    names = [
        b.name for b in pending_builds(["deform_conv", "my_add_ext", "bev_pool", "msda", "asinh"])
    ]
    assert names == [b.name for b in NATIVE_BUILDS]  # nothing is cached in an empty folder
    assert [b.name for b in pending_builds(["asinh"])] == ["ONNX Runtime kernel shim (C)"]
    monkeypatch.delenv("ONNX_CUSTOM_CACHE_DIR")
    run_case(
        "my_add",
        importlib.import_module("onnx_custom.models.my_add"),
        ZooCase("torchscript", 13, variant="custom"),
    )
    assert pending_builds(["asinh"]) == []  # the shim ran a custom node: it is in the real cache


def test_first_run_builds_the_shim_up_front_and_says_so(tmp_path: Path) -> None:
    """A fresh cache: the shim is built (for real, with the C compiler) before the first row."""
    exe = Path(sys.executable).with_name("onnx-custom")
    env = dict(os.environ, ONNX_CUSTOM_CACHE_DIR=str(tmp_path))
    result = subprocess.run(
        [str(exe), "zoo", "asinh"], capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert (
        lines[0]
        == "onnx-custom: first run here: one-time native build(s) ahead, cached afterwards in"
        f" {tmp_path}: ONNX Runtime kernel shim (C) (~5 s)"
    )
    assert (
        lines[1]
        == "onnx-custom: building the ONNX Runtime kernel shim (C) (one time, usually ~5 s) ..."
    )
    assert lines[2].startswith("onnx-custom: built the ONNX Runtime kernel shim (C) in 0:")
    assert lines[3].startswith(
        "[1/6] asinh "
    )  # 4 export rows + 2 compile rows and not any("build" in line for line in lines[3:])
    assert list((tmp_path / "ort_shim").glob("*/*.so"))


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def pending(self, builds: Any) -> None:
        self.events.append(("pending", len(builds)))

    def building(self, build: Any) -> None:
        self.events.append(("building", build.name))

    def built(self, build: Any, seconds: float, error: Any) -> None:
        self.events.append(("built", build.name, error))

    def planned(self, rows: Any) -> None:
        self.events.append(("planned", len(rows)))

    def started(self, index: int, total: int, model: str, case: ZooCase) -> None:
        self.events.append(("started", index, total, case.label))

    def finished(self, index: int, total: int, result: ZooResult) -> None:
        self.events.append(("finished", index, total, result.case.label, result.status))


def test_run_zoo_streams_each_row_as_it_finishes() -> None:
    recorder = Recorder()
    results = run_zoo(["numpy_sin"], listener=recorder)
    from onnx_custom.zoo import compile_rows

    module = importlib.import_module("onnx_custom.models.numpy_sin")
    labels = [c.label for c in (*module.ZOO, *compile_rows(module))]
    assert recorder.events[0][0] == "pending"  # then any builds (none once cached), then the plan
    planned = recorder.events.index(("planned", len(labels)))
    rows = recorder.events[planned + 1 :]
    expected = [
        e
        for i, label in enumerate(labels, start=1)
        for e in (("started", i, len(labels), label), ("finished", i, len(labels), label, "pass"))
    ]
    assert rows == expected
    assert [r.status for r in results] == ["pass"] * len(labels)


def _result(label_case: ZooCase, status: str = "pass", seconds: float = 1.0) -> ZooResult:
    return ZooResult(
        "my_model",
        label_case,
        status,
        "" if status == "pass" else "boom\nmore",
        seconds,
        "custom::VeryLongNodeTypeName, Relu x3",
    )


def test_console_plain_mode() -> None:
    out, err = io.StringIO(), io.StringIO()
    console = ZooConsole(out, err, live=False)
    cases = [
        ZooCase("torchscript", 17),
        ZooCase("dynamo", 18, "custom", dynamic=True),
        ZooCase("dynamo", 18),
    ]
    console.pending([])
    console.planned([("my_model", c) for c in cases])
    results = []
    for i, (case, status) in enumerate(zip(cases, ("pass", "fail", "skip"), strict=True), start=1):
        console.started(i, 3, "my_model", case)
        results.append(_result(case, status, seconds=2.0 * i))
        console.finished(i, 3, results[-1])
    console.finish(results)
    rows = out.getvalue().splitlines()
    assert rows[1].startswith("[1/3] my_model  torchscript-opset17") and rows[1].endswith(
        "custom::VeryLongNodeTypeName, Relu x3"
    )
    assert (
        "FAIL" in rows[2]
        and "boom" in rows[2]
        and rows[-1].startswith("1 passed, 1 failed, 1 skipped in ")
    )
    progress = err.getvalue().splitlines()
    assert progress[0] == "[1/3] my_model torchscript-opset17 ... (elapsed 0:00, ETA --)"
    assert progress[1].endswith(
        "ETA ~0:04)"
    )  # two dynamo rows, no dynamo timing yet: the overall mean (2 s)
    assert "--- FAIL my_model dynamo-opset18-custom-dynamic ---\nboom\nmore" in err.getvalue()


def test_console_live_mode_redraws_one_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    console = ZooConsole(out, err, live=True, tick=0.01)
    case = ZooCase("dynamo", 18)
    console.planned([("m", case)])
    console.started(1, 1, "m", case)
    time.sleep(0.05)
    console.finished(1, 1, _result(case))
    console.finish([_result(case)])
    text = err.getvalue()
    assert (
        text.count("\r\x1b[K[1/1] m dynamo-opset18 ... 0s (elapsed 0:00, ETA --)") >= 2
    )  # redrawn by the ticker
    assert text.endswith("\r\x1b[K") and "\n" not in text  # one line, cleared at the end
    assert out.getvalue().splitlines()[-1].startswith("1 passed, 0 failed, 0 skipped")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00"), (59.6, "1:00"), (75.2, "1:15"), (3725, "1:02:05")]
)
def test_clock(seconds: float, text: str) -> None:
    assert clock(seconds) == text


def test_module_rows_are_not_labelled_opset0() -> None:
    assert MODULE_ROW.label == "(all rows)"
    assert ZooCase("dynamo", 18, "custom", dynamic=True).label == "dynamo-opset18-custom-dynamic"


def test_unknown_zoo_model_lists_the_known_ones() -> None:
    from onnx_custom.errors import OnnxCustomError

    with pytest.raises(
        OnnxCustomError, match=r"Unknown zoo model\(s\) \['nope'\]; expected names from: asinh, "
    ):
        discover(["nope"])


# ---------------------------------------------------------------------------- compile rows


@pytest.mark.parametrize(("name", "batches"), [("my_add", "2,3,5"), ("multi_out", "4,3,5")])
def test_compile_rows_pass_and_the_dynamic_one_sweeps_other_batches(
    name: str, batches: str
) -> None:
    from onnx_custom.zoo import compile_rows

    module = importlib.import_module(f"onnx_custom.models.{name}")
    static, dynamic = compile_rows(module)
    assert (static.label, dynamic.label) == (
        "compile-opset18-custom",
        "compile-opset18-custom-dynamic",
    )
    result = run_case(name, module, static)
    assert result.status == "pass", result.detail
    assert result.nodes.startswith("ORT ") and "eager:" not in result.nodes  # every node ran in ORT
    result = run_case(name, module, dynamic)
    assert result.status == "pass", result.detail
    assert result.summary.endswith(f"batch {batches}, no recompile"), (
        result.summary
    )  # the example batch, then 2 others


@torch.library.custom_op("zoo_compile_test::scaled_sin", mutates_args=())
def _scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale


@_scaled_sin.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class ScaledSin(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scaled_sin(x + 1.0, 3.0)


def _planted_registry(correct: bool) -> Any:
    from onnx_custom import Registry

    registry = Registry()

    @registry.symbolic("zoo_compile_test::scaled_sin", opset=13)
    def translation(g: Any, x: Any, scale: float) -> Any:
        sin = g.op("Sin", x)
        return (
            g.op("Mul", sin, g.constant(scale, dtype=torch.float32)) if correct else sin
        )  # planted: scale forgotten

    return registry


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("correct", [True, False], ids=["right", "planted-wrong"])
def test_a_wrong_translation_fails_the_compile_row(
    monkeypatch: pytest.MonkeyPatch, correct: bool, dynamic: bool
) -> None:
    """The compile row compares with eager itself: a wrong translation must FAIL, never PASS."""
    import onnx_custom.translate.registry as registry_module

    monkeypatch.setattr(registry_module, "default_registry", lambda: _planted_registry(correct))
    module = _fake_module(ScaledSin, ({0: torch.export.Dim("batch")},))
    result = run_case("fake", module, ZooCase("compile", 18, dynamic=dynamic))
    if correct:
        assert result.status == "pass", result.detail
        assert result.nodes.startswith("ORT ") and "eager:" not in result.nodes
    else:
        assert result.status == "fail", result.detail
        assert (
            "differs from eager" in result.detail
            and "outside rtol=1.3e-06 atol=1e-05" in result.detail
        ), result.detail


def test_a_recompile_fails_the_dynamic_compile_row() -> None:
    """A model that branches on the batch size recompiles at another size: the row must say so."""

    class BranchesOnBatch(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.shape[0] < 3 else x * 3

    module = _fake_module(BranchesOnBatch, ({0: torch.export.Dim("batch")},))
    result = run_case("fake", module, ZooCase("compile", 18, dynamic=True))
    assert result.status == "fail" and "recompiled at another batch size" in result.detail, (
        result.detail
    )


def test_list_shows_the_compile_rows_and_why_a_dynamic_one_skips() -> None:
    from onnx_custom.zoo import list_zoo

    text = list_zoo(["my_add", "bev_pool"])
    assert "  compile-opset18-custom  (torch.compile vs eager)" in text
    assert (
        "  compile-opset18-custom-dynamic  (dynamic=True, other batch sizes, no recompile)" in text
    )
    assert (
        "  compile-opset18-custom-dynamic  (skip: no dynamic_shapes: the model declares no dynamic"
        " batch" in text
    )

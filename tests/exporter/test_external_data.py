"""External data: automatic past the threshold (lowered here through the environment variable,
so the files stay small), ``external_data=`` honoured, the pair written crash-safe, and missing,
truncated or foreign data files refused by our loaders with `ModelLoadError`.

The real > 2 GiB export is `test_external_data_big.py` (slow)."""

from __future__ import annotations

import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # (defines onnx_custom::my_add)
from onnx_custom.common import external_data as external
from onnx_custom.errors import InvalidArgumentError, ModelLoadError
from onnx_custom.verification.initializers import InitializerMismatchWarning

EXPORTERS = ["torchscript", "dynamo"]
SMALL = "4096"  # bytes: the test model (two 64x64 float32 weights, 32 KiB) is far above it


class Net(torch.nn.Module):
    """Written as tutorials write it: nn.Linear layers around a custom op."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 64)
        self.fc2 = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.ops.onnx_custom.my_add(self.fc1(x), x))


def _net() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(3, 64),)


def _expected(model: torch.nn.Module, args: tuple[torch.Tensor]) -> np.ndarray:
    with torch.no_grad():
        return model(*args).numpy()


def _run_plain(path: Path, args: tuple[torch.Tensor]) -> np.ndarray:
    """Plain ONNX Runtime, from the path (standard ops only: the default translation)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: args[0].numpy()})[0]


@pytest.fixture
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(external.THRESHOLD_ENV, SMALL)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_past_the_threshold_the_tensors_go_to_model_onnx_data(
    tmp_path: Path, small_threshold: None, exporter: str
) -> None:
    model, args = _net()
    path = tmp_path / "model.onnx"
    onnx_custom.export(model, args, path, exporter=exporter)
    (name,) = external.referenced_data_files(path)
    assert re.fullmatch(r"model\.onnx\.[0-9a-f]{16}\.data", name)  # one data file per write
    data = tmp_path / name
    assert data.is_file() and data.stat().st_size > 2 * 64 * 64 * 4
    assert path.stat().st_size < 16384  # the weights are not in the model file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", name]  # no temporaries left
    want = _expected(model, args)
    np.testing.assert_allclose(_run_plain(path, args), want, rtol=1.3e-6, atol=1e-5)
    session = onnx_custom.InferenceSession(path)
    np.testing.assert_allclose(
        session.run(None, {session.get_inputs()[0].name: args[0].numpy()})[0],
        want,
        rtol=1.3e-6,
        atol=1e-5,
    )
    assert onnx_custom.verify(model, args, path).passed
    reloaded = onnx.load(str(path))  # onnx's own loader reads the data back
    assert not external.external_tensors(reloaded)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_below_the_threshold_one_file(tmp_path: Path, exporter: str) -> None:
    model, args = _net()
    onnx_custom.export(model, args, tmp_path / "model.onnx", exporter=exporter)
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


@pytest.mark.parametrize(
    ("option", "files", "env"),
    [
        (True, ["model.onnx", r"model\.onnx\.[0-9a-f]{16}\.data"], None),
        ("weights.bin", ["model.onnx", r"weights\.bin"], None),
        ("weights", ["model.onnx", r"weights"], None),
        (False, ["model.onnx"], SMALL),  # False wins over the (lowered) threshold
        (None, ["model.onnx", r"model\.onnx\.[0-9a-f]{16}\.data"], SMALL),
    ],
    ids=[
        "True",
        "a-file-name",
        "a-name-without-suffix",
        "False-over-threshold",
        "None-over-threshold",
    ],
)
def test_external_data_option_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: Any, files: list[str], env: str | None
) -> None:
    if env:
        monkeypatch.setenv(external.THRESHOLD_ENV, env)
    model, args = _net()
    onnx_custom.export(
        model, args, tmp_path / "model.onnx", exporter="torchscript", external_data=option
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == len(files) and all(
        re.fullmatch(f, n) for f, n in zip(files, names, strict=True)
    ), names
    np.testing.assert_allclose(
        _run_plain(tmp_path / "model.onnx", args), _expected(model, args), rtol=1.3e-6, atol=1e-5
    )


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_chosen_data_file_name_is_written_exactly(tmp_path: Path, exporter: str) -> None:
    """``external_data="weights.bin"`` writes exactly ``weights.bin``; exporting again (other
    weights) replaces that pair in place, and plain ONNX Runtime reads the new weights."""
    model, args = _net()
    path = tmp_path / "model.onnx"
    weight = model.get_parameter("fc1.weight")
    for scale in (1.0, 2.0):
        with torch.no_grad():
            weight.mul_(scale)
        onnx_custom.export(model, args, path, exporter=exporter, external_data="weights.bin")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "weights.bin"]
        proto = onnx.load(str(path), load_external_data=False)
        locations = {
            entry.value
            for tensor in external.external_tensors(proto)
            for entry in tensor.external_data
            if entry.key == "location"
        }
        assert locations == {"weights.bin"}
        np.testing.assert_allclose(
            _run_plain(path, args), _expected(model, args), rtol=1.3e-6, atol=1e-5
        )
        onnx_custom.InferenceSession(path)  # our loader accepts the pair (token matches)


@pytest.mark.parametrize(
    ("f", "option", "match"),
    [
        (io.BytesIO(), True, "file object"),
        (None, True, "no f"),
        ("model.onnx", "sub/weights.bin", "plain file name"),
        ("model.onnx", "", "plain file name"),
        ("model.onnx", 3, "expects None"),
        ("model.onnx", "model.onnx", "names the model file itself"),
    ],
    ids=["file-object", "no-f", "folder-in-name", "empty-name", "int", "the-model-name"],
)
def test_bad_external_data_arguments_are_refused_before_exporting(
    tmp_path: Path, f: Any, option: Any, match: str
) -> None:
    model, args = _net()
    target = tmp_path / f if isinstance(f, str) else f
    with pytest.raises(InvalidArgumentError, match=match):
        onnx_custom.export(model, args, target, exporter="torchscript", external_data=option)
    assert not list(tmp_path.iterdir())


def test_a_file_object_past_the_threshold_is_the_documented_error(small_threshold: None) -> None:
    model, args = _net()
    buffer = io.BytesIO()
    with pytest.raises(InvalidArgumentError, match=r"file object cannot hold.*f='model.onnx'"):
        onnx_custom.export(model, args, buffer, exporter="dynamo")
    assert buffer.getvalue() == b""


def test_a_bad_threshold_variable_is_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(external.THRESHOLD_ENV, "2GB")
    model, args = _net()
    with pytest.raises(InvalidArgumentError, match=external.THRESHOLD_ENV):
        onnx_custom.export(model, args, tmp_path / "model.onnx", exporter="torchscript")


def _exported(folder: Path) -> tuple[Path, Path]:
    model, args = _net()
    folder.mkdir(exist_ok=True)
    onnx_custom.export(
        model, args, folder / "model.onnx", exporter="torchscript", external_data=True
    )
    (name,) = external.referenced_data_files(folder / "model.onnx")
    return folder / "model.onnx", folder / name


def _loaders(path: Path) -> list[Any]:
    model, args = _net()
    return [
        lambda: onnx_custom.InferenceSession(path),
        lambda: onnx_custom.verify(model, args, path),
        lambda: onnx_custom.runtime.session.load_model(path),
    ]


@pytest.mark.parametrize("loader", [0, 1, 2], ids=["InferenceSession", "verify", "load_model"])
def test_missing_data_file_is_a_model_load_error(tmp_path: Path, loader: int) -> None:
    path, data = _exported(tmp_path)
    data.unlink()
    with pytest.raises(
        ModelLoadError,
        match=r"model.onnx.[0-9a-f]{16}.data.*missing.*Fix: keep the data file next to the model",
    ):
        _loaders(path)[loader]()


@pytest.mark.parametrize("loader", [0, 1, 2], ids=["InferenceSession", "verify", "load_model"])
def test_truncated_data_file_is_a_model_load_error(tmp_path: Path, loader: int) -> None:
    path, data = _exported(tmp_path)
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size // 2)
    with pytest.raises(ModelLoadError, match=r"truncated.*Fix: copy the data file again"):
        _loaders(path)[loader]()


def test_data_of_another_export_is_refused(tmp_path: Path) -> None:
    """Same name, same size, other write: a data file replaced by hand
    (copied from another export)."""
    path, data = _exported(tmp_path / "a")
    _, other = _exported(tmp_path / "b")
    os.replace(other, data)
    with pytest.raises(ModelLoadError, match="different exports"):
        onnx_custom.InferenceSession(path)


def test_a_proto_pointing_into_files_is_refused_as_bytes(tmp_path: Path) -> None:
    path, _ = _exported(tmp_path)
    detached = onnx.load(str(path), load_external_data=False)
    with pytest.raises(ModelLoadError, match="pass the model's path"):
        onnx_custom.InferenceSession(detached)


def test_the_callers_proto_is_not_modified(tmp_path: Path) -> None:
    model, args = _net()
    proto = onnx_custom.export(model, args, exporter="torchscript")
    before = proto.SerializeToString()
    onnx_custom.exporter.pipeline.save_model(proto, tmp_path / "m.onnx", external_data=True)
    assert proto.SerializeToString() == before


# -- verify / localize past the threshold: sessions read a model + data pair, never bytes -----


@pytest.fixture
def session_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """What every ONNX Runtime session of the test was created from (ours and plain ones), with
    temporary folders made under ``tmp_path / "tmp"`` so the test can see they are removed."""
    seen: list[Any] = []
    original = ort.InferenceSession.__init__

    def recording(self: Any, path_or_bytes: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(path_or_bytes if isinstance(path_or_bytes, str) else type(path_or_bytes))
        original(self, path_or_bytes, *args, **kwargs)

    monkeypatch.setattr(ort.InferenceSession, "__init__", recording)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return seen


def _from_files(seen: list[Any], tmp_path: Path) -> None:
    assert seen and all(isinstance(s, str) and s.endswith(".onnx") for s in seen), seen
    assert not list(
        (tmp_path / "tmp").glob("onnx_custom_session_*")
    )  # the temporary pairs are gone


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_export_verify_past_the_threshold_runs_sessions_from_files(
    tmp_path: Path, small_threshold: None, session_sources: list[Any], exporter: str
) -> None:
    """Past 2 GiB a proto cannot be serialized, so verify=True (which runs before ``f`` is
    written) and verify of an in-memory proto hand ORT a temporary model + data pair."""
    model, args = _net()
    proto = onnx_custom.export(model, args, tmp_path / "model.onnx", exporter=exporter, verify=True)
    _from_files(session_sources, tmp_path)
    session_sources.clear()
    assert onnx_custom.verify(model, args, proto, trials=2).passed
    _from_files(session_sources, tmp_path)


@pytest.mark.parametrize("source", ["path", "proto"])
def test_verify_past_the_threshold_still_fails_a_wrong_model(
    tmp_path: Path, small_threshold: None, session_sources: list[Any], source: str
) -> None:
    """The file route must not make verify pass what it should fail: other weights are caught."""
    model, args = _net()
    path = tmp_path / "model.onnx"
    proto = onnx_custom.export(model, args, path, exporter="torchscript")
    with torch.no_grad():
        model.fc2.weight[0, 0] += 0.5  # type: ignore[union-attr, index, operator]
    with pytest.warns(InitializerMismatchWarning, match="fc2.weight"):
        report = onnx_custom.verify(
            model, args, path if source == "path" else proto, raise_on_mismatch=False
        )
    assert not report.passed and report.failures()
    _from_files(session_sources, tmp_path)


def test_localize_past_the_threshold_runs_sessions_from_files(
    tmp_path: Path, small_threshold: None, session_sources: list[Any]
) -> None:
    from onnx_custom.verification.localize import localize

    model, args = _net()
    path = tmp_path / "model.onnx"
    onnx_custom.export(model, args, path, exporter="dynamo")
    result = localize(model, args, path)
    assert result.nodes and result.first is None, result.summary()
    _from_files(session_sources, tmp_path)


def test_an_inference_session_of_a_proto_past_the_threshold(
    tmp_path: Path, small_threshold: None, session_sources: list[Any]
) -> None:
    model, args = _net()
    proto = onnx_custom.export(model, args, exporter="torchscript")
    session = onnx_custom.InferenceSession(proto)
    got = session.run(None, {session.get_inputs()[0].name: args[0].numpy()})[0]
    np.testing.assert_allclose(got, _expected(model, args), rtol=1.3e-6, atol=1e-5)
    _from_files(session_sources, tmp_path)

"""The model + external data pair is crash-safe for ANY reader: plain
``onnxruntime.InferenceSession(path)`` and ``onnx.load`` see the old complete pair or the new
complete pair, never the old model with new data or the reverse, whichever step a write dies at;
and no stale data file accumulates across repeated (or interrupted) writes.

The two pairs differ in structure as well as values (the new model adds a bias), so a model read
with the other write's data would give neither expected output. Crashes are simulated two ways:
an exception raised from ``os.replace``/``os.unlink`` at step k (the cleanup handlers run, as on
Ctrl-C), and ``os._exit`` at step k in a child process (nothing runs after it, as on SIGKILL or a
power cut)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_custom.common.external_data import referenced_data_files
from onnx_custom.errors import ModelLoadError, OutputPathError
from onnx_custom.exporter.pipeline import save_model
from onnx_custom.runtime import InferenceSession

N = 64
X = np.random.default_rng(0).standard_normal((3, N)).astype(np.float32)
CHOICES = [True, "weights.bin"]  # the default name and a user-chosen one


def _old() -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.random.default_rng(1).standard_normal((N, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, N])],
        [numpy_helper.from_array(w, "w")],
    )
    return (
        helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]),
        X @ w,
    )


def _new() -> tuple[onnx.ModelProto, np.ndarray]:
    """Another structure: a bias before the weight, so offsets into the data differ from _old's."""
    rng = np.random.default_rng(2)
    b = rng.standard_normal((N,)).astype(np.float32)  # 256 bytes: stays inside the model
    c = rng.standard_normal((N, N)).astype(
        np.float32
    )  # a second big tensor, first in the data file
    w = rng.standard_normal((N, N)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "b"], ["xb"]),
            helper.make_node("MatMul", ["xb", "c"], ["t"]),
            helper.make_node("MatMul", ["t", "w"], ["y"]),
        ],
        "new",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, N])],
        [
            numpy_helper.from_array(c, "c"),
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(w, "w"),
        ],
    )
    expected = ((X.astype(np.float64) + b) @ c.astype(np.float64)) @ w.astype(np.float64)
    return (
        helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)]),
        expected,
    )


def _which_pair(path: Path) -> str:
    """'old' or 'new' as plain ONNX Runtime and onnx.load read ``path``; fails on a mix."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # nothing of ours
    (y,) = session.run(None, {"x": X})
    loaded = onnx.load(str(path))  # onnx's own loader, data read in
    found = []
    for name, (proto, expected) in (("old", _old()), ("new", _new())):
        if np.allclose(y, expected, rtol=1e-4, atol=1e-4):
            found.append(name)
            want = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
            got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
            assert want.keys() == got.keys() and all(
                np.array_equal(want[k], got[k]) for k in want
            ), "onnx.load read a mix"
    assert len(found) == 1, f"plain ORT computed neither pair's output (a mix): {y[0, :4]}"
    InferenceSession(path)  # and our own loader accepts the pair
    return found[0]


def _data_files(folder: Path) -> list[str]:
    """Visible files other than the model: data files, current or stale."""
    return sorted(
        p.name for p in folder.iterdir() if p.name != "model.onnx" and not p.name.startswith(".")
    )


def _assert_one_pair(folder: Path) -> None:
    assert _data_files(folder) == sorted(referenced_data_files(folder / "model.onnx")), _data_files(
        folder
    )


class Crash(BaseException):
    """Raised at the chosen step: a BaseException, like KeyboardInterrupt."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, function: str, step: int) -> None:
    original = getattr(os, function)
    calls = {"n": 0}

    def maybe_crash(*args: Any, **kwargs: Any) -> Any:
        if function == "unlink" and os.path.basename(args[0]).startswith("."):
            return original(*args, **kwargs)  # a hidden probe or temporary, not a data file
        calls["n"] += 1
        if calls["n"] == step + 1:
            raise Crash(f"crash at {function} #{step}")
        return original(*args, **kwargs)

    monkeypatch.setattr(os, function, maybe_crash)


# The write's steps, per choice. Default name: fsync #0 finishes the data file, replace #0 puts it
# in place, replace #1 the model (the switch), unlink #0 removes the previous write's data file.
# A chosen name that exists already (the previous model reads it): replace #0 puts the data in
# place under this write's own name, replace #1 the model pointing there (the switch), replace #2
# moves the previous chosen file to a hidden backup, replace #3 renames the new data to the chosen
# name, replace #4 points the model at it. (Hidden probes, temporaries and backups not counted.)
STEPS = {
    "default-name": [
        ("fsync", 0, "old"),
        ("replace", 0, "old"),
        ("replace", 1, "old"),
        ("unlink", 0, "new"),
    ],
    "weights.bin": [
        ("fsync", 0, "old"),
        ("replace", 0, "old"),
        ("replace", 1, "old"),
        ("replace", 2, "old"),
        ("replace", 3, "old"),
        ("replace", 4, "old"),
    ],
}
# After a killed process no handler ran: from the switch on, the folder holds the new pair; a
# chosen name killed between its last rename and the model's last write leaves the model pointing
# at a missing file ("missing": refused by every reader, never read with other data).
KILLED = {
    "default-name": [("replace", 0, "old"), ("replace", 1, "old"), ("unlink", 0, "new")],
    "weights.bin": [
        ("replace", 0, "old"),
        ("replace", 1, "old"),
        ("replace", 2, "new"),
        ("replace", 3, "new"),
        ("replace", 4, "missing"),
    ],
}


def _cases(table: dict[str, list[tuple[str, int, str]]]) -> list[Any]:
    return [
        pytest.param(choice, *step, id=f"{name}-{step[0]}{step[1]}")
        for name, choice in zip(("default-name", "weights.bin"), CHOICES, strict=True)
        for step in table[name]
    ]


@pytest.mark.parametrize(("choice", "function", "step", "pair"), _cases(STEPS))
def test_an_interrupted_write_leaves_one_complete_pair(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    function: str,
    step: int,
    pair: str,
    choice: Any,
) -> None:
    path = tmp_path / "model.onnx"
    save_model(_old()[0], path, external_data=choice)
    assert _which_pair(path) == "old"
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    _crash_at(monkeypatch, function, step)
    with pytest.raises(Crash):
        save_model(_new()[0], path, external_data=choice)
    monkeypatch.undo()
    assert _which_pair(path) == pair
    if pair == "old":  # the previous files exactly as they were, and nothing else
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")
    ]  # handlers removed temporaries
    save_model(_new()[0], path, external_data=choice)  # the next write cleans whatever was left
    assert _which_pair(path) == "new"
    _assert_one_pair(tmp_path)


_HARD_CRASH = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[4])
    from test_external_data_crash import _new
    from onnx_custom.exporter.pipeline import save_model

    function, step, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    original, calls = getattr(os, function), [0]

    def die(*args, **kwargs):
        if function == "unlink" and os.path.basename(args[0]).startswith("."):
            return original(*args, **kwargs)  # a hidden probe or temporary, not a data file
        calls[0] += 1
        if calls[0] == step + 1:
            os._exit(3)  # no handler, no finally: the process is gone
        return original(*args, **kwargs)

    setattr(os, function, die)
    save_model(_new()[0], path, external_data=eval(sys.argv[5]))
    """)


@pytest.mark.parametrize(("choice", "function", "step", "pair"), _cases(KILLED))
def test_a_killed_write_leaves_one_complete_pair(
    tmp_path: Path, choice: Any, function: str, step: int, pair: str
) -> None:
    path = tmp_path / "model.onnx"
    save_model(_old()[0], path, external_data=choice)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _HARD_CRASH,
            function,
            str(step),
            str(path),
            str(Path(__file__).parent),
            repr(choice),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    if pair == "missing":
        with pytest.raises(Exception, match="weights\\.[0-9a-f]{16}\\.bin"):
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        with pytest.raises(ModelLoadError, match="is missing"):
            InferenceSession(path)
    else:
        assert _which_pair(path) == pair
    save_model(_new()[0], path, external_data=choice)
    assert _which_pair(path) == "new"
    _assert_one_pair(tmp_path)  # stale data files of the killed write are gone (a killed
    # process's hidden '.<name>.<random>.tmp' temporary may remain:
    # no live write could be told apart)


@pytest.mark.parametrize("choice", CHOICES, ids=["default-name", "weights.bin"])
def test_repeated_writes_keep_exactly_one_data_file(tmp_path: Path, choice: Any) -> None:
    path = tmp_path / "model.onnx"
    names = set()
    for i in range(4):
        save_model((_old if i % 2 else _new)()[0], path, external_data=choice)
        _assert_one_pair(tmp_path)
        names |= referenced_data_files(path)
    assert _which_pair(path) == "old"
    if choice is True:
        assert len(names) == 4  # each write had a data file of its own
        assert all(re.fullmatch(r"model\.onnx\.[0-9a-f]{16}\.data", n) for n in names), names
    else:
        assert names == {"weights.bin"}  # the chosen name, exactly


def test_switching_to_one_file_removes_the_previous_data(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    save_model(_old()[0], path, external_data="weights.bin")
    save_model(_new()[0], path, external_data=True)  # another name: the old one is still removed
    _assert_one_pair(tmp_path)
    save_model(_old()[0], path, external_data=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert _which_pair(path) == "old"


def test_files_that_are_not_this_models_data_are_kept(tmp_path: Path) -> None:
    """Only data files onnx-custom wrote for *this* model are removed: not a user's file that
    happens to match the naming, and not another model's data."""
    foreign = tmp_path / "model.onnx.0123456789abcdef.data"
    foreign.write_bytes(b"the user's own bytes")
    save_model(_old()[0], tmp_path / "other.onnx", external_data="weights.bin")
    for _ in range(2):
        save_model(_new()[0], tmp_path / "model.onnx", external_data=True)
        save_model(_new()[0], tmp_path / "model.onnx", external_data="model.bin")
    assert foreign.read_bytes() == b"the user's own bytes"
    assert _which_pair(tmp_path / "other.onnx") == "old"
    assert referenced_data_files(tmp_path / "model.onnx") == {"model.bin"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model.onnx", "model.bin", "other.onnx", "weights.bin", foreign.name]
    )


def test_a_chosen_name_another_model_reads_is_refused(tmp_path: Path) -> None:
    """Two models cannot share one chosen data file: the second write would break the first."""
    save_model(_old()[0], tmp_path / "other.onnx", external_data="weights.bin")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(OutputPathError, match=r"other\.onnx.*still reads it.*Fix: choose another"):
        save_model(_new()[0], tmp_path / "model.onnx", external_data="weights.bin")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / "other.onnx").unlink()  # its model gone, the name is free to take
    save_model(_new()[0], tmp_path / "model.onnx", external_data="weights.bin")
    assert _which_pair(tmp_path / "model.onnx") == "new"


def test_a_users_file_under_the_chosen_name_is_replaced(tmp_path: Path) -> None:
    """The chosen name is what the user asked for: a file of theirs there is replaced, whole."""
    (tmp_path / "weights.bin").write_bytes(b"x" * 10)
    save_model(_new()[0], tmp_path / "model.onnx", external_data="weights.bin")
    assert _which_pair(tmp_path / "model.onnx") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "weights.bin"]


def test_data_swapped_in_by_hand_is_still_refused_by_our_loaders(tmp_path: Path) -> None:
    """The per-write token stays: a data file copied over another one (same name) is refused."""
    save_model(_old()[0], tmp_path / "a.onnx", external_data=True)
    save_model(_old()[0], tmp_path / "b.onnx", external_data=True)
    (a_data,), (b_data,) = (
        referenced_data_files(tmp_path / "a.onnx"),
        referenced_data_files(tmp_path / "b.onnx"),
    )
    os.replace(tmp_path / b_data, tmp_path / a_data)
    with pytest.raises(ModelLoadError, match="different exports"):
        InferenceSession(tmp_path / "a.onnx")

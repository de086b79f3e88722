"""The whole-suite ORT log guard (``tests/ort_log_guard.py``, loaded by ``tests/conftest.py``) can
fail: planted tests that let ONNX Runtime log to stderr (a session created outside our wrappers
with ``log_severity_level`` 0, in the test itself, in a fixture, or in a child process whose
output the test captures) are reported as failures naming the lines; the same tests marked
``@pytest.mark.ort_logs``, and sessions built with our quiet options, pass. Runs pytest in a child
process on a planted test file, so the planted failures do not fail this suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLANTED = textwrap.dedent("""
    import subprocess, sys
    import numpy as np
    import onnxruntime as ort
    import pytest
    from onnx import TensorProto, helper

    def model_bytes():
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        opsets = [helper.make_opsetid("", 18)]
        return helper.make_model(graph, ir_version=10, opset_imports=opsets).SerializeToString()

    def verbose_session(level=0):
        so = ort.SessionOptions()
        so.log_severity_level = level  # asks ORT for every log line, outside onnx-custom's wrappers
        session = ort.InferenceSession(model_bytes(), so, providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones(2, np.float32)})

    CHILD = ("import sys; sys.path.insert(0, %r); "
             "from test_planted import verbose_session; verbose_session()")

    def test_noisy_session():
        verbose_session()

    @pytest.fixture
    def noisy_fixture():
        verbose_session()

    def test_noisy_fixture(noisy_fixture):
        pass

    def test_noisy_child_process_captured():
        proc = subprocess.run(
            [sys.executable, "-c", CHILD % sys.path[0]], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr

    @pytest.mark.ort_logs
    def test_noisy_but_marked():
        verbose_session()

    @pytest.mark.ort_logs
    def test_noisy_child_but_marked():
        proc = subprocess.run(
            [sys.executable, "-c", CHILD % sys.path[0]], capture_output=True, text=True)
        assert "onnxruntime" in proc.stderr

    def test_quiet_session():
        from onnx_custom.runtime.ort_log_level import quiet_session_options
        session = ort.InferenceSession(
            model_bytes(), quiet_session_options(), providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones(2, np.float32)})

    def test_failing_and_noisy():
        verbose_session()
        assert False, "its own failure"
    """)


@pytest.mark.ort_logs  # the child pytest's report quotes the planted lines
def test_the_guard_fails_tests_that_let_ort_log(tmp_path: Path) -> None:
    (tmp_path / "test_planted.py").write_text(PLANTED, encoding="utf-8")
    tests_dir = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tests_dir), os.environ.get("PYTHONPATH", "")])
        ),
    }
    env.pop("ONNX_CUSTOM_ORT_LOG_SEVERITY", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "ort_log_guard",
            "-p",
            "no:cacheprovider",
            "-rA",
            "--strict-markers",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_planted.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = proc.stdout
    outcomes = {
        name: outcome
        for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\w+)", out, re.M)
    }
    assert outcomes == {
        "test_noisy_session": "FAILED",
        "test_noisy_fixture": "ERROR",  # the fixture's setup phase printed them
        "test_noisy_child_process_captured": "FAILED",
        "test_noisy_but_marked": "PASSED",
        "test_noisy_child_but_marked": "PASSED",
        "test_quiet_session": "PASSED",
        "test_failing_and_noisy": "FAILED",
    }, out[-4000:]
    assert out.count("ONNX Runtime log lines reached stderr during call") >= 2, out[-4000:]
    assert "ONNX Runtime log lines reached stderr during setup" in out
    assert re.search(r"\[I:onnxruntime:.*Session successfully initialized", out), out[
        -4000:
    ]  # names the lines
    assert (
        "its own failure" in out and "ORT log guard" in out
    )  # a failing test keeps its failure, gets a section

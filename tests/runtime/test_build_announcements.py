"""Every first-time native build announces itself on stderr wherever it happens:
one line before (what, how long it usually takes, where it is cached), one after (how long it
took); a cache hit says nothing. Real compiles into an empty cache, in fresh interpreters.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SESSION = textwrap.dedent("""
    import numpy as np
    from onnx import TensorProto, helper
    from onnx_custom.runtime import InferenceSession, KernelRegistry

    reg = KernelRegistry()

    @reg.kernel("test::Twice", inputs=["x"], outputs=["y"], shape_fn="like0")
    def twice(x):
        return x * 2

    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["y"], domain="test")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("test", 1)]
    model = helper.make_model(graph, ir_version=10, opset_imports=opsets)
    print(InferenceSession(model, kernels=reg).run(None, {"x": np.ones(2, np.float32)})[0])
    """)

EXTENSION = "from onnx_custom.ops.deform_conv import load_extension; load_extension()"
LIBRARY = "from onnx_custom.runtime.native import library_path; print(library_path())"


def _run(code: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ONNX_CUSTOM_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env
    )


def _assert_announced(stderr: str, what: str, usual: str, cache: Path) -> None:
    lines = [line for line in stderr.splitlines() if line.startswith("onnx-custom: ")]
    assert len(lines) == 2, stderr
    assert (
        lines[0]
        == f"onnx-custom: building {what} (one time, usually {usual}; cached in {cache}) ..."
    ), lines[0]
    assert re.fullmatch(rf"onnx-custom: built {re.escape(what)} in \d+\.\d s", lines[1]), lines[1]


def test_first_session_announces_the_shim_build_and_the_second_does_not(tmp_path: Path) -> None:
    fresh = _run(SESSION, tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == "[2. 2.]"
    _assert_announced(fresh.stderr, "the ONNX Runtime kernel shim (C)", "~5 s", tmp_path)
    cached = _run(SESSION, tmp_path)
    assert cached.returncode == 0 and "building" not in cached.stderr, cached.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "what", "usual"),
    [
        (EXTENSION, "the C++ extension onnx_custom_deform_conv2d", "30-60 s"),
        (LIBRARY, "libonnx_custom_ops.so (the native kernel library, release build)", "15-45 s"),
    ],
    ids=["deform_conv-extension", "native-library"],
)
def test_first_cxx_builds_announce_themselves(
    code: str, what: str, usual: str, tmp_path: Path
) -> None:
    fresh = _run(code, tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    _assert_announced(fresh.stderr, what, usual, tmp_path)
    cached = _run(code, tmp_path)
    assert cached.returncode == 0 and "building" not in cached.stderr, cached.stderr

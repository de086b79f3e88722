"""Kernel lifetime: a kernel (and everything its function holds) is released once its registry
and every session (and SessionOptions) using it are gone; memory stays flat over many sessions."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_custom.runtime as rt
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.host import live_kernel_ops


def model(op: str = "Big") -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], domain="mem")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("mem", 1)],
        ir_version=10,
    )


class Payload:
    """Something a kernel closure holds; weakly referenceable so the test can watch it die."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)


def registry_with_payload(size: int = 1 << 20) -> tuple[KernelRegistry, weakref.ref[Payload]]:
    payload = Payload(size)
    reg = KernelRegistry()

    @reg.kernel("mem::Big", inputs=["x"], outputs=["y"], shape_fn="like:x")
    def big(x: np.ndarray) -> np.ndarray:
        return x + len(payload.data) % 7

    return reg, weakref.ref(payload)


def _gone(ref: weakref.ref[Any]) -> bool:
    for _ in range(3):
        gc.collect()
    return ref() is None


X = np.arange(4, dtype=np.float32)
EXPECTED = X + (1 << 20) % 7


def _live_ops() -> int:
    gc.collect()  # earlier tests' sessions may still wait for the collector
    return live_kernel_ops()


def test_kernel_released_when_registry_and_session_are_gone() -> None:
    base = _live_ops()
    reg, payload = registry_with_payload()
    sess = rt.InferenceSession(model(), kernels=reg)
    assert live_kernel_ops() == base + 1
    del reg
    assert not _gone(payload)  # the session still uses it
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], EXPECTED)
    del sess
    assert _gone(payload)
    assert _live_ops() == base


def test_kernel_lives_as_long_as_sessions_share_its_options() -> None:
    reg, payload = registry_with_payload()
    so = rt.session_options(model(), kernels=reg)
    first = ort.InferenceSession(
        model().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    second = ort.InferenceSession(
        model().SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    del reg, so, first
    assert not _gone(payload)
    np.testing.assert_array_equal(second.run(None, {"x": X})[0], EXPECTED)
    del second  # the last holder of the options
    assert _gone(payload)


def test_one_spec_registered_again_after_release_still_runs() -> None:
    reg, payload = registry_with_payload()
    for _ in range(3):  # released with each session, revived by the next
        sess = rt.InferenceSession(model(), kernels=reg)
        np.testing.assert_array_equal(sess.run(None, {"x": X})[0], EXPECTED)
        del sess
        gc.collect()
    assert not _gone(payload)  # the registry still holds it
    del reg
    assert _gone(payload)


def test_options_collected_before_their_sessions_are_created_release_kernels() -> None:
    base = _live_ops()
    reg, payload = registry_with_payload()
    so = rt.session_options(model(), kernels=reg)
    assert live_kernel_ops() == base + 1
    del so, reg
    assert _gone(payload) and _live_ops() == base


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc for RSS")
def test_rss_flat_over_500_sessions_each_with_its_own_registry(tmp_path: Path) -> None:
    script = tmp_path / "many.py"
    script.write_text(
        textwrap.dedent("""
        import gc, numpy as np
        from pathlib import Path
        from onnx import helper, TensorProto
        import onnx_custom.runtime as rt
        from onnx_custom.runtime import KernelRegistry
        from onnx_custom.runtime.host import live_kernel_ops

        node = helper.make_node("Big", ["x"], ["y"], domain="mem")
        graph = helper.make_graph([node], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("mem", 1)]
        m = helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()
        x = np.ones(4, np.float32)

        def rss_mib():
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

        def one_session():
            payload = np.ones(1 << 18, np.float32)  # 1 MiB held by the kernel's closure
            reg = KernelRegistry()
            declare = reg.kernel("mem::Big", inputs=["x"], outputs=["y"], shape_fn="like:x")
            declare(lambda x: x + payload[0])
            sess = rt.InferenceSession(m, kernels=reg)
            assert sess.run(None, {"x": x})[0].tolist() == [2.0] * 4

        for _ in range(50):  # warm-up: allocator pools, lazily built caches
            one_session()
        gc.collect()
        before = rss_mib()
        for _ in range(500):
            one_session()
        gc.collect()
        print(f"growth {rss_mib() - before:.1f} live {live_kernel_ops()}")
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    growth, live = float(words[1]), int(words[3])
    assert live == 0, proc.stdout
    # leaking the kernels would hold 500 MiB here
    assert growth < 25, f"RSS grew {growth:.1f} MiB over 500 sessions with their own 1 MiB kernels"

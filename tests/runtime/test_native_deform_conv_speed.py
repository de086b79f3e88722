"""The native ``onnx_custom::DeformConv2d`` keeps pace with the eager op it shares its forward with.

Both run the kernels of ``onnx_custom/kernels/deform_conv.h`` on ``benchmarks/native_ops.py``'s
``dcn`` shape (N=4, C=64, 56x56, 3x3, Cout=64, mask on), 2 threads each; timed as pairs, round by
round (``benchmarks/harness.py``), so load that drifts on a shared machine hits both alike. The
native kernel drifting above 1.2x the eager op means it no longer runs the shared fast path. The
fast variant checks the two agree on a small shape (the timing needs the full one: slow).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from onnx_custom.ops.deform_conv import deform_conv2d
from onnx_custom.runtime.native import library_path

HARNESS = Path(__file__).resolve().parents[2] / "benchmarks" / "harness.py"
NAMES = ("input", "weight", "offset", "mask", "bias")
LIMIT = 1.2  # native / eager, paired wall time


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_harness_dcn_speed", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _tensors(n: int, c: int, hw: int, cout: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "input": torch.randn(n, c, hw, hw, generator=g),
        "weight": torch.randn(cout, c, 3, 3, generator=g) * 0.05,
        "offset": torch.randn(n, 18, hw, hw, generator=g) * 2.0,
        "mask": torch.rand(n, 9, hw, hw, generator=g),
        "bias": torch.randn(cout, generator=g),
    }


def _session(threads: int) -> ort.InferenceSession:
    node = helper.make_node(
        "DeformConv2d", list(NAMES), ["Y"], domain="onnx_custom", pad_h=1, pad_w=1, use_mask=1
    )
    graph = helper.make_graph(
        [node],
        "dcn",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in NAMES],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("onnx_custom", 1)],
        ir_version=9,
    )
    opts = _harness().ort_options(threads)
    opts.register_custom_ops_library(str(library_path()))
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _eager(t: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        return deform_conv2d(
            t["input"], t["offset"], t["weight"], t["bias"], padding=1, mask=t["mask"]
        )


@pytest.mark.parametrize("shape", [(1, 16, 9, 8)], ids=["N1-C16-9x9-Cout8"])
def test_native_matches_eager_on_the_channels_last_path(shape: tuple[int, int, int, int]) -> None:
    t = _tensors(*shape)
    feeds = {k: v.numpy() for k, v in t.items()}
    (got,) = _session(2).run(None, feeds)
    torch.testing.assert_close(torch.from_numpy(np.asarray(got)), _eager(t))


@pytest.mark.slow
def test_native_within_1_2x_of_the_eager_op() -> None:
    harness = _harness()
    t = _tensors(4, 64, 56, 64)
    feeds = {k: v.numpy() for k, v in t.items()}
    session = _session(2)
    torch.set_num_threads(2)
    native = lambda: session.run(None, feeds)  # noqa: E731
    eager = lambda: _eager(t)  # noqa: E731
    for _ in range(2):  # warm up: kernel creation, thread pools, caches
        native()
        eager()
    native_ms, eager_ms, ratio = harness.paired_rounds(native, eager, rounds=7, repeat=5)
    assert ratio <= LIMIT, (
        f"native DeformConv2d {native_ms:.2f} ms is {ratio:.2f}x the eager op's {eager_ms:.2f} ms"
        f" (paired, 2 threads); expected <= {LIMIT}x: the native kernel no longer runs the eager"
        " op's channels-last forward (onnx_custom/kernels/deform_conv.h)"
    )

"""Benchmark the ``custom::DeformConv2d`` function body in plain ONNX Runtime against ORT's built-in
``DeformConv`` (opset 19): the price of running a DCN file with nothing registered.

Run: ``python benchmarks/function_bodies.py [--repeat 10] [--rounds 5]``. Shape N=4, C=64, 56x56,
3x3, Cout=64, pad 1, mask on, float32; every session has 2 intra-op threads, spinning off, and is
a plain ``onnxruntime.InferenceSession`` (nothing registered). Times are measured side by side in
one process, paired round by round in alternating order; the ratio is the median of the per-round
ratios. Peak memory is the RSS high-water increase of one warm call, each model in a fresh
subprocess that imports only onnxruntime and numpy.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

__all__ = ["body_model", "builtin_model", "main"]

_HERE = Path(__file__).resolve().parent
_NAMES = ["X", "W", "offset", "mask", "B"]  # custom::DeformConv2d's input order


def _sibling(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", _HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def body_model(opset: int) -> onnx.ModelProto:
    """One ``custom::DeformConv2d`` node (pad 1, mask on) with its embedded function body."""
    from onnx_custom.runtime import embed_functions

    pad = 1
    node = helper.make_node("DeformConv2d", _NAMES, ["Y"], domain="custom", stride_h=1, stride_w=1,
                            pad_h=pad, pad_w=pad, dilation_h=1, dilation_w=1, groups=1,
                            offset_groups=1, use_mask=1)  # fmt: skip
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (1 if n == "B" else 4)) for n in _NAMES]
    graph = helper.make_graph([node], "dcn_body", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)])  # fmt: skip
    return embed_functions(model)


def _options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def _rss_child(model_path: str, feeds_path: str) -> None:
    """Subprocess body (onnxruntime + numpy only): RSS high-water increase (KiB) of one warm call."""

    def kib(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

    sess = ort.InferenceSession(model_path, _options(), providers=["CPUExecutionProvider"])
    with np.load(feeds_path) as data:
        feeds = {i.name: data[i.name] for i in sess.get_inputs()}
    sess.run(None, feeds)  # warm: arena and thread-pool growth are not one call's working set
    before = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    sess.run(None, feeds)
    assert "torch" not in sys.modules and "onnx_custom" not in sys.modules
    print(kib("VmHWM") - before)


def _peak_bytes(model_path: Path, feeds_path: Path) -> int:
    # glibc maps and unmaps large buffers right away, so memory freed by the warm call is not reused
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-I", __file__, "--rss-child", str(model_path), str(feeds_path)],
                         env=env, check=True, capture_output=True, text=True).stdout  # fmt: skip
    return int(out.split()[-1]) * 1024


def builtin_model(k: int, pad: int) -> onnx.ModelProto:
    """One opset-19 ``DeformConv`` node (float32, bias and mask inputs): ORT's own kernel."""
    names = ["X", "W", "offset", "B", "mask"]
    node = helper.make_node("DeformConv", names, ["Y"], kernel_shape=[k, k], pads=[pad] * 4)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (1 if n == "B" else 4)) for n in names]
    graph = helper.make_graph([node], "deformconv", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rss-child", nargs=2, metavar=("MODEL", "FEEDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        _rss_child(*args.rss_child)
        return {}
    bench: Any = _sibling("deform_conv2d")  # same inputs and timer as benchmarks/deform_conv2d.py
    shape = bench.SHAPE
    feeds = {name: t.numpy() for name, t in bench.make_inputs().items()}
    base = "ORT DeformConv (opset 19)"
    models = {base: builtin_model(shape["K"], shape["K"] // 2)}
    models.update({f"function body (opset {v})": body_model(v) for v in (11, 18)})
    contenders: dict[str, Callable[[], Any]] = {}
    for label, model in models.items():
        sess = ort.InferenceSession(model.SerializeToString(), _options(), providers=["CPUExecutionProvider"])
        contenders[label] = lambda s=sess: s.run(None, feeds)
    expected = contenders[base]()[0]
    for label, fn in contenders.items():
        np.testing.assert_allclose(fn()[0], expected, rtol=1e-4, atol=1e-4, err_msg=label)

    labels = list(contenders)
    rounds: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(args.rounds):  # paired rounds, order reversed every other round
        for label in labels if r % 2 == 0 else labels[::-1]:
            rounds[label].append(bench.time_fn(contenders[label], args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, **feeds)
        peaks = {}
        for i, (label, model) in enumerate(models.items()):
            path = Path(tmp) / f"model{i}.onnx"
            path.write_bytes(model.SerializeToString())
            peaks[label] = _peak_bytes(path, feeds_path)
    mib = 1024 * 1024
    dims = ", ".join(f"{k}={v}" for k, v in shape.items())
    print(f"DeformConv2d forward, float32, {dims}, pad 1, mask on; plain onnxruntime "
          f"{ort.__version__}, 2 intra-op threads, spinning off; {args.rounds} paired rounds")  # fmt: skip
    print(f"{'model':<28}{'median ms':>11}{'x builtin':>11}{'peak RSS MiB':>14}")
    results: dict[str, float] = {}
    for label in labels:
        ratio = statistics.median(a / b for a, b in zip(rounds[label], rounds[base], strict=True))
        results[f"{label} / {base}"] = ratio
        results[f"{label} peak_bytes"] = peaks[label]
        print(f"{label:<28}{statistics.median(rounds[label]):>11.2f}{ratio:>10.2f}x{peaks[label] / mib:>14.1f}")
    return results


if __name__ == "__main__":
    main()

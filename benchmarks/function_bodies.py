"""Benchmark the ``onnx_custom::DeformConv2d`` function body in plain ONNX Runtime against ORT's
built-in ``DeformConv`` (opset 19): the price of running a DCN file with nothing registered.

Run: ``python benchmarks/function_bodies.py [--repeat 10] [--rounds 5]``. Shape N=4, C=64, 56x56,
3x3, Cout=64, pad 1, mask on, float32; every session has 2 intra-op threads, spinning off, and is
a plain ``onnxruntime.InferenceSession`` (nothing registered). Times are measured side by side in
one process, paired round by round in alternating order; the ratio is the median of the per-round
ratios. Peak memory is the RSS high-water increase (session + first call, and one warm call) of
each model in a fresh subprocess that imports only onnxruntime and numpy. ``--instructions``
also counts instructions per call under callgrind (load-independent; minutes).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
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
_NAMES = ["X", "W", "offset", "mask", "B"]  # onnx_custom::DeformConv2d's input order


def _sibling(name: str) -> object:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", _HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def body_model(opset: int) -> onnx.ModelProto:
    """One ``onnx_custom::DeformConv2d`` node (pad 1, mask on) with its embedded function body."""
    from onnx_custom.function_bodies import embed_functions

    pad = 1
    node = helper.make_node(
        "DeformConv2d",
        _NAMES,
        ["Y"],
        domain="onnx_custom",
        stride_h=1,
        stride_w=1,
        pad_h=pad,
        pad_w=pad,
        dilation_h=1,
        dilation_w=1,
        groups=1,
        offset_groups=1,
        use_mask=1,
    )
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (1 if n == "B" else 4))
        for n in _NAMES
    ]
    graph = helper.make_graph(
        [node], "dcn_body", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(
        graph,
        ir_version=9,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("onnx_custom", 1)],
    )
    return embed_functions(model)


def _options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def _child(model_path: str, feeds_path: str, calls: int) -> None:
    """Subprocess body (onnxruntime + numpy only): session, ``calls`` runs, then prints the RSS
    high-water increase (KiB) over the RSS before the session, and of the last (warm) call."""

    def kib(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

    start = kib("VmRSS")
    sess = ort.InferenceSession(model_path, _options(), providers=["CPUExecutionProvider"])
    with np.load(feeds_path) as data:
        feeds = {i.name: data[i.name] for i in sess.get_inputs()}
    for _ in range(calls - 1):
        sess.run(None, feeds)
    first = kib("VmHWM") - start
    before = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    sess.run(None, feeds)
    assert "torch" not in sys.modules and "onnx_custom" not in sys.modules
    print(first, kib("VmHWM") - before)


def _run_child(
    model_path: Path, feeds_path: Path, calls: int, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    # glibc maps and unmaps large buffers right away, so memory freed by a call is not reused
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    command = [
        *prefix,
        sys.executable,
        "-I",
        __file__,
        "--child",
        str(model_path),
        str(feeds_path),
        str(calls),
    ]
    return subprocess.run(command, env=env, check=True, capture_output=True, text=True)


def _peaks(model_path: Path, feeds_path: Path) -> tuple[int, int]:
    """(peak RSS increase of session + first call, of one warm call), bytes, fresh subprocess."""
    first, warm = _run_child(model_path, feeds_path, 2).stdout.split()[-2:]
    return int(first) * 1024, int(warm) * 1024


def _instructions(model_path: Path, feeds_path: Path) -> int:
    """Instructions of one call under callgrind: (session + 3 calls) - (session + 1 call), / 2."""
    counts = []
    for calls in (1, 3):
        done = _run_child(
            model_path,
            feeds_path,
            calls,
            ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"),
        )
        counts.append(int(re.findall(r"Collected : (\d+)", done.stderr)[-1]))
    return (counts[1] - counts[0]) // 2


def builtin_model(k: int, pad: int) -> onnx.ModelProto:
    """One opset-19 ``DeformConv`` node (float32, bias and mask inputs): ORT's own kernel."""
    names = ["X", "W", "offset", "B", "mask"]
    node = helper.make_node("DeformConv", names, ["Y"], kernel_shape=[k, k], pads=[pad] * 4)
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * (1 if n == "B" else 4))
        for n in names
    ]
    graph = helper.make_graph(
        [node], "deformconv", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per call with callgrind (slow)",
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("MODEL", "FEEDS", "CALLS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return {}
    bench: Any = _sibling("deform_conv2d")  # same inputs and timer as benchmarks/deform_conv2d.py
    shape = bench.SHAPE
    feeds = {name: t.numpy() for name, t in bench.make_inputs().items()}
    base = "ORT DeformConv (opset 19)"
    models = {base: builtin_model(shape["K"], shape["K"] // 2)}
    models.update({f"function body (opset {v})": body_model(v) for v in (11, 18)})
    contenders: dict[str, Callable[[], Any]] = {}
    for label, model in models.items():
        sess = ort.InferenceSession(
            model.SerializeToString(), _options(), providers=["CPUExecutionProvider"]
        )
        contenders[label] = lambda s=sess: s.run(None, feeds)
    expected = contenders[base]()[0]
    for label, fn in contenders.items():
        np.testing.assert_allclose(fn()[0], expected, rtol=1e-4, atol=1e-4, err_msg=label)

    harness: Any = _sibling("harness")
    labels = list(contenders)
    rounds = harness.rounds_ms(contenders, args.rounds, args.repeat, warmup=3)
    with tempfile.TemporaryDirectory() as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, **feeds)
        peaks, instructions = {}, {}
        for i, (label, model) in enumerate(models.items()):
            path = Path(tmp) / f"model{i}.onnx"
            path.write_bytes(model.SerializeToString())
            peaks[label] = _peaks(path, feeds_path)
            if args.instructions:
                instructions[label] = _instructions(path, feeds_path)
    mib = 1024 * 1024
    dims = ", ".join(f"{k}={v}" for k, v in shape.items())
    print(
        f"DeformConv2d forward, float32, {dims}, pad 1, mask on; plain onnxruntime "
        f"{ort.__version__}, 2 intra-op threads, spinning off; {args.rounds} paired rounds"
    )
    print(
        f"{'model':<28}{'median ms':>10}{'x builtin':>10}{'instr x':>9}"
        f"{'peak MiB: 1st call':>20}{'warm':>7}"
    )
    results: dict[str, float] = {}
    for label in labels:
        ratio = harness.paired_ratio(rounds[label], rounds[base])
        results[f"{label} / {base}"] = ratio
        results[f"{label} peak_bytes"], results[f"{label} warm_peak_bytes"] = peaks[label]
        instr = (
            f"{instructions[label] / instructions[base]:>8.2f}x" if instructions else f"{'-':>9}"
        )
        if instructions:
            results[f"{label} instructions"] = instructions[label]
        print(
            f"{label:<28}{statistics.median(rounds[label]):>10.2f}{ratio:>9.2f}x{instr}"
            f"{peaks[label][0] / mib:>20.1f}{peaks[label][1] / mib:>7.1f}"
        )
    print(
        "peak MiB: RSS high-water increase over the RSS before the session (session + first call), "
        "and of one warm call; each model in a fresh onnxruntime+numpy subprocess"
    )
    return results


if __name__ == "__main__":
    main()

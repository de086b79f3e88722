"""Per-call overhead of a Python kernel over native ONNX Runtime nodes doing the same math.

Native: ``Mul(a, 2) -> Add(., b)``. Ours: ``custom::my_add`` (alpha=2), which writes into ORT's
output buffer (``out=``). Also shown: the same math as a kernel that *returns* its result (one
extra copy into ORT's buffer). Sessions run side by side in one process, interleaved, with one
intra-op thread and spinning off, so the difference is the host's overhead, not parallelism.

Run: ``python benchmarks/kernel_overhead.py [--repeats 7]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnx_custom.runtime as rt
from onnx_custom.runtime import KernelRegistry

SHAPES = [(2, 3), (64, 1024), (4, 64, 56, 56)]


def _model(nodes: list, inits: list | None = None) -> bytes:
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits or [],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                helper.make_opsetid("custom", 1)], ir_version=10)
    return m.SerializeToString()


def _options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


def _per_call_us(sess: ort.InferenceSession, feeds: dict, n: int) -> float:
    run = sess.run
    t0 = time.perf_counter_ns()
    for _ in range(n):
        run(None, feeds)
    return (time.perf_counter_ns() - t0) / n / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds per shape (median)")
    args = ap.parse_args()

    returning = KernelRegistry()

    @returning.kernel("custom::my_add_ret", inputs=["a", "b"], outputs=["y"],
                      attrs={"alpha": ("float", 2.0)}, shape_fn="broadcast")
    def my_add_ret(a: np.ndarray, b: np.ndarray, *, alpha: float) -> np.ndarray:
        return a * np.float32(alpha) + b

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    native = ort.InferenceSession(
        _model([helper.make_node("Mul", ["a", "two"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
               [two]), _options(), providers=["CPUExecutionProvider"])
    ours = rt.InferenceSession(_model([helper.make_node("my_add", ["a", "b"], ["y"], domain="custom",
                                                         alpha=2.0)]), _options())
    ret = rt.InferenceSession(_model([helper.make_node("my_add_ret", ["a", "b"], ["y"], domain="custom",
                                                        alpha=2.0)]), _options(), kernels=returning)

    print(f"onnxruntime {ort.__version__}, numpy {np.__version__}; 1 intra-op thread; "
          f"median of {args.repeats} interleaved rounds")
    header = (f"{'shape':<16} {'native us':>10} {'ours us':>10} {'overhead us':>12} {'ratio':>7}"
              f" {'ours(return) us':>16} {'overhead us':>12}")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        feeds = {"a": a, "b": b}
        want = native.run(None, feeds)[0]
        for s in (ours, ret):
            np.testing.assert_allclose(s.run(None, feeds)[0], want, rtol=1e-6)
        size = int(np.prod(shape))
        n = max(20, min(20000, int(4e7 / max(size, 1) / 20)))
        for s in (native, ours, ret):  # warm-up
            _per_call_us(s, feeds, max(5, n // 10))
        t_nat, t_ours, t_ret = [], [], []
        for _ in range(args.repeats):
            t_nat.append(_per_call_us(native, feeds, n))
            t_ours.append(_per_call_us(ours, feeds, n))
            t_ret.append(_per_call_us(ret, feeds, n))
        nat, our, rtn = (statistics.median(t) for t in (t_nat, t_ours, t_ret))
        print(f"{'x'.join(map(str, shape)):<16} {nat:>10.1f} {our:>10.1f} {our - nat:>12.1f} "
              f"{our / nat:>7.2f} {rtn:>16.1f} {rtn - nat:>12.1f}")


if __name__ == "__main__":
    main()

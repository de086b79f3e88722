"""Python kernels on every kind of ONNX Runtime thread: results, thread states, GIL, exit."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnx_custom.runtime as rt
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.host import thread_state_counts

kernels = KernelRegistry()
seen_threads: set[int] = set()


@kernels.kernel(
    "th::AddMul",
    inputs=["a", "b"],
    outputs=["y"],
    attrs={"k": ("float", 2.0)},
    shape_fn="broadcast",
)
def add_mul(a: np.ndarray, b: np.ndarray, *, k: float) -> np.ndarray:
    seen_threads.add(threading.get_native_id())
    return ((a + b) * np.asarray(k, a.dtype)).astype(a.dtype)


_barrier: list[threading.Barrier] = []


@kernels.kernel("th::Meet", inputs=["x"], outputs=["y"], shape_fn="like:x")
def meet(x: np.ndarray) -> np.ndarray:
    # returns only once another branch reached the barrier at the same time: fails (times out)
    # unless two kernels run concurrently, i.e. a waiting kernel lets the other take the GIL
    _barrier[0].wait(timeout=20)
    return x + 1


def branches_model(op: str, n: int, depth: int = 1, **attrs: Any) -> onnx.ModelProto:
    nodes = []
    for br in range(n):
        prev = "a"
        for d in range(depth):
            out = f"y{br}" if d == depth - 1 else f"t{br}_{d}"
            ins = [prev, "b"] if op == "AddMul" else [prev]
            nodes.append(helper.make_node(op, ins, [out], domain="th", name=f"n{br}_{d}", **attrs))
            prev = out
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", 3]) for x in ("a", "b")]
    graph = helper.make_graph(
        nodes,
        "g",
        inputs if op == "AddMul" else inputs[:1],
        [helper.make_tensor_value_info(f"y{br}", TensorProto.FLOAT, ["N", 3]) for br in range(n)],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("th", 1)],
        ir_version=10,
    )


def options(mode: str, inter: int = 3) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = inter
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if mode == "parallel" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    return so


def expected(a: np.ndarray, b: np.ndarray, depth: int) -> np.ndarray:
    y = a
    for _ in range(depth):
        y = (y + b) * np.float32(2.0)
    return y


def run_async(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return run_async_started(sess, feeds)()


@pytest.mark.parametrize("kind", ["caller", "inter-op", "intra-op", "python-threads"])
def test_results_correct_on_every_thread_kind(kind: str) -> None:
    depth, n_branches = 3, 8
    sess = rt.InferenceSession(
        branches_model("AddMul", n_branches, depth),
        options("parallel" if kind == "inter-op" else "sequential"),
        kernels=kernels,
    )
    rng = np.random.default_rng(0)
    feeds = [
        {
            "a": rng.standard_normal((r, 3)).astype(np.float32),
            "b": rng.standard_normal((r, 3)).astype(np.float32),
        }
        for r in (1, 2, 5, 7)
    ]
    seen_threads.clear()
    python_ids = {t.native_id for t in threading.enumerate()}
    if kind == "python-threads":
        results: dict[int, list[np.ndarray]] = {}

        def worker(i: int) -> None:
            for _ in range(25):
                results[i] = sess.run(None, feeds[i])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(feeds))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        python_ids |= {t.native_id for t in threads}
        got = [results[i] for i in range(len(feeds))]
    else:
        got = [
            run_async(sess, f) if kind == "intra-op" else sess.run(None, f)
            for f in feeds
            for _ in range(5)
        ]
        got = got[::5]
    for f, outs in zip(feeds, got, strict=True):
        want = expected(f["a"], f["b"], depth)
        for y in outs:
            np.testing.assert_allclose(y, want, rtol=1.3e-6, atol=1e-5)
    on_ort_threads = seen_threads - python_ids
    if kind in ("inter-op", "intra-op"):  # the point of the test: kernels ran on ORT's own threads
        assert on_ort_threads, "no kernel ran on an ONNX Runtime pool thread"
    else:
        assert not on_ort_threads


@pytest.mark.parametrize("via", ["run_async", "python-threads"])
def test_a_waiting_kernel_lets_another_kernel_run(via: str) -> None:
    """Two runs at once, each kernel waiting for the other at a barrier: only works if a waiting
    kernel releases the GIL. ``run_async`` on two sessions runs them on two intra-op pool threads
    (ORT_PARALLEL in onnxruntime 1.31 runs a run's independent branches on one pool thread)."""
    x = np.zeros((2, 3), np.float32)
    sessions = [
        rt.InferenceSession(branches_model("Meet", 1), options("sequential"), kernels=kernels)
        for _ in range(2)
    ]
    for _ in range(3):
        _barrier[:] = [threading.Barrier(2)]
        if via == "run_async":
            waits = [run_async_started(s, {"a": x}) for s in sessions]
            results = [wait() for wait in waits]
        else:
            box: list[Any] = []
            threads = [
                threading.Thread(target=lambda s=s, box=box: box.append(s.run(None, {"a": x})))
                for s in sessions
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            results = box
        assert len(results) == 2
        for (y,) in results:
            np.testing.assert_array_equal(y, x + 1)


def run_async_started(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> Any:
    done = threading.Event()
    box: list[Any] = []

    def callback(results: Any, user_data: Any, err: str) -> None:
        box.append(err or results)
        done.set()

    sess.run_async(None, feeds, callback, None)

    def wait() -> list[np.ndarray]:
        assert done.wait(60), "run_async never called back"
        assert not isinstance(box[0], str), box[0]
        return list(box[0])

    return wait


def _settled_thread_states(timeout: float = 20.0) -> tuple[int, int]:
    """(created, deleted) once the reaper caught up with exited ORT threads."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        created, deleted = thread_state_counts()
        if created == deleted or time.monotonic() > deadline:
            return created, deleted
        time.sleep(0.05)


def test_thread_states_do_not_leak_over_many_sessions() -> None:
    m = branches_model("AddMul", 4, 2)
    feeds = {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)}
    created0, deleted0 = _settled_thread_states()
    for i in range(40):
        sess = rt.InferenceSession(
            m, options("parallel" if i % 2 else "sequential"), kernels=kernels
        )
        sess.run(None, feeds)
        run_async(sess, feeds)
        del sess
    created, deleted = _settled_thread_states()
    assert created > created0, "sessions on pool threads should have needed thread states"
    assert created - deleted == created0 - deleted0, (
        f"thread states leak: {created - created0} made for ORT threads, {deleted - deleted0}"
        " deleted"
    )


def test_kernel_nesting_a_session_on_a_pool_thread() -> None:
    inner_model = branches_model("AddMul", 1, 1)
    reg = KernelRegistry()

    @reg.kernel("th::Nest", inputs=["x"], outputs=["y"], shape_fn="like:x")
    def nest(x: np.ndarray) -> np.ndarray:
        # a session created and run inside a kernel that already holds the GIL on an ORT thread
        inner = rt.InferenceSession(inner_model, kernels=kernels)
        return inner.run(None, {"a": x, "b": x})[0]

    nodes = [helper.make_node("Nest", ["a"], [f"y{i}"], domain="th") for i in range(2)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 3]) for i in range(2)],
    )
    m = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("th", 1)],
        ir_version=10,
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for y in rt.InferenceSession(m, options("parallel"), kernels=reg).run(None, {"a": x}):
        np.testing.assert_allclose(y, 4 * x)


def _run_script(tmp_path: Path, body: str, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path
    )


_SUBPROCESS_PRELUDE = """
import ctypes, threading, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto
import onnx_custom.runtime as rt
from onnx_custom.runtime import KernelRegistry
reg = KernelRegistry()

def model(op, n):
    nodes = [helper.make_node(op, ["a"], [f"y{i}"], domain="t") for i in range(n)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4]) for i in range(n)])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("t", 1)]
    return helper.make_model(g, opset_imports=opsets, ir_version=10)

def parallel():
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 3
    return so
"""


def test_nested_gilstate_calls_inside_a_kernel_on_a_pool_thread(tmp_path: Path) -> None:
    """ctypes callbacks enter Python with PyGILState_Ensure:
    it must find the pool thread's state."""
    proc = _run_script(
        tmp_path,
        _SUBPROCESS_PRELUDE
        + """
CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_float))
libc = ctypes.CDLL(None)

@reg.kernel("t::Sort", inputs=["a"], outputs=["y"], shape_fn="like:a")
def sort(a):
    buf = (ctypes.c_float * a.size)(*a.tolist())
    cmp = CMP(lambda x, y: (x[0] > y[0]) - (x[0] < y[0]))
    libc.qsort(buf, a.size, ctypes.sizeof(ctypes.c_float), cmp)  # calls back into Python
    return np.array(buf[:], np.float32)

sess = rt.InferenceSession(model("Sort", 4), parallel(), kernels=reg)
for y in sess.run(None, {"a": np.array([3, 1, 2, 0], np.float32)}):
    assert y.tolist() == [0, 1, 2, 3], y
print("sorted")
""",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sorted" in proc.stdout


def test_interpreter_exit_with_live_sessions_on_pool_threads(tmp_path: Path) -> None:
    proc = _run_script(
        tmp_path,
        _SUBPROCESS_PRELUDE
        + """
@reg.kernel("t::Twice", inputs=["a"], outputs=["y"], shape_fn="like:a")
def twice(a):
    return a * 2

x = np.ones(4, np.float32)
keep = []
for i in range(3):
    s = rt.InferenceSession(model("Twice", 4), parallel(), kernels=reg)
    assert all(y.tolist() == [2.0] * 4 for y in s.run(None, {"a": x}))
    done = threading.Event()
    s.run_async(None, {"a": x}, lambda res, data, err: done.set(), None)
    assert done.wait(60)
    keep.append(s)
short_lived = rt.InferenceSession(model("Twice", 2), parallel(), kernels=reg)
short_lived.run(None, {"a": x})
del short_lived  # its pool threads exit now; the rest are alive when the interpreter exits
cycle = {"session": keep[0]}
cycle["self"] = cycle  # only the final garbage collection at shutdown frees this one
print("ok", flush=True)
""",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok" in proc.stdout
    assert "Fatal" not in proc.stderr and "terminate" not in proc.stderr, proc.stderr[-3000:]

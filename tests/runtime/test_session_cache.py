"""SessionCache: a session is reused only for the same bytes, kernels and log severity; bounded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.ort_log_level import ORT_LOG_ENV
from onnx_custom.runtime.session_cache import SessionCache
from onnx_custom.verification.runner import make_session, plain_session

DOMAIN = "octest_cache"


def _scaled_model(weight: float, custom: bool = False) -> onnx.ModelProto:
    """y = x * w (a Mul with initializer ``w``),
    then a custom ``octest_cache::Twice`` when ``custom``."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["m" if custom else "y"])]
    if custom:
        nodes.append(helper.make_node("Twice", ["m"], ["y"], domain=DOMAIN))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.full((3,), weight, dtype=np.float32), "w")],
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(DOMAIN, 1)] if custom else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _twice_kernels(factor: float) -> KernelRegistry:
    kernels = KernelRegistry()
    kernels.kernel(f"{DOMAIN}::Twice", inputs=["x"], outputs=["y"], shape_fn="like:x")(
        lambda x: factor * x
    )
    return kernels


X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5


def _run(session: Any) -> np.ndarray:
    return np.asarray(session.run(None, {"x": X})[0])


class _Counting:
    """A session builder that counts the sessions it makes."""

    def __init__(self, make: Callable[[bytes | None], Any]) -> None:
        self.make, self.built = make, 0
        self.given: list[bytes | None] = []

    def __call__(self, data: bytes | None) -> Any:
        self.built += 1
        self.given.append(data)
        return self.make(data)


def _plain(model: onnx.ModelProto) -> _Counting:
    return _Counting(lambda data: plain_session(model, data))


def test_same_bytes_reuse_one_session_and_changed_bytes_make_another() -> None:
    cache, model = SessionCache(), _scaled_model(2.0)
    build = _plain(model)
    first = cache.session(model, build, plain=True)
    assert cache.session(model, build, plain=True) is first and build.built == 1
    np.testing.assert_array_equal(_run(first), X * 2.0)
    # The same proto object edited in place (a key by identity would hand back the old session).
    model.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.full((3,), -3.0, dtype=np.float32), "w")
    )
    changed = cache.session(model, build, plain=True)
    assert changed is not first and build.built == 2
    np.testing.assert_array_equal(_run(changed), X * -3.0)


def test_a_replaced_kernel_makes_another_session() -> None:
    cache, model = SessionCache(), _scaled_model(2.0, custom=True)
    kernels = _twice_kernels(2.0)
    build = _Counting(lambda data: make_session(model, kernels, data))
    first = cache.session(model, build, kernels)
    assert cache.session(model, build, kernels) is first and build.built == 1
    np.testing.assert_allclose(_run(first), X * 4.0)
    kernels.kernel(
        f"{DOMAIN}::Twice", inputs=["x"], outputs=["y"], shape_fn="like:x", replace=True
    )(lambda x: 10.0 * x)
    replaced = cache.session(model, build, kernels)
    assert replaced is not first and build.built == 2
    np.testing.assert_allclose(_run(replaced), X * 20.0)


def test_plain_and_kernel_sessions_of_one_file_differ() -> None:
    cache, model = SessionCache(), _scaled_model(2.0)
    plain = cache.session(model, _plain(model), plain=True)
    ours = cache.session(model, _Counting(lambda data: make_session(model, None, data)))
    assert plain is not ours and len(cache) == 2


def test_the_log_severity_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    cache, model = SessionCache(), _scaled_model(2.0)
    build = _plain(model)
    monkeypatch.delenv(ORT_LOG_ENV, raising=False)
    quiet = cache.session(model, build, plain=True)
    monkeypatch.setenv(ORT_LOG_ENV, "3")
    assert cache.session(model, build, plain=True) is not quiet and build.built == 2


@pytest.mark.parametrize("max_entries", [1, 2], ids=lambda n: f"max{n}")
def test_the_least_recently_used_session_goes_first(max_entries: int) -> None:
    cache = SessionCache(max_entries=max_entries)
    models = [_scaled_model(w) for w in (1.0, 2.0, 3.0)]
    builds = [_plain(m) for m in models]
    for m, b in zip(models, builds, strict=True):
        cache.session(m, b, plain=True)
    assert len(cache) == max_entries
    cache.session(models[-1], builds[-1], plain=True)  # the newest is still there
    cache.session(models[0], builds[0], plain=True)  # the oldest was evicted
    assert (builds[-1].built, builds[0].built) == (1, 2)


@pytest.mark.parametrize("bound", ["file", "weights"])
def test_files_past_the_size_bound_are_not_kept(bound: str) -> None:
    model = _scaled_model(2.0)
    # "weights": past the bound by its initializers alone (counted before serializing anything)
    limit = (
        model.ByteSize() - 1 if bound == "file" else len(model.graph.initializer[0].raw_data) - 1
    )
    cache = SessionCache(max_file_bytes=limit)
    build = _plain(model)
    assert cache.session(model, build, plain=True) is not cache.session(model, build, plain=True)
    assert build.built == 2 and len(cache) == 0 and build.given == [None, None]
    np.testing.assert_array_equal(_run(build.make(None)), X * 2.0)


def test_a_failed_build_caches_nothing_and_discard_forgets() -> None:
    cache, model = SessionCache(), _scaled_model(2.0)

    def failing(data: bytes) -> Any:
        raise RuntimeError("no session")

    with pytest.raises(RuntimeError, match="no session"):
        cache.session(model, failing, plain=True)
    assert len(cache) == 0
    build = _plain(model)
    session = cache.session(model, build, plain=True)
    cache.discard(session)
    assert len(cache) == 0 and cache.session(model, build, plain=True) is not session

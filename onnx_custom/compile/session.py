"""Sessions (LRU-cached) and the torch <-> ONNX Runtime hand-off of one compiled partition.

Hand-off without copies: inputs are wrapped as ``OrtValue``s over the tensors' own memory
(``OrtValueVector.push_back_batch``) and ORT's outputs become torch tensors through DLPack
(``OrtValueVector.to_dlpacks``), a few microseconds per call. Wrapping by data pointer ignores
strides, so a non-contiguous input is made contiguous first (the only copy, and only when needed);
bool outputs arrive as uint8 through DLPack and are viewed back as bool; Python ints/floats
(SymInt inputs) become 0-d tensors.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.capi import _pybind_state as ortc
from torch.utils.dlpack import from_dlpack

from onnx_custom.compile.fx_to_onnx import TranslatedGraph
from onnx_custom.compile.options import CompileOptions
from onnx_custom.errors import OnnxCustomError

__all__ = ["OrtPartition", "SessionCache"]

_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}
_COPIED_SETTINGS = (
    "intra_op_num_threads",
    "inter_op_num_threads",
    "graph_optimization_level",
    "execution_mode",
    "log_severity_level",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "use_deterministic_compute",
)


# A zero-size tensor has no memory (data_ptr 0), which ORT refuses to wrap: it gets this valid,
# never-read address instead.
_EMPTY = torch.empty(16, dtype=torch.uint8)
_EMPTY_PTR = _EMPTY.data_ptr()


def _fresh_options(base: ort.SessionOptions | None) -> ort.SessionOptions | None:
    """A new SessionOptions with the user's settings: each session registers its own kernels."""
    if base is None:
        return None
    fresh = ort.SessionOptions()
    for name in _COPIED_SETTINGS:
        setattr(fresh, name, getattr(base, name))
    return fresh


class SessionCache:
    """At most ``size`` sessions, keyed by the model's bytes (and the kernel choice); the least
    recently used is dropped first. ``created`` counts sessions made (tests read it)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.created = 0
        self._sessions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, model: bytes, options: CompileOptions) -> Any:
        from onnx_custom.runtime.session import InferenceSession

        key = (
            hashlib.sha256(model).hexdigest()
            + "/"
            + options.kernels
            + "/"
            + ",".join(options.providers)
        )
        with self._lock:
            found = self._sessions.get(key)
            if found is not None:
                self._sessions.move_to_end(key)
                return found
        kernels = "native" if options.kernels == "native" else None
        session = InferenceSession(
            model, _fresh_options(options.session_options), list(options.providers), kernels=kernels
        )
        with self._lock:
            self.created += 1
            self._sessions[key] = session
            while len(self._sessions) > self.size:
                self._sessions.popitem(last=False)
        return session


_from_dlpack = from_dlpack  # bound once: an attribute chain per call is part of the hand-off


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value if value.is_contiguous() else value.contiguous()
    if isinstance(value, bool):
        return torch.tensor(value, dtype=torch.bool)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float32)
    raise OnnxCustomError(
        f"an ONNX Runtime partition received a {type(value).__name__} input ({value!r:.60});"
        " expected tensors, ints or floats."
    )


class OrtPartition:
    """Callable running one translated graph in ORT; called like the FX graph it replaces.

    With ``OrtPartition.profile = True`` (benchmarks) each call adds to ``seconds`` (whole call)
    and ``ort_seconds`` (inside ORT's run); the difference is the hand-off.
    """

    profile = False

    def __init__(
        self,
        graph: TranslatedGraph,
        session: Any,
        name: str,
        verify: Callable[[Sequence[Any], Any], None] | None = None,
    ) -> None:
        self.graph = graph
        self.name = name
        self.session = session
        self._sess = (
            session._sess if session is not None else None
        )  # ORT's C++ session (run_with_ortvaluevector)
        self._inputs = list(graph.input_names)
        self._outputs = list(graph.output_names)
        self._devices = [ortc.OrtDevice(ortc.OrtDevice.cpu(), ortc.OrtDevice.default_memory(), 0)]
        self._in_devices = self._devices * len(self._inputs)
        self._out_devices = self._devices * len(self._outputs)
        self._run_options = ort.RunOptions()
        self._verify = verify
        self.calls = 0
        self.seconds = 0.0
        self.ort_seconds = 0.0

    def run(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """ORT's distinct outputs for ``args`` (the graph's inputs, in order)."""
        # one pass over the inputs (this loop is most of the hand-off's Python time)
        tensors, pointers, dtypes, shapes = [], [], [], []
        try:
            for arg in args:
                tensor = (
                    (arg if arg.is_contiguous() else arg.contiguous())
                    if isinstance(arg, torch.Tensor)
                    else _as_tensor(arg)
                )
                tensors.append(tensor)
                pointers.append(tensor.data_ptr() or _EMPTY_PTR)
                dtypes.append(_NUMPY[tensor.dtype])
                shapes.append(tensor.shape)
        except KeyError as exc:
            raise OnnxCustomError(
                f"{self.name}: input dtype {exc.args[0]} cannot be handed to ONNX Runtime without a"
                f" copy; supported: {sorted(str(d) for d in _NUMPY)}."
            ) from None
        values = ortc.OrtValueVector()
        values.reserve(len(tensors))
        values.push_back_batch(tensors, pointers, dtypes, shapes, self._in_devices)
        outputs = ortc.OrtValueVector()
        assert self._sess is not None  # only graphs with outputs run
        try:
            if self.profile:
                start = time.perf_counter()
                self._sess.run_with_ortvaluevector(
                    self._run_options,
                    self._inputs,
                    values,
                    self._outputs,
                    outputs,
                    self._out_devices,
                )
                self.ort_seconds += time.perf_counter() - start
            else:
                self._sess.run_with_ortvaluevector(
                    self._run_options,
                    self._inputs,
                    values,
                    self._outputs,
                    outputs,
                    self._out_devices,
                )
        except OnnxCustomError:
            raise
        except Exception as exc:
            from onnx_custom.runtime.failures import raise_typed

            raise_typed(exc, "ran")
        return list(outputs.to_dlpacks(_from_dlpack))

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter() if self.profile else 0.0
        result = self.graph.plan.assemble(self.run(args) if self._outputs else [], args)
        if self.profile:
            self.seconds += time.perf_counter() - start
        if self._verify is not None and self.calls == 0:
            self._verify(args, result)
        self.calls += 1
        return result

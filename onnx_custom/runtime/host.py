"""Bridge between :class:`KernelSpec` objects and the C shim / ONNX Runtime session options."""

from __future__ import annotations

import atexit
import threading
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnxruntime as ort

from onnx_custom.errors import KernelError
from onnx_custom.runtime import _abi
from onnx_custom.runtime._build import load_shim
from onnx_custom.runtime.registry import KernelSpec
from onnx_custom.runtime.types import TensorInfo, concrete_shape

__all__ = ["format_error", "register_kernels", "shim_api_version"]

_CHAR = {"required": _abi.CHAR_REQUIRED, "optional": _abi.CHAR_OPTIONAL, "variadic": _abi.CHAR_VARIADIC}
_lock = threading.Lock()
_ops: dict[int, tuple[KernelSpec, int]] = {}  # id(spec) -> (spec kept alive, op address)
_initialised = False
_init_lock = threading.Lock()


def format_error(qualname: str, exc: BaseException) -> str:
    """Text of the ORT error raised when a kernel fails: our message plus the Python traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"onnx-custom kernel {qualname} raised {type(exc).__name__}: {exc}\n{tb}"


def _shim() -> tuple[Any, str]:
    global _initialised
    shim, path = load_shim()
    with _init_lock:
        if not _initialised:
            shim.init(_abi.numpy_table(), format_error)
            atexit.register(shim.shutdown)  # ORT may destroy kernels after Python is gone
            _initialised = True
    return shim, path


def shim_api_version() -> int:
    """OrtApi version the shim negotiated with ONNX Runtime (0 before the first registration)."""
    return int(_shim()[0].api_version())


# ---- torch adapters -------------------------------------------------------------------------
def _to_torch(a: Any) -> Any:
    import torch

    if a is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inputs are read-only views; kernels must not write them
        if a.dtype == _abi.elem_to_numpy(16):  # bfloat16: numpy cannot hand it to torch directly
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)


def _from_torch(t: Any) -> Any:
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_abi.elem_to_numpy(16))
    return t.numpy()


def _torch_wrapper(fn: Callable[..., Any], out_mode: bool) -> Callable[..., Any]:
    def run(*arrays: Any, **kwargs: Any) -> Any:
        args = [_to_torch(a) for a in arrays]
        if out_mode:
            kwargs["out"] = tuple(_to_torch(o) for o in kwargs["out"])
        res = fn(*args, **kwargs)
        if res is None:
            return None
        if isinstance(res, (tuple, list)):
            return tuple(_from_torch(r) for r in res)
        return _from_torch(res)

    return run


# ---- callbacks handed to the shim -----------------------------------------------------------
def _make_bind(spec: KernelSpec) -> Callable[..., tuple[Any, dict[str, Any], Any]]:
    defaults = spec.attr_defaults()
    types = {a.name: a.type for a in spec.attrs}

    def bind(attrs: dict[str, Any], missing: list[str], elems: list[int]) -> tuple[Any, dict[str, Any], Any]:
        # ORT ignores failures of graph-time inference, so dtype constraints are enforced here
        spec.check_input_dtypes([
            TensorInfo(_abi.elem_to_numpy(e)) if e in _abi.ELEM_TO_NAME else None for e in elems
        ])
        unknown = [e for e in elems if e and e not in _abi.ELEM_TO_NAME]
        if unknown:
            raise KernelError(
                f"kernel {spec.name}: input element type(s) {unknown} (ONNX TensorProto.DataType) "
                f"cannot be passed to Python kernels; expected one of {', '.join(_abi.DTYPE_NAMES)}."
            )
        required = [m for m in missing if m not in defaults]
        if required:
            decl = ", ".join(f"{m} ({types[m]})" for m in required)
            raise KernelError(
                f"node of {spec.name} lacks required attribute(s) {decl} (absent, or set with "
                f"another type); fix: set them on the node or declare defaults at registration."
            )
        kwargs = {**{m: defaults[m] for m in missing}, **attrs}
        fn = _torch_wrapper(spec.fn, spec.out_mode) if spec.tensor_type == "torch" else spec.fn
        shape_fn = None
        user_shape_fn = spec.shape_fn
        if spec.out_mode and callable(user_shape_fn):
            def shape_fn(arrays: tuple[Any, ...]) -> list[tuple[int, ...]]:
                # concrete shapes for preallocation; dtypes were checked when the kernel was made
                infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in arrays]
                res = user_shape_fn(infos, kwargs)
                items = [res] if isinstance(res, TensorInfo) else list(res)
                return [concrete_shape(r.shape, f"{spec.name} output shape") for r in items]
        return fn, kwargs, shape_fn

    return bind


def _make_infer(spec: KernelSpec) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    def infer(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
        infos: list[TensorInfo | None] = []
        for i, item in enumerate(inputs):
            if item is None:
                infos.append(None)
                continue
            elem, shape = item
            if elem == 0:  # type unknown at this point of graph resolution
                infos.append(None)
                continue
            try:
                dt = _abi.elem_to_numpy(elem)
            except KeyError:
                raise KernelError(
                    f"kernel {spec.name}: input {i} has ONNX element type {elem}, which Python "
                    f"kernels cannot receive; expected one of {', '.join(_abi.DTYPE_NAMES)}."
                ) from None
            # ORT reports an input of unknown rank as rank 0; treat () as unknown so we never
            # declare a scalar output by mistake (true scalars just lose static shapes)
            infos.append(TensorInfo(dt, shape if shape != () else None))
        results = spec.infer(infos, attrs)
        return [(_abi.numpy_to_elem(r.dtype), r.shape) for r in results]

    return infer


def _op_address(spec: KernelSpec) -> int:
    with _lock:
        hit = _ops.get(id(spec))
        if hit is not None:
            return hit[1]
        shim, _ = _shim()
        rule = {"like0": _abi.RULE_LIKE0, "broadcast": _abi.RULE_BROADCAST}.get(
            spec.shape_fn if isinstance(spec.shape_fn, str) else "", _abi.RULE_PY
        )
        addr = shim.make_op(
            spec.op_type,
            spec.name,
            [_CHAR[p.kind] for p in spec.inputs],
            [_CHAR[p.kind] for p in spec.outputs],
            [(a.name, _abi.ATTR_KINDS[a.type]) for a in spec.attrs],
            rule,
            int(spec.out_mode),
            _make_bind(spec),
            _make_infer(spec),
        )
        _ops[id(spec)] = (spec, addr)  # never freed: ORT keeps pointers to the op for good
        return int(addr)


def register_kernels(so: ort.SessionOptions, specs: Iterable[KernelSpec]) -> None:
    """Add the custom-op domains serving ``specs`` to ``so`` (one domain object per domain)."""
    by_domain: dict[str, list[int]] = {}
    for spec in specs:
        by_domain.setdefault(spec.domain, []).append(_op_address(spec))
    if not by_domain:
        return
    shim, path = _shim()
    shim.lock()
    try:
        shim.set_pending(sorted(by_domain.items()))
        # ORT dlopens the very file Python imported, so it calls back into the same globals.
        so.register_custom_ops_library(path)
    except Exception as exc:
        raise KernelError(f"registering Python kernels with ONNX Runtime failed: {exc}") from exc
    finally:
        shim.unlock()

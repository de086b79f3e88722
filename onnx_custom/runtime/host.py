"""Bridge between :class:`KernelSpec` objects and the C shim / ONNX Runtime session options.

Lifetime of a registered kernel: the shim describes each KernelSpec to ORT with one small C
struct (an OrtCustomOp) holding two Python callbacks, ``bind`` and ``infer``, which reference the
spec and so the kernel function and everything its closure holds. Each ``SessionOptions`` a spec
is registered with counts as one user of it (sessions keep their options alive). When the last
such options object is garbage collected, the callbacks are dropped; when the spec itself is
gone too, the C struct is freed as soon as no ORT kernel instance of it is left. The custom-op
domain objects handed to ORT are reference counted the same way.
"""

from __future__ import annotations

import atexit
import itertools
import re
import threading
import traceback
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from onnx_custom.errors import KernelError
from onnx_custom.runtime import abi
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.shim_build import load_shim
from onnx_custom.runtime.types import TensorInfo, concrete_shape

__all__ = [
    "KernelFailure",
    "format_error",
    "live_kernel_ops",
    "note_exact_strings",
    "register_kernels",
    "shim_api_version",
    "take_failure",
    "thread_state_counts",
]

_CHAR = {
    "required": abi.CHAR_REQUIRED,
    "optional": abi.CHAR_OPTIONAL,
    "variadic": abi.CHAR_VARIADIC,
}
_initialised = False
_shutting_down = False
_init_lock = threading.Lock()


# ---- kernel failures ------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelFailure:
    """What a kernel raised: kept (bounded) until the session re-raises it as a typed error."""

    kernel: str
    node: str
    exception: BaseException
    traceback: str


_FAILURE_TOKEN = re.compile(r"\[onnx-custom error #(\d+)\]")
_MAX_FAILURES = 64  # failures nobody collects (plain onnxruntime sessions) must not pile up
_failures: OrderedDict[int, KernelFailure] = OrderedDict()
_failure_ids = itertools.count(1)
_failures_lock = threading.Lock()


def _clear_frames(exc: BaseException) -> None:
    """Drop the locals of every frame in ``exc``'s chain: they hold zero-copy views of ORT
    buffers that are freed when the kernel returns, and must not be reachable afterwards."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def format_error(qualname: str, node: str, exc: BaseException) -> str:
    """Text of the ORT error raised when a kernel fails: our message plus the Python traceback.

    The exception itself is kept under a token written into the text, so that
    :class:`onnx_custom.runtime.InferenceSession` can re-raise it typed.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    _clear_frames(exc)
    token = next(_failure_ids)
    with _failures_lock:
        _failures[token] = KernelFailure(qualname, node, exc, tb)
        while len(_failures) > _MAX_FAILURES:
            _failures.popitem(last=False)
    where = f" (node {node!r})" if node else ""
    return (
        f"onnx-custom kernel {qualname}{where} raised {type(exc).__name__}: {exc} [onnx-custom"
        f" error #{token}]\n{tb}"
    )


def take_failure(message: str) -> KernelFailure | None:
    """The kernel failure an ORT error message refers to (removed from the store), if any."""
    match = _FAILURE_TOKEN.search(message)
    if match is None:
        return None
    with _failures_lock:
        return _failures.pop(int(match.group(1)), None)


# ---- the shim -------------------------------------------------------------------------------
def _shutdown() -> None:
    global _shutting_down
    _shutting_down = True
    shim, _ = load_shim()
    shim.shutdown()  # ORT may destroy kernels (or end threads) after Python is gone


def _shim() -> tuple[Any, str]:
    global _initialised
    shim, path = load_shim()
    with _init_lock:
        if not _initialised:
            shim.init(abi.numpy_table(), format_error)
            atexit.register(_shutdown)
            _initialised = True
    return shim, path


def shim_api_version() -> int:
    """OrtApi version the shim negotiated with ONNX Runtime (0 before the first registration)."""
    return int(_shim()[0].api_version())


def thread_state_counts() -> tuple[int, int]:
    """``(created, deleted)`` Python thread states the shim made for ONNX Runtime's own threads."""
    created, deleted = _shim()[0].thread_states()
    return int(created), int(deleted)


# ---- torch adapters -------------------------------------------------------------------------
def _to_torch(a: Any) -> Any:
    import torch

    if a is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inputs are read-only views; kernels must not write them
        if a.dtype == abi.elem_to_numpy(16):  # bfloat16: numpy cannot hand it to torch directly
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)


def _from_torch(t: Any) -> Any:
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(abi.elem_to_numpy(16))
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


# ---- STRINGS attributes at graph time -------------------------------------------------------
# ORT hands graph-time inference a STRINGS attribute as NUL-terminated strings without lengths.
# Lists whose strings contain NUL bytes are recorded from the model before ORT sees it (see
# session.validate_model), so the exact list is recovered from its joined bytes.
_exact_strings: dict[bytes, list[str]] = {}


def _joined(values: Sequence[str]) -> bytes:
    return b"".join(v.encode() + b"\0" for v in values)


def note_exact_strings(values: Sequence[str]) -> None:
    """Remember a STRINGS attribute value whose strings contain NUL bytes."""
    if any("\0" in v for v in values):
        _exact_strings[_joined(values)] = list(values)


def _strings_value(blob: bytes) -> list[str]:
    exact = _exact_strings.get(blob)
    if exact is not None:
        return list(exact)
    return [part.decode() for part in blob.split(b"\0")[:-1]]


# ---- callbacks handed to the shim -----------------------------------------------------------
def _dtype_of(elem: int) -> TensorInfo | None:
    return TensorInfo(abi.elem_to_numpy(elem)) if elem in abi.ELEM_TO_NAME else None


def _check_output_dtypes(
    spec: KernelSpec, inputs: list[TensorInfo | None], out_elems: list[int]
) -> None:
    """ORT types an output whose shape we leave unknown by its own guess (the last input's
    dtype); when that differs from the kernel's dtype rule, say so now, not at run time."""
    if callable(spec.shape_fn):
        return
    for j, (want, got) in enumerate(zip(spec.infer(inputs, {}), out_elems, strict=False)):
        if want is None or not got or abi.numpy_to_elem(want.dtype) == got:
            continue
        name = spec.outputs[min(j, len(spec.outputs) - 1)].name
        want_name, got_name = str(want.dtype), abi.ELEM_TO_NAME.get(got, f"element type {got}")
        src = spec.inputs[spec.like_index or 0].name
        raise KernelError(
            f"kernel {spec.name}: ONNX Runtime typed output {j} ({name!r}) as {got_name}, but the "
            f"kernel's dtype rule gives {want_name}; ONNX Runtime cannot be told a dtype without a "
            f"shape; fix: declare the output's dtype (dtypes={{{name!r}: {want_name!r}}}) or a"
            " shape "
            f'rule (shape_fn="like:{src}" or a callable), or correct the model\'s types.'
        )


def _make_bind(spec: KernelSpec) -> Callable[..., tuple[Any, dict[str, Any], Any]]:
    defaults = spec.attr_defaults()
    types = {a.name: a.type for a in spec.attrs}

    def bind(
        attrs: dict[str, Any], missing: list[str], elems: list[int], out_elems: list[int]
    ) -> tuple[Any, dict[str, Any], Any]:
        # ORT ignores failures of graph-time inference, so dtype constraints are enforced here
        inputs = [_dtype_of(e) for e in elems]
        spec.check_input_dtypes(inputs)
        unknown = [e for e in elems if e and e not in abi.ELEM_TO_NAME]
        if unknown:
            raise KernelError(
                f"kernel {spec.name}: input element type(s) {unknown} (ONNX TensorProto.DataType)"
                " cannot be passed to Python kernels; expected one of"
                f" {', '.join(abi.DTYPE_NAMES)}; fix: cast the inputs in the model."
            )
        required = [m for m in missing if m not in defaults]
        if required:
            decl = ", ".join(f"{m} ({types[m]})" for m in required)
            raise KernelError(
                f"node of {spec.name} lacks required attribute(s) {decl} (absent, or set with "
                "another type); fix: set them on the node or declare defaults at registration."
            )
        _check_output_dtypes(spec, inputs, out_elems)
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
                return [
                    concrete_shape(None if r is None else r.shape, f"{spec.name} output shape")
                    for r in items
                ]

        return fn, kwargs, shape_fn

    return bind


_FRESH_DIMS = itertools.count()


def _named_unknowns(shape: Sequence[Any]) -> tuple[Any, ...]:
    """Unknown dims (None) as fresh names no other dim shares. ORT stores a nameless unknown dim
    as dim_value -1, which later nodes' inference takes literally (a MatMul after an output of
    shape (2, 336, None) then fails to load); the native library names them the same way."""
    return tuple(f"onnx_custom_unk__py{next(_FRESH_DIMS)}" if d is None else d for d in shape)


def _make_infer(spec: KernelSpec) -> Callable[[list[Any], dict[str, Any]], list[Any]]:
    def infer(inputs: list[Any], attrs: dict[str, Any]) -> list[Any]:
        infos: list[TensorInfo | None] = []
        for i, item in enumerate(inputs):
            if item is None or item[0] == 0:  # absent, or type unknown at this point
                infos.append(None)
                continue
            elem, shape = item
            try:
                dt = abi.elem_to_numpy(elem)
            except KeyError:
                raise KernelError(
                    f"kernel {spec.name}: input {i} has ONNX element type {elem}, which Python "
                    f"kernels cannot receive; expected one of {', '.join(abi.DTYPE_NAMES)}."
                ) from None
            # ORT reports an input of unknown rank as rank 0; treat () as unknown so we never
            # declare a scalar output by mistake (true scalars just lose static shapes)
            infos.append(TensorInfo(dt, shape if shape != () else None))
        values = {k: _strings_value(v) if isinstance(v, bytes) else v for k, v in attrs.items()}
        # an output whose shape is unknown is left to ORT (it cannot take a dtype alone)
        return [
            (
                None
                if r is None or r.shape is None
                else (abi.numpy_to_elem(r.dtype), _named_unknowns(r.shape))
            )
            for r in spec.infer(infos, values)
        ]

    return infer


# ---- op lifetime ----------------------------------------------------------------------------
@dataclass
class _HostOp:
    addrs: tuple[
        int, ...
    ]  # one OrtCustomOp per dtype variant (see _type_variants); [0] names the op
    spec_ref: weakref.ref[KernelSpec]
    spec: KernelSpec | None  # strong only while some SessionOptions use the op
    users: int = 0


_lock = threading.Lock()
_ops: dict[int, _HostOp] = {}  # id(spec) -> op
_by_addr: dict[int, _HostOp] = {}  # first address -> op
_dead_specs: list[
    tuple[int, int]
] = []  # (id, first address) of collected specs (weakref callbacks)
_pending_releases: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # finalizers append


def _type_variants(spec: KernelSpec) -> list[tuple[list[int], list[int]]]:
    """``(input types, output types)`` of each OrtCustomOp serving ``spec`` (0: any type).

    Outputs declared with one dtype have it. An output whose dtype follows an input (no
    shape_fn, "like:x", "broadcast") is typed by ORT itself whenever we cannot state its shape,
    and ORT guesses from the *last* input. So when later inputs exist, the op is registered once
    per dtype of the source input, each variant stating its output dtypes: ORT then picks the
    variant matching the node, and the output dtype is right with the shape left unknown.
    """
    n_in = len(spec.inputs)
    declared = [spec.declared_dtype(j) for j in range(len(spec.outputs))]
    fixed = [0 if d is None else abi.numpy_to_elem(d) for d in declared]
    source = spec.like_index or 0
    if callable(spec.shape_fn) or all(fixed) or source >= n_in - 1:
        return [([0] * n_in, fixed)]
    variants = []
    for name in spec.inputs[source].dtypes:
        elem = abi.NAME_TO_ELEM[name]
        in_types = [0] * n_in
        in_types[source] = elem
        variants.append((in_types, [f or elem for f in fixed]))
    return variants


def _new_op(shim: Any, spec: KernelSpec) -> _HostOp:
    like = spec.like_index
    rule = (
        abi.RULE_UNKNOWN
        if spec.shape_fn is None
        else (
            abi.RULE_PY
            if callable(spec.shape_fn)
            else abi.RULE_BROADCAST
            if like is None
            else abi.RULE_LIKE
        )
    )
    bind, infer = _make_bind(spec), _make_infer(spec)
    addrs = tuple(
        int(
            shim.make_op(
                spec.op_type,
                spec.name,
                [_CHAR[p.kind] for p in spec.inputs],
                [_CHAR[p.kind] for p in spec.outputs],
                in_types,
                out_types,
                [(a.name, abi.ATTR_KINDS[a.type]) for a in spec.attrs],
                rule,
                like or 0,
                spec.out_mode,
                bind,
                infer,
            )
        )
        for in_types, out_types in _type_variants(spec)
    )
    key, first = id(spec), addrs[0]
    ref = weakref.ref(spec, lambda _ref: _dead_specs.append((key, first)))
    return _HostOp(addrs, ref, spec)


def _acquire(shim: Any, spec: KernelSpec) -> _HostOp:
    """One more user of ``spec``'s op (with _lock held)."""
    op = _ops.get(id(spec))
    if op is None or op.spec_ref() is not spec:
        op = _new_op(shim, spec)
        _ops[id(spec)] = op
        _by_addr[op.addrs[0]] = op
    elif op.users == 0:
        bind, infer = _make_bind(spec), _make_infer(spec)
        for addr in op.addrs:
            shim.op_revive(addr, bind, infer)
        op.spec = spec
    op.users += 1
    return op


def _release_now(shim: Any, addrs: tuple[int, ...], domains: tuple[int, ...]) -> None:
    for dom in domains:
        shim.domain_release(dom)
    for first in addrs:
        op = _by_addr.get(first)
        if op is None:
            continue
        op.users -= 1
        if op.users == 0:
            op.spec = None
            for addr in op.addrs:
                shim.op_release(addr)  # drops bind/infer: the spec may be collected right here


def _unlock(shim: Any) -> None:
    """Finish queued releases and collections, then release _lock (again if more arrived)."""
    while True:
        while _pending_releases:
            _release_now(shim, *_pending_releases.pop())
        while _dead_specs:
            key, first = _dead_specs.pop()
            if _ops.get(key) is _by_addr.get(first):
                _ops.pop(key, None)
            op = _by_addr.pop(first, None)
            for addr in op.addrs if op is not None else ():
                shim.op_free(addr)
        _lock.release()
        if not (_pending_releases or _dead_specs) or not _lock.acquire(blocking=False):
            return


def _release_later(addrs: tuple[int, ...], domains: tuple[int, ...]) -> None:
    """weakref.finalize callback of a SessionOptions: may run inside our own locked section
    (garbage collection), so it queues, and processes the queue only if the lock is free."""
    if _shutting_down:
        return
    _pending_releases.append((addrs, domains))
    if _lock.acquire(blocking=False):
        _unlock(_shim()[0])


def live_kernel_ops() -> int:
    """Ops whose Python callbacks are alive (registered with SessionOptions still in use)."""
    with _lock:
        return sum(1 for op in _by_addr.values() if op.users > 0)


def register_kernels(so: ort.SessionOptions, specs: Iterable[KernelSpec]) -> None:
    """Add the custom-op domains serving ``specs`` to ``so`` (one domain object per domain).

    The kernels stay registered as long as ``so`` lives (every session keeps its options).
    """
    specs = list(specs)
    if not specs:
        return
    shim, path = _shim()
    by_domain: dict[str, list[int]] = {}
    addrs: list[int] = []  # first address of each op: what the finalizer releases
    domains: list[int] = []
    _lock.acquire()
    try:
        for spec in specs:
            op = _acquire(shim, spec)
            addrs.append(op.addrs[0])
            by_domain.setdefault(spec.domain, []).extend(op.addrs)
    finally:
        _unlock(shim)
    shim.lock()
    try:
        shim.set_pending(sorted(by_domain.items()))
        # ORT dlopens the very file Python imported, so it calls back into the same globals.
        so.register_custom_ops_library(path)
    except Exception as exc:
        domains = list(shim.take_registered())
        _release_later(tuple(addrs), tuple(domains))
        raise KernelError(f"registering Python kernels with ONNX Runtime failed: {exc}") from exc
    else:
        domains = list(shim.take_registered())
    finally:
        shim.unlock()
    weakref.finalize(so, _release_later, tuple(addrs), tuple(domains)).atexit = False

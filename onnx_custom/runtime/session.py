"""``InferenceSession`` / ``session_options`` / ``missing_kernels``:
run models with Python kernels."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError

from onnx_custom.common.external_data import check_external_data, external_tensors, session_source
from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.errors import (
    InvalidArgumentError,
    KernelError,
    ModelLoadError,
    ModelNotFoundError,
    OnnxCustomError,
)
from onnx_custom.runtime.failures import (
    KernelRunError,
    raise_for_type_error,
    raise_typed,
    typed_kernel_errors,
)
from onnx_custom.runtime.feeds import HALF_TYPES, explain_feed_error, from_ort_value, half_feeds
from onnx_custom.runtime.host import register_kernels
from onnx_custom.runtime.implementations import Implementation, node_implementations
from onnx_custom.runtime.kernel_spec import RESERVED_DOMAINS, KernelSpec
from onnx_custom.runtime.native import NativeLibrary, plan_native, register_library, shipped_library
from onnx_custom.runtime.ort_log_level import ORT_LOG_ENV, ort_log_severity, quiet_session_options
from onnx_custom.runtime.registry import KernelRegistry, default_kernel_registry
from onnx_custom.runtime.validate import validate_model

__all__ = [
    "ORT_LOG_ENV",
    "InferenceSession",
    "KernelRunError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelSource",
    "custom_nodes",
    "load_model",
    "missing_kernels",
    "ort_log_severity",
    "parse_model",
    "quiet_session_options",
    "required_kernels",
    "session_options",
]

ModelSource = Union[onnx.ModelProto, bytes, bytearray, memoryview, str, "os.PathLike[str]"]
_REGISTERED_KEY = "onnx_custom.kernels"  # session config entry recording what we registered
_SPIN_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def parse_model(model: ModelSource, *, with_data: bool = False) -> onnx.ModelProto:
    """The ``ModelProto`` of ``model`` (a proto is returned as it is, never serialized: past 2 GiB
    it cannot be); a file's external data is checked (present, long enough, from the same
    export: else `ModelLoadError` with the fix) and, with ``with_data``, loaded into the proto."""
    if isinstance(model, onnx.ModelProto):
        _refuse_detached(model, "the given ModelProto")
        return model
    return load_model(model, with_data=with_data)[0]


def load_model(
    model: ModelSource, *, with_data: bool = False
) -> tuple[onnx.ModelProto, bytes | str]:
    """``(ModelProto, what to hand ORT)``; paths stay paths so external data keeps resolving.

    A file's external data is checked (present, long enough, from the same export: else
    `ModelLoadError` with the fix) and, with ``with_data``, loaded into the returned proto.
    A proto too big to serialize (past 2 GiB): use `parse_model`, and `InferenceSession(proto)`.
    """
    if isinstance(model, onnx.ModelProto):
        _refuse_detached(model, "the given ModelProto")
        return model, model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        parsed = _parse(data, "the given bytes")
        _refuse_detached(parsed, "the given bytes")
        return parsed, data
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ModelNotFoundError(
                f"ONNX model file {str(path)!r} does not exist (not found); fix: export it first"
                f" (onnx-custom export ... -o {path}), or pass the model's bytes or an"
                " onnx.ModelProto."
            )
        if not path.is_file():
            raise ModelLoadError(
                f"{str(path)!r} is not a file; expected an .onnx model file. Fix: pass the path of"
                " the .onnx file inside it."
            )
        parsed = _parse(path.read_bytes(), repr(str(path)))
        check_external_data(parsed, path.resolve().parent, f"the model {str(path)!r}")
        if with_data and external_tensors(parsed):
            onnx.external_data_helper.load_external_data_for_model(
                parsed, str(path.resolve().parent)
            )
        return parsed, str(path.resolve())
    raise ModelLoadError(
        f"expected an onnx.ModelProto, bytes or a file path; received {type(model).__name__}"
        f" ({model!r:.60}). Fix: pass onnx_custom.export(...)'s result, open(path, 'rb').read() or"
        " the path itself."
    )


def _refuse_detached(model: onnx.ModelProto, what: str) -> None:
    """A proto whose tensors point into files cannot be handed over as bytes: ORT would look for
    the files relative to nothing."""
    tensors = external_tensors(model)
    if tensors:
        files = sorted(
            {
                entry.value
                for tensor in tensors
                for entry in tensor.external_data
                if entry.key == "location"
            }
        )
        raise ModelLoadError(
            f"{what} keeps {len(tensors)} tensor(s) (e.g. {tensors[0].name!r}) in the external"
            f" data file(s) {files}, which can only be found relative to the model's file. Fix:"
            " pass the model's path (with the data file(s) beside it), or load it with"
            " onnx.load(path) (which reads the data in)."
        )


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except (DecodeError, ValueError) as exc:
        raise ModelLoadError(
            f"{what} is not a valid ONNX model (corrupt or truncated; protobuf decoding failed:"
            f" {exc}); fix: re-export the model or check that the file is not truncated."
        ) from exc
    if not m.HasField("graph"):
        raise ModelLoadError(
            f"{what} is not a valid ONNX model (corrupt or not an ONNX file: no graph); fix:"
            " re-export the model."
        )
    return m


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node (subgraphs and local functions included) outside ONNX Runtime's own domains."""
    return [n for n in iter_nodes(model) if n.domain not in RESERVED_DOMAINS]


def _registry(kernels: KernelRegistry | None) -> KernelRegistry:
    if kernels is None:
        return default_kernel_registry()
    if not isinstance(kernels, KernelRegistry):
        raise KernelError(
            "kernels= expects an onnx_custom.runtime.KernelRegistry or None; received"
            f" {type(kernels).__name__} ({kernels!r:.60}). Fix: pass"
            " onnx_custom.runtime.KernelRegistry() with your kernels registered, or leave it out"
            " for the default kernels."
        )
    return kernels


def _as_model(model: ModelSource) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else parse_model(model)


def missing_kernels(
    model: ModelSource, kernels: KernelRegistry | None = None
) -> list[tuple[str, str]]:
    """``(domain, op_type)`` of custom nodes with neither a kernel nor a model-local function."""
    m = _as_model(model)
    reg = _registry(kernels)
    local = {(f.domain, f.name) for f in m.functions}
    out: list[tuple[str, str]] = []
    for node in custom_nodes(m):
        key = (node.domain, node.op_type)
        if key in local or reg.lookup(*key) is not None or key in out:
            continue
        out.append(key)
    return out


def required_kernels(model: ModelSource, kernels: KernelRegistry | None = None) -> list[KernelSpec]:
    """Kernels serving the model's custom nodes; raises KernelError naming every missing one."""
    m = _as_model(model)
    reg = _registry(kernels)
    missing = missing_kernels(m, reg)
    if missing:
        where: dict[tuple[str, str], list[str]] = {}
        for node in custom_nodes(m):
            key = (node.domain, node.op_type)
            if key in missing:
                where.setdefault(key, []).append(node.name or "<unnamed>")
        lines = "\n".join(
            f"  {d}::{t} (node{'s' if len(where[(d, t)]) > 1 else ''}"
            f" {', '.join(where[(d, t)][:5])}{', ...' if len(where[(d, t)]) > 5 else ''})"
            for d, t in missing
        )
        known = ", ".join(reg.names()) or "(none)"
        raise KernelError(
            f"{len(missing)} custom op(s) in the model have no Python kernel:\n{lines}\n"
            f"registered kernels: {known}\n"
            "fix: register them with @onnx_custom.runtime.kernel('domain::OpType', ...) (or pass "
            "kernels=...), or embed function bodies with embed_functions()."
        )
    seen: dict[str, KernelSpec] = {}
    for node in custom_nodes(m):
        spec = reg.lookup(node.domain, node.op_type)
        if spec is not None:
            seen.setdefault(spec.name, spec)
    return list(seen.values())


def _config(so: ort.SessionOptions, key: str) -> str | None:
    try:
        return str(so.get_session_config_entry(key))
    except (RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail):  # type: ignore[attr-defined]
        return None


def session_options(
    model: ModelSource,
    base: ort.SessionOptions | None = None,
    kernels: KernelRegistry | None = None,
) -> ort.SessionOptions:
    """SessionOptions with the Python kernels ``model`` needs registered
    (``base`` is updated in place).

    Also turns thread-pool spinning off unless ``base`` set it: spinning ORT threads starve the
    Python kernels of CPU on small machines. Raises :class:`KernelError` naming every custom node
    whose inputs, outputs or attributes disagree with its kernel's declaration.
    """
    m = _as_model(model)
    specs = required_kernels(m, kernels)
    validate_model(m, specs)
    return _options_for(specs, base)


def _check_options(options: object, argument: str) -> None:
    """Named after the caller's own parameter (``sess_options=`` of InferenceSession,
    ``base=`` here)."""
    if options is not None and not isinstance(options, ort.SessionOptions):
        raise InvalidArgumentError(
            f"{argument}= expects onnxruntime.SessionOptions or None; received"
            f" {type(options).__name__} ({options!r:.60}). Fix: pass onnxruntime.SessionOptions()"
            " with your settings, or leave it out."
        )


def _options_for(
    specs: Sequence[KernelSpec], base: ort.SessionOptions | None, argument: str = "base"
) -> ort.SessionOptions:
    _check_options(base, argument)
    so = base if base is not None else ort.SessionOptions()
    for key in _SPIN_KEYS:
        if _config(so, key) is None:
            so.add_session_config_entry(key, "0")
    done = _config(so, _REGISTERED_KEY)
    if done is not None:
        have = set(filter(None, done.split(",")))
        need = {s.name for s in specs}
        if need <= have:
            return so
        raise KernelError(
            f"these SessionOptions already carry onnx-custom kernels ({', '.join(sorted(have))}) "
            f"and cannot take more ({', '.join(sorted(need - have))}); fix: pass fresh "
            "onnxruntime.SessionOptions()."
        )
    register_kernels(so, specs)
    so.add_session_config_entry(_REGISTERED_KEY, ",".join(sorted(s.name for s in specs)))
    return so


def _native_libraries(kernels: Any) -> tuple[NativeLibrary, ...] | None:
    """The user libraries ``kernels=`` names (``()`` for "native"), or None: not native."""
    if isinstance(kernels, str):
        if kernels != "native":
            raise KernelError(
                "kernels= expects a KernelRegistry, None or 'native' (or NativeLibrary objects);"
                f" received {kernels!r}. Fix: pass kernels='native' (the compiled library), a"
                " KernelRegistry, or leave it out."
            )
        return ()
    if isinstance(kernels, NativeLibrary):
        return (kernels,)
    if (
        isinstance(kernels, (list, tuple))
        and kernels
        and all(isinstance(k, NativeLibrary) for k in kernels)
    ):
        return tuple(kernels)
    return None


class InferenceSession(ort.InferenceSession):
    """``onnxruntime.InferenceSession`` that registers the Python kernels the model needs.

    Before ORT sees the model, raises :class:`KernelError` listing every custom node without a
    kernel, or whose inputs, outputs or attributes disagree with its kernel's declaration.
    ``model_or_path``: ModelProto, serialized bytes or a path. ``providers`` defaults to CPU
    (Python kernels always run on CPU). ``kernels="native"``: prefer the native library
    (``onnx_custom.library_path()``) and use Python kernels only for domains it cannot serve;
    ``kernels=`` a `NativeLibrary` or a list of them (``onnx_custom.spec.build_native_library``):
    those libraries first, then the shipped one.
    A kernel that raises makes ``run`` (and ``run_with_ort_values``, ``run_with_iobinding``)
    raise :class:`KernelRunError` carrying the kernel's exception type and traceback; Ctrl-C
    inside a kernel raises KeyboardInterrupt. ORT logs nothing to stderr (each failure is raised
    once, typed) unless ``sess_options.log_severity_level`` was set or
    ``$ONNX_CUSTOM_ORT_LOG_SEVERITY`` (0-4) asks for ORT's logs. ``.implementations`` says what
    serves each non-standard node type (`onnx_custom.runtime.implementations`).
    """

    def __init__(
        self,
        model_or_path: ModelSource,
        sess_options: ort.SessionOptions | None = None,
        providers: Sequence[str] | None = None,
        *,
        kernels: KernelRegistry | str | NativeLibrary | Sequence[NativeLibrary] | None = None,
        **kwargs: Any,
    ) -> None:
        _check_options(sess_options, "sess_options")
        source: contextlib.AbstractContextManager[bytes | str]
        if isinstance(model_or_path, onnx.ModelProto):  # bytes, or a temporary file pair past 2 GiB
            _refuse_detached(model_or_path, "the given ModelProto")
            model, source = model_or_path, session_source(model_or_path)
        else:
            model, path_or_bytes = load_model(model_or_path)
            source = contextlib.nullcontext(path_or_bytes)
        native: dict[str, NativeLibrary] = {}
        libraries = _native_libraries(kernels)
        if libraries is not None:  # see onnx_custom.runtime.native.plan_native
            native, specs = plan_native(model, None, libraries)
            self.kernel_specs: tuple[KernelSpec, ...] = tuple(specs)
        else:
            self.kernel_specs = tuple(required_kernels(model, kernels))  # type: ignore[arg-type]  # _registry checks it
        validate_model(model, self.kernel_specs)
        # what serves each non-standard node type (verify's report names it)
        self.implementations: tuple[Implementation, ...] = tuple(
            node_implementations(model, self.kernel_specs, native)
        )
        so = _options_for(self.kernel_specs, sess_options)
        for lib in dict.fromkeys(
            native.values()
        ):  # each library once, with the domains it serves here
            register_library(
                so,
                [d for d, chosen in native.items() if chosen is lib],
                None if lib == shipped_library() else lib,
            )
        quiet_session_options(so)  # ORT's log lines would repeat what our typed errors say
        try:
            with source as model_source:
                super().__init__(
                    model_source,
                    sess_options=so,
                    providers=(
                        list(providers) if providers is not None else ["CPUExecutionProvider"]
                    ),
                    **kwargs,
                )
        except OnnxCustomError:
            raise
        except Exception as exc:
            raise_for_type_error(exc, self.kernel_specs, custom_nodes(model))
            raise_typed(exc, "created the kernel of")
        self._half_io = any(a.type in HALF_TYPES for a in (*self.get_inputs(), *self.get_outputs()))

    _typed_run = typed_kernel_errors(ort.InferenceSession.run)

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        """``onnxruntime.InferenceSession.run``; inputs or output names that do not fit the model
        raise `InvalidArgumentError` (a ValueError) listing the declared inputs and outputs.

        float16/bfloat16 inputs take any NumPy flavour (``np.float16``, ``ml_dtypes.bfloat16``,
        or a ``uint16`` view of the bits), wrapped without a copy; bfloat16 outputs come back as
        ``ml_dtypes.bfloat16`` arrays."""
        try:
            feeds = half_feeds(self, input_feed) if self._half_io else None
            if feeds is not None:
                names = list(output_names) if output_names else [o.name for o in self.get_outputs()]
                return [
                    from_ort_value(v) for v in self.run_with_ort_values(names, feeds, run_options)
                ]
            return self._typed_run(output_names, input_feed, run_options)
        except OnnxCustomError:
            raise
        except Exception as exc:  # ORT's own refusal of the inputs: say what the model expects
            explain_feed_error(self, output_names, input_feed, exc)
            raise

    run_with_ort_values = typed_kernel_errors(ort.InferenceSession.run_with_ort_values)
    run_with_iobinding = typed_kernel_errors(ort.InferenceSession.run_with_iobinding)

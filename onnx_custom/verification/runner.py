"""Loading ONNX models, matching example inputs to ONNX inputs, running ORT or onnx's reference.

Sits just above `compare` and below `verify`, `localize` and `inspect_model`.

Inputs are matched to the file's inputs **by name**: a model's example arguments are named after
``forward``'s parameters, nested containers flattened the way ``torch.export`` names its
placeholders (``pair=(a, b)`` gives ``pair_0``, ``pair_1``; ``d={"k": t}`` gives ``d_k``; deeper
levels append ``_<index or key>`` again). Files whose names do not match (older exports named
``input_0``, ``input_1``, ...) are matched by position, ``input_<i>`` meaning the i-th tensor.
Arguments that the file has no input for (the TorchScript exporter prunes unused inputs) are
listed in `InputBinding.pruned`.

ONNX Runtime is fed through ``OrtValue``\\s, so bfloat16 flows in and out (its Python API refuses
ml_dtypes arrays), and 0-d tensors stay 0-d.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import inspect
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom.common.external_data import session_source
from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.errors import ExtensionBuildError, VerificationError
from onnx_custom.verification.compare import flatten_outputs, to_numpy

__all__ = [
    "STANDARD_DOMAINS",
    "InputBinding",
    "argument_names",
    "bind_inputs",
    "custom_node_types",
    "graph_inputs",
    "input_leaves",
    "input_names",
    "load_model",
    "make_reference",
    "make_session",
    "plain_session",
    "release_session",
    "run_onnx",
    "shared_session",
    "tensor_inputs",
    "torch_dtype",
]

_POSITIONAL_NAME = re.compile(r"input_(\d+)")
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")  # ONNX Runtime's own: every other domain is custom


def load_model(onnx_model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> onnx.ModelProto:
    """A ModelProto from a proto (as it is: never serialized, which fails past 2 GiB), bytes or a
    path (external data read in); clear errors for missing or corrupt files."""
    from onnx_custom.runtime.session import parse_model

    return parse_model(onnx_model, with_data=True)


def tensor_inputs(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [leaf for _, leaf in flatten_outputs(args, "input") if isinstance(leaf, torch.Tensor)]


def graph_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds (initializers listed as inputs excluded)."""
    initializers = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in initializers]


def input_names(proto: onnx.ModelProto, args: tuple[Any, ...]) -> list[str]:
    """The ONNX input names fed by the tensors of ``args`` in order (no name matching)."""
    names = [i.name for i in graph_inputs(proto)]
    if len(names) != len(tensor_inputs(args)):
        raise _arity_error(
            graph_inputs(proto),
            [f"input_{i}" for i in range(len(tensor_inputs(args)))],
            "their counts differ",
        )
    return names


def torch_dtype(elem_type: int) -> torch.dtype | None:
    """The torch dtype of an ONNX ``TensorProto`` element type (None when torch has none)."""
    if elem_type == onnx.TensorProto.BFLOAT16:
        return torch.bfloat16
    try:
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype
    except Exception:
        return None


# ----------------------------------------------------------------------------- input matching


def _flatten_named(prefix: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [leaf for k, v in value.items() for leaf in _flatten_named(f"{prefix}_{k}", v)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _flatten_named(f"{prefix}_{i}", v)]
    return [(prefix, value)]


def argument_names(model: Any, args: tuple[Any, ...]) -> list[str] | None:
    """``forward``'s names for ``args`` (``*rest`` gives ``rest_0``...);
    None if they cannot bind."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins, C functions: no names to offer
        return [f"input_{i}" for i in range(len(args))]
    try:
        bound = signature.bind(*args)
    except TypeError:
        return None
    names: list[str] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{name}_{i}" for i in range(len(value))]
        else:
            names.append(name)
    return names


def input_leaves(model: Any, args: tuple[Any, ...]) -> list[tuple[str, Any]]:
    """``[(name, leaf), ...]`` of ``args`` named after ``forward``'s parameters (see module doc).

    Raises `VerificationError` when ``forward`` cannot take ``args``.
    """
    names = argument_names(model, args)
    if names is None:
        fn = model.forward if isinstance(model, torch.nn.Module) else model
        raise VerificationError(
            f"the example arguments ({len(args)} argument(s)) do not fit"
            f" {getattr(fn, '__qualname__', 'the model')}{inspect.signature(fn)}. Fix: pass the"
            " same example inputs used for export."
        )
    return [
        leaf
        for name, value in zip(names, args, strict=True)
        for leaf in _flatten_named(name, value)
    ]


@dataclasses.dataclass(frozen=True)
class InputBinding:
    """Which example tensor feeds which ONNX input.

    ``onnx_names[i]`` is fed ``leaves[positions[i]]`` (``leaves``: the tensors of `input_leaves`);
    ``leaf_names`` names every tensor; ``pruned``: tensors the file has no input for;
    ``matched_by``: ``"name"`` or ``"position"`` (the file's names are not ``forward``'s).
    """

    onnx_names: tuple[str, ...]
    positions: tuple[int, ...]
    leaf_names: tuple[str, ...]
    pruned: tuple[str, ...] = ()
    matched_by: str = "name"

    def feeds(self, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensors[p] for name, p in zip(self.onnx_names, self.positions, strict=True)}

    def describe(self) -> str:
        how = (
            "by name"
            if self.matched_by == "name"
            else "by position (the file's input names are not forward's parameter names)"
        )
        text = f"inputs matched {how}"
        if self.pruned:
            text += (
                "; not inputs of the file (pruned by the exporter, unused by the graph):"
                f" {', '.join(self.pruned)}"
            )
        return text


def _declared_fits(info: onnx.ValueInfoProto, tensor: torch.Tensor) -> bool:
    tensor_type = info.type.tensor_type
    if tensor_type.elem_type and torch_dtype(tensor_type.elem_type) not in (None, tensor.dtype):
        return False
    return not tensor_type.HasField("shape") or len(tensor_type.shape.dim) == tensor.dim()


def _arity_error(
    file_inputs: list[onnx.ValueInfoProto], names: list[str], why: str
) -> VerificationError:
    return VerificationError(
        f"The ONNX model takes {len(file_inputs)} input(s) {[i.name for i in file_inputs]} but the"
        f" example arguments hold {len(names)} tensor(s) {names}; {why}. Fix: pass the same example"
        " inputs used for export."
    )


def bind_inputs(proto: onnx.ModelProto, args: tuple[Any, ...], model: Any = None) -> InputBinding:
    """Match the tensors of ``args`` to the ONNX inputs: by name, else by position (module doc)."""
    file_inputs = graph_inputs(proto)
    named = [(f"input_{i}", t) for i, t in enumerate(tensor_inputs(args))]
    if model is not None:
        try:
            named = [
                (n, leaf) for n, leaf in input_leaves(model, args) if isinstance(leaf, torch.Tensor)
            ]
        except VerificationError as exc:
            raise _arity_error(
                file_inputs,
                [n for n, _ in named],
                str(exc)
                .removesuffix(" Fix: pass the same example inputs used for export.")
                .removesuffix("."),
            ) from exc
    names = [n for n, _ in named]
    tensors = [t for _, t in named]
    index = {n: i for i, n in enumerate(names)}
    onnx_names = tuple(i.name for i in file_inputs)
    if all(n in index for n in onnx_names) and len(set(onnx_names)) == len(onnx_names):
        positions = tuple(index[n] for n in onnx_names)
        return InputBinding(
            onnx_names,
            positions,
            tuple(names),
            tuple(n for n in names if index[n] not in positions),
            "name",
        )
    if len(file_inputs) > len(tensors):
        raise _arity_error(
            file_inputs, names, "the file has more inputs than the arguments have tensors"
        )
    # Align in order: exact names and ``input_<i>`` anchor; the rest take the next tensor whose
    # dtype and rank fit the declared type (a pruned tensor is skipped).
    chosen: list[int] = []
    for info in file_inputs:
        start = chosen[-1] + 1 if chosen else 0
        anchor = index.get(info.name)
        match = _POSITIONAL_NAME.fullmatch(info.name)
        if anchor is None and match is not None and int(match[1]) < len(tensors):
            anchor = int(match[1])
        if anchor is not None:
            if anchor < start:
                raise _arity_error(
                    file_inputs,
                    names,
                    f"input {info.name!r} would take tensor {names[anchor]!r} out of order",
                )
            chosen.append(anchor)
            continue
        fitting = [i for i in range(start, len(tensors)) if _declared_fits(info, tensors[i])]
        if not fitting:
            raise _arity_error(
                file_inputs,
                names,
                f"no remaining tensor fits input {info.name!r} ({_describe_type(info)})",
            )
        chosen.append(fitting[0])
    pruned = tuple(n for i, n in enumerate(names) if i not in chosen)
    return InputBinding(onnx_names, tuple(chosen), tuple(names), pruned, "position")


def _describe_type(info: onnx.ValueInfoProto) -> str:
    tensor_type = info.type.tensor_type
    dtype = (
        onnx.helper.tensor_dtype_to_string(tensor_type.elem_type)
        .removeprefix("TensorProto.")
        .lower()
        if tensor_type.elem_type
        else "?"
    )
    if not tensor_type.HasField("shape"):
        return f"{dtype}, rank unknown"
    dims = [
        d.dim_param or (d.dim_value if d.HasField("dim_value") else "?")
        for d in tensor_type.shape.dim
    ]
    return f"{dtype}{dims}"


# ----------------------------------------------------------------------------- running


def _to_ort_value(tensor: torch.Tensor) -> Any:
    import onnxruntime

    array = to_numpy(tensor)
    if tensor.dtype == torch.bfloat16:  # ORT's Python API has no numpy type for bfloat16
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint16), onnx.TensorProto.BFLOAT16
        )
    return onnxruntime.OrtValue.ortvalue_from_numpy(array)


def _from_ort_value(value: Any, name: str) -> np.ndarray:
    if not value.is_tensor():
        raise VerificationError(
            f"ONNX output {name!r} is not a tensor ({value.data_type()}); only tensor outputs can"
            " be compared."
        )
    if value.element_type() != onnx.TensorProto.BFLOAT16:
        return np.array(value.numpy(), copy=True)  # detach from ORT's buffer
    import ml_dtypes

    shape = tuple(value.shape())
    size = value.tensor_size_in_bytes()
    raw = bytes((ctypes.c_char * size).from_address(value.data_ptr())) if size else b""
    return np.frombuffer(raw, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(shape).copy()


def run_onnx(
    session: Any, proto: onnx.ModelProto, args: tuple[Any, ...], binding: InputBinding | None = None
) -> list[np.ndarray]:
    """Every graph output of ``proto`` (in order) for ``args``.

    Without ``binding`` the tensors of ``args`` feed the ONNX inputs in order (they must be as
    many). ONNX Runtime sessions are fed OrtValues (bfloat16-safe); other backends numpy arrays.
    """
    tensors = tensor_inputs(args)
    if binding is None:
        feeds = dict(zip(input_names(proto, args), tensors, strict=True))
    else:
        feeds = binding.feeds(tensors)
    output_names = [o.name for o in proto.graph.output]
    if hasattr(session, "run_with_ort_values"):
        values = session.run_with_ort_values(
            output_names, {n: _to_ort_value(t) for n, t in feeds.items()}
        )
        return [_from_ort_value(v, n) for v, n in zip(values, output_names, strict=True)]
    return [
        np.asarray(v) for v in session.run(output_names, {n: to_numpy(t) for n, t in feeds.items()})
    ]


def _session_options(as_written: bool) -> Any:
    from onnx_custom.runtime.ort_log_level import quiet_session_options

    # quiet: a failing trial is reported by the verifier, not also by ORT's log on stderr
    options = quiet_session_options()
    if as_written:
        import onnxruntime

        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def plain_session(
    proto: onnx.ModelProto, data: bytes | None = None, *, as_written: bool = False
) -> Any:
    """Plain ONNX Runtime (nothing registered); ``data``: ``proto`` already serialized.
    ``as_written``: graph optimizations off (`make_session`)."""
    import onnxruntime

    # past 2 GiB the proto cannot be serialized: ORT reads a temporary model + data pair
    with session_source(proto) if data is None else contextlib.nullcontext(data) as source:
        return onnxruntime.InferenceSession(
            source, _session_options(as_written), providers=["CPUExecutionProvider"]
        )


def make_session(
    proto: onnx.ModelProto,
    kernels: Any = None,
    data: bytes | None = None,
    *,
    as_written: bool = False,
) -> Any:
    """An ORT session with our custom kernels loaded (plain ORT when the kernel host is
    unavailable); ``data``: ``proto`` already serialized
    (parsing it back is cheaper than serializing again).

    ``as_written``: ORT's graph optimizations off, so the session runs the file as other runtimes
    read it. ORT's level-1 ReshapeFusion rewrites a Reshape whose shape is computed from Shape
    into constants with 0/-1, which can turn a wrong computation (``[n, c, h * h]`` for h x w)
    into a right one; TensorRT, OpenVINO or onnx's reference would still fail the file."""
    try:
        from onnx_custom.runtime import InferenceSession
    except ImportError:  # the kernel host is optional for models without custom nodes
        return plain_session(proto, data, as_written=as_written)
    try:
        options = (
            _session_options(True) if as_written else None
        )  # None: the session's own quiet defaults
        return InferenceSession(proto if data is None else data, options, kernels=kernels)
    except ExtensionBuildError:
        # The native shim could not be built: only models with custom nodes need it.
        if custom_node_types(proto):
            raise
        return plain_session(proto, data, as_written=as_written)


def shared_session(proto: onnx.ModelProto, kernels: Any = None, *, plain: bool = False) -> Any:
    """`make_session` (or `plain_session` with ``plain``) reused across calls on the same bytes
    and kernels (`onnx_custom.runtime.session_cache`): verify's repeated calls skip ORT's
    session creation and the first-touch memory of a new arena."""
    try:
        from onnx_custom.runtime.session_cache import shared_sessions
    except ImportError:  # no kernel host: sessions as before, one per call
        return plain_session(proto) if plain else make_session(proto, kernels)
    if plain:
        return shared_sessions.session(proto, lambda data: plain_session(proto, data), plain=True)
    return shared_sessions.session(proto, lambda data: make_session(proto, kernels, data), kernels)


def release_session(session: Any) -> None:
    """Stop sharing ``session`` (`shared_session`): its memory goes when the caller drops it."""
    try:
        from onnx_custom.runtime.session_cache import shared_sessions
    except ImportError:  # nothing was shared
        return
    shared_sessions.discard(session)


def custom_node_types(proto: onnx.ModelProto) -> list[str]:
    found = {
        f"{n.domain}::{n.op_type}": None
        for n in iter_nodes(proto, functions=False)
        if n.domain not in STANDARD_DOMAINS
    }
    return list(found)


def make_reference(proto: onnx.ModelProto, kernels: Any = None) -> Any:
    """onnx's ``ReferenceEvaluator``; custom nodes run our kernels adapted as ``OpRun`` classes."""
    from onnx.reference import ReferenceEvaluator

    custom = custom_node_types(proto)
    if not custom:
        return ReferenceEvaluator(proto)
    try:
        from onnx_custom.runtime import reference_evaluator
    except ImportError as exc:
        raise VerificationError(
            f"The model has custom nodes {custom}; the reference backend needs their kernels as"
            " OpRun classes (onnx_custom.runtime.reference_evaluator), which is unavailable:"
            f" {exc}. Fix: install/build the kernel host or verify with backends=('onnxruntime',)."
        ) from exc
    return reference_evaluator(proto, kernels=kernels)

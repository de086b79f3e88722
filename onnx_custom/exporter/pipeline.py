"""The exporters themselves: run either PyTorch exporter with our translations, return a ModelProto.

`export` (the public call) adds verification, function bodies and saving on top; `localize`
re-exports probes through `export_model` here, so the verify path never imports `export`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import os
import re
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from onnx_custom.common.atomic import atomic_write, check_output_path, is_file_object
from onnx_custom.common.external_data import (
    PROTOBUF_LIMIT,
    check_chosen_data_name,
    data_file_name,
    external_threshold,
    referenced_data_files,
    remove_stale_data,
    save_with_external_data,
    serialized_size,
)
from onnx_custom.common.onnx_utils import ModelCensus, function_nodes, iter_nodes, model_census
from onnx_custom.common.torch_chatter import quiet_torch
from onnx_custom.common.torch_onnx import torch_fixes
from onnx_custom.errors import (
    InvalidArgumentError,
    KernelError,
    OnnxCustomError,
    SymbolicError,
    UnsupportedOpError,
)
from onnx_custom.exporter import program_cache, trace_provenance
from onnx_custom.exporter.arguments import (
    EXPORTERS,
    check_args,
    check_dynamic_for_program,
    check_exporter,
    check_exporter_kwargs,
    check_model,
    check_names,
    check_opset,
    check_output,
    check_registry,
)
from onnx_custom.exporter.constraints import (
    check_with_torch_export,
    constraint_violation,
    note_data_dependent,
    static_axes,
    symbol_names_of,
)
from onnx_custom.exporter.dim_params import rename_dims, write_metadata
from onnx_custom.exporter.dynamic_shapes import DynamicSpec, resolve_dynamic_shapes
from onnx_custom.exporter.dynamo_output_types import symbol_names
from onnx_custom.exporter.export_flag import onnx_exporting
from onnx_custom.exporter.fake_kernels import check_fake_kernels
from onnx_custom.exporter.function_symbolics import (
    function_symbolic_error,
    recording_function_failures,
    warn_traced_functions,
)
from onnx_custom.exporter.opset_compat import lower_default_opset
from onnx_custom.exporter.output_names import default_output_names, rename_outputs
from onnx_custom.exporter.scalar_bounds import float_clamp_bounds
from onnx_custom.exporter.torchscript import registered
from onnx_custom.exporter.torchscript_shapes import (
    ExportDims,
    drop_contradicted_output_dims,
    export_dims,
    name_derived_dims,
    recorded_outputs,
)
from onnx_custom.runtime.half_precision import DEFAULT_MODE, check_mode, widen_model
from onnx_custom.runtime.mixed_types import repair_mixed_floats
from onnx_custom.translate.coverage import (
    format_missing,
    missing_ops_dynamo,
    missing_ops_torchscript,
)
from onnx_custom.translate.registry import Registry, resolve_registry
from onnx_custom.translate.torch_errors import (
    chain,
    check_functional,
    unwrap_dynamo_error,
    unwrap_torchscript_error,
)
from onnx_custom.translate.type_check import deferring_half_precision

__all__ = [
    "DEFAULT_OPSET",
    "EXPORTERS",
    "EXPORT_LOCK",
    "MAX_IR_VERSION",
    "ExportRequest",
    "check_export_request",
    "check_external_data_option",
    "export_model",
    "export_with_census",
    "finalize_model",
    "run_export",
    "save_model",
    "trace_program",
]

DEFAULT_OPSET = 18
MAX_IR_VERSION = 10  # ORT 1.31 accepts <= 13; 10 covers opsets up to 21 and every older runtime
_DYNAMO_NATIVE_OPSET = 18
_IN_MEMORY_LIMIT = 2**30  # above this many bytes of weights, TorchScript exports through a folder
_ONNX_FLOATS = {
    torch.float16: onnx.TensorProto.FLOAT16,
    torch.bfloat16: onnx.TensorProto.BFLOAT16,
    torch.float32: onnx.TensorProto.FLOAT,
    torch.float64: onnx.TensorProto.DOUBLE,
}
_NO_FAKE = re.compile(r"no fake impl registered for (?:<CustomOpDef\()?(?P<op>[\w:.]+)")


def _custom_domains(model: onnx.ModelProto, census: ModelCensus | None) -> set[str]:
    nodes = (
        iter_nodes(model)
        if census is None
        else itertools.chain(census.domain_nodes, function_nodes(model))
    )
    return {n.domain for n in nodes if n.domain not in ("", "ai.onnx")}


def finalize_model(
    model: onnx.ModelProto,
    domain_versions: dict[str, int] | None = None,
    *,
    census: ModelCensus | None = None,
) -> onnx.ModelProto:
    """Declare every used domain in ``opset_import`` and set an IR version ORT accepts
    (``census``: the model's, whose nodes with a domain are then the only ones read)."""
    declared = {o.domain for o in model.opset_import}
    for domain in sorted(_custom_domains(model, census) - declared):
        model.opset_import.append(
            onnx.helper.make_opsetid(domain, (domain_versions or {}).get(domain, 1))
        )
    model.ir_version = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    return model


def check_external_data_option(external_data: Any, f: Any) -> None:
    """``external_data=`` before any export work: None, a bool, or a plain file name, and only
    with a path ``f`` (a file object cannot hold a second file)."""
    if external_data is None or external_data is False:
        return
    if not isinstance(external_data, (bool, str, os.PathLike)):
        raise InvalidArgumentError(
            f"external_data= expects None (automatic: above {external_threshold()} bytes), True,"
            f" False or a file name; received {type(external_data).__name__}"
            f" ({external_data!r:.60}). Fix: pass external_data=True (tensors in"
            " '<f>.<token>.data') or external_data='weights.bin'."
        )
    if not isinstance(external_data, bool):
        name = os.fspath(external_data)
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise InvalidArgumentError(
                "external_data= names the data file, which must sit next to the model: a plain"
                f" file name; received {name!r}. Fix: pass a name without folders, e.g."
                " external_data='weights.bin'."
            )
    if f is None or is_file_object(f):
        target = "no f" if f is None else "a file object f"
        raise InvalidArgumentError(
            f"external_data={external_data!r} writes the tensors to a second file next to the"
            f" model, which needs f to be a path; received {target}. Fix: pass a path"
            " (f='model.onnx'; the tensors go to 'model.onnx.<token>.data'), or leave"
            " external_data out."
        )
    if not isinstance(external_data, bool) and isinstance(f, (str, os.PathLike)):
        final = Path(os.fspath(f))
        if os.fspath(external_data) == final.name:
            raise InvalidArgumentError(
                f"external_data={os.fspath(external_data)!r} names the model file itself; the"
                " tensors need a second file next to it. Fix: choose another name, e.g."
                f" external_data='{final.stem}.bin'."
            )
        check_chosen_data_name(final, os.fspath(external_data))


def save_model(
    model: onnx.ModelProto,
    f: str | os.PathLike[str] | io.IOBase | Any,
    *,
    external_data: bool | str | os.PathLike[str] | None = None,
) -> None:
    """Write ``model`` to a path or a binary file object, whole or not at all.

    A path is written through a temporary file in its folder and ``os.replace``d, so a failure
    (serialization, a full disk, Ctrl-C) leaves the previous file intact and no temporary file.
    ``external_data``: None (default) puts the tensors of 1 KiB or more in a data file next to
    the model (``<f>.<token>.data``, one per write) when it serializes to more than
    `external_threshold` bytes (protobuf's 2 GiB limit, or
    ``$ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD``); True always; False never (an error past 2 GiB); a
    file name (``weights.bin``): always, in exactly that file. The data file is written first,
    then the model, then the previous write's data file is removed: crash-safe for any reader
    (`onnx_custom.common.external_data`); ``model`` itself is never modified.
    A file object receives the bytes only once the whole model serialized.
    """
    check_external_data_option(external_data, None if external_data in (None, False) else f)
    size = serialized_size(model)
    external = size > external_threshold() if external_data is None else bool(external_data)
    if is_file_object(f):
        if external:
            raise InvalidArgumentError(
                f"This model is {size / 2**30:.1f} GiB: over {external_threshold()} bytes it needs"
                " an external data file, which a file object cannot hold; received a file object."
                " Fix: pass a path (f='model.onnx'); the tensors go to 'model.onnx.<token>.data'."
            )
        f.write(model.SerializeToString())  # type: ignore[union-attr]
        return
    final = check_output_path(f)
    if not external:
        if size > PROTOBUF_LIMIT:
            raise InvalidArgumentError(
                f"external_data=False, but this model is {size / 2**30:.2f} GiB and protobuf cannot"
                " write one file over 2 GiB. Fix: leave external_data out (automatic) or pass"
                " True."
            )
        started, previous = time.time(), referenced_data_files(final)
        atomic_write(final, model.SerializeToString())
        remove_stale_data(
            final, None, set(), previous, started
        )  # a previous pair's data has no reader now
        return
    chosen = os.fspath(external_data) if isinstance(external_data, (str, os.PathLike)) else None
    check_output_path(
        final.with_name(chosen or data_file_name(final.name, None, "0" * 16)),
        what="the external data file",
    )
    save_with_external_data(model, final, chosen)


def _ours(exc: BaseException, unwrap: Any = None) -> BaseException | None:
    """What to raise instead of torch's wrapper ``exc``: the `OnnxCustomError` a translation or a
    check of ours raised inside it, or ``unwrap(exc)`` (torch's error turned into ours), else None.

    The caller raises it *outside* its ``except`` block: raised inside, Python would chain torch's
    wrapper (which contains it) as its context, printing the wrapper again and making a cycle.
    """
    found = next((e for e in chain(exc)[1:] if isinstance(e, OnnxCustomError)), None)
    if found is None and unwrap is not None:
        found = unwrap(exc)
        if found is not None:
            found.__cause__ = chain(exc)[-1]  # the root cause, with its traceback
    return found


def _tensor_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers, each tensor once (tied weights are one): what
    TorchScript writes of them, an initializer per tensor with its own elements (a parameter
    viewing part of a larger storage writes only that part).

    Read off each module's own tensor dicts: ``parameters()``/``buffers()`` and a storage object
    per tensor cost a visible part of our export overhead with the caches cold.
    """
    if not isinstance(model, torch.nn.Module):
        return 0
    seen: dict[int, int] = {}
    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for tensor in tensors.values():
                if tensor is not None:
                    seen[id(tensor)] = tensor.nbytes
    return sum(seen.values())


def _export_torchscript(
    model: Any,
    args: tuple[Any, ...],
    opset: int,
    reg: Registry,
    spec: DynamicSpec,
    output_names: Any,
    kwargs: dict[str, Any],
) -> tuple[onnx.ModelProto, DynamicSpec, ModelCensus]:
    if spec.export_shapes is not None:
        functions = [t.function for t in reg.targets() if t.function is not None]
        spec = check_with_torch_export(model, args, kwargs.get("kwargs"), spec, functions)
    keyword_inputs = kwargs.pop("kwargs", None)
    verbose = bool(kwargs.pop("verbose", False))
    if keyword_inputs:
        args = (*args, keyword_inputs)  # TorchScript takes keyword inputs as a trailing dict
    names = list(spec.input_names)
    dims = ExportDims(
        tuple(names), spec.dynamic_axes, tuple(tuple(leaf.tensor.shape) for leaf in spec.leaves)
    )
    buffer = io.BytesIO()
    failure: BaseException | None = None
    big = _tensor_bytes(model) > _IN_MEMORY_LIMIT
    folder = (
        tempfile.TemporaryDirectory(prefix="onnx_custom_export_")
        if big
        else contextlib.nullcontext(None)
    )
    try:
        with (
            folder as where,
            export_dims(dims),
            registered(reg, opset=opset),
            trace_provenance.recorded() as warned,
            trace_provenance.sources_requested(log=verbose),
            recorded_outputs(model) as example_outputs,
        ):
            # TorchScript writes past 2 GiB only to a path (tensors as files next to it): a big
            # model goes through a temporary folder and is read back with its data.
            target = os.path.join(where, "model.onnx") if where else buffer
            torch.onnx.export(
                model,
                args,
                target,  # type: ignore[arg-type]
                dynamo=False,
                opset_version=opset,
                input_names=names,
                output_names=output_names,
                dynamic_axes=spec.dynamic_axes or None,
                verbose=True,  # the nodes' source lines (`trace_provenance.keep_sources`)
                **kwargs,
            )
            if where:
                proto = onnx.load(target, load_external_data=True)
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        missing = missing_ops_torchscript(model, args, opset, reg)
        if not missing:
            raise
        raise UnsupportedOpError(
            format_missing(missing, "torchscript", opset), tuple(m.name for m in missing)
        ) from exc
    except OnnxCustomError:
        raise
    except Exception as exc:
        failure = _ours(exc, unwrap_torchscript_error)
        if failure is None:
            raise
    if failure is not None:
        raise failure
    if not big:
        proto = onnx.load_from_string(buffer.getvalue())
    trace_provenance.write(proto, warned)
    trace_provenance.keep_sources(proto, keep_doc_strings=verbose)
    census = model_census(proto)
    name_derived_dims(
        proto, dims, census=census
    )  # drops attributes and renames dims: the census stays true
    drop_contradicted_output_dims(proto, dims, example_outputs)
    return proto, spec, census


@contextlib.contextmanager
def _reject_autograd_functions(reg: Registry) -> Any:
    """The dynamo exporter silently inlines autograd.Functions, ignoring their translation.

    Make that loud: a registered Function that runs while tracing raises `SymbolicError`.
    """
    patched = []
    for target in reg.targets():
        cls = target.function
        if cls is None:
            continue
        original = cls.__dict__.get("forward")

        def forward(*a: Any, __cls: type = cls, __orig: Any = original, **k: Any) -> Any:
            raise SymbolicError(
                f"{__cls.__qualname__} is a torch.autograd.Function with an onnx-custom"
                " translation, but the dynamo exporter ignores Function translations (it inlines"
                " forward). Fix: wrap the computation as a torch.library.custom_op with"
                " register_fake and register the translation for that op, or export with"
                " exporter='torchscript'."
            )

        cls.forward = staticmethod(forward)  # type: ignore[attr-defined]
        patched.append((cls, original))
    try:
        yield
    finally:
        for cls, original in patched:
            cls.forward = original  # type: ignore[attr-defined]


def trace_program(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    registry: Registry,
    *,
    kwargs: dict[str, Any] | None = None,
    dynamic_shapes: Any = None,
    spec: DynamicSpec | None = None,
    deferred_asserts: bool = False,
) -> torch.export.ExportedProgram:
    """``torch.export`` as the dynamo exporter runs it, with our errors for its sharp edges
    (a registered autograd.Function, a custom op without a fake kernel, a dynamic dim the model
    specializes); others propagate. ``dynamic_shapes`` may be any form `export` accepts.
    ``deferred_asserts``: guards on data-dependent values become runtime asserts in the graph
    (what ``torch.onnx.export``'s own capture asks for)."""
    if spec is None:
        spec = resolve_dynamic_shapes(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    failure: BaseException | None = None
    failed_functions: list[type] = []
    traced_functions: list[type] = []
    try:
        with (
            _reject_autograd_functions(registry),
            recording_function_failures(failed_functions, traced_functions),
            quiet_torch(),
            onnx_exporting(),
        ):
            deferred: dict[str, Any] = (
                {"prefer_deferred_runtime_asserts_over_guards": True} if deferred_asserts else {}
            )
            program = torch.export.export(
                model,
                args,
                kwargs=kwargs,
                dynamic_shapes=spec.export_shapes,
                strict=False,
                **deferred,
            )
    except Exception as exc:
        failure = _ours(exc)
        if failure is None:
            failure = constraint_violation(exc, spec)
            if failure is not None:
                failure.__cause__ = exc
        match = _NO_FAKE.search(str(exc))
        if failure is None and match:
            op = match["op"]
            failure = SymbolicError(
                f"The custom op {op} has no fake (meta) kernel, which the dynamo exporter needs to"
                f" trace it. Fix: add @torch.library.register_fake('{op}') returning empty outputs"
                " of the right shape/dtype, or export with exporter='torchscript'."
            )
            failure.__cause__ = exc
        if failure is None and failed_functions:
            failure = function_symbolic_error(failed_functions[0], exc)
        if failure is None:
            note_data_dependent(exc)
            raise
    if failure is not None:
        raise failure
    warn_traced_functions(traced_functions)
    return program


def _export_dynamo(
    model: Any,
    args: tuple[Any, ...],
    opset: int,
    reg: Registry,
    spec: DynamicSpec,
    output_names: Any,
    kwargs: dict[str, Any],
    deferred_asserts: bool = False,
) -> tuple[onnx.ModelProto, DynamicSpec, ModelCensus]:
    from onnx_custom.exporter.dynamo import program_constants, translation_table

    model_kwargs = None
    if isinstance(model, torch.export.ExportedProgram):
        program, names = model, {}  # its dims are torch's (s77): no user names to give them
    else:
        model_kwargs = kwargs.pop("kwargs", None)
        program = trace_program(
            model, args, reg, kwargs=model_kwargs, spec=spec, deferred_asserts=deferred_asserts
        )
        if not model_kwargs:
            program_cache.remember(
                model, args, program
            )  # localize reuses it instead of tracing again
        names = symbol_names_of(program, spec)
    _check_no_mutating_ops(program)
    check_fake_kernels(program, args, model_kwargs)  # the file gets the fakes' ranks and dtypes
    float_clamp_bounds(program)  # torch's type promotion fails on clamp(0, 1.5) of a float tensor
    missing = missing_ops_dynamo(program, opset, reg)
    if missing:
        raise UnsupportedOpError(
            format_missing(missing, "dynamo", opset), tuple(m.name for m in missing)
        )
    table = translation_table(opset, reg, build_opset=max(opset, _DYNAMO_NATIVE_OPSET))
    failure: BaseException | None = None
    try:
        with symbol_names(names), program_constants(program):
            # Build at >= 18 (the exporter's native opset) and lower ourselves: torch's own
            # down-conversion silently keeps opset 18 whenever onnx lacks an adapter.
            onnx_program = torch.onnx.export(
                program,
                args,
                dynamo=True,
                opset_version=max(opset, _DYNAMO_NATIVE_OPSET),
                custom_translation_table=table,  # type: ignore[arg-type]
                input_names=list(spec.input_names),
                output_names=output_names,
                verbose=False,
                **kwargs,
            )
    except Exception as exc:
        failure = _ours(exc, unwrap_dynamo_error)
        traced_here = not isinstance(model, torch.export.ExportedProgram)
        if failure is None and traced_here and not deferred_asserts:
            # torch.onnx.export's own capture defers data-dependent guards to runtime asserts;
            # torch 2.11's decomposition fails on some guards kept as guards (transformers'
            # v2 attention checks a tensor's values): trace once more the way torch does
            retry = kwargs if model_kwargs is None else {**kwargs, "kwargs": model_kwargs}
            try:
                return _export_dynamo(
                    model, args, opset, reg, spec, output_names, retry, deferred_asserts=True
                )
            except Exception:
                pass  # the first attempt's error is the one to report
        if failure is None:
            raise
    if failure is not None:
        raise failure
    proto = lower_default_opset(onnx_program.model_proto, opset)  # type: ignore[union-attr]
    _keep_output_dtypes(proto, program)
    rename_dims(proto, names)
    if not isinstance(model, torch.export.ExportedProgram):
        spec = spec.without(static_axes(program, spec))
    return proto, spec, model_census(proto)


def _check_no_mutating_ops(program: torch.export.ExportedProgram) -> None:
    """A custom op that writes into its arguments becomes ``auto_functionalized`` in the
    exporter's decomposition, which it cannot translate (a bare KeyError on the op). ATen's
    in-place ops are functionalized by torch and stay allowed."""
    for node in program.graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.namespace not in ("aten", "prims")
        ):
            check_functional(target.name(), target._schema)


def _keep_output_dtypes(proto: onnx.ModelProto, program: torch.export.ExportedProgram) -> None:
    """Graph outputs in the dtypes PyTorch returns: torch's dynamo exporter drops the final
    downcast of a float16 ``sum`` (computed in float32), so the file returned float32 where the
    model returns float16. A ``Cast`` back restores the model's dtype."""
    from torch.export.graph_signature import OutputKind

    output = next(n for n in program.graph.nodes if n.op == "output")
    kinds = [spec.kind for spec in program.graph_signature.output_specs]
    values = [
        getattr(a, "meta", {}).get("val")
        for a, kind in zip(output.args[0], kinds, strict=False)
        if kind == OutputKind.USER_OUTPUT
    ]
    if len(values) != len(proto.graph.output):
        return
    for info, value in zip(proto.graph.output, values, strict=True):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        want = _ONNX_FLOATS.get(value.dtype)
        have = info.type.tensor_type.elem_type
        if want is None or have == want or have not in _ONNX_FLOATS.values():
            continue
        computed = f"{info.name}_as_computed"
        for node in proto.graph.node:
            node.output[:] = [computed if o == info.name else o for o in node.output]
            node.input[:] = [computed if i == info.name else i for i in node.input]
        for described in proto.graph.value_info:
            if described.name == info.name:
                described.name = computed
        proto.graph.node.append(
            onnx.helper.make_node(
                "Cast", [computed], [info.name], name=f"{info.name}_dtype", to=want
            )
        )
        info.type.tensor_type.elem_type = want


@dataclasses.dataclass(frozen=True)
class ExportRequest:
    """The arguments of one export, checked once (`check_export_request`) before anything runs."""

    model: Any
    args: tuple[Any, ...]
    exporter: str
    opset: int
    registry: Registry | None
    dynamic_shapes: Any
    dynamic_axes: Any
    input_names: Sequence[str] | None
    output_names: Sequence[str] | None
    exporter_kwargs: dict[str, Any]
    half_precision: str = DEFAULT_MODE


EXPORT_LOCK = threading.RLock()
"""Held for the length of each export (`export_with_census`); re-entrant (localization
re-exports)."""


def check_export_request(
    model: Any,
    args: Any,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    dynamic_shapes: Any = None,
    dynamic_axes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    registry: Registry | None = None,
    half_precision: str = DEFAULT_MODE,
    f: Any = None,
    external_data: Any = None,
    kernels: Any = None,
    keep_failed: Any = None,
    verify: bool = False,
    **exporter_kwargs: Any,
) -> ExportRequest:
    """Every check of `export_model`'s and `onnx_custom.export`'s arguments, in the order a user
    reads them; the one place the export path validates its arguments. ``f``, ``external_data``,
    ``kernels``, ``keep_failed`` and ``verify`` are `onnx_custom.export`'s (checked here, used
    there; their defaults check nothing)."""
    opset = DEFAULT_OPSET if opset is None else opset
    check_exporter(exporter)
    check_model(model, exporter)
    check_mode(half_precision)
    check_opset(exporter, opset)
    check_registry(registry)
    check_exporter_kwargs(exporter_kwargs)
    args = check_args(args)
    check_dynamic_for_program(model, dynamic_shapes, dynamic_axes)
    _check_output_options(f, external_data, input_names, output_names, kernels, keep_failed, verify)
    return ExportRequest(
        model,
        args,
        exporter,
        opset,
        registry,
        dynamic_shapes,
        dynamic_axes,
        input_names,
        output_names,
        dict(exporter_kwargs),
        half_precision,
    )


def _check_output_options(
    f: Any,
    external_data: Any,
    input_names: Any,
    output_names: Any,
    kernels: Any,
    keep_failed: Any,
    verify: bool,
) -> None:
    """The arguments about what an export writes and runs it with: ``f``, ``external_data``,
    the names, ``kernels`` and ``keep_failed``."""
    check_output(f)
    check_external_data_option(external_data, f)
    check_names(input_names, "input_names")
    check_names(output_names, "output_names")
    if kernels is not None:
        _check_kernels(kernels)
    if keep_failed is not None:
        if not verify:
            raise InvalidArgumentError(
                f"keep_failed={keep_failed!r} keeps a model that failed verification, so it needs "
                "verify=True; received verify=False. Fix: pass verify=True, or drop keep_failed."
            )
        check_output_path(keep_failed, what="keep_failed")


def _check_kernels(kernels: Any) -> None:
    """``kernels=`` before the export runs (its consumers check it only after)."""
    from onnx_custom.runtime import KernelRegistry

    if not isinstance(kernels, KernelRegistry) and kernels != "native":
        raise KernelError(
            f"kernels= expects a KernelRegistry, None or 'native'; received {kernels!r:.60}. Fix:"
            " pass an onnx_custom.runtime.KernelRegistry with your kernels, kernels='native', or"
            " leave it out."
        )


def export_model(model: Any, args: Any, **options: Any) -> onnx.ModelProto:
    """Export with ``exporter`` at ``opset`` using ``registry``; every used domain declared.

    ``half_precision`` (see `onnx_custom.runtime.half_precision`): standard nodes ONNX Runtime's
    CPU provider lacks at float16/bfloat16 compute in float32 (``"float32-compute"``), raise
    `HalfPrecisionError` (``"strict"``), or are left alone (``"off"``).

    ``dynamic_shapes`` (any form torch.onnx.export accepts) or ``dynamic_axes`` (the TorchScript
    form) are read once, the same way for both exporters: ONNX inputs are named after
    ``forward``'s parameters (unless ``input_names``), each dynamic dim is a ``dim_param`` with the
    user's name, and ``metadata_props["onnx_custom.dynamic_dims"]`` records the named dims' ranges.
    Options are those of `check_export_request`.
    """
    return run_export(check_export_request(model, args, **options))


def run_export(request: ExportRequest) -> onnx.ModelProto:
    """Run a checked `ExportRequest` (no argument is checked again)."""
    return export_with_census(request)[0]


def export_with_census(request: ExportRequest) -> tuple[onnx.ModelProto, ModelCensus]:
    """`run_export`, and the exported model's `ModelCensus` (read once, before the passes below,
    which keep it true) for the caller's own checks of the model."""
    model, args, kwargs = request.model, request.args, dict(request.exporter_kwargs)
    reg = resolve_registry(request.registry)
    if isinstance(model, torch.export.ExportedProgram):
        spec = resolve_dynamic_shapes(
            model.module(), args, kwargs.get("kwargs"), input_names=request.input_names
        )
    else:
        spec = resolve_dynamic_shapes(
            model,
            args,
            kwargs.get("kwargs"),
            dynamic_shapes=request.dynamic_shapes,
            dynamic_axes=request.dynamic_axes,
            input_names=request.input_names,
            output_names=request.output_names,
        )
    run = _export_dynamo if request.exporter == "dynamo" else _export_torchscript
    # One export at a time per process: torch's exporters keep process-global state (the
    # TorchScript symbolic table our `registered` swaps in, its GLOBALS, the dynamo exporter's
    # registries), so two threads exporting with different specs would see each other's.
    # The half-precision pass below fixes (or refuses) float16/bfloat16 nodes a schema refuses, so
    # the translations' type check leaves those to it unless the user turned it off.
    # `torch_fixes`: older torch's pieces that refuse right models, mended for the export.
    with (
        EXPORT_LOCK,
        quiet_torch(),
        torch_fixes(),
        deferring_half_precision(request.half_precision != "off"),
    ):
        proto, spec, census = run(
            model, args, request.opset, reg, spec, request.output_names, kwargs
        )
    if (
        request.output_names is None
    ):  # predictable names, not the exporter's value numbering ('3', 'add_3')
        source = model.module() if isinstance(model, torch.export.ExportedProgram) else model
        rename_outputs(
            proto,
            default_output_names(source, len(proto.graph.output)),
            keep_values=request.exporter == "dynamo",
            census=census,
        )
    # the passes below rename values and add Identity and Cast nodes only: the census's graphs,
    # nodes with a domain and attribute facts stay true (its names do not, and are not read again)
    write_metadata(proto, spec, graphs=census.graphs)
    widened = widen_model(
        finalize_model(proto, census=census), request.half_precision, census=census
    )
    return repair_mixed_floats(widened, request.half_precision), census

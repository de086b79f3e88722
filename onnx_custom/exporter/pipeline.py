"""The exporters themselves: run either PyTorch exporter with our translations, return a ModelProto.

`export` (the public call) adds verification, function bodies and saving on top; `localize`
re-exports probes through `export_model` here, so the verify path never imports `export`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Sequence
from typing import Any

import onnx
import torch

from onnx_custom.common.atomic import (
    atomic_write,
    check_output_path,
    commit_file,
    is_file_object,
    temporary_folder,
)
from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.common.quiet import quiet_torch
from onnx_custom.errors import (
    InvalidArgumentError,
    OnnxCustomError,
    SymbolicError,
    UnsupportedOpError,
)
from onnx_custom.exporter.arguments import (
    EXPORTERS,
    check_args,
    check_dynamic_for_program,
    check_exporter,
    check_exporter_kwargs,
    check_model,
    check_opset,
    check_registry,
)
from onnx_custom.exporter.constraints import (
    check_with_torch_export,
    constraint_violation,
    static_axes,
    symbol_names_of,
)
from onnx_custom.exporter.dim_params import rename_dims, write_metadata
from onnx_custom.exporter.dynamic_shapes import DynamicSpec, resolve_dynamic_shapes
from onnx_custom.exporter.dynamo_shapes import symbol_names
from onnx_custom.exporter.opset_compat import lower_default_opset
from onnx_custom.exporter.output_names import default_output_names, rename_outputs
from onnx_custom.exporter.torchscript import registered
from onnx_custom.exporter.torchscript_shapes import ExportDims, export_dims, name_derived_dims
from onnx_custom.translate.coverage import (
    format_missing,
    missing_ops_dynamo,
    missing_ops_torchscript,
)
from onnx_custom.translate.registry import Registry, resolve_registry
from onnx_custom.translate.torch_errors import chain, unwrap_dynamo_error, unwrap_torchscript_error

__all__ = ["DEFAULT_OPSET", "EXPORTERS", "MAX_IR_VERSION", "export_model", "finalize_model", "save_model", "trace_program"]

DEFAULT_OPSET = 18
MAX_IR_VERSION = 10  # ORT 1.31 accepts <= 13; 10 covers opsets up to 21 and every older runtime
_PROTOBUF_LIMIT = 2**31 - 1
_DYNAMO_NATIVE_OPSET = 18
_NO_FAKE = re.compile(r"no fake impl registered for (?:<CustomOpDef\()?(?P<op>[\w:.]+)")


def _validate(model: Any, args: Any, exporter: str, opset: int, registry: Any = None, kwargs: dict[str, Any] | None = None) -> tuple[Any, ...]:
    """Every argument checked before any tracing (see `_validation`)."""
    check_exporter(exporter)
    check_model(model, exporter)
    check_opset(exporter, opset)
    check_registry(registry)
    check_exporter_kwargs(kwargs or {})
    return check_args(args)


def _custom_domains(model: onnx.ModelProto) -> set[str]:
    return {n.domain for n in iter_nodes(model) if n.domain not in ("", "ai.onnx")}


def finalize_model(model: onnx.ModelProto, domain_versions: dict[str, int] | None = None) -> onnx.ModelProto:
    """Declare every used domain in ``opset_import`` and set an IR version ORT accepts."""
    declared = {o.domain for o in model.opset_import}
    for domain in sorted(_custom_domains(model) - declared):
        model.opset_import.append(onnx.helper.make_opsetid(domain, (domain_versions or {}).get(domain, 1)))
    model.ir_version = min(model.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    return model


def save_model(model: onnx.ModelProto, f: str | os.PathLike[str] | io.IOBase | Any, *, external_data: bool | None = None) -> None:
    """Write ``model`` to a path or a binary file object, whole or not at all.

    A path is written through a temporary file in its folder and ``os.replace``d, so a failure
    (serialization, a full disk, Ctrl-C) leaves the previous file intact and no temporary file.
    ``external_data`` (default: only past protobuf's 2 GB limit) puts the tensors in
    ``<name>.data`` next to it, written the same way; ``model`` itself is never modified.
    A file object receives the bytes only once the whole model serialized.
    """
    too_big = model.ByteSize() > _PROTOBUF_LIMIT
    external = too_big if external_data is None else bool(external_data)
    if is_file_object(f):
        if external:
            raise InvalidArgumentError(
                f"This model is {model.ByteSize() / 2**30:.1f} GiB: over protobuf's 2 GiB limit it "
                "needs an external data file, which a file object cannot hold; received a file "
                "object. Fix: pass a path (f='model.onnx'); the tensors go to 'model.onnx.data'."
            )
        f.write(model.SerializeToString())  # type: ignore[union-attr]
        return
    final = check_output_path(f)
    if not external:
        atomic_write(final, model.SerializeToString())
        return
    data_name = final.name + ".data"
    check_output_path(final.with_name(data_name), what="the external data file")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model moves tensors out of the proto it is given
    with temporary_folder(final) as folder:
        onnx.save_model(copy, os.fspath(folder / final.name), save_as_external_data=True, all_tensors_to_one_file=True, location=data_name)
        # Data first: the new model file never points at missing data.
        if (folder / data_name).exists():  # absent when no tensor was big enough to move
            commit_file(folder / data_name, final.with_name(data_name))
        commit_file(folder / final.name, final)


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


def _export_torchscript(model: Any, args: tuple[Any, ...], opset: int, reg: Registry, spec: DynamicSpec, output_names: Any, kwargs: dict[str, Any]) -> tuple[onnx.ModelProto, DynamicSpec]:
    if spec.export_shapes is not None:
        spec = check_with_torch_export(model, args, kwargs.get("kwargs"), spec)
    keyword_inputs = kwargs.pop("kwargs", None)
    if keyword_inputs:
        args = (*args, keyword_inputs)  # TorchScript takes keyword inputs as a trailing dict
    names = list(spec.input_names)
    dims = ExportDims(tuple(names), spec.dynamic_axes, tuple(tuple(leaf.tensor.shape) for leaf in spec.leaves))
    buffer = io.BytesIO()
    failure: BaseException | None = None
    try:
        with export_dims(dims), registered(reg, opset=opset):
            torch.onnx.export(
                model, args, buffer, dynamo=False, opset_version=opset, input_names=names,  # type: ignore[arg-type]
                output_names=output_names, dynamic_axes=spec.dynamic_axes or None, **kwargs,
            )
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        missing = missing_ops_torchscript(model, args, opset, reg)
        if not missing:
            raise
        raise UnsupportedOpError(format_missing(missing, "torchscript", opset), tuple(m.name for m in missing)) from exc
    except OnnxCustomError:
        raise
    except Exception as exc:
        failure = _ours(exc, unwrap_torchscript_error)
        if failure is None:
            raise
    if failure is not None:
        raise failure
    proto = onnx.load_from_string(buffer.getvalue())
    name_derived_dims(proto, dims)
    return proto, spec


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
                f"{__cls.__qualname__} is a torch.autograd.Function with an onnx-custom translation, "
                "but the dynamo exporter ignores Function translations (it inlines forward). Fix: "
                "wrap the computation as a torch.library.custom_op with register_fake and register "
                "the translation for that op, or export with exporter='torchscript'."
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
) -> torch.export.ExportedProgram:
    """``torch.export`` as the dynamo exporter runs it, with our errors for its sharp edges
    (a registered autograd.Function, a custom op without a fake kernel, a dynamic dim the model
    specializes); others propagate. ``dynamic_shapes`` may be any form `export` accepts."""
    if spec is None:
        spec = resolve_dynamic_shapes(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    failure: BaseException | None = None
    try:
        with _reject_autograd_functions(registry), quiet_torch():
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=spec.export_shapes, strict=False)
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
                f"The custom op {op} has no fake (meta) kernel, which the dynamo exporter needs to "
                f"trace it. Fix: add @torch.library.register_fake('{op}') returning empty outputs of "
                "the right shape/dtype, or export with exporter='torchscript'."
            )
            failure.__cause__ = exc
        if failure is None:
            raise
    raise failure


def _export_dynamo(model: Any, args: tuple[Any, ...], opset: int, reg: Registry, spec: DynamicSpec, output_names: Any, kwargs: dict[str, Any]) -> tuple[onnx.ModelProto, DynamicSpec]:
    from onnx_custom.exporter.dynamo import translation_table

    if isinstance(model, torch.export.ExportedProgram):
        program, names = model, {}  # its dims are torch's (s77): no user names to give them
    else:
        program = trace_program(model, args, reg, kwargs=kwargs.pop("kwargs", None), spec=spec)
        names = symbol_names_of(program, spec)
    missing = missing_ops_dynamo(program, opset, reg)
    if missing:
        raise UnsupportedOpError(format_missing(missing, "dynamo", opset), tuple(m.name for m in missing))
    table = translation_table(opset, reg)
    failure: BaseException | None = None
    try:
        with symbol_names(names):
            # Build at >= 18 (the exporter's native opset) and lower ourselves: torch's own
            # down-conversion silently keeps opset 18 whenever onnx lacks an adapter.
            onnx_program = torch.onnx.export(
                program, args, dynamo=True, opset_version=max(opset, _DYNAMO_NATIVE_OPSET), custom_translation_table=table,  # type: ignore[arg-type]
                input_names=list(spec.input_names), output_names=output_names, verbose=False, **kwargs,
            )
    except Exception as exc:
        failure = _ours(exc, unwrap_dynamo_error)
        if failure is None:
            raise
    if failure is not None:
        raise failure
    proto = lower_default_opset(onnx_program.model_proto, opset)  # type: ignore[union-attr]
    rename_dims(proto, names)
    if not isinstance(model, torch.export.ExportedProgram):
        spec = spec.without(static_axes(program, spec))
    return proto, spec


def export_model(
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
    **exporter_kwargs: Any,
) -> onnx.ModelProto:
    """Export with ``exporter`` at ``opset`` using ``registry``; every used domain declared.

    ``dynamic_shapes`` (any form torch.onnx.export accepts) or ``dynamic_axes`` (the TorchScript
    form) are read once, the same way for both exporters: ONNX inputs are named after
    ``forward``'s parameters (unless ``input_names``), each dynamic dim is a ``dim_param`` with the
    user's name, and ``metadata_props["onnx_custom.dynamic_dims"]`` records the named dims' ranges.
    """
    opset = DEFAULT_OPSET if opset is None else opset
    args = _validate(model, args, exporter, opset, registry, exporter_kwargs)
    check_dynamic_for_program(model, dynamic_shapes, dynamic_axes)
    reg = resolve_registry(registry)
    kwargs = dict(exporter_kwargs)
    if isinstance(model, torch.export.ExportedProgram):
        spec = resolve_dynamic_shapes(model.module(), args, kwargs.get("kwargs"), input_names=input_names)
    else:
        spec = resolve_dynamic_shapes(
            model, args, kwargs.get("kwargs"), dynamic_shapes=dynamic_shapes, dynamic_axes=dynamic_axes,
            input_names=input_names, output_names=output_names,
        )
    run = _export_dynamo if exporter == "dynamo" else _export_torchscript
    with quiet_torch():
        proto, spec = run(model, args, opset, reg, spec, output_names, kwargs)
    if output_names is None:  # predictable names, not the exporter's value numbering ('3', 'add_3')
        source = model.module() if isinstance(model, torch.export.ExportedProgram) else model
        rename_outputs(proto, default_output_names(source, len(proto.graph.output)), keep_values=exporter == "dynamo")
    write_metadata(proto, spec)
    return finalize_model(proto)

"""``onnx_custom.export``: one call, either exporter, our translations scoped to the call."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from typing import Any

import onnx
import torch

from onnx_custom.common.onnx_utils import ModelCensus
from onnx_custom.common.progress import ProgressArg, progress_for
from onnx_custom.common.progress import close as close_progress
from onnx_custom.errors import (
    NodeDeclarationError,
    OnnxCustomError,
    VerificationError,
)
from onnx_custom.exporter.pipeline import (
    DEFAULT_OPSET,
    EXPORTERS,
    MAX_IR_VERSION,
    check_export_request,
    export_with_census,
    finalize_model,
    save_model,
    trace_program,
)
from onnx_custom.fusion import check_fuse, fusing
from onnx_custom.runtime.half_precision import DEFAULT_MODE
from onnx_custom.translate.registry import Registry
from onnx_custom.verification.verifier import verify as run_verify

__all__ = [
    "DEFAULT_OPSET",
    "EXPORTERS",
    "MAX_IR_VERSION",
    "export",
    "finalize_model",
    "trace_program",
]


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...] | torch.Tensor,
    f: str | os.PathLike[str] | io.IOBase | None = None,
    *,
    exporter: str = "dynamo",
    opset: int | None = None,
    dynamic_shapes: Any = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    registry: Registry | None = None,
    verify: bool = False,
    functions: bool = False,
    kernels: Any = None,
    dynamic_axes: Any = None,
    keep_failed: str | os.PathLike[str] | None = None,
    half_precision: str = DEFAULT_MODE,
    external_data: bool | str | os.PathLike[str] | None = None,
    fuse: Any = False,
    progress: ProgressArg = None,
    **exporter_kwargs: Any,
) -> onnx.ModelProto:
    """Export ``model`` with the ``"dynamo"`` or ``"torchscript"`` exporter using our translations.

    The translations are visible only during the call. Every custom domain is declared in
    ``opset_import`` and the IR version is one ONNX Runtime accepts. With ``f`` the model is written
    as one self-contained file (external data only past protobuf's 2 GB limit), whole or not at
    all: through a temporary file in the same folder, so a failure leaves the previous file intact.
    Every argument (``model``, ``f``, ``opset``, ...) is checked before the export starts.

    ``dynamic_shapes`` takes every form ``torch.onnx.export`` does (a dict keyed by ``forward``'s
    parameter names or a tuple by position; per tensor ``{axis: dim}`` or one entry per axis; a
    dim is a name such as ``"batch"``, a ``torch.export.Dim`` with min/max, ``Dim.AUTO``/
    ``DYNAMIC``/``STATIC`` or None), the same way for both exporters; ``dynamic_axes`` is the
    TorchScript form (``{"x": {0: "batch"}}``). Dim names become the file's ``dim_param``s, ONNX
    inputs are named after ``forward``'s parameters, and ``metadata_props
    ["onnx_custom.dynamic_dims"]`` records each named dim's declared range. ``functions=True``
    embeds the ONNX function bodies of custom nodes that have one (from ``kernels`` when given, for
    runtimes without our kernels). ``verify=True`` runs `onnx_custom.verify` (with ``kernels``, a
    `onnx_custom.runtime.KernelRegistry`, for custom nodes) *before* writing ``f``: on a mismatch
    nothing is written and `VerificationError` says so, unless ``keep_failed`` names a path for the
    failing model (the error then says where it is).

    ``external_data``: None (default) writes ``f`` as one file unless it would exceed protobuf's
    2 GiB limit (or ``$ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD`` bytes), and then puts the tensors in
    ``<f>.data`` next to it; True always does; False never (an error past 2 GiB); a file name
    (``"weights.bin"``) always, in that file next to ``f``. The data file is written first and
    the model records which write it belongs to, so onnx-custom's loaders never pair a model with
    another export's data. A file object ``f`` cannot take external data (`InvalidArgumentError`).

    ``half_precision``: standard nodes (function bodies included) that ONNX Runtime's CPU provider
    cannot run at float16/bfloat16 are computed in float32 with ``Cast``s around them
    (``"float32-compute"``, default), or raise `HalfPrecisionError` naming the op, dtype and
    provider (``"strict"``), or are left alone (``"off"``: files for other providers).

    ``fuse``: True replaces, for this export only, the pure-PyTorch implementations onnx-custom
    recognises (transformers' ``MultiScaleDeformableAttention`` modules, mmcv's
    ``multi_scale_deformable_attn_pytorch``, functions registered with
    `onnx_custom.fusion.register_fusion`) by our ops; a list adds your own functions or module
    classes (``fuse=[my_msda]``; ``(target, replacement)`` pairs too). Each use is checked on the
    example input first; what was fused and what was not (and why) is in
    ``onnx_custom.fusion.fusion_report(proto)`` (see docs/howto/fusion.md). ``verify=True``
    compares the fused file with the unfused model.

    ``progress``: on a terminal (stderr a TTY) one live line shows the stage (export, checks,
    verify's trials, writing); ``False`` or a non-terminal stderr shows nothing; a callable gets
    the stage lines (`onnx_custom.common.progress`).
    """
    request = check_export_request(
        model,
        args,
        exporter=exporter,
        opset=opset,
        dynamic_shapes=dynamic_shapes,
        dynamic_axes=dynamic_axes,
        input_names=input_names,
        output_names=output_names,
        registry=registry,
        half_precision=half_precision,
        f=f,
        external_data=external_data,
        kernels=kernels,
        keep_failed=keep_failed,
        verify=verify,
        **exporter_kwargs,
    )
    check_fuse(fuse)  # fusion sits above the exporter in the layer order: its check stays here
    reporter = progress_for(progress)
    try:
        return _export_checked(
            request,
            (model, args, half_precision, fuse),
            f,
            kernels,
            functions,
            verify,
            keep_failed,
            external_data,
            reporter,
        )
    finally:
        close_progress(reporter)


def _export_checked(
    request: Any,
    call: tuple[Any, Any, str, Any],
    f: Any,
    kernels: Any,
    functions: bool,
    verify: bool,
    keep_failed: Any,
    external_data: Any,
    progress: Callable[[str], None] | None,
) -> onnx.ModelProto:
    """`export` after its argument checks: export, check, embed, verify, write."""
    model, args, half_precision, fuse = call
    if progress is not None:
        progress(f"export: {request.exporter} export of {type(model).__name__}")
    with fusing(request.model, request.args, fuse, request.exporter_kwargs.get("kwargs")) as fusion:
        proto, census = export_with_census(request)
    if fusion is not None:
        fusion.attach(proto)
    _check_nodes_against_kernels(proto, kernels, f, census)
    if functions:
        from onnx_custom.function_bodies import embed_functions
        from onnx_custom.runtime import KernelRegistry

        proto = embed_functions(
            proto,
            kernels if isinstance(kernels, KernelRegistry) else None,
            half_precision=half_precision,
        )  # type: ignore[operator]
    if verify:
        if progress is not None:
            progress("export: verifying")
        _verify_before_writing(model, args, proto, kernels, f, keep_failed, progress)
    if f is not None:
        if progress is not None:
            progress(f"export: writing {_describe(f)}")
        save_model(proto, f, external_data=external_data)
    return proto


def _verify_before_writing(
    model: Any,
    args: Any,
    proto: onnx.ModelProto,
    kernels: Any,
    f: Any,
    keep_failed: Any,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Verify ``proto``; on failure write nothing to ``f`` (the failing model goes to
    ``keep_failed`` when given) and say so in the error."""
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    try:
        run_verify(
            model,
            args if isinstance(args, tuple) else (args,),
            proto,
            raise_on_mismatch=True,
            kernels=kernels,
            progress=progress if progress is not None else False,
        )
    except Exception as exc:
        notes = []
        if f is not None:
            notes.append(f"Nothing was written to {_describe(f)}.")
        if keep_failed is not None:
            save_model(proto, keep_failed)
            notes.append(
                f"The failing model was kept at {os.fspath(keep_failed)!r} (keep_failed=)."
            )
            if isinstance(exc, VerificationError):
                exc.kept = os.fspath(keep_failed)
        elif f is not None:
            notes.append(
                "Pass keep_failed='failing.onnx' to keep the failing model for inspection."
            )
        if notes:
            if isinstance(exc, OnnxCustomError) and exc.args and isinstance(exc.args[0], str):
                exc.args = (f"{exc.args[0]}\n{' '.join(notes)}", *exc.args[1:])
            else:
                exc.add_note(" ".join(notes))
        raise


def _check_nodes_against_kernels(
    proto: onnx.ModelProto, kernels: Any, f: Any, census: ModelCensus | None = None
) -> None:
    """Custom nodes against their registered kernels' declarations (attribute names and types,
    required attributes, arity, dtypes) before ``f`` is written: the same check (and error) as
    creating a session, which otherwise came only after a file ORT cannot load was on disk."""
    from onnx_custom.runtime import KernelRegistry
    from onnx_custom.runtime.registry import default_kernel_registry
    from onnx_custom.runtime.validate import validate_registered

    try:
        validate_registered(
            proto,
            kernels if isinstance(kernels, KernelRegistry) else default_kernel_registry(),
            census=census,
        )
    except NodeDeclarationError as exc:
        if f is not None:
            exc.args = (f"{exc.args[0]}\nNothing was written to {_describe(f)}.", *exc.args[1:])
        raise


def _describe(f: Any) -> str:
    return repr(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else "the file object f"

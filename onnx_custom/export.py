"""``onnx_custom.export``: one call, either exporter, our translations scoped to the call."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import onnx
import torch

from onnx_custom._exporters import (
    DEFAULT_OPSET,
    EXPORTERS,
    MAX_IR_VERSION,
    export_model,
    finalize_model,
    save_model,
    trace_program,
)
from onnx_custom.registry import Registry
from onnx_custom.verify import verify as run_verify

__all__ = ["DEFAULT_OPSET", "EXPORTERS", "MAX_IR_VERSION", "export", "finalize_model", "trace_program"]


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
    **exporter_kwargs: Any,
) -> onnx.ModelProto:
    """Export ``model`` with the ``"dynamo"`` or ``"torchscript"`` exporter using our translations.

    The translations are visible only during the call. Every custom domain is declared in
    ``opset_import`` and the IR version is one ONNX Runtime accepts. With ``f`` the model is written
    as one self-contained file (external data only past protobuf's 2 GB limit).

    ``dynamic_shapes`` takes every form ``torch.onnx.export`` does (a dict keyed by ``forward``'s
    parameter names or a tuple by position; per tensor ``{axis: dim}`` or one entry per axis; a
    dim is a name such as ``"batch"``, a ``torch.export.Dim`` with min/max, ``Dim.AUTO``/
    ``DYNAMIC``/``STATIC`` or None), the same way for both exporters; ``dynamic_axes`` is the
    TorchScript form (``{"x": {0: "batch"}}``). Dim names become the file's ``dim_param``s, ONNX
    inputs are named after ``forward``'s parameters, and ``metadata_props
    ["onnx_custom.dynamic_dims"]`` records each named dim's declared range. ``functions=True``
    embeds the ONNX function bodies of custom nodes that have one (for runtimes without our
    kernels). ``verify=True`` runs `onnx_custom.verify` (with ``kernels``, a
    `onnx_custom.runtime.KernelRegistry`, for custom nodes) and raises on mismatch.
    """
    proto = export_model(
        model, args, exporter=exporter, opset=opset, dynamic_shapes=dynamic_shapes, dynamic_axes=dynamic_axes,
        input_names=input_names, output_names=output_names, registry=registry, **exporter_kwargs,
    )
    if functions:
        from onnx_custom.runtime import embed_functions

        proto = embed_functions(proto)  # type: ignore[operator]
    if f is not None:
        save_model(proto, f)
    if verify:
        if isinstance(model, torch.export.ExportedProgram):
            model = model.module()
        run_verify(model, args, proto, raise_on_mismatch=True, kernels=kernels)
    return proto

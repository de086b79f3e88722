"""``torch.onnx.is_in_onnx_export()`` true while we trace a model for ONNX,
as in torch's own export.

Models branch on it (mmdet/mmdeploy heads, ``torch.onnx.ops.symbolic`` guarded by it, shape
code that avoids data-dependent ops only when exporting). ``torch.onnx.export(dynamo=True)``
sets it around its own ``torch.export`` call; we call ``torch.export`` ourselves, so without
this the file would hold the eager branch while raw torch's holds the export branch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from onnx_custom.common.torch_onnx import dynamo_exporter

__all__ = ["onnx_exporting"]


@contextlib.contextmanager
def onnx_exporting() -> Iterator[None]:
    """Inside the block ``torch.onnx.is_in_onnx_export()`` is True; the previous value returns
    after it, also on an exception (torch's own flag setter resets to False, which would end an
    enclosing export's flag early)."""
    _flags = dynamo_exporter("_flags")  # the flag torch's dynamo exporter sets

    previous = _flags._is_onnx_exporting
    _flags._is_onnx_exporting = True
    try:
        yield
    finally:
        _flags._is_onnx_exporting = previous

"""Translations for the few ATen ops aot_autograd's decompositions emit that torchlib lacks.

Written with our own `Registry` (the same machinery as every user translation) and used only
where torchlib has no translation (`onnx_custom.compile.translate.scoped_translations`).
"""

from __future__ import annotations

import functools
from typing import Any

from onnx_custom.translate.registry import Registry

__all__ = ["symint_registry"]


@functools.cache
def symint_registry() -> Registry:
    registry = Registry()

    @registry.symbolic("aten::sym_numel", opset=13)
    def sym_numel(g: Any, self: Any) -> Any:
        """aten::sym_numel(Tensor self) -> SymInt: training batch norm's element count."""
        return g.op("Size", self)

    return registry

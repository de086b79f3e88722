"""ONNX math of the seed ops (declared in ``onnx_custom/ops/seed.yaml``).

Standard ops by default; the custom nodes ``onnx_custom::my_add`` / ``onnx_custom::multi_out`` are
the ``"custom"`` variant (``registry.with_variants("custom")``), with these same functions as their
function bodies (the node's constants ``alpha``, ``scale``, ``shift`` as attribute references).
"""

from __future__ import annotations

from typing import Any

from onnx_custom.ops.seed import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["alpha_a_plus_b", "registry", "scaled_and_shifted"]


# No dtype handling here: at float16/bfloat16 the export computes in float32 whatever ONNX
# Runtime's CPU provider lacks (onnx_custom.runtime.half_precision), for every translation.


def alpha_a_plus_b(g: Any, a: Any, b: Any, *, alpha: Any) -> Any:
    """alpha * a + b."""
    return g.op("Add", g.op("Mul", a, g.constant(alpha, like=a)), b)


def scaled_and_shifted(g: Any, x: Any, *, scale: Any, shift: Any) -> tuple[Any, Any]:
    """(x * scale, x + shift)."""
    return g.op("Mul", x, g.constant(scale, like=x)), g.op("Add", x, g.constant(shift, like=x))


registry = spec_translations(*SPECS)

"""ONNX math of the seed ops (declared in ``onnx_custom/ops/seed.yaml``).

Standard ops by default; the custom nodes ``onnx_custom::my_add`` / ``onnx_custom::multi_out`` are the
``"custom"`` variant (``registry.with_variants("custom")``), with these same functions as their
function bodies (the node's constants ``alpha``, ``scale``, ``shift`` as attribute references).
"""

from __future__ import annotations

from typing import Any

import torch

from onnx_custom.ops.seed import SPECS
from onnx_custom.spec import spec_translations

__all__ = ["alpha_a_plus_b", "registry", "scaled_and_shifted"]


# ONNX Runtime's CPU Mul/Add have no bfloat16 kernels: bf16 values are computed in float32 and
# cast back (one rounding, within bfloat16's tolerance of the eager op's).
_FLOAT, _BFLOAT16 = 1, 16  # onnx.TensorProto.FLOAT / BFLOAT16


def _widen(g: Any, *values: Any) -> tuple[bool, list[Any]]:
    if g.dtype(values[0]) != torch.bfloat16:
        return False, list(values)
    return True, [g.op("Cast", v, to=_FLOAT) for v in values]


def _narrow(g: Any, widened: bool, value: Any) -> Any:
    return g.op("Cast", value, to=_BFLOAT16) if widened else value


def alpha_a_plus_b(g: Any, a: Any, b: Any, *, alpha: Any) -> Any:
    """alpha * a + b."""
    widened, (a, b) = _widen(g, a, b)
    return _narrow(g, widened, g.op("Add", g.op("Mul", a, g.constant(alpha, like=a)), b))


def scaled_and_shifted(g: Any, x: Any, *, scale: Any, shift: Any) -> tuple[Any, Any]:
    """(x * scale, x + shift)."""
    widened, (x,) = _widen(g, x)
    scaled, shifted = g.op("Mul", x, g.constant(scale, like=x)), g.op("Add", x, g.constant(shift, like=x))
    return _narrow(g, widened, scaled), _narrow(g, widened, shifted)


registry = spec_translations(*SPECS)

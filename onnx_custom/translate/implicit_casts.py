"""Torch's implicit type promotion for the ONNX ops whose inputs share one element type.

Symbolics written for ``register_custom_op_symbolic`` rely on it: mmcv writes
``g.op("Mul", x, g.op("Constant", value_t=torch.tensor(2.0)))`` and the TorchScript exporter's
scalar type analysis retypes the constant to ``x``'s float16, or casts an int64 ``x`` to float.
The same symbolic must export the same way under the dynamo exporter, which has no such pass,
so ``g.op`` applies the rule itself for these ops, before the node's types are checked.

The rule is torch's: dimensioned operands promote as tensors (``torch.promote_types``); a 0-d
Constant counts like a Python scalar, changing the result only when its category (bool < integer
< floating) is higher, and then to the default dtype of that category (float32, int64). Unlike
the TorchScript pass, comparisons follow the same rule (``x_half > 0.5`` compares in float16,
as eager does; the pass compares in float32).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

__all__ = ["PROMOTING_OPS", "implicit_dtype", "promoted_inputs"]

# op type -> indices of the inputs promoted together (torch's scalar type analysis covers these)
PROMOTING_OPS: dict[str, slice] = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod"), slice(0, None)),
    **dict.fromkeys(("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"), slice(0, None)),
    "Where": slice(1, 3),  # the two values; the condition stays bool
}

_DEFAULT = {2: torch.float32, 1: torch.int64, 0: torch.bool}


def _category(dtype: torch.dtype) -> int:
    return 2 if dtype.is_floating_point or dtype.is_complex else 0 if dtype == torch.bool else 1


def implicit_dtype(operands: Sequence[tuple[torch.dtype, bool]]) -> torch.dtype:
    """The dtype torch computes ``operands`` in: ``(dtype, is a 0-d constant)`` each."""
    tensors = [d for d, scalar in operands if not scalar]
    scalars = [d for d, scalar in operands if scalar]
    if not tensors:
        return functools.reduce(torch.promote_types, scalars)
    result = functools.reduce(torch.promote_types, tensors)
    top = max((_category(d) for d in scalars), default=-1)
    return _DEFAULT[top] if top > _category(result) else result


def promoted_inputs(
    op_type: str, dtypes: Sequence[torch.dtype | None], scalars: Sequence[bool]
) -> tuple[torch.dtype, list[int]] | None:
    """``(dtype, indices to convert)`` when ``op_type`` promotes and its inputs' known dtypes
    differ; None when there is nothing to do (or a dtype is unknown: the type check decides)."""
    span = PROMOTING_OPS.get(op_type)
    if span is None:
        return None
    indices = list(range(len(dtypes)))[span]
    known = [(i, dtypes[i]) for i in indices]
    if len(known) < 2 or any(d is None for _, d in known) or len({d for _, d in known}) == 1:
        return None
    target = implicit_dtype([(d, scalars[i]) for i, d in known])  # type: ignore[misc]
    return target, [i for i, d in known if d != target]

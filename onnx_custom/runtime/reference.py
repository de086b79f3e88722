"""``onnx.reference.ReferenceEvaluator`` running custom nodes through the same Python kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from onnx_custom.runtime.host import _torch_wrapper
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.registry import KernelRegistry
from onnx_custom.runtime.session import ModelSource, parse_model, required_kernels
from onnx_custom.runtime.types import TensorInfo, concrete_shape

__all__ = ["make_op_run", "reference_evaluator", "run_kernel"]


def run_kernel(
    spec: KernelSpec, inputs: list[Any], attrs: dict[str, Any]
) -> tuple[np.ndarray, ...]:
    """Call ``spec``'s kernel eagerly on numpy arrays, the way the ORT host does."""
    kwargs = {**spec.attr_defaults(), **{k: v for k, v in attrs.items() if v is not None}}
    fn = _torch_wrapper(spec.fn, spec.out_mode) if spec.tensor_type == "torch" else spec.fn
    arrays = [None if x is None else np.ascontiguousarray(x) for x in inputs]
    if spec.out_mode:
        infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in arrays]
        outs = tuple(
            np.empty(
                concrete_shape(None if r is None else r.shape, f"{spec.name} output shape"),
                None if r is None else r.dtype,
            )
            for r in spec.infer(infos, kwargs)
        )
        res = fn(*arrays, out=outs, **kwargs)
        if res is None:
            return outs
    else:
        res = fn(*arrays, **kwargs)
    items = res if isinstance(res, (tuple, list)) else (res,)
    return tuple(np.asarray(r) for r in items)


def make_op_run(spec: KernelSpec) -> type[OpRun]:
    """An ``OpRun`` subclass named after the op type, for ``ReferenceEvaluator(new_ops=...)``."""
    names = {a.name for a in spec.attrs}

    def _run(self: OpRun, *inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        attrs = {k: v for k, v in kwargs.items() if k in names}
        for name in names - attrs.keys():
            if hasattr(self, name):
                attrs[name] = getattr(self, name)
        return run_kernel(spec, list(inputs), attrs)

    return type(spec.op_type, (OpRun,), {"op_domain": spec.domain, "_run": _run})


def reference_evaluator(
    model: ModelSource, kernels: KernelRegistry | None = None, **kwargs: Any
) -> ReferenceEvaluator:
    """A ReferenceEvaluator for ``model`` whose custom nodes call our kernels
    (extra kwargs pass through)."""
    proto = parse_model(model)
    specs = required_kernels(proto, kernels)
    new_ops = [make_op_run(s) for s in specs] + list(kwargs.pop("new_ops", None) or [])
    return ReferenceEvaluator(proto, new_ops=new_ops, **kwargs)

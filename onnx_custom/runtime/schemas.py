"""ONNX ``OpSchema`` registration for kernels,
so ``onnx.checker`` and shape inference accept them."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import onnx
from onnx import helper, numpy_helper
from onnx.defs import OpSchema

from onnx_custom.runtime import abi
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.registry import KernelRegistry, default_kernel_registry
from onnx_custom.runtime.types import TensorInfo

__all__ = ["make_schema", "register_schema", "register_schemas"]

_lock = threading.Lock()
_ours: dict[
    tuple[str, str], weakref.ref[KernelSpec]
] = {}  # (domain, op_type) -> spec we registered

_OPTION = {
    "required": OpSchema.FormalParameterOption.Single,
    "optional": OpSchema.FormalParameterOption.Optional,
    "variadic": OpSchema.FormalParameterOption.Variadic,
}
_ATTR_TYPE = {
    "int": OpSchema.AttrType.INT,
    "float": OpSchema.AttrType.FLOAT,
    "string": OpSchema.AttrType.STRING,
    "ints": OpSchema.AttrType.INTS,
    "floats": OpSchema.AttrType.FLOATS,
    "strings": OpSchema.AttrType.STRINGS,
    "tensor": OpSchema.AttrType.TENSOR,
}


def _onnx_type_str(dtype_name: str) -> str:
    elem = abi.NAME_TO_ELEM[dtype_name]
    name = onnx.TensorProto.DataType.Name(elem).lower()  # FLOAT -> float, DOUBLE -> double
    return f"tensor({name})"


def _info_from_type(tp: onnx.TypeProto | None) -> TensorInfo | None:
    if tp is None or not tp.HasField("tensor_type") or tp.tensor_type.elem_type == 0:
        return None
    tt = tp.tensor_type
    try:
        dt = abi.elem_to_numpy(tt.elem_type)
    except KeyError:
        return None
    if not tt.HasField("shape"):
        return TensorInfo(dt, None)
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(dt, tuple(dims))


def _type_from_info(info: TensorInfo) -> onnx.TypeProto:
    elem = abi.numpy_to_elem(info.dtype)
    shape = None if info.shape is None else list(info.shape)
    return helper.make_tensor_type_proto(elem, shape)


def _inference(spec: KernelSpec) -> Any:
    def infer(ctx: Any) -> None:
        inputs: list[TensorInfo | None] = []
        for i in range(ctx.get_num_inputs()):
            inputs.append(_info_from_type(ctx.get_input_type(i)) if ctx.has_input(i) else None)
        attrs: dict[str, Any] = {}
        for a in spec.attrs:
            proto = ctx.get_attribute(a.name)
            attrs[a.name] = helper.get_attribute_value(proto) if proto is not None else None
            if isinstance(attrs[a.name], bytes):
                attrs[a.name] = attrs[a.name].decode()
            elif (
                isinstance(attrs[a.name], list)
                and attrs[a.name]
                and isinstance(attrs[a.name][0], bytes)
            ):
                attrs[a.name] = [s.decode() for s in attrs[a.name]]
        outputs = spec.infer(inputs, attrs)
        for j, info in enumerate(outputs[: ctx.get_num_outputs()]):
            if info is not None:  # None: not even the dtype is known, claim nothing
                ctx.set_output_type(j, _type_from_info(info))

    return infer


def make_schema(spec: KernelSpec) -> OpSchema:
    """The ``OpSchema`` (since_version 1) describing ``spec``."""
    inputs: list[OpSchema.FormalParameter] = []
    outputs: list[OpSchema.FormalParameter] = []
    constraints: list[tuple[str, list[str], str]] = []
    for prefix, params, target in (("T", spec.inputs, inputs), ("O", spec.outputs, outputs)):
        for i, p in enumerate(params):
            tname = f"{prefix}{i}"
            target.append(
                OpSchema.FormalParameter(
                    p.name,
                    tname,
                    param_option=_OPTION[p.kind],
                    is_homogeneous=False,
                    min_arity=1,
                )
            )
            constraints.append((tname, [_onnx_type_str(d) for d in p.dtypes], ""))
    attributes = []
    for a in spec.attrs:
        if a.required:
            attributes.append(OpSchema.Attribute(a.name, _ATTR_TYPE[a.type], "", required=True))
        else:
            value = numpy_helper.from_array(a.default) if a.type == "tensor" else a.default
            default = helper.make_attribute(a.name, value, attr_type=abi.ATTR_PROTO_TYPES[a.type])
            attributes.append(OpSchema.Attribute(a.name, default, ""))
    schema = OpSchema(
        spec.op_type,
        spec.domain,
        1,
        spec.doc or f"Python kernel {spec.name} (onnx-custom).",
        inputs=inputs,
        outputs=outputs,
        type_constraints=constraints,
        attributes=attributes,
    )
    schema.set_type_and_shape_inference_function(_inference(spec))
    return schema


def register_schema(spec: KernelSpec) -> bool:
    """Register ``spec``'s schema with onnx (idempotent). Returns False if someone else owns it."""
    key = (spec.domain, spec.op_type)
    with _lock:
        ours = _ours.get(key)
        if ours is not None and ours() is spec:
            return True
        if ours is not None:
            onnx.defs.deregister_schema(spec.op_type, 1, spec.domain)  # our older version
        elif onnx.defs.has(spec.op_type, spec.domain):
            return False  # defined elsewhere (another library); leave it alone
        onnx.defs.register_schema(make_schema(spec))
        _ours[key] = weakref.ref(spec)  # onnx's registry holds the schema (and so the spec)
        return True


def register_schemas(kernels: KernelRegistry | None = None) -> list[str]:
    """Register schemas for every kernel of ``kernels`` (default registry); returns their names."""
    reg = default_kernel_registry() if kernels is None else kernels
    return [s.name for s in reg if register_schema(s)]

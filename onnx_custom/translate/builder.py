"""The exporter-neutral graph builder ``g`` that translations receive.

Subclasses adapt it to the TorchScript exporter (`_torchscript.py`) and to the torch.export-based
exporter (`_dynamo.py`). Everything a translation can observe (node types, attribute kinds,
output counts) is decided here, so both exporters emit the same ONNX nodes.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import numbers
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from onnx_custom.errors import OnnxCustomError, SymbolicError
from onnx_custom.translate.attributes import AttrValue, c_contiguous, convert_attribute
from onnx_custom.translate.implicit_casts import promoted_inputs
from onnx_custom.translate.names import parse_node_type
from onnx_custom.translate.opset_lift import meaning_changes
from onnx_custom.translate.opset_upgrade import attributes_moved_to_inputs, split_outputs_attribute
from onnx_custom.translate.standard_ops import check_standard_node
from onnx_custom.translate.torch_errors import translation_error
from onnx_custom.translate.torch_style import TORCH_STYLE_MARK
from onnx_custom.translate.type_check import NodeInput, check_node_types, half_precision_deferred

__all__ = [
    "GraphBuilder",
    "NodeRecord",
    "OutputMeta",
    "call_translation",
    "numpy_dtype",
    "onnx_dtype",
    "record_nodes",
    "register_value_check",
]

DimValue = int | str | None


# torch's g.op attribute suffix -> the attribute kinds it means (torch_style reads them).
_TORCH_SUFFIX_KINDS = {
    "i": {"int", "ints"},
    "is": {"ints"},
    "f": {"float", "floats"},
    "fs": {"floats"},
    "s": {"string", "strings"},
    "ss": {"strings"},
    "t": {"tensor"},
}


def _refuse_torch_suffixes(
    where: str, domain: str, op_type: str, attrs: Sequence[AttrValue]
) -> None:
    """A custom node's attribute written torch's way (``keep_topk_i=8``) in a translation whose
    ``g`` types attributes from values would carry the literal name ``keep_topk_i``: no kernel or
    TensorRT plugin reads it, and nothing fails until one runs. Standard nodes are checked
    against their schema; a custom node's registered schema that declares the name allows it."""
    for attr in attrs:
        base, sep, suffix = attr.name.rpartition("_")
        if not sep or not base or attr.kind.value not in _TORCH_SUFFIX_KINDS.get(suffix, ()):
            continue
        if (
            onnx.defs.has(op_type, domain)
            and attr.name in onnx.defs.get_schema(op_type, domain=domain).attributes
        ):
            continue
        raise SymbolicError(
            f"{where}attribute {attr.name!r} ends in torch's type suffix _{suffix}, but this g"
            " names attributes as written (their types come from the values), so the node would"
            f" carry an attribute named {attr.name!r} where torch's g.op writes {base!r}. Fix:"
            f" write {base}=..., or make the function torch-style (@symbolic_helper.parse_args, or"
            " every argument positional, registered with onnx_custom.register_custom_op_symbolic)"
            " so g.op reads suffixes as torch does. If the attribute really is named"
            f" {attr.name!r}, a registered schema for the node that declares it allows the name (an"
            " op spec, or onnx_custom.runtime.register_schemas(kernels) for the node's kernel)."
        )


@dataclasses.dataclass(frozen=True)
class OutputMeta:
    """What torch computed for one output of the op being translated (its fake kernel's answer).

    ``dtype`` is None when torch could not tell; ``shape`` is None when even the rank is unknown.
    A dim is an int (static), a str (a symbolic dim: the user's dim name such as ``"batch"``, or
    an expression of names such as ``"2*batch"``) or None (dynamic, with no name).
    """

    dtype: torch.dtype | None = None
    shape: tuple[DimValue, ...] | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """What a translation emitted: enough to compare the two exporters node for node."""

    target: str
    domain: str
    op_type: str
    attributes: tuple[tuple[str, str, Any], ...]
    inputs: int
    outputs: int


_recorder: contextvars.ContextVar[list[NodeRecord] | None] = contextvars.ContextVar(
    "onnx_custom_recorder", default=None
)


@contextlib.contextmanager
def record_nodes() -> Iterator[list[NodeRecord]]:
    """Collect a `NodeRecord` for every node any translation adds inside the block."""
    log: list[NodeRecord] = []
    token = _recorder.set(log)
    try:
        yield log
    finally:
        _recorder.reset(token)


def _freeze(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    return value


class GraphBuilder(abc.ABC):
    """``g.op(...)``, ``g.constant(...)``, ``g.opset``, ``g.exporter``, ``g.dtype(x)``,
    ``g.outputs``."""

    exporter: str = ""

    def __init__(
        self, opset: int, target: str, outputs: Sequence[OutputMeta] | None = None
    ) -> None:
        self.opset = opset
        self.target = target  # the torch op being translated, for error messages
        self.custom_domains: set[str] = set()
        # The op's arguments in schema order as (name, type text), set by the exporter adapters;
        # torch-style translations take them all positionally (`onnx_custom.translate.torch_style`).
        self.arguments: tuple[tuple[str, str], ...] | None = None
        self._nodes = 0  # nodes added so far, to name a node in errors
        # The opset a torch-style symbolic was registered for (it is written for that opset's
        # ops, as torch's register_custom_op_symbolic means it); standard nodes whose meaning
        # changed since are written to the older meaning (`opset_lift`). None: written for g.opset.
        self.symbolic_opset: int | None = None
        self._outputs: tuple[OutputMeta, ...] | None = None if outputs is None else tuple(outputs)

    @property
    def outputs(self) -> tuple[OutputMeta, ...]:
        """One `OutputMeta` per torch output (a ``Tensor[]`` return gives one per element):
        dtype and shape as torch computed them, symbolic dims by name. The same under both
        exporters."""
        if self._outputs is None:
            raise SymbolicError(
                f"{self.target}: torch's output types are not known here: g.outputs exists inside "
                "a translation called by an exporter, for an op whose fake kernel (or, under "
                "TorchScript, whose trace) tells them. Fix: add register_fake to the op, or pass "
                "output_types= to g.op."
            )
        return self._outputs

    def op(
        self,
        node_type: str,
        *inputs: Any,
        outputs: int = 1,
        output_types: Sequence[OutputMeta | torch.dtype] | None = None,
        **attributes: Any,
    ) -> Any:
        """Add one ONNX node. ``node_type`` is ``"OpType"`` or ``"domain::OpType"``.

        Returns one value, or a tuple of ``outputs`` values when ``outputs > 1``.

        A custom-domain node's outputs get the dtypes of ``g.outputs`` when it has as many
        outputs as the torch op, and torch's shapes too once the translation returns them (a
        node inside the translation may have other shapes); to say more, pass
        ``output_types``: one `OutputMeta` (or just a torch dtype) per output.
        """
        domain, op_type = parse_node_type(node_type)
        if not isinstance(outputs, int) or isinstance(outputs, bool) or outputs < 1:
            raise SymbolicError(
                f"{self.target}: outputs= must be a positive int; received {outputs!r}. Fix: pass"
                " outputs=1 or more."
            )
        written = self.symbolic_opset
        if not domain and written is not None and written < self.opset:
            changes = meaning_changes(op_type, written, self.opset)
            if changes:
                self.symbolic_opset = None  # the rewritten nodes are written for self.opset
                try:
                    return self._lifted(
                        op_type, written, changes, list(inputs), dict(attributes), outputs
                    )
                finally:
                    self.symbolic_opset = written
        types = self._output_types(node_type, outputs, output_types, custom=bool(domain))
        where = f"{self.target}: g.op({node_type!r}): "
        attrs = [
            convert_attribute(name, value, where=where)
            for name, value in attributes.items()
            if value is not None
        ]
        if domain:
            _refuse_torch_suffixes(where, domain, op_type, attrs)
        converted = [self._input(domain, op_type, i, value) for i, value in enumerate(inputs)]
        if not domain:
            attrs = self._upgrade_attributes(where, op_type, converted, attrs, outputs)
        while converted and converted[-1] is None:  # trailing absent optional inputs are dropped
            converted.pop()
        if domain:
            self._nodes += 1
            self._check_types(domain, op_type, converted)
        else:
            converted, attrs = self._checked_standard(where, op_type, converted, attrs, outputs)
        if domain:
            self.custom_domains.add(domain)
        log = _recorder.get()
        if log is not None:
            frozen = tuple((a.name, a.kind.value, _freeze(a.value)) for a in attrs)
            log.append(NodeRecord(self.target, domain, op_type, frozen, len(converted), outputs))
        result = self._add_node(domain, op_type, converted, attrs, outputs)
        if types is not None:
            torch_types = types is self._outputs
            for index, (value, meta) in enumerate(zip(result, types, strict=True)):
                self._set_type(value, meta, index if torch_types else None)
        return result[0] if outputs == 1 else tuple(result)

    def _lifted(
        self,
        op_type: str,
        written: int,
        changes: tuple[int, ...],
        inputs: list[Any],
        attributes: dict[str, Any],
        outputs: int,
    ) -> Any:
        """``g.op(op_type, ...)`` of a symbolic written for opset ``written``, as it meant there
        (`onnx_custom.translate.opset_lift`); ``changes``: the versions since that changed it."""
        where = f"{self.target}: g.op({op_type!r}) in a symbolic registered for opset {written}"
        if op_type == "RoiAlign":
            attributes.setdefault("coordinate_transformation_mode", "output_half_pixel")
        elif op_type == "Resize" and len(inputs) == 2:  # opset 10's (X, scales)
            mode = attributes.get("mode", "nearest")
            attributes.setdefault("coordinate_transformation_mode", "asymmetric")
            if mode == "nearest":
                attributes.setdefault("nearest_mode", "floor")
            inputs = [inputs[0], self.constant(np.zeros(0, np.float32)), inputs[1]]
        elif op_type in ("Softmax", "LogSoftmax", "Hardmax"):
            axis = attributes.pop("axis", 1)
            shape = self.shape(inputs[0]) if inputs and self.is_value(inputs[0]) else None
            last = axis == -1 or (shape is not None and axis % max(len(shape), 1) == len(shape) - 1)
            if not last:  # the older definition: normalise the input flattened to 2-D at axis
                flat = self.op("Flatten", inputs[0], axis=axis)
                result = self.op(op_type, flat, axis=1, **attributes)
                return self.op("Reshape", result, self.op("Shape", inputs[0]))
            attributes["axis"] = axis
        elif op_type == "GridSample":
            renamed = {"bilinear": "linear", "bicubic": "cubic"}
            mode = attributes.get("mode")
            if isinstance(mode, bytes):
                mode = mode.decode()
            if mode in renamed:
                attributes["mode"] = renamed[mode]
        elif op_type == "GroupNormalization":
            raise SymbolicError(
                f"{where} is exported at opset {self.opset}, where GroupNormalization (changed at"
                f" opset {changes[-1]}) takes scale and bias per channel; at opset {written} they"
                " are per group, so the same node would compute something else. Fix: export at"
                f" opset {written}..{changes[-1] - 1}, or register a symbolic for opset"
                f" {changes[-1]} that repeats each group's scale and bias for its channels"
                " (or writes InstanceNormalization on the input reshaped to groups)."
            )
        return self.op(op_type, *inputs, outputs=outputs, **attributes)

    def _check_types(self, domain: str, op_type: str, inputs: list[Any]) -> None:
        check_node_types(
            self.target,
            f"the translation's node {self._nodes},",
            domain,
            op_type,
            self.opset,
            [None if v is None else NodeInput(self.dtype(v), self._is_constant(v)) for v in inputs],
        )

    def _checked_standard(
        self, where: str, op_type: str, inputs: list[Any], attrs: list[AttrValue], outputs: int
    ) -> tuple[list[Any], list[AttrValue]]:
        """A standard node's inputs promoted (`_promote`) and checked against its schema
        (`check_standard_node`, `check_node_types`). A signature whose checks passed with nothing
        to change is remembered (`_PASSED`) and skips them next time: the verdicts are functions
        of the key alone (the ONNX schemas are fixed in a process; the half-precision deferral is
        part of the key). Failures are never remembered: a bad node raises every time."""
        # A function body's attribute references (FunctionBuilder) are present at run time.
        referenced = tuple(ref.name for ref in getattr(self, "_pending_refs", ()))
        key = self._signature(op_type, inputs, attrs, outputs, referenced)
        if key is not None and key in _PASSED:
            self._nodes += 1
            return inputs, attrs
        promoted = self._promote(op_type, inputs)
        checked = check_standard_node(
            where, op_type, self.opset, len(promoted), outputs, attrs, list(referenced)
        )
        self._nodes += 1
        self._check_types("", op_type, promoted)
        if (
            key is not None
            and promoted is inputs
            and len(checked) == len(attrs)
            and all(a is b for a, b in zip(checked, attrs, strict=True))
        ):
            if len(_PASSED) >= _PASSED_LIMIT:
                _PASSED.clear()
            _PASSED.add(key)
        return promoted, checked

    def _signature(
        self,
        op_type: str,
        inputs: list[Any],
        attrs: list[AttrValue],
        outputs: int,
        referenced: tuple[str, ...],
    ) -> Hashable | None:
        """Everything the standard-node checks read: per input its dtype, whether it is a Constant
        and a 0-d one (torch's promotion treats those as Python scalars); the attributes' names
        and kinds (values matter only where a kind is widened, which is never remembered)."""
        sig: list[tuple[torch.dtype, bool, bool] | None] = []
        for value in inputs:
            if value is None:
                sig.append(None)
                continue
            dtype = self.dtype(value)
            if dtype is None:
                return None  # unknown dtypes are not checked: nothing worth remembering
            constant = self._is_constant(value)
            sig.append((dtype, constant, constant and self.shape(value) == ()))
        kinds = tuple((a.name, a.kind) for a in attrs)
        return (
            type(self),
            op_type,
            self.opset,
            outputs,
            kinds,
            referenced,
            tuple(sig),
            half_precision_deferred(),
        )

    def _promote(self, op_type: str, inputs: list[Any]) -> list[Any]:
        """Inputs of an op that promotes types (Add, Mul, Where, ...) converted to the dtype torch
        computes them in, as the TorchScript exporter's scalar type analysis does for symbolics
        written for it (`implicit_casts`): a Constant is made again in that dtype, anything else
        is cast."""
        dtypes = [None if v is None else self.dtype(v) for v in inputs]
        scalars = [v is not None and self._is_constant(v) and self.shape(v) == () for v in inputs]
        plan = promoted_inputs(op_type, dtypes, scalars)
        if plan is None:
            return inputs
        target, indices = plan
        converted = list(inputs)
        for index in indices:
            value = self.constant_value(inputs[index]) if self._is_constant(inputs[index]) else None
            if value is not None:
                converted[index] = self.constant(value, dtype=target)
            else:
                converted[index] = self.op("Cast", inputs[index], to=onnx_dtype(target))
        return converted

    def _upgrade_attributes(
        self, where: str, op_type: str, inputs: list[Any], attrs: list[AttrValue], outputs: int
    ) -> list[AttrValue]:
        """Attributes this opset takes as inputs (a symbolic written for an older opset) become
        constant inputs, in ``inputs`` in place; returns the attributes left (`opset_upgrade`)."""
        kept, moved = attributes_moved_to_inputs(op_type, self.opset, attrs)
        for move in moved:
            if move.index < len(inputs) and inputs[move.index] is not None:
                raise SymbolicError(
                    f"{where}{op_type} (opset {self.opset}) takes {move.attribute.name!r} as input"
                    f" {move.index}; received it both as that input and as an attribute. Fix: pass"
                    " it once (as the input from opset 13/18 on)."
                )
            if move.dtype is not None:
                value = self.constant(move.value, dtype=move.dtype)
            elif inputs and inputs[0] is not None and self.dtype(inputs[0]) is not None:
                value = self.constant(move.value, like=inputs[0])
            else:
                raise SymbolicError(
                    f"{where}{op_type} (opset {self.opset}) takes {move.attribute.name!r} as an"
                    " input typed like input 0, whose dtype this export does not know. Fix: pass"
                    f" it as input {move.index}: g.constant(value, dtype=...)."
                )
            inputs.extend([None] * (move.index + 1 - len(inputs)))
            inputs[move.index] = value
        extra = split_outputs_attribute(
            op_type, self.opset, sum(v is not None for v in inputs), kept, outputs
        )
        return kept if extra is None else [*kept, extra]

    def _output_types(
        self,
        node_type: str,
        outputs: int,
        given: Sequence[OutputMeta | torch.dtype] | None,
        *,
        custom: bool,
    ) -> tuple[OutputMeta, ...] | None:
        if given is None:
            # A custom node's outputs are invisible to ONNX shape inference. Whether it stands
            # for the whole op is known only from what the translation returns (`finish` gives
            # a returned custom node torch's exact types); a node inside (mmdeploy's
            # Reshape -> custom normalisation -> Reshape back) may have any shape. So here it
            # gets torch's dtypes only (same output count), its shapes left unknown.
            if custom and self._outputs is not None and outputs == len(self._outputs):
                return tuple(OutputMeta(meta.dtype, None) for meta in self._outputs)
            return None
        if isinstance(given, (OutputMeta, torch.dtype)) or len(given) != outputs:
            raise SymbolicError(
                f"{self.target}: {node_type} has {outputs} output(s); output_types= must list one "
                f"OutputMeta (or torch dtype) per output, got {given!r}."
            )
        metas = []
        for item in given:
            if isinstance(item, torch.dtype):
                item = OutputMeta(item, None)
            if not isinstance(item, OutputMeta):
                raise SymbolicError(
                    f"{self.target}: output_types= entries must be"
                    f" onnx_custom.translate.builder.OutputMeta or torch dtypes, got {item!r}"
                    f" ({type(item).__name__})."
                )
            metas.append(item)
        return tuple(metas)

    def finish(self, result: Any) -> list[Any]:
        """The translation's return value as one graph value per entry of `outputs`, checked
        against what torch computed (a claimed dtype or static shape torch contradicts raises)."""
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        if self._outputs is None:
            return values
        if len(values) != len(self._outputs):
            raise SymbolicError(
                f"The translation for {self.target} returned {len(values)} output(s) but the torch"
                f" op has {len(self._outputs)} (per torch's fake kernel; a Tensor[] return counts"
                " each element). Return one value per torch output (a tuple for several)."
            )
        for index, (value, meta) in enumerate(zip(values, self._outputs, strict=True)):
            if not self.is_value(value):
                raise SymbolicError(
                    f"The translation for {self.target} returned {type(value).__name__} ({value!r})"
                    f" as output {index}; expected a graph value from g.op(...) or an input."
                )
            self._check_claim(index, value, meta)
        return values

    def _check_claim(self, index: int, value: Any, meta: OutputMeta) -> None:
        dtype, shape = self.dtype(value), self.shape(value)
        problem = ""
        if dtype is not None and meta.dtype is not None and dtype != meta.dtype:
            problem = f"dtype {dtype}, but torch computes {meta.dtype}"
        elif shape is not None and meta.shape is not None:
            if len(shape) != len(meta.shape):
                problem = (
                    f"rank {len(shape)} (shape {list(shape)}), but torch computes rank"
                    f" {len(meta.shape)} ({list(meta.shape)})"
                )
            else:
                clash = [
                    i
                    for i, (a, b) in enumerate(zip(shape, meta.shape, strict=True))
                    if isinstance(a, int) and isinstance(b, int) and a != b
                ]
                if clash:
                    problem = (
                        f"shape {list(shape)}, but torch computes {list(meta.shape)} (axis"
                        f" {clash[0]})"
                    )
        if problem:
            raise SymbolicError(
                f"The translation for {self.target} returns output {index} with {problem} (its fake"
                " kernel). Fix the translation (e.g. a Cast, or output_types= on a custom node),"
                " or the op's fake kernel (register_fake, or an OpSpec's shape= meta function) if"
                " that is what is wrong."
            )

    def _input(self, domain: str, op_type: str, index: int, value: Any) -> Any:
        if value is None or self.is_value(value):
            return value
        if isinstance(value, (np.ndarray, torch.Tensor, np.generic)):
            return self.constant(value)
        kind = type(value).__name__
        hint = (
            " Use g.constant(value, like=x) so the dtype is explicit."
            if isinstance(value, numbers.Number)
            else ""
        )
        raise SymbolicError(
            f"{self.target}: input {index} of {domain + '::' if domain else ''}{op_type} is a"
            f" {kind} ({value!r}); expected a graph value, a numpy array or a torch tensor.{hint}"
        )

    def constant(self, value: Any, *, dtype: Any = None, like: Any = None) -> Any:
        """A Constant node. ``dtype`` (torch/numpy dtype) or ``like``
        (a graph value) sets its type."""
        if like is not None:
            dtype = self.dtype(like)
            if dtype is None:
                raise SymbolicError(
                    f"{self.target}: g.constant(like=...) got a value with unknown dtype; pass"
                    " dtype= explicitly."
                )
        if isinstance(value, torch.Tensor):
            array = value.detach().cpu().numpy()
        else:
            self._check_constant_items(value)
            array = np.asarray(value)
        if dtype is not None:
            array = array.astype(numpy_dtype(dtype))
        elif array.dtype == np.float64 and not isinstance(
            value, (np.ndarray, torch.Tensor, np.generic)
        ):
            array = array.astype(np.float32)  # a bare Python float means float32, as in torch
        array = c_contiguous(array)  # keeps a 0-d constant 0-d
        self._nodes += 1
        self._record_constant(array)
        return self._constant(array)

    def _check_constant_items(self, value: Any) -> None:
        """`SymbolicError` for a list holding a graph value: a ``SymInt[]`` argument traced from a
        dynamic dim (``[y.shape[0], 4]``) reaches the translation with the size as a graph value,
        and numpy would make an object array that fails deep inside the exporter's passes."""
        if not isinstance(value, (list, tuple)):
            return
        for index, item in enumerate(value):
            if isinstance(item, (list, tuple)):
                self._check_constant_items(item)
            elif not isinstance(item, (numbers.Number, np.generic)) and self.is_value(item):
                raise SymbolicError(
                    f"{self.target}: g.constant got a graph value at index {index} of a list;"
                    " expected numbers only. A size traced from a dynamic dim (an int[]/SymInt[]"
                    " argument such as [y.shape[0], 4]) arrives as a 0-d int64 graph value. Fix:"
                    " build the list in the graph, e.g. g.op('Concat', *[g.op('Reshape', v,"
                    " g.constant([1])) if g.is_value(v) else g.constant([v]) for v in size],"
                    " axis=0)."
                )

    def output_users(self, index: int) -> list[str] | None:
        """What in the model uses torch output ``index`` of the op (names of the consuming
        nodes; [] when nothing does), or None when the exporter cannot tell."""
        return None

    def unused_output(self, index: int) -> Any:
        """A stand-in for output ``index`` that the translation left None (torch's ``return
        value, None``) and the model never uses: zeros of torch's dtype and rank, which the
        exporter drops with the rest of the unused graph."""
        meta = self._outputs[index] if self._outputs is not None else OutputMeta()
        shape = [d if isinstance(d, int) else 1 for d in meta.shape or ()]
        return self.constant(np.zeros(shape, numpy_dtype(meta.dtype or torch.float32)))

    @abc.abstractmethod
    def is_value(self, value: Any) -> bool: ...

    def _is_constant(self, value: Any) -> bool:
        """Whether a graph value is a Constant node's output (error messages suggest typing it)."""
        return False

    def constant_value(self, value: Any) -> np.ndarray | None:
        """The contents of a graph value the export already knows (a Constant node's output, or an
        initializer the exporter has made from a lifted constant or buffer), else None (a graph
        input or a computed value). For translations that check values at export time."""
        return None

    @abc.abstractmethod
    def dtype(self, value: Any) -> torch.dtype | None:
        """The torch dtype of a graph value, or None when the exporter does not know it."""

    @abc.abstractmethod
    def shape(self, value: Any) -> tuple[int | None, ...] | None:
        """The shape of a graph value (None for a dynamic dim), or None when the rank is unknown."""

    @abc.abstractmethod
    def _add_node(
        self, domain: str, op_type: str, inputs: Sequence[Any], attrs: list[AttrValue], outputs: int
    ) -> list[Any]: ...

    @abc.abstractmethod
    def _constant(self, array: np.ndarray) -> Any: ...

    @abc.abstractmethod
    def _set_type(self, value: Any, meta: OutputMeta, index: int | None = None) -> None:
        """Give a node output the dtype/shape of ``meta`` (symbolic dims by name); ``index`` says
        ``meta`` is ``outputs[index]``, whose symbols the exporter knows exactly."""

    def _record_constant(self, array: np.ndarray) -> None:
        log = _recorder.get()
        if log is not None:
            log.append(
                NodeRecord(
                    self.target, "", "Constant", (("value", "tensor", _freeze(array)),), 0, 1
                )
            )


_NUMPY_DTYPES: dict[
    torch.dtype, np.dtype
] = {}  # torch dtype -> numpy's (one 0-d tensor each, once)


def numpy_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        known = _NUMPY_DTYPES.get(dtype)
        if known is None:
            known = _NUMPY_DTYPES[dtype] = _numpy_dtype_of(dtype)
        return known
    return np.dtype(dtype)


def _numpy_dtype_of(dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return torch.empty((), dtype=dtype).numpy().dtype


def onnx_dtype(dtype: Any) -> int:
    """The ``TensorProto`` element type of a torch or numpy dtype."""
    return onnx.helper.np_dtype_to_tensor_dtype(numpy_dtype(dtype))


# Signatures of standard nodes whose checks passed with nothing to change (`_checked_standard`);
# cleared when full (a model has a few dozen signatures).
_PASSED: set[Hashable] = set()
_PASSED_LIMIT = 4096


# Target key ("onnx_custom::multi_scale_deformable_attn") -> checks run before any of its
# translations, whichever variant: fn(g, *inputs, **attrs) reads what the export knows (constant
# values through g.constant_value) and raises the op's typed error before anything is written.
_VALUE_CHECKS: dict[str, Callable[..., None]] = {}


def register_value_check(target: str, fn: Callable[..., None]) -> None:
    """Run ``fn(g, *inputs, **attrs)`` before every translation of ``target`` (one per target; a
    family module registers its own, so re-registering replaces it)."""
    _VALUE_CHECKS[target] = fn


def call_translation(
    entry: Any,
    g: GraphBuilder,
    inputs: Sequence[Any],
    attrs: dict[str, Any],
    *,
    outputs: int | None = None,
    schema_args: Sequence[str] | None = None,
) -> tuple[Any, ...]:
    """Run a `SymbolicEntry` for an exporter adapter: its result checked (`SymbolicEntry.call`:
    None, a number, an eager tensor or a wrong count -> `SymbolicError` naming the op) and any
    other exception it raises turned into a `SymbolicError` naming the translation and the line
    (``schema_args``: the op's argument names, listed when the call itself does not fit). A value
    check registered for the target (`register_value_check`) runs first."""
    check = _VALUE_CHECKS.get(str(getattr(getattr(entry, "target", None), "key", "")))
    if check is not None:
        check(g, *inputs, **attrs)
    if getattr(getattr(entry, "fn", None), TORCH_STYLE_MARK, None) is not None or (
        getattr(getattr(entry, "target", None), "function", None) is not None
    ):  # written for its registered opset, as torch means it (`GraphBuilder.symbolic_opset`)
        g.symbolic_opset = getattr(entry, "opset", None)
    try:
        return tuple(entry.call(g, inputs, attrs, outputs=outputs))
    except OnnxCustomError:
        raise
    except Exception as exc:
        raise translation_error(entry, exc, len(inputs), list(attrs), schema_args) from exc

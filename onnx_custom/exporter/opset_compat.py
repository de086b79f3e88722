"""Lower a dynamo-exported model (built at opset 18) to an older default-domain opset.

torch's dynamo exporter builds at opset 18 and asks onnx's version converter to go lower; that
converter lacks adapters for many ops whose newer versions only *added types* (Relu-14, Add-14,
...), and on failure torch silently keeps opset 18. We relabel instead, but only when every node
whose schema changed between the target and the built opset is on a list of changes known to be
type-only (or to add an attribute the node does not use); anything else raises, naming the ops.
The result is then checked with onnx's full checker at the target opset.
"""

from __future__ import annotations

import onnx
import onnx.defs

from onnx_custom.common.onnx_utils import iter_nodes
from onnx_custom.errors import OnnxCustomError

__all__ = ["lower_default_opset"]

# (op_type, since_version) whose change from the previous version only widened type support.
_TYPE_ONLY = {
    ("Abs", 13),
    ("Add", 13),
    ("Add", 14),
    ("Sub", 13),
    ("Sub", 14),
    ("Mul", 13),
    ("Mul", 14),
    ("Div", 13),
    ("Div", 14),
    ("Relu", 13),
    ("Relu", 14),
    ("Sigmoid", 13),
    ("Tanh", 13),
    ("Exp", 13),
    ("Log", 13),
    ("Sqrt", 13),
    ("Neg", 13),
    ("Reciprocal", 13),
    ("Floor", 13),
    ("Ceil", 13),
    ("Erf", 13),
    ("Pow", 13),
    ("Pow", 15),
    ("Identity", 13),
    ("Identity", 14),
    ("Identity", 16),
    ("Identity", 19),
    ("Identity", 21),
    ("Constant", 13),
    ("Constant", 19),
    ("Constant", 21),
    ("Cast", 13),
    ("Transpose", 13),
    ("Transpose", 21),
    ("Concat", 13),
    ("Gather", 13),
    ("GatherElements", 13),
    ("GatherND", 13),
    ("MatMul", 13),
    ("Gemm", 13),
    ("Flatten", 13),
    ("Flatten", 21),
    ("Max", 12),
    ("Max", 13),
    ("Min", 12),
    ("Min", 13),
    ("Sum", 13),
    ("Expand", 13),
    ("Tile", 13),
    ("Clip", 12),
    ("Clip", 13),
    ("Less", 13),
    ("Greater", 13),
    ("Equal", 13),
    ("Equal", 19),
    ("Where", 16),
    ("Not", 1),
    ("And", 7),
    ("Or", 7),
    ("LessOrEqual", 16),
    ("GreaterOrEqual", 16),
    ("Slice", 13),
    ("Size", 13),
    ("Size", 19),
    ("Sign", 13),
    ("LeakyRelu", 16),
    ("PRelu", 16),
    ("Range", 11),
    ("Shape", 13),
    ("BatchNormalization", 15),
    ("MaxPool", 12),
    ("Softplus", 22),
    ("ConstantOfShape", 20),
    ("Reshape", 13),
    ("Asinh", 22),
    ("Sin", 22),
    ("Cos", 22),
    ("Pad", 13),
    ("Pad", 21),
}

# Versions that added an attribute; fine as long as the node does not set it.
_NEW_ATTRIBUTE = {
    ("Reshape", 14): "allowzero",
    ("Cast", 19): "saturate",
    ("Shape", 15): "start",
    ("AveragePool", 19): "dilations",
    ("ScatterND", 16): "reduction",
    ("ScatterND", 18): "reduction",
    ("ScatterElements", 16): "reduction",
    ("ScatterElements", 18): "reduction",
    ("BatchNormalization", 14): "training_mode",
    ("Split", 18): "num_outputs",
}


# Versions that added an optional input at this index; fine as long as the node leaves it empty.
_NEW_INPUT = {("Pad", 18): 3}  # axes

# Versions that added a value to an attribute; fine as long as the node does not use that value.
_NEW_VALUE = {("Pad", 19): ("mode", b"wrap")}


def _allowed(node: onnx.NodeProto, version: int, attrs: dict[str, onnx.AttributeProto]) -> bool:
    """Whether ``node`` means the same before and after ``node.op_type``'s change at ``version``."""
    key = (node.op_type, version)
    if key in _TYPE_ONLY:
        return True
    added = _NEW_ATTRIBUTE.get(key)
    if added is not None:
        return added not in attrs and not (added == "start" and "end" in attrs)
    index = _NEW_INPUT.get(key)
    if index is not None:
        return len(node.input) <= index or not node.input[index]
    value = _NEW_VALUE.get(key)
    if value is not None:
        name, new = value
        return name not in attrs or attrs[name].s != new
    return False


def _since(op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


def _blockers(nodes: list[onnx.NodeProto], target: int, built: int) -> list[str]:
    problems = []
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        old, new = _since(node.op_type, target), _since(node.op_type, built)
        if old is None or new is None:
            problems.append(f"{node.op_type} (does not exist at opset {target})")
            continue
        attrs = {a.name: a for a in node.attribute}
        versions = [v for v in range(old + 1, new + 1) if _since(node.op_type, v) == v]
        problems += [
            f"{node.op_type} (changed at opset {v})"
            for v in versions
            if not _allowed(node, v, attrs)
        ]
    return problems


def lower_default_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Relabel the default-domain opset of ``model`` to ``target`` when that is provably safe."""
    built = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), target)
    if built <= target:
        return model
    problems = sorted(set(_blockers(list(iter_nodes(model)), target, built)))
    if problems:
        raise OnnxCustomError(
            f"The dynamo exporter builds at opset {built} and this model cannot be lowered to opset"
            f" {target}: {', '.join(problems)} changed meaning in between. Fix: export with"
            f" exporter='torchscript' (opsets 7..20), or use opset >= {built}."
        )
    for entry in list(model.opset_import) + [o for f in model.functions for o in f.opset_import]:
        if entry.domain in ("", "ai.onnx"):
            entry.version = target
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        raise OnnxCustomError(
            f"Lowering the dynamo export from opset {built} to {target} produced an invalid model:"
            f" {exc}"
        ) from exc
    return model

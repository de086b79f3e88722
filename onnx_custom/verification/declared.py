"""Do the types a file declares agree with what ONNX Runtime returns?

Checked values: every graph output, and every custom-node output the file gives a type
(``value_info``): those are the risky ones, typed by our translations rather than by ONNX's own
shape inference (the TorchScript exporter once baked export-time shapes into them). A declared
static dim must equal the runtime size; a ``dim_param`` named like an input dim (or an arithmetic
expression of input dims, as the dynamo exporter writes ``2*s77``) must equal its value; any other
``dim_param`` must have one value across the checked values of a run; element type and rank must
match.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from onnx_custom.verification.runner import STANDARD_DOMAINS, graph_inputs

__all__ = ["DeclaredTypes", "TypeMismatch", "evaluate_dim"]


@dataclasses.dataclass(frozen=True)
class TypeMismatch:
    """One value whose declared type disagrees with the runtime value of one trial."""

    trial: int
    value: str
    producer: str  # "onnx_custom::MultiOut3 node '/MultiOut3' output 1"
    declared: str
    actual: str
    problem: str
    backend: str = "onnxruntime"  # verify's backend that returned the value

    def describe(self) -> str:
        returned = "ONNX Runtime" if self.backend == "onnxruntime" else f"backend {self.backend}"
        return (
            f"trial {self.trial}: {self.value!r} ({self.producer}) is declared {self.declared} but"
            f" {returned} returned {self.actual}: {self.problem}"
        )


def _dtype_name(elem_type: int) -> str:
    return onnx.helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()


def _elem_type(array: np.ndarray) -> int:
    if array.dtype.name == "bfloat16":
        return onnx.TensorProto.BFLOAT16
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
    except Exception:
        return 0


def _dims(info: onnx.ValueInfoProto) -> list[int | str | None] | None:
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in tensor_type.shape.dim
    ]


def _describe(elem_type: int, dims: list[int | str | None] | None) -> str:
    dtype = _dtype_name(elem_type) if elem_type else "?"
    return f"{dtype}{dims if dims is not None else '[rank unknown]'}".replace("None", "?")


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CALLS: dict[str, Any] = {"max": max, "Max": max, "min": min, "Min": min}


def evaluate_dim(expression: str, env: Mapping[str, int]) -> int | None:
    """``"2*s77"`` with ``{"s77": 5}`` -> 10; None when it uses anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](ev(node.left), ev(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS
            and not node.keywords
        ):
            return int(_CALLS[node.func.id](*(ev(a) for a in node.args)))
        raise ValueError(expression)

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError):
        return None


class DeclaredTypes:
    """The declared types of ``proto``'s graph outputs and typed custom-node outputs.

    ``extra_outputs``: custom-node outputs that are not graph outputs; `augmented` exposes them
    as extra graph outputs (for one run per shape, apart from the session that is compared).
    """

    def __init__(self, proto: onnx.ModelProto) -> None:
        graph = proto.graph
        producers: dict[str, str] = {}
        custom: list[str] = []
        for node in graph.node:
            kind = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
            for i, out in enumerate(node.output):
                producers[out] = f"{kind} node {node.name or '<unnamed>'!r} output {i}"
                if out and node.domain not in STANDARD_DOMAINS:
                    custom.append(out)
        outputs = {o.name: o for o in graph.output}
        typed = {v.name: v for v in graph.value_info}
        self.producers = producers
        self.declared: dict[str, onnx.ValueInfoProto] = dict(outputs)
        self.extra_outputs = [
            name
            for name in custom
            if name not in outputs and name in typed and typed[name].type.HasField("tensor_type")
        ]
        for name in self.extra_outputs:
            self.declared[name] = typed[name]
        self._proto = proto
        self._input_dims = {i.name: _dims(i) for i in graph_inputs(proto)}

    def augmented(self) -> onnx.ModelProto:
        """``proto`` with `extra_outputs` appended to the graph outputs."""
        extended = onnx.ModelProto()
        extended.CopyFrom(self._proto)
        for name in self.extra_outputs:
            extended.graph.output.append(self.declared[name])
        return extended

    def _environment(self, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        env: dict[str, int] = {}
        for name, dims in self._input_dims.items():
            shape = input_shapes.get(name)
            if dims is None or shape is None or len(shape) != len(dims):
                continue
            for dim, size in zip(dims, shape, strict=True):
                if isinstance(dim, str):
                    env.setdefault(dim, size)
        return env

    def check(
        self,
        trial: int,
        values: Mapping[str, np.ndarray],
        input_shapes: Mapping[str, tuple[int, ...]],
    ) -> list[TypeMismatch]:
        """Mismatches between the declared types and ``values`` (ORT's outputs by name)."""
        env = self._environment(input_shapes)
        seen: dict[str, tuple[int, str]] = {}
        found = []
        for name, info in self.declared.items():
            if name not in values:
                continue
            array = values[name]
            elem_type = info.type.tensor_type.elem_type
            dims = _dims(info)
            actual_type = _dtype_name(_elem_type(array)) if _elem_type(array) else array.dtype
            actual = f"{actual_type}{list(array.shape)}"
            problem = self._problem(elem_type, dims, array, env, seen, name)
            if problem:
                found.append(
                    TypeMismatch(
                        trial,
                        name,
                        self.producers.get(name, "graph input"),
                        _describe(elem_type, dims),
                        actual,
                        problem,
                    )
                )
        return found

    @staticmethod
    def _problem(
        elem_type: int,
        dims: list[int | str | None] | None,
        array: np.ndarray,
        env: Mapping[str, int],
        seen: dict[str, tuple[int, str]],
        name: str,
    ) -> str:
        actual_type = _elem_type(array)
        if elem_type and actual_type and elem_type != actual_type:
            return f"element type {_dtype_name(elem_type)} vs {_dtype_name(actual_type)}"
        if dims is None:
            return ""
        if len(dims) != array.ndim:
            return f"rank {len(dims)} vs {array.ndim}"
        problems = []
        for axis, (dim, size) in enumerate(zip(dims, array.shape, strict=True)):
            if isinstance(dim, int) and dim != size:
                problems.append(f"dim {axis} is static {dim} in the file but {size} at run time")
            elif isinstance(dim, str):
                expected = evaluate_dim(dim, env)
                if expected is not None and expected != size:
                    problems.append(
                        f"dim {axis} is {dim!r} = {expected} from the inputs but {size} at run time"
                    )
                elif expected is None:
                    other = seen.setdefault(dim, (size, f"{name}[{axis}]"))
                    if other[0] != size:
                        problems.append(
                            f"dim {axis} is {dim!r}, which is {other[0]} at {other[1]}, but {size}"
                            " here"
                        )
        return "; ".join(problems)

"""The parts of an op spec: `Input`, `Output`, `Attribute`, the markers (`NO_DEFAULT`, `EAGER`,
`NODE`) and the checks of single fields (names, dtypes, code references, defaults, translation
tables, devices) that `onnx_custom.spec.spec.OpSpec` runs on every field when a spec is made.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from onnx_custom.errors import SpecError
from onnx_custom.runtime.abi import DTYPE_NAMES
from onnx_custom.translate.registry import DEFAULT_VARIANT

__all__ = [
    "ATTRIBUTE_TYPES",
    "EAGER",
    "NODE",
    "NODE_ONLY_TYPES",
    "NO_DEFAULT",
    "TORCH_DTYPES",
    "Attribute",
    "Input",
    "Output",
    "Ref",
    "TensorValue",
]

Ref = str | Callable[..., Any]
"""A reference to code: ``"package.module:function"`` (imported at registration) or the object."""

# torch schema type -> ONNX attribute type (the kernel registry's names); bool travels as INT.
ATTRIBUTE_TYPES: dict[str, str] = {
    "int": "int",
    "float": "float",
    "bool": "int",
    "str": "string",
    "int[]": "ints",
    "float[]": "floats",
    "str[]": "strings",
}
# Types a node constant (`OpSpec.node_attributes`) may have beyond those: no torch schema type
# expresses them, so torch arguments cannot.
NODE_ONLY_TYPES: dict[str, str] = {"tensor": "tensor"}
# The op-plugin YAML style spells some types differently.
_TYPE_ALIASES = {
    "listInt": "int[]",
    "listFloat": "float[]",
    "listStr": "str[]",
    "string": "str",
    "double": "float",
}
_NOT_ATTRIBUTES = {
    "Tensor": "make it an input (input_desc) instead",
    "Tensor?": "make it an optional input ('name?') instead",
    "Tensor[]": "make it a variadic input ('name*') instead",
    "bool[]": "use int[] (ONNX has no list-of-bool attribute)",
    "Scalar": "use float (or int)",
    "complex": "use two float attributes",
}

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF = re.compile(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
# Input and attribute names become parameters of translations (g, ...), kernels (out=) and
# keywords of g.op(node_type, ..., outputs=n, **attributes); output names never do.
_RESERVED_NAMES = {
    "g": "the translation's graph builder",
    "out": "kernels' preallocated outputs",
    "outputs": "g.op's output count",
    "node_type": "g.op's first parameter",
    "output_types": "g.op's declared output types",
}
# Spellings of the default ONNX domain, where only standard ops live.
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class TensorValue:
    """An immutable tensor constant: the value of a ``"tensor"`` node attribute (an ONNX TENSOR
    attribute). Made from a numpy array, a torch tensor or a nested list (floats -> float32,
    ints -> int64, as ONNX constants usually are); kernels get ``numpy()``, eager math
    ``torch()``, translations write it as a TENSOR attribute."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes = dataclasses.field(repr=False)

    @classmethod
    def of(cls, value: Any) -> TensorValue:
        import numpy as np

        if isinstance(value, TensorValue):
            return value
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            name = str(value.dtype).removeprefix("torch.")
            if name == "bfloat16":
                return cls(name, tuple(value.shape), value.view(torch.int16).numpy().tobytes())
            value = value.numpy()
        elif not isinstance(value, np.ndarray):
            value = np.asarray(value)
            if value.dtype == np.float64:
                value = value.astype(np.float32)
        name = "bfloat16" if value.dtype.name == "bfloat16" else str(value.dtype)
        if name not in DTYPE_NAMES:
            raise TypeError(f"dtype {value.dtype} is not one of {', '.join(DTYPE_NAMES)}")
        return cls(name, tuple(int(d) for d in value.shape), np.ascontiguousarray(value).tobytes())

    def numpy(self) -> Any:
        """A read-only numpy array (bfloat16 via ml_dtypes)."""
        import numpy as np

        if self.dtype == "bfloat16":
            import ml_dtypes

            dtype: Any = ml_dtypes.bfloat16
        else:
            dtype = np.dtype(self.dtype)
        array = np.frombuffer(self.data, dtype=dtype).reshape(self.shape)
        return array

    def torch(self) -> torch.Tensor:
        """A torch tensor (a copy; CPU)."""
        if self.dtype == "bfloat16":
            return torch.from_numpy(self.numpy().view("int16").copy()).view(torch.bfloat16)
        return torch.from_numpy(self.numpy().copy())


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"

    def __reduce__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()

EAGER = "eager"
"""``kernel="eager"``: the node's kernel runs the eager torch op on torch views of ORT's buffers."""


def _fail(op: str, key: tuple[Any, ...], message: str) -> SpecError:
    label = f"op {op}" if op else "op spec"
    return SpecError(f"{label}: {message}", op=op, key=key)


def _check_name(op: str, key: tuple[Any, ...], what: str, name: Any) -> str:
    if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
        raise _fail(
            op,
            key,
            f"{what} name {name!r} is not a Python identifier; expected e.g. 'x' or 'weight'; fix:"
            " rename it.",
        )
    if name in _RESERVED_NAMES and what != "output":
        raise _fail(
            op,
            key,
            f"{what} name {name!r} is reserved for {_RESERVED_NAMES[name]}; fix: rename it.",
        )
    return name


def _check_dtypes(op: str, key: tuple[Any, ...], value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise _fail(
            op,
            key,
            "dtype must be a non-empty list of dtype names such as [float32, float16]; received"
            f" {value!r}.",
        )
    unknown = [d for d in items if d not in DTYPE_NAMES]
    if unknown:
        raise _fail(
            op,
            key,
            f"unknown dtype(s) {unknown}; expected names from {', '.join(DTYPE_NAMES)}; fix: spell"
            " them as listed.",
        )
    if len(set(items)) != len(items):
        raise _fail(op, key, f"dtype list {list(items)} repeats a dtype; fix: list each once.")
    return tuple(items)


def _check_ref(op: str, key: tuple[Any, ...], value: Any, what: str) -> Ref | None:
    if value is None or callable(value):
        return value
    if isinstance(value, str) and _REF.match(value):
        return value
    raise _fail(
        op,
        key,
        f"{what} must be 'package.module:function' or a callable; received {value!r}; fix: write"
        " e.g. 'my_ops:scale_add'.",
    )


@dataclasses.dataclass(frozen=True)
class Input:
    """A tensor input. ``name`` may end in ``?`` (optional: ``Tensor?``) or ``*`` (variadic:
    ``Tensor[]``, last input only). ``dtype``: allowed dtype names (default: all). ``format`` is
    the op-plugin layout label (``ND``, ``NCHW``...), one or one per dtype, kept as documentation.
    """

    name: str
    dtype: tuple[str, ...] | None = None
    optional: bool = False
    variadic: bool = False
    format: str | tuple[str, ...] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.name, str) and self.name[-1:] in ("?", "*"):
            object.__setattr__(self, "optional", self.optional or self.name.endswith("?"))
            object.__setattr__(self, "variadic", self.variadic or self.name.endswith("*"))
            object.__setattr__(self, "name", self.name[:-1])
        if isinstance(self.dtype, (list, str)):
            object.__setattr__(
                self, "dtype", tuple([self.dtype] if isinstance(self.dtype, str) else self.dtype)
            )
        if isinstance(self.format, list):  # frozen: the op-plugin YAML's list becomes a tuple
            object.__setattr__(self, "format", tuple(self.format))

    @property
    def dtypes(self) -> tuple[str, ...]:
        return self.dtype or DTYPE_NAMES

    @property
    def torch_type(self) -> str:
        return "Tensor[]" if self.variadic else "Tensor?" if self.optional else "Tensor"


@dataclasses.dataclass(frozen=True)
class Output:
    """A tensor output. ``dtype``: a list of allowed dtypes, or ``"like:<input>"`` (default: like
    the first input). ``shape``: ``"like:x"``, ``"broadcast"`` or an expression (see
    `onnx_custom.spec.shape_rules`)."""

    name: str
    dtype: tuple[str, ...] | str | None = None
    shape: str | None = None
    format: str | tuple[str, ...] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.dtype, list):
            object.__setattr__(self, "dtype", tuple(self.dtype))
        if isinstance(self.format, list):
            object.__setattr__(self, "format", tuple(self.format))


@dataclasses.dataclass(frozen=True)
class Attribute:
    """A non-tensor argument: torch schema ``type`` (int, float, bool, str, int[], float[], str[])
    and an optional ``default``. It becomes a typed ONNX attribute of the same name.

    ``after``: the input it follows in the torch schema (default: after every input), for ops
    whose schema interleaves tensors and other arguments. ``node_default``: what a node without
    this attribute means (kernel, ONNX schema, function body) when the torch schema has no
    default. In `OpSpec.node_attributes`, ``default`` is the constant every node carries."""

    name: str
    type: str
    default: Any = NO_DEFAULT
    doc: str = ""
    after: str | None = None
    node_default: Any = NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    @property
    def onnx_default(self) -> Any:
        """The node-side default (NO_DEFAULT: the attribute is required on every node)."""
        return self.default if self.has_default else self.node_default

    @property
    def onnx_type(self) -> str:
        return NODE_ONLY_TYPES.get(self.type) or ATTRIBUTE_TYPES[self.type]


def _normalize_default(
    op: str, key: tuple[Any, ...], attr: Attribute, value: Any = NO_DEFAULT
) -> Any:
    """The default as the Python value torch hands the op (lists become tuples:
    specs are frozen)."""
    value, typ = (attr.default if value is NO_DEFAULT else value), attr.type
    if typ == "tensor":
        try:
            return TensorValue.of(value)
        except (TypeError, ValueError) as exc:
            raise _fail(
                op,
                key,
                f"attribute {attr.name!r} (tensor) has value {value!r:.80}, which is not a tensor"
                f" ({exc}); expected a numpy array, a torch tensor or a nested list of numbers;"
                " fix: e.g. numpy.array([1.0, 2.0], dtype='float32').",
            ) from None
    scalar = typ.removesuffix("[]")
    items = value if typ.endswith("[]") else [value]
    if typ.endswith("[]") and not isinstance(value, (list, tuple)):
        raise _fail(
            op,
            key,
            f"attribute {attr.name!r} ({typ}) has default {value!r}; expected a list of {scalar}s.",
        )
    checks: dict[str, Callable[[Any], bool]] = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
    }
    bad = [v for v in items if not checks[scalar](v)]
    if bad:
        raise _fail(
            op,
            key,
            f"attribute {attr.name!r} ({typ}) has default {value!r}; expected"
            f" {'a list of ' + scalar + 's' if typ.endswith('[]') else 'a ' + scalar}; fix: change"
            " the default or the type.",
        )
    if scalar == "float":
        items = [float(v) for v in items]
        if not all(math.isfinite(v) for v in items):
            raise _fail(
                op,
                key,
                f"attribute {attr.name!r}: default {value!r} is not finite; the torch schema cannot"
                " express inf/nan defaults; fix: use a finite default or none.",
            )
    return tuple(items) if typ.endswith("[]") else items[0]


NODE = "node"
"""In `OpSpec.translations`, where the custom-node translation goes:
``{16: {"custom": "node"}}``."""
_VARIANT = re.compile(r"^[A-Za-z_][\w-]*$")


def _normalize_translations(op: str, value: Any) -> tuple[tuple[int, str, Any], ...]:
    """``{opset: ref | "node" | {variant: ref | "node"}}`` as sorted (opset, variant,
    ref) triples."""
    items = value.items() if isinstance(value, Mapping) else value
    out: list[tuple[int, str, Any]] = []
    try:
        # (opset, variant, ref) triples too: a normalized spec goes through dataclasses.replace
        pairs = [
            (k[0], {k[1]: k[2]}) if len(k) == 3 else (k[0], k[1]) for k in (tuple(i) for i in items)
        ]
    except (TypeError, ValueError, IndexError):
        raise _fail(
            op,
            ("translations",),
            "translations must map opset -> translation (or -> {variant: translation}), e.g."
            f" {{13: 'my_onnx:scale_add_13'}}; received {value!r}.",
        ) from None
    for opset, ref in pairs:
        if not isinstance(opset, int) or isinstance(opset, bool) or opset < 1:
            raise _fail(
                op,
                ("translations", opset),
                f"translation opset {opset!r} must be a positive int (the first opset it is valid"
                " for).",
            )
        by_variant = ref if isinstance(ref, Mapping) else {DEFAULT_VARIANT: ref}
        if not by_variant:
            raise _fail(
                op,
                ("translations", opset),
                "maps to an empty {variant: translation} mapping; fix: name at least one"
                " translation.",
            )
        for variant, fn in by_variant.items():
            if not isinstance(variant, str) or not _VARIANT.match(variant):
                raise _fail(
                    op,
                    ("translations", opset, variant),
                    f"variant {variant!r} is not a variant name; expected an identifier such as"
                    " 'default', 'custom' or 'gemm'.",
                )
            checked = (
                fn
                if fn == NODE
                else _check_ref(
                    op,
                    ("translations", opset, variant),
                    fn,
                    f"translation for opset {opset} (variant {variant!r})",
                )
            )
            out.append((opset, variant, checked))
    if len({(o, v) for o, v, _ in out}) != len(out):
        raise _fail(
            op,
            ("translations",),
            "two translations for one opset and variant; fix: keep one per opset and variant.",
        )
    if sum(ref == NODE for _, _, ref in out) > 1:
        raise _fail(
            op,
            ("translations",),
            f"places the custom node ({NODE!r}) more than once; fix: name it once, at its first"
            " opset (it is re-registered where later translations start).",
        )
    return tuple(sorted(out, key=lambda item: (item[0], item[1])))


def _has_schema_default(item: Input | Attribute) -> bool:
    return item.optional if isinstance(item, Input) else item.has_default


_DEVICE = re.compile(r"^[a-z][a-z0-9_]*$")


def _check_devices(op: str, value: Any) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(d, str) and _DEVICE.match(d) for d in items
    ):
        raise _fail(
            op,
            ("devices",),
            "devices must be a list of torch device types such as ['cpu', 'cuda']; received"
            f" {value!r}.",
        )
    return tuple(items)


def _is_code_object(value: Any) -> bool:
    """Callables, kernel declarations and ONNX function bodies may be given as objects."""
    import onnx

    from onnx_custom.function_bodies.builder import TranslationBody
    from onnx_custom.runtime.kernel_spec import KernelSpec
    from onnx_custom.runtime.registry import KernelRegistry

    return callable(value) or isinstance(
        value, (KernelSpec, KernelRegistry, TranslationBody, onnx.FunctionProto)
    )


def _as_list(op: str, field: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _fail(
            op, (field,), f"{field} must be a list; received {type(value).__name__} {value!r}."
        )
    return list(value)


def _schema_literal(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_schema_literal(v) for v in value) + "]"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)

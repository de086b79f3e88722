"""Kernel declarations: :class:`KernelSpec` (inputs, outputs, attributes, dtypes, shape rule) and
:func:`make_spec`, which validates a kernel function against what it declares. The registries that
hold them are in :mod:`onnx_custom.runtime.registry`."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnx_custom.errors import KernelError, SymbolicError
from onnx_custom.runtime.abi import DTYPE_NAMES
from onnx_custom.runtime.types import TensorInfo, broadcast_shapes

__all__ = [
    "RESERVED_DOMAINS",
    "AttrSpec",
    "KernelSpec",
    "ParamSpec",
    "make_spec",
    "split_name",
    "tensor_attribute_value",
]

# Domains ONNX Runtime serves itself; kernels may not be registered there.
RESERVED_DOMAINS = frozenset(
    {
        "",
        "ai.onnx",
        "ai.onnx.ml",
        "ai.onnx.training",
        "ai.onnx.preview.training",
        "com.microsoft",
        "com.microsoft.nchwc",
        "com.microsoft.experimental",
        "com.ms.internal.nhwc",
        "com.microsoft.mlfeaturizers",
        "com.microsoft.dml",
        "org.pytorch.aten",
    }
)
_IDENT = r"[A-Za-z_][A-Za-z0-9_\-]*"
_NAME_RE = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*)::([A-Za-z_][A-Za-z0-9_]*)$")
_PARAM_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)([?*]?)$")
_ATTR_TYPES = ("int", "float", "string", "ints", "floats", "strings", "tensor")
_RULE_NAMES = ("like:<input name>", "like0", "broadcast")
_INT64 = (-(2**63), 2**63 - 1)


def split_name(name: str) -> tuple[str, str]:
    """``"com.example::Foo"`` -> ``("com.example", "Foo")``; raises SymbolicError when malformed."""
    m = _NAME_RE.match(name) if isinstance(name, str) else None
    if not m:
        raise SymbolicError(
            "kernel name must look like 'domain::OpType' (domain may contain dots, e.g. "
            f"'com.example::Foo'); received {name!r}; fix: qualify the op type with its domain."
        )
    domain, op_type = m.group(1), m.group(2)
    if domain in RESERVED_DOMAINS:
        raise SymbolicError(
            f"kernel {name!r}: domain {domain!r} belongs to ONNX/ONNX Runtime; expected a custom "
            f"domain; fix: use your own domain, e.g. 'mylib::{op_type}'."
        )
    return domain, op_type


@dataclass(frozen=True)
class ParamSpec:
    """One declared input or output: ``"x"`` required, ``"x?"`` optional, ``"xs*"`` variadic."""

    name: str
    kind: str = "required"  # "required" | "optional" | "variadic"
    dtypes: tuple[str, ...] = DTYPE_NAMES


@dataclass(frozen=True)
class AttrSpec:
    name: str
    type: str  # int | float | string | ints | floats | strings
    default: Any = None
    required: bool = True


@dataclass(frozen=True)
class KernelSpec:
    """A registered Python kernel (immutable; use :meth:`renamed` to serve another domain)."""

    name: str
    fn: Callable[..., Any]
    inputs: tuple[ParamSpec, ...]
    outputs: tuple[ParamSpec, ...]
    attrs: tuple[AttrSpec, ...] = ()
    shape_fn: Callable[..., Any] | str | None = None
    function: Any = None
    tensor_type: str = "numpy"
    out_mode: bool = False
    doc: str = ""

    @property
    def domain(self) -> str:
        return split_name(self.name)[0]

    @property
    def op_type(self) -> str:
        return split_name(self.name)[1]

    def renamed(self, name: str) -> KernelSpec:
        """The same kernel under another ``domain::OpType``."""
        split_name(name)
        return dataclasses.replace(self, name=name)

    def attr_defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attrs if not a.required}

    @property
    def like_index(self) -> int | None:
        """Input whose dtype and shape every output takes (``"like:x"``/``"like0"``), else None."""
        rule = self.shape_fn
        if rule == "like0":
            return 0
        if isinstance(rule, str) and rule.startswith("like:"):
            return [p.name for p in self.inputs].index(rule[5:])
        return None

    def declared_dtype(self, output: int) -> np.dtype[Any] | None:
        """The dtype output ``output`` always has (when exactly one is declared for it)."""
        dtypes = self.outputs[output].dtypes
        return np.dtype(_numpy_dtype(dtypes[0])) if len(dtypes) == 1 else None

    def infer(
        self, inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
    ) -> list[TensorInfo | None]:
        """Output types/shapes from input types/shapes (dims may be symbolic).

        An output's shape is None when the rule does not know it, and the whole entry is None
        when not even its dtype is known: the kernel then claims nothing about it.
        """
        self.check_input_dtypes(inputs)
        rule = self.shape_fn
        if rule is None or isinstance(rule, str):
            return [self._rule_output(j, inputs) for j in range(len(self.outputs))]
        merged = {**self.attr_defaults(), **{k: v for k, v in attrs.items() if v is not None}}
        res = rule(list(inputs), merged)
        res_list = [res] if isinstance(res, TensorInfo) else list(res)
        for r in res_list:
            if r is not None and not isinstance(r, TensorInfo):
                raise KernelError(
                    f"kernel {self.name}: shape_fn must return TensorInfo objects (one per output, "
                    f"None for an unknown one); received {type(r).__name__}; fix: return "
                    "TensorInfo(dtype, shape)."
                )
        return res_list

    def _rule_output(self, j: int, inputs: Sequence[TensorInfo | None]) -> TensorInfo | None:
        """Output ``j`` under a built-in rule: dtype declared or taken from the source input."""
        like = self.like_index
        source_index = 0 if like is None else like
        source = inputs[source_index] if source_index < len(inputs) else None
        declared = self.declared_dtype(j)
        dtype = declared if declared is not None else (None if source is None else source.dtype)
        if dtype is None:
            return None
        if self.shape_fn is None or source is None:
            return TensorInfo(dtype, None)  # no shape_fn: claim no shape we do not know
        if like is not None:
            return TensorInfo(dtype, source.shape)
        if any(i is None for i in inputs):  # absent or not yet typed: the broadcast is unknown
            return TensorInfo(dtype, None)
        return TensorInfo(dtype, broadcast_shapes(*(i.shape for i in inputs if i is not None)))

    def check_input_dtypes(self, inputs: Sequence[TensorInfo | None]) -> None:
        for i, info in enumerate(inputs):
            if info is None:
                continue
            param = self.inputs[min(i, len(self.inputs) - 1)] if self.inputs else None
            if param is None:
                continue
            name = _dtype_name(info.dtype)
            if name not in param.dtypes:
                raise KernelError(
                    f"kernel {self.name}: input {i} ({param.name!r}) has dtype {name}; expected one"
                    f" of {', '.join(param.dtypes)}; fix: cast the input or widen dtypes= at"
                    " registration."
                )


def _dtype_name(dt: np.dtype[Any]) -> str:
    s = str(dt)
    return "bool" if s == "bool" else s


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return name


def _parse_params(names: Sequence[str], what: str, qual: str) -> list[ParamSpec]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise SymbolicError(
            f"kernel {qual}: {what} must be a list of names such as ['x', 'mask?', 'rest*']; "
            f"received {names!r}."
        )
    out: list[ParamSpec] = []
    for i, n in enumerate(names):
        m = _PARAM_RE.match(n) if isinstance(n, str) else None
        if not m:
            raise SymbolicError(
                f"kernel {qual}: bad {what[:-1]} name {n!r}; expected an identifier, optionally"
                " suffixed with '?' (optional) or '*' (variadic, last only). Fix: e.g. 'x',"
                " 'mask?', 'rest*'."
            )
        kind = {"": "required", "?": "optional", "*": "variadic"}[m.group(2)]
        if kind == "variadic" and i != len(names) - 1:
            raise SymbolicError(
                f"kernel {qual}: variadic {what[:-1]} {n!r} must be the last one; received it at"
                f" position {i} of {list(names)}. Fix: move it to the end."
            )
        out.append(ParamSpec(m.group(1), kind))
    if len({p.name for p in out}) != len(out):
        dupes = sorted({p.name for p in out if [q.name for q in out].count(p.name) > 1})
        raise SymbolicError(
            f"kernel {qual}: duplicate {what} names {dupes} in {list(names)}; expected unique"
            f" names. Fix: give each of the {what} its own name."
        )
    return out


def _is_tensor_value(value: Any) -> bool:
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
        return getattr(value, "dtype", None) is not None and np.asarray(value).dtype != object
    return False


def tensor_attribute_value(value: Any) -> np.ndarray[Any, Any]:
    """A TENSOR attribute's value as kernels receive it: a read-only C-contiguous numpy copy
    (a torch tensor is detached and moved to the CPU first)."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch here
        value = value.detach().cpu().numpy()
    array = np.array(value, copy=True, order="C")
    array.setflags(write=False)
    return array


def _check_default(qual: str, name: str, typ: str, value: Any) -> Any:
    ok = {
        "int": lambda v: isinstance(v, (int, np.integer)),
        "float": lambda v: isinstance(v, (int, float, np.floating, np.integer)),
        "string": lambda v: isinstance(v, str),
        "ints": lambda v: (
            isinstance(v, (list, tuple)) and all(isinstance(x, (int, np.integer)) for x in v)
        ),
        "floats": lambda v: (
            isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v)
        ),
        "strings": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
        "tensor": _is_tensor_value,
    }[typ]
    if not ok(value):
        raise SymbolicError(
            f"kernel {qual}: default of attribute {name!r} must be a {typ}; received {value!r}; "
            f"fix: pass a {typ} default, e.g. attrs={{{name!r}: ({typ!r}, ...)}}."
        )
    ints = [value] if typ == "int" else list(value) if typ == "ints" else []
    big = [int(v) for v in ints if not _INT64[0] <= int(v) <= _INT64[1]]
    if big:
        raise SymbolicError(
            f"kernel {qual}: default of attribute {name!r} is {big[0]}, outside ONNX's int64 range "
            f"[{_INT64[0]}, {_INT64[1]}]; fix: use a value that fits in 64 bits."
        )
    if typ == "int":
        return int(value)
    if typ == "float":
        return float(value)
    if typ == "ints":
        return [int(x) for x in value]
    if typ == "floats":
        return [float(x) for x in value]
    if typ == "strings":
        return list(value)
    if typ == "tensor":
        return tensor_attribute_value(value)
    return value


def _parse_attrs(attrs: Mapping[str, Any] | None, qual: str) -> list[AttrSpec]:
    out: list[AttrSpec] = []
    for name, decl in (attrs or {}).items():
        if not isinstance(name, str) or not _PARAM_RE.match(name) or name.endswith(("?", "*")):
            raise SymbolicError(
                f"kernel {qual}: attribute names must be identifiers (the kernel's keyword"
                f" arguments); received {name!r}. Fix: rename it, e.g."
                f" {'_'.join(str(name).split()) or 'alpha'!r}."
            )
        if name == "out":
            raise SymbolicError(
                f"kernel {qual}: attribute names must not be 'out'; received attrs with 'out',"
                " which is reserved for preallocated outputs. Fix: rename the attribute."
            )
        if isinstance(decl, tuple) and len(decl) == 2:
            typ, default = decl
            required = False
        else:
            typ, default, required = decl, None, True
        if typ not in _ATTR_TYPES:
            raise SymbolicError(
                f"kernel {qual}: attribute {name!r} has type {typ!r}; expected one of"
                f" {', '.join(_ATTR_TYPES)} (or a (type, default) tuple). Fix: e.g."
                f" attrs={{{name!r}: 'float'}} or attrs={{{name!r}: ('float', 1.0)}}."
            )
        if not required:
            default = _check_default(qual, name, typ, default)
        out.append(AttrSpec(name, typ, default, required))
    return out


def _apply_dtypes(params: list[ParamSpec], dtypes: Any, qual: str) -> list[ParamSpec]:
    if dtypes is None:
        return params

    def check(seq: Any) -> tuple[str, ...]:
        seq = (seq,) if isinstance(seq, str) else tuple(seq)
        bad = [d for d in seq if d not in DTYPE_NAMES]
        if bad or not seq:
            raise SymbolicError(
                f"kernel {qual}: unknown dtype(s) {bad or seq}; expected names from "
                f"{', '.join(DTYPE_NAMES)}. Fix: e.g. dtypes=['float32', 'float64']."
            )
        return seq

    if isinstance(dtypes, Mapping):
        return [
            dataclasses.replace(p, dtypes=check(dtypes[p.name])) if p.name in dtypes else p
            for p in params
        ]
    common = check(dtypes)
    return [dataclasses.replace(p, dtypes=common) for p in params]


def _accepts_out(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    p = sig.parameters.get("out")
    return p is not None and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)


def _check_signature(
    fn: Callable[..., Any], attrs: list[AttrSpec], qual: str, ins: Sequence[ParamSpec] = ()
) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    _check_positional(fn, params, attrs, qual, ins)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    missing = [a.name for a in attrs if a.name not in params]
    if missing:
        raise SymbolicError(
            f"kernel {qual}: function {getattr(fn, '__name__', fn)!r} does not accept attribute"
            f" keyword(s) {missing}; expected e.g. `def f(a, b, *, {', '.join(missing)})`. Fix: add"
            " them to its signature (or **attrs), or remove them from attrs=."
        )


def _check_positional(
    fn: Callable[..., Any],
    params: Mapping[str, inspect.Parameter],
    attrs: list[AttrSpec],
    qual: str,
    ins: Sequence[ParamSpec],
) -> None:
    """The kernel receives one positional argument per declared input:
    its function must take them."""
    if (
        not ins
        or any(p.kind == "variadic" for p in ins)
        or any(p.kind == p.VAR_POSITIONAL for p in params.values())
    ):
        return
    keywords = {a.name for a in attrs} | {"out"}
    positional = [
        p
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in keywords
    ]
    required = [p for p in positional if p.default is p.empty]
    if len(positional) >= len(ins) and len(required) <= len(ins):
        return
    declared = [p.name for p in ins]
    takes = [p.name for p in (required if len(required) > len(ins) else positional)]
    raise SymbolicError(
        f"kernel {qual}: declares {len(ins)} input(s) {declared}, passed positionally, but function"
        f" {getattr(fn, '__name__', fn)!r} takes {len(takes)} positional argument(s) {takes}. Fix:"
        f" def {getattr(fn, '__name__', 'kernel')}({', '.join(declared)}, *, <attributes>), or"
        " correct inputs=."
    )


def make_spec(
    name: str,
    fn: Callable[..., Any],
    *,
    inputs: Sequence[str],
    outputs: Sequence[str],
    attrs: Mapping[str, Any] | None = None,
    dtypes: Any = None,
    shape_fn: Callable[..., Any] | str | None = None,
    function: Any = None,
    tensor_type: str = "numpy",
    out: bool | None = None,
) -> KernelSpec:
    """Validate a declaration and build its :class:`KernelSpec`."""
    split_name(name)
    if not callable(fn):
        raise SymbolicError(
            f"kernel {name}: expected a callable computing the outputs from the inputs; received"
            f" {type(fn).__name__} ({fn!r:.60}). Fix: decorate a function: @kernel({name!r}, ...)"
            " above def my_kernel(x): ..."
        )
    ins = _parse_params(inputs, "inputs", name)
    outs = _parse_params(outputs, "outputs", name)
    if not outs:
        raise SymbolicError(
            f"kernel {name}: expected at least one output; received outputs={list(outputs)!r}. Fix:"
            " e.g. outputs=['y']."
        )
    if isinstance(dtypes, Mapping):
        unknown = set(dtypes) - {p.name for p in ins + outs}
        if unknown:
            raise SymbolicError(
                f"kernel {name}: dtypes= names {sorted(unknown)} are not inputs/outputs (expected"
                f" among {[p.name for p in ins + outs]}). Fix: key dtypes= by those names."
            )
    ins, outs = _apply_dtypes(ins, dtypes, name), _apply_dtypes(outs, dtypes, name)
    attr_specs = _parse_attrs(attrs, name)
    _check_signature(fn, attr_specs, name, ins)
    if tensor_type not in ("numpy", "torch"):
        raise SymbolicError(
            f"kernel {name}: tensor_type must be 'numpy' or 'torch'; received {tensor_type!r}; "
            "fix: pass tensor_type='numpy' (arrays) or 'torch' (tensors)."
        )
    out_mode = _accepts_out(fn) if out is None else bool(out)
    _check_shape_rule(name, shape_fn, ins, out_mode)
    return KernelSpec(
        name=name,
        fn=fn,
        inputs=tuple(ins),
        outputs=tuple(outs),
        attrs=tuple(attr_specs),
        shape_fn=shape_fn,
        function=function,
        tensor_type=tensor_type,
        out_mode=out_mode,
        doc=inspect.getdoc(fn) or "",
    )


def _check_shape_rule(name: str, rule: Any, ins: Sequence[ParamSpec], out_mode: bool) -> None:
    names = [p.name for p in ins]
    if rule is None:
        if out_mode:
            raise SymbolicError(
                f"kernel {name}: writes into preallocated outputs (out=) but declares no shape_fn, "
                "so its output shapes are unknown; fix: pass"
                f' shape_fn="like:{names[0] if names else "x"}", '
                f'"broadcast" or a callable returning TensorInfo per output.'
            )
        return
    if callable(rule):
        return
    if not isinstance(rule, str):
        raise SymbolicError(
            f"kernel {name}: shape_fn must be a callable, one of {', '.join(_RULE_NAMES)} or None; "
            f"received {type(rule).__name__}."
        )
    valid = rule in ("like0", "broadcast") or (rule.startswith("like:") and rule[5:] in names)
    if not valid:
        known = ", ".join(f"'like:{n}'" for n in names) or "(the op has no inputs)"
        raise SymbolicError(
            f"kernel {name}: shape_fn={rule!r}; expected a callable, 'broadcast', 'like0' or "
            f"'like:<input name>' with one of the declared inputs ({known}); fix: name a declared "
            "input or pass a callable."
        )
    if not ins:
        raise SymbolicError(
            f"kernel {name}: shape_fn={rule!r} expects a declared input to copy from; received "
            "inputs=[]; fix: pass a callable shape_fn."
        )

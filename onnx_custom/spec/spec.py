"""`OpSpec`: one frozen declaration of a custom op, validated when it is made.

Everything structural is checked here (names, types, dtypes, defaults, shape rules, the node type
and domain), so a spec that exists is well-formed; the parts it is made of (`Input`, `Output`,
`Attribute`) and the checks of single fields live in `onnx_custom.spec.fields`. References to
code (``"module:function"`` or callables) are resolved and checked against the declaration when
the spec is registered (`onnx_custom.spec.generate`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch

from onnx_custom.errors import SpecError, SymbolicError
from onnx_custom.spec.fields import (
    _DEFAULT_DOMAINS,
    _IDENT,
    _NOT_ATTRIBUTES,
    _TYPE_ALIASES,
    ATTRIBUTE_TYPES,
    EAGER,
    NO_DEFAULT,
    NODE,
    NODE_ONLY_TYPES,
    TORCH_DTYPES,
    Attribute,
    Input,
    Output,
    Ref,
    _as_list,
    _check_devices,
    _check_dtypes,
    _check_name,
    _check_ref,
    _fail,
    _has_schema_default,
    _is_code_object,
    _normalize_default,
    _normalize_translations,
    _schema_literal,
)
from onnx_custom.spec.native_source import NativeKernel, native_field
from onnx_custom.spec.shape_rules import (
    ExpressionRule,
    LikeRule,
    RuleError,
    ShapeRule,
    parse_shape_rule,
)
from onnx_custom.translate.names import QualifiedName
from onnx_custom.translate.registry import DEFAULT_VARIANT

# The parts are re-exported: `from onnx_custom.spec.spec import Input` keeps working.
__all__ = [
    "ATTRIBUTE_TYPES",
    "EAGER",
    "NODE",
    "NO_DEFAULT",
    "TORCH_DTYPES",
    "Attribute",
    "Input",
    "OpSpec",
    "Output",
    "Ref",
    "SpecError",
]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One custom op, declared once (see ``onnx_custom.spec`` for what registering it generates).

    ``name``: qualified torch name ``ns::op``. ``op_type``/``domain``: the custom ONNX node
    (domain defaults to the namespace; omit ``op_type`` for an op with standard translations
    only). ``inputs``/``outputs``/``attributes``: the signature; the torch schema is inputs then
    attributes, in order (an attribute's ``after`` moves it behind an input). ``node_attributes``:
    constants every custom node carries that the torch op does not take (``Attribute`` with the
    constant as ``default``); kernels, standard translations and function bodies receive them
    like attributes. ``shape``: a Python meta function (``meta(*inputs, **attributes)`` -> fake
    outputs), instead of per-output shape rules. ``impl``: eager math ``impl(*inputs,
    **attributes)`` on torch tensors (omit it to adopt an op that a library already defines, e.g.
    a C++ extension: the schemas must then agree). ``check``: a validator called with the op's
    arguments (schema order) by the eager op and the fake kernel before anything else, for
    messages more specific than the dtype check. ``devices``: device types the eager math serves
    (default: every device). ``kernel``: Python kernel ``kernel(*inputs, **attributes)`` on numpy
    arrays, ``"eager"`` (the eager op on torch views of ONNX Runtime's buffers), or a
    `KernelSpec` / `KernelRegistry` holding one (checked against the spec instead).
    ``backward``/``setup_context``: as ``torch.library.register_autograd`` (``setup_context``
    gets the inputs as a named tuple; ``backward`` may return ``{input name: grad}``).
    ``native``: the native library (``libonnx_custom_ops.so``) serves the node (True, or the node
    name ``"domain::OpType"``), or the user's C++ kernel ``{"source": "acme_kernels.cpp",
    "function": "scale_add"}`` (`NativeKernel`; built by `onnx_custom.spec.build_native_library`).
    ``function``: the node's ONNX function body (a FunctionProto, an
    onnxscript function, a zero-argument builder, a `TranslationBody`, or a translation
    ``fn(g, *inputs, **attributes)``). ``translations``: ``{opset: fn}`` standard-op
    translations ``fn(g, *inputs, **attributes)``, each valid from its opset on; ``{opset:
    {variant: fn}}`` for registry variants; ``"node"`` in place of a function places the
    custom-node translation (default: opset 1, variant ``"custom"`` when default-variant
    translations exist, else ``"default"``).
    """

    name: str
    inputs: Sequence[Input]  # stored as a tuple; plain names ("x", "bias?") are accepted too
    outputs: Sequence[Output]
    attributes: Sequence[Attribute] = ()
    op_type: str | None = None
    domain: str | None = None
    impl: Ref | None = None
    kernel: Any = None
    backward: Ref | None = None
    setup_context: Ref | None = None
    native: bool | str | NativeKernel = False
    function: Any = None
    translations: Any = ()  # {opset: ref | {variant: ref}}; stored as sorted (opset, variant, ref)
    shape: Ref | None = None
    doc: str = ""
    source: str = dataclasses.field(default="", compare=False)  # "file.yaml:3" for messages
    node_attributes: Sequence[Attribute] = ()
    check: Ref | None = None
    devices: Sequence[str] = ()
    # Each output's parsed shape rule (None: no rule), parsed once here when the spec is made:
    # the eager op and the fake kernel evaluate them on every call (re-parsing with `ast` cost
    # a sizeable part of a small op's forward).
    _shape_rules: tuple[ShapeRule | None, ...] = dataclasses.field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        op = self.name if isinstance(self.name, str) else ""
        try:
            qualified = QualifiedName.parse(self.name)
        except SymbolicError as exc:
            raise _fail(op, ("name",), str(exc)) from None
        if qualified.overload:
            raise _fail(
                op,
                ("name",),
                f"name {self.name!r} has an overload; expected 'namespace::op' (specs define the"
                f" default overload); fix: drop '.{qualified.overload}'.",
            )

        def set_(field: str, value: Any) -> None:  # normalize a field of this frozen instance
            object.__setattr__(self, field, value)

        set_(
            "inputs",
            tuple(
                i if isinstance(i, Input) else Input(i) for i in _as_list(op, "inputs", self.inputs)
            ),
        )
        set_(
            "outputs",
            tuple(
                o if isinstance(o, Output) else Output(o)
                for o in _as_list(op, "outputs", self.outputs)
            ),
        )
        set_("attributes", tuple(_as_list(op, "attributes", self.attributes)))
        set_("node_attributes", tuple(_as_list(op, "node_attributes", self.node_attributes)))
        set_("devices", _check_devices(op, self.devices))
        set_("translations", _normalize_translations(op, self.translations))
        set_("native", native_field(op, self.native))
        if self.domain is None:
            set_("domain", qualified.namespace)
        self._check_signature(op)
        set_(
            "attributes",
            tuple(
                self._checked_attribute(op, ("attributes", i), a)
                for i, a in enumerate(self.attributes)
            ),
        )
        set_(
            "node_attributes",
            tuple(
                self._checked_attribute(op, ("node_attributes", i), a)
                for i, a in enumerate(self.node_attributes)
            ),
        )
        self._check_positions(op)
        self._check_node(op)
        for field in ("kernel", "function"):
            value = getattr(self, field)
            if field == "kernel" and value == EAGER:
                continue
            if isinstance(value, str) or (value is not None and not _is_code_object(value)):
                _check_ref(op, (field,), value, field)
        self._check_outputs(op)
        for field in ("impl", "backward", "setup_context", "shape", "check"):
            _check_ref(op, (field,), getattr(self, field), field)
        if self.setup_context is not None and self.backward is None:
            raise _fail(
                op,
                ("setup_context",),
                "setup_context is given without backward; fix: add backward or drop setup_context.",
            )
        if self.devices and self.impl is None:
            raise _fail(
                op,
                ("devices",),
                f"devices {list(self.devices)} are given without impl: they say which devices the"
                " eager math serves; fix: add impl or drop devices.",
            )
        self._check_schema_round_trip(op)

    # -- checks ------------------------------------------------------------------------
    def _check_signature(self, op: str) -> None:
        if not self.inputs:
            raise _fail(
                op,
                ("inputs",),
                "declares no tensor input; expected at least one (ops without tensor inputs are not"
                " supported by specs).",
            )
        if not self.outputs:
            raise _fail(
                op,
                ("outputs",),
                "declares no output; expected at least one. Fix: e.g. outputs=[Output('y')].",
            )
        seen: dict[str, tuple[Any, ...]] = {}
        groups: list[tuple[str, str, Sequence[Any]]] = [
            ("inputs", "input", self.inputs),
            ("attributes", "attribute", self.attributes),
            ("node_attributes", "node attribute", self.node_attributes),
            ("outputs", "output", self.outputs),
        ]
        classes: dict[str, type] = {
            "inputs": Input,
            "outputs": Output,
            "attributes": Attribute,
            "node_attributes": Attribute,
        }
        for field, what, items in groups:
            for index, item in enumerate(items):
                if not isinstance(item, classes[field]):
                    raise _fail(
                        op,
                        (field, index),
                        f"{what} {index} is a {type(item).__name__}; expected"
                        f" onnx_custom.spec.{classes[field].__name__}.",
                    )
                assert isinstance(item, (Input, Output, Attribute))
                name = _check_name(op, (field, index, "name"), what, item.name)
                if name in seen:
                    other_field, other_index = seen[name]
                    other = dict((f, w) for f, w, _ in groups)[other_field]
                    raise _fail(
                        op,
                        (field, index, "name"),
                        f"duplicate name {name!r} ({what} {index} and {other} {other_index}); names"
                        " must be unique across inputs, attributes and outputs; fix: rename one.",
                    )
                seen[name] = (field, index)
        for index, item in enumerate(self.inputs):
            if item.dtype is not None:
                _check_dtypes(op, ("inputs", index, "dtype"), item.dtype)
            if item.variadic and index != len(self.inputs) - 1:
                raise _fail(
                    op,
                    ("inputs", index, "name"),
                    f"variadic input {item.name!r} must be the last input (ONNX allows only a"
                    " trailing variadic input); fix: move it last.",
                )
            if item.variadic and item.optional:
                raise _fail(
                    op,
                    ("inputs", index, "name"),
                    f"input {item.name!r} cannot be both optional and variadic; fix: pass an empty"
                    " list instead.",
                )
        tensors: list[tuple[str, Sequence[Input | Output]]] = [
            ("inputs", self.inputs),
            ("outputs", self.outputs),
        ]
        for field, items in tensors:
            for index, item in enumerate(items):
                fmt = item.format
                if (
                    fmt is not None
                    and not isinstance(fmt, str)
                    and not (
                        isinstance(fmt, tuple) and fmt and all(isinstance(f, str) for f in fmt)
                    )
                ):
                    raise _fail(
                        op,
                        (field, index, "format"),
                        f"{field[:-1]} {item.name!r} has format {fmt!r}; expected a layout label"
                        " such as 'ND' or a list of them (one per dtype); fix: write e.g."
                        " format=['ND', 'ND'] or drop it.",
                    )
        for index, output in enumerate(self.outputs):
            if output.name[-1:] in ("?", "*"):
                raise _fail(
                    op, ("outputs", index, "name"), "outputs cannot be optional or variadic."
                )

    def _checked_attribute(self, op: str, key: tuple[Any, ...], attr: Attribute) -> Attribute:
        typ = _TYPE_ALIASES.get(attr.type, attr.type) if isinstance(attr.type, str) else attr.type
        if typ in NODE_ONLY_TYPES and key[0] != "node_attributes":
            raise _fail(
                op,
                (*key, "type"),
                f"attribute {attr.name!r} has type {typ!r}, which a torch op cannot take as an"
                f" argument; expected one of {', '.join(ATTRIBUTE_TYPES)}; fix: make it an input,"
                " or a node attribute (node_attributes / node_attr_desc) if it is a constant every"
                " node carries.",
            )
        if typ not in ATTRIBUTE_TYPES and typ not in NODE_ONLY_TYPES:
            hint = _NOT_ATTRIBUTES.get(str(typ).removesuffix("?"), "")
            if isinstance(typ, str) and typ.endswith("?") and typ[:-1] in ATTRIBUTE_TYPES:
                hint = "give it a default value instead of making it optional"
            raise _fail(
                op,
                (*key, "type"),
                f"attribute {attr.name!r} has type {attr.type!r}, which an op-spec attribute cannot"
                f" express; expected one of {', '.join(ATTRIBUTE_TYPES)}; fix:"
                f" {hint or 'use one of those types'}.",
            )
        if attr.type != typ:
            attr = dataclasses.replace(attr, type=typ)
        node_only = key[0] == "node_attributes"
        if node_only:
            if not attr.has_default:
                raise _fail(
                    op,
                    (*key, "default"),
                    f"node attribute {attr.name!r} has no value; expected the constant every node"
                    " carries as its default (e.g. Attribute('alpha', 'float', 2.0)).",
                )
            if attr.after is not None or attr.node_default is not NO_DEFAULT:
                raise _fail(
                    op,
                    (*key, "after" if attr.after is not None else "node_default"),
                    f"node attribute {attr.name!r} is not a torch argument: it has no position"
                    " (after) and its value is its default; fix: drop after/node_default.",
                )
        elif attr.has_default and typ == "str[]":
            raise _fail(
                op,
                (*key, "default"),
                f"attribute {attr.name!r}: the torch schema cannot express a default for str[]"
                f" attributes (received {attr.default!r}); fix: drop the default (make it"
                " required).",
            )
        if attr.has_default:
            attr = dataclasses.replace(
                attr, default=_normalize_default(op, (*key, "default"), attr)
            )
        if attr.node_default is not NO_DEFAULT:
            if attr.has_default:
                raise _fail(
                    op,
                    (*key, "node_default"),
                    f"attribute {attr.name!r} has a torch default ({attr.default!r}), which is also"
                    " what a node without it means; fix: drop node_default.",
                )
            attr = dataclasses.replace(
                attr,
                node_default=_normalize_default(
                    op, (*key, "node_default"), attr, attr.node_default
                ),
            )
        return attr

    def _check_positions(self, op: str) -> None:
        """``after`` names an input; defaults come last in the resulting torch schema."""
        names = [i.name for i in self.inputs]
        for index, attr in enumerate(self.attributes):
            if attr.after is not None and attr.after not in names:
                raise _fail(
                    op,
                    ("attributes", index, "after"),
                    f"attribute {attr.name!r} comes after {attr.after!r}, which is not an input;"
                    f" expected one of {names}; fix: name an input (or drop after: to place it"
                    " after every input).",
                )
        defaulted: Attribute | None = None
        for item in self.arguments:
            if isinstance(item, Attribute) and item.has_default:
                defaulted = item
            elif defaulted is not None and not (isinstance(item, Input) and item.optional):
                if isinstance(item, Attribute):
                    key, fix = (
                        ("attributes", self.attributes.index(item), "default"),
                        f"give {item.name!r} a default or move it before {defaulted.name!r}",
                    )
                else:
                    key, fix = (
                        ("inputs", self.inputs.index(item), "name"),
                        f"move {defaulted.name!r} after it (after: {item.name})",
                    )
                raise _fail(
                    op,
                    key,
                    f"{'attribute' if isinstance(item, Attribute) else 'input'} {item.name!r} has"
                    f" no default but follows {defaulted.name!r}, which has one; torch schemas need"
                    f" defaults last; fix: {fix}.",
                )

    def _check_node(self, op: str) -> None:
        node_placed = any(ref == NODE for _, _, ref in self.translations)
        if self.op_type is None:
            for field in ("kernel", "native", "function", "node_attributes"):
                if getattr(self, field):
                    raise _fail(
                        op,
                        (field,),
                        f"{field} is given but op_type is not: it belongs to a custom node; fix:"
                        " add op_type (the ONNX node type).",
                    )
            if node_placed:
                raise _fail(
                    op,
                    ("translations",),
                    f"places the custom node ({NODE!r}) but op_type is not given; fix: add op_type"
                    f" or drop {NODE!r}.",
                )
            if not self.translations:
                raise _fail(
                    op,
                    ("op_type",),
                    "has neither op_type (a custom node) nor translations (standard ops); fix:"
                    " declare at least one.",
                )
            return
        if not isinstance(self.op_type, str) or not _IDENT.match(self.op_type):
            raise _fail(
                op,
                ("op_type",),
                f"op_type {self.op_type!r} is not an ONNX node type; expected an identifier such as"
                " 'ScaleAdd'.",
            )
        domain = self.domain
        if not isinstance(domain, str) or (
            domain and not re.match(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$", domain)
        ):
            raise _fail(
                op,
                ("domain",),
                f"domain {domain!r} is not an ONNX domain; expected e.g. 'acme' or 'com.acme'.",
            )
        if domain in _DEFAULT_DOMAINS:
            import onnx.defs

            clash = onnx.defs.has(self.op_type, "")
            what = (
                f"collides with the standard ONNX op {self.op_type!r}"
                if clash
                else "would sit in the default ONNX domain, where runtimes only serve standard ops"
            )
            raise _fail(
                op,
                ("domain",),
                f"node {self.op_type!r} in domain {domain!r} {what}; expected a custom domain; fix:"
                f" drop domain: (it defaults to {self.name.split('::')[0]!r}) or name your own.",
            )
        from onnx_custom.runtime.kernel_spec import RESERVED_DOMAINS

        if domain in RESERVED_DOMAINS:
            raise _fail(
                op,
                ("domain",),
                f"domain {domain!r} belongs to ONNX Runtime; expected your own domain, e.g."
                f" {self.name.split('::')[0]!r}.",
            )
        if isinstance(self.native, str) and self.native != self.node_type:
            raise _fail(
                op,
                ("native",),
                f"native is {self.native!r}; expected true or this spec's node {self.node_type!r}"
                " (the native library serves the node the spec emits).",
            )

    def _check_outputs(self, op: str) -> None:
        inputs = {i.name: i for i in self.inputs}
        attrs = {a.name for a in self.attributes}
        if self.shape is not None and any(o.shape is not None for o in self.outputs):
            raise _fail(
                op,
                ("shape",),
                "has both a meta function (shape) and per-output shape rules; fix: keep one.",
            )
        rules: list[ShapeRule | None] = []
        for index, output in enumerate(self.outputs):
            key = ("outputs", index)
            rules.append(None)
            if isinstance(output.dtype, str):
                if not output.dtype.startswith("like:") or output.dtype[5:] not in inputs:
                    raise _fail(
                        op,
                        (*key, "dtype"),
                        f"output {output.name!r} has dtype {output.dtype!r}; expected a dtype list"
                        f" or 'like:<input>' with an input from {sorted(inputs)}.",
                    )
            elif output.dtype is not None:
                _check_dtypes(op, (*key, "dtype"), output.dtype)
                self.dtype_source(index)  # ambiguous lists fail here, at declaration
            if output.shape is None:
                continue
            try:
                rule = parse_shape_rule(output.shape)
            except RuleError as exc:
                raise _fail(op, (*key, "shape"), f"output {output.name!r}: {exc}") from None
            rules[index] = rule
            unknown = sorted(rule.names - set(inputs) - attrs)
            if unknown:
                raise _fail(
                    op,
                    (*key, "shape"),
                    f"output {output.name!r}: shape rule {output.shape!r} names {unknown}, which"
                    f" are neither inputs {sorted(inputs)} nor attributes {sorted(attrs)}; fix: use"
                    " those names.",
                )
            if isinstance(rule, ExpressionRule):
                bad = sorted(
                    n
                    for n in rule.names
                    if n in attrs and self.attribute(n).type in ("str", "str[]", "float", "float[]")
                )
                if bad:
                    raise _fail(
                        op,
                        (*key, "shape"),
                        f"output {output.name!r}: shape rule {output.shape!r} uses non-integer"
                        f" attribute(s) {bad}; expected int, bool or int[] attributes.",
                    )
        object.__setattr__(self, "_shape_rules", tuple(rules))

    def _check_schema_round_trip(self, op: str) -> None:
        """The schema string must parse and give back exactly the declared defaults."""
        try:
            parsed = torch._C.parse_schema(f"{self.name}{self.schema}")
        except RuntimeError as exc:
            raise _fail(
                op,
                ("attributes",),
                f"the generated torch schema {self.schema!r} does not parse:"
                f" {str(exc).strip().splitlines()[0]}.",
            ) from None
        for item, arg in zip(self.arguments, parsed.arguments, strict=True):
            if not isinstance(item, Attribute) or not item.has_default:
                continue
            got = arg.default_value
            want = list(item.default) if isinstance(item.default, tuple) else item.default
            if got != want or type(got) is not type(want):
                raise _fail(
                    op,
                    ("attributes", self.attributes.index(item), "default"),
                    f"attribute {item.name!r}: the torch schema cannot express the default"
                    f" {item.default!r} (it reads back as {got!r}); fix: use a plainer default or"
                    " none.",
                )

    # -- derived -----------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self.name.split("::")[0]

    @property
    def op_name(self) -> str:
        return self.name.split("::")[1]

    @property
    def node_type(self) -> str | None:
        """``"domain::OpType"`` of the custom node, or None (standard translations only)."""
        return None if self.op_type is None else f"{self.domain}::{self.op_type}"

    @property
    def arguments(self) -> tuple[Input | Attribute, ...]:
        """The torch op's arguments in schema order: inputs, each attribute after its ``after``
        input (or after every input)."""
        out: list[Input | Attribute] = []
        for item in self.inputs:
            out.append(item)
            out += [a for a in self.attributes if a.after == item.name]
        return (*out, *(a for a in self.attributes if a.after is None))

    @property
    def schema(self) -> str:
        """The torch schema (without the name): ``(Tensor x, float alpha=2.0) -> Tensor``."""
        parts: list[str] = []
        arguments = self.arguments
        for index, item in enumerate(arguments):
            if isinstance(item, Input):
                text = f"{item.torch_type} {item.name}"
                # `Tensor? b=None` only when everything after it has a default (torch's rule).
                if item.optional and all(
                    _has_schema_default(later) for later in arguments[index + 1 :]
                ):
                    text += "=None"
            else:
                text = f"{item.type} {item.name}"
                if item.has_default:
                    text += f"={_schema_literal(item.default)}"
            parts.append(text)
        returns = (
            "Tensor"
            if len(self.outputs) == 1
            else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        )
        return f"({', '.join(parts)}) -> {returns}"

    @property
    def translation_refs(self) -> tuple[tuple[int, str, Ref], ...]:
        """``(opset, variant, translation)`` triples, lowest opset first (``"node"``: the custom
        node's place)."""
        return self.translations  # type: ignore[no-any-return]  # normalized in __post_init__

    def node_placements(self) -> tuple[tuple[int, str], ...]:
        """``(opset, variant)`` of every registry entry of the custom-node translation: where
        ``"node"`` places it (default: opset 1, variant ``"custom"`` when default-variant standard
        translations exist, else ``"default"``), and again at every later opset where another
        translation starts, so that the registry, which picks the highest opset first and a
        variant among the entries there, can still choose the node there."""
        if self.op_type is None:
            return ()
        triples = self.translation_refs
        placed = next(((o, v) for o, v, ref in triples if ref == NODE), None)
        if placed is None:
            standard_default = any(v == DEFAULT_VARIANT for _, v, _ in triples)
            placed = (1, "custom" if standard_default else DEFAULT_VARIANT)
        first, variant = placed
        taken = {(o, v) for o, v, ref in triples if ref != NODE}
        later = sorted({o for o, _, _ in triples if o > first})
        return ((first, variant), *((o, variant) for o in later if (o, variant) not in taken))

    def input(self, name: str) -> Input:
        return next(i for i in self.inputs if i.name == name)

    def attribute(self, name: str) -> Attribute:
        return next(a for a in (*self.attributes, *self.node_attributes) if a.name == name)

    def shape_rule(self, index: int) -> ShapeRule | None:
        """Output ``index``'s rule, parsed once when the spec was made (None: no rule)."""
        if self._shape_rules:
            return self._shape_rules[index]
        text = self.outputs[index].shape  # during __post_init__, before the rules are stored
        return None if text is None else parse_shape_rule(text)

    def dtype_source(self, index: int) -> tuple[str, str]:
        """How output ``index`` gets its dtype: ``("like", input)`` or ``("fixed", dtype)``."""
        output = self.outputs[index]
        if output.dtype is None:
            return ("like", self.inputs[0].name)
        if isinstance(output.dtype, str):
            return ("like", output.dtype[len("like:") :])
        if len(output.dtype) == 1:
            return ("fixed", output.dtype[0])
        rule = self.shape_rule(index)
        candidates = ([rule.input] if isinstance(rule, LikeRule) else []) + [
            i.name for i in self.inputs
        ]
        for name in candidates:
            if set(self.input(name).dtypes) == set(output.dtype):
                return ("like", name)
        raise _fail(
            self.name,
            ("outputs", index, "dtype"),
            f"output {output.name!r} may be any of {list(output.dtype)}, but no input has that"
            " dtype list, so its dtype is ambiguous; fix: write dtype: 'like:<input>' or a single"
            " dtype.",
        )

    def output_dtypes(self, index: int) -> tuple[str, ...]:
        """Dtypes output ``index`` can have (for the ONNX schema's type constraint)."""
        kind, value = self.dtype_source(index)
        return (value,) if kind == "fixed" else self.input(value).dtypes

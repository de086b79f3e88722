"""Op specs from YAML, in the op-plugin style (``op_name``, ``op_type``, ``input_desc``,
``output_desc``, ``attr_desc``) plus onnx-custom's keys. A file holds a list of ops (or one op)::

    - op_name: "acme::scale_add"          # qualified torch op name (required)
      op_type: "ScaleAdd"                 # ONNX node type of the custom node
      domain: "acme"                      # its ONNX domain (default: the torch namespace)
      doc: "alpha * x + y"                # documentation (kernel and OpSchema doc)
      input_desc:                         # tensor inputs, in order (required)
        - {name: x, dtype: [float32, float16], format: ND}
        - {name: bias, dtype: [float32], optional: true}   # or name: "bias?"
      output_desc:                        # tensor outputs (required)
        - {name: out, dtype: [float32, float16], shape: "like:x"}
      attr_desc:                          # non-tensor arguments -> typed ONNX attributes
        - {name: alpha, dtype: float, default_value: 2.0}
      node_attr_desc:                     # constants on the custom node, not torch arguments
        - {name: beta, dtype: float, value: 1.0}
      impl: "acme_ops:scale_add"          # eager math on torch tensors: impl(x, y, *, alpha)
      check: "acme_ops:check_scale_add"   # validator: check(x, y, alpha), eager and fake
      devices: [cpu, cuda]                # device types impl serves (default: all)
      kernel: "acme_ops:scale_add_np"     # ONNX Runtime kernel math on numpy arrays (or: eager)
      backward: "acme_ops:scale_add_bwd"  # backward(ctx, *grads) -> one grad per argument
      setup_context: "acme_ops:save"      # setup_context(ctx, inputs, output)
      shape: "acme_ops:scale_add_meta"    # meta function instead of per-output shape rules
      native: true                        # libonnx_custom_ops.so serves the node too, or the
                                          # user's C++ kernel (onnx_custom/kernel.h), source
                                          # relative to this file:
      # native: {source: acme_kernels.cpp, function: scale_add}
      function: "acme_ops:scale_add_fn"   # ONNX function body (FunctionProto, builder or
                                          # translation)
      translations:                       # standard-op translations, each from its opset on
        13: "acme_onnx:scale_add_13"
        18: {default: "acme_onnx:scale_add_18", custom: node}   # by variant; node: the custom node

The op-plugin files of the op-adaptation articles load as written:

* a bare ``op_name`` (``custom_linear``) is the torch op ``custom::custom_linear``: the default
  namespace is ``custom`` (`DEFAULT_NAMESPACE`; ``load_specs(path, namespace="npu")`` picks
  another), and the node's domain defaults to that namespace (``custom::CustomLinear``);
* ``format`` is a layout label or a list of them (one per dtype, ``[ND, ND]``), kept on the
  spec's `Input`/`Output` as documentation; ``param_type`` (``required``, ``optional``,
  ``dynamic``) means what ``optional``/``variadic`` mean;
* dtype lists may use the vendor spellings ``fp16``, ``fp32``, ``float``, ``half``, ``double``,
  ``fp64``, ``bf16`` (read as float16, float32, float32, float16, float64, float64, bfloat16).

A vendor key with a value of the wrong type is a `SpecError` like any other key.

Keys of ``input_desc`` items: ``name`` (required; ``?`` suffix optional, ``*`` variadic),
``dtype`` (list of dtype names, default all), ``format`` (layout label or list of them,
documentation only), ``param_type``, ``optional``, ``variadic`` (booleans), ``doc``.
``output_desc`` items: ``name``, ``dtype`` (a list, or ``"like:<input>"``; default like the first
input), ``shape`` (``"like:x"``, ``"broadcast"``, or an expression such as ``"[x.0, w.0]"``),
``format``, ``param_type`` (``required`` only), ``doc``. ``attr_desc``
items: ``name``, ``dtype`` (int, float, bool, str, int[], float[], str[]; also listInt,
listFloat, listStr), ``default_value``, ``after`` (the input it follows in the torch schema;
default: after every input), ``node_default`` (what a node without it means, when the torch
schema has no default), ``doc``. ``node_attr_desc`` items: ``name``, ``dtype``, ``value`` (the
constant every node carries), ``doc``.

``kernel: eager`` runs the eager torch op as the node's kernel. ``translations`` maps an opset
to a translation or to ``{variant: translation}``; ``node`` in place of a translation says where
the custom-node translation goes (default: opset 1, variant ``custom`` when default-variant
translations exist, else ``default``). A ``function`` that takes the graph builder first is a
translation used as the body, valid from the first opset ``translations`` use it at.

Unknown keys, wrong value types, duplicate keys and everything `OpSpec` refuses are reported as a
`SpecError` naming the file, the line and the key.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from onnx_custom.spec.native_source import native_field
from onnx_custom.spec.spec import NO_DEFAULT, Attribute, Input, OpSpec, Output, SpecError

__all__ = ["DEFAULT_NAMESPACE", "DTYPE_ALIASES", "YAML_KEYS", "load_specs", "parse_specs"]

DEFAULT_NAMESPACE = "custom"
"""The torch namespace (and so the default node domain) of a bare ``op_name``."""

DTYPE_ALIASES: dict[str, str] = {
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "double": "float64",
    "fp64": "float64",
    "bf16": "bfloat16",
}
"""Vendor dtype spellings of op-plugin files, read as our dtype names."""
_PARAM_TYPES = ("required", "optional", "dynamic")

_STR, _BOOL, _LIST, _MAP = "a string", "a boolean", "a list", "a mapping"
_FORMAT = "a layout label (ND, NCHW, ...) or a list of them"
_PARAM_TYPE = "one of required, optional, dynamic"
_OP_KEYS: dict[str, str] = {
    "op_name": _STR,
    "op_type": _STR,
    "domain": _STR,
    "doc": _STR,
    "input_desc": _LIST,
    "output_desc": _LIST,
    "attr_desc": _LIST,
    "impl": _STR,
    "kernel": _STR,
    "backward": _STR,
    "setup_context": _STR,
    "shape": _STR,
    "native": "a boolean, 'domain::OpType' or {source, function}",
    "function": _STR,
    "translations": _MAP,
    "node_attr_desc": _LIST,
    "check": _STR,
    "devices": "a list of device types",
}
_ITEM_KEYS: dict[str, dict[str, str]] = {
    "input_desc": {
        "name": _STR,
        "dtype": "a dtype list",
        "format": _FORMAT,
        "param_type": _PARAM_TYPE,
        "optional": _BOOL,
        "variadic": _BOOL,
        "doc": _STR,
    },
    "output_desc": {
        "name": _STR,
        "dtype": "a dtype list or 'like:<input>'",
        "shape": _STR,
        "format": _FORMAT,
        "param_type": _PARAM_TYPE,
        "doc": _STR,
    },
    "attr_desc": {
        "name": _STR,
        "dtype": _STR,
        "default_value": "a value",
        "after": _STR,
        "node_default": "a value",
        "doc": _STR,
    },
    "node_attr_desc": {"name": _STR, "dtype": _STR, "value": "a value", "doc": _STR},
}
YAML_KEYS: dict[str, Any] = {**_OP_KEYS, **{k: dict(v) for k, v in _ITEM_KEYS.items()}}
"""Every accepted key with the type it takes (item keys nested under their list key)."""

# OpSpec field -> YAML key, to point errors raised by OpSpec at the right line.
_FIELD_TO_KEY = {
    "name": "op_name",
    "inputs": "input_desc",
    "outputs": "output_desc",
    "attributes": "attr_desc",
    "node_attributes": "node_attr_desc",
}
_ITEM_FIELD_TO_KEY = {"type": "dtype", "default": "default_value"}

_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    _STR: lambda v: isinstance(v, str),
    _BOOL: lambda v: isinstance(v, bool),
    _LIST: lambda v: isinstance(v, list),
    _MAP: lambda v: isinstance(v, dict),
    "a boolean, 'domain::OpType' or {source, function}": lambda v: isinstance(v, (bool, str, dict)),
    "a dtype list": lambda v: (
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(d, str) for d in v))
    ),
    "a dtype list or 'like:<input>'": lambda v: (
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(d, str) for d in v))
    ),
    "a value": lambda v: True,
    _FORMAT: lambda v: (
        isinstance(v, str)
        or (isinstance(v, list) and bool(v) and all(isinstance(f, str) for f in v))
    ),
    _PARAM_TYPE: lambda v: v in _PARAM_TYPES,
    "a list of device types": lambda v: isinstance(v, list) and all(isinstance(d, str) for d in v),
}


class _Document:
    """A composed YAML document: values constructed on demand, marks kept for every key."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.loader = yaml.SafeLoader(text)
        try:
            self.root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise SpecError(
                f"not valid YAML: {exc.problem or exc}; fix: correct the YAML syntax there",
                file=path,
                line=None if mark is None else mark.line + 1,
            ) from None
        except yaml.YAMLError as exc:
            raise SpecError(f"not valid YAML: {exc}", file=path) from None

    def value(self, node: yaml.Node, op: str = "", label: str = "") -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise self.error(
                node,
                f"cannot read this value: {exc.problem}; fix: write plain YAML (strings, numbers,"
                " lists, mappings).",
                op,
                label,
            ) from None

    def error(self, node: yaml.Node | None, message: str, op: str = "", key: str = "") -> SpecError:
        line = None if node is None else node.start_mark.line + 1
        where = f"key {key}: " if key else ""
        return SpecError(f"{where}{message}", op=op, file=self.path, line=line)

    def mapping(
        self, node: yaml.Node, what: str, allowed: dict[str, str], op: str, prefix: str
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Key -> (key node, value node); unknown, duplicate and non-string keys are errors."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(
                node,
                f"{what} must be a mapping of keys such as {', '.join(list(allowed)[:4])}; received"
                f" {_kind(node)}.",
                op,
                prefix,
            )
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node)
            label = f"{prefix}.{key}" if prefix else str(key)
            if not isinstance(key, str) or key not in allowed:
                hint = _suggest(str(key), allowed)
                raise self.error(
                    key_node,
                    f"unknown key {key!r} in {what}; {hint}expected one of {', '.join(allowed)};"
                    " fix: rename or remove it.",
                    op,
                    label,
                )
            if key in out:
                raise self.error(
                    key_node, f"key {key!r} appears twice in {what}; fix: keep one.", op, label
                )
            out[key] = (key_node, value_node)
        return out

    def typed(
        self,
        entries: dict[str, tuple[yaml.Node, yaml.Node]],
        key: str,
        expected: str,
        op: str,
        label: str,
    ) -> Any:
        _, node = entries[key]
        value = self.value(node, op, label)
        if not _TYPE_CHECKS[expected](value):
            raise self.error(
                node,
                f"expected {expected}; received {type(value).__name__} {value!r}; fix: write"
                f" {expected} here.",
                op,
                label,
            )
        return value


def _suggest(key: str, allowed: dict[str, str]) -> str:
    """'did you mean ...? ' for a misspelt or abbreviated/expanded key
    ('' when nothing is close)."""
    close = [k for k in allowed if k.startswith(key)][:1]  # an abbreviation first ('default')
    close = close or difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    close = close or [k for k in allowed if key.startswith(k)][:1]
    return f"did you mean {close[0]!r}? " if close else ""


def _kind(node: yaml.Node) -> str:
    return {
        yaml.ScalarNode: "a scalar",
        yaml.SequenceNode: "a list",
        yaml.MappingNode: "a mapping",
    }.get(type(node), type(node).__name__)


class _ParsedOp:
    """One op entry: its spec plus the nodes needed to place later errors on a line."""

    def __init__(
        self, spec: OpSpec, node: yaml.Node, index: dict[tuple[Any, ...], yaml.Node]
    ) -> None:
        self.spec, self.node, self.index = spec, node, index

    def locate(self, key: tuple[Any, ...]) -> tuple[yaml.Node, str]:
        """The deepest node recorded for ``key`` (an OpSpec field path) and its YAML label."""
        path = _yaml_path(key)
        for end in range(len(path), 0, -1):
            node = self.index.get(tuple(path[:end]))
            if node is not None:
                return node, _label(path[:end])
        return self.node, ""


def _yaml_path(key: tuple[Any, ...]) -> list[Any]:
    path: list[Any] = [_FIELD_TO_KEY.get(key[0], key[0])] if key else []
    renames = (
        {**_ITEM_FIELD_TO_KEY, "default": "value"}
        if path[:1] == ["node_attr_desc"]
        else _ITEM_FIELD_TO_KEY
    )
    for part in key[1:]:
        path.append(
            renames.get(part, part)
            if isinstance(part, str) and path[:1] != ["translations"]
            else part
        )
    return path


def _label(path: Sequence[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) and text else f".{part}" if text else str(part)
    return text


def _dtypes(value: Any) -> Any:
    """A dtype list with the vendor spellings (`DTYPE_ALIASES`) read as ours."""
    if isinstance(value, list):
        return [DTYPE_ALIASES.get(d, d) for d in value]
    return DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


def _kind_flags(
    doc: _Document, item: dict[str, Any], key: str, node: yaml.Node, op: str
) -> tuple[bool, bool]:
    """(optional, variadic) of an input_desc/output_desc item, from param_type or the flags."""
    optional, variadic = item.get("optional", False), item.get("variadic", False)
    kind = item.get("param_type")
    if kind is None:
        return optional, variadic
    if key == "output_desc" and kind != "required":
        raise doc.error(
            node,
            f"param_type {kind!r} on an output; expected required (outputs cannot be optional or"
            " dynamic); fix: drop it or write required.",
            op,
            f"{key}.param_type",
        )
    if (optional and kind != "optional") or (variadic and kind != "dynamic"):
        raise doc.error(
            node,
            f"param_type {kind!r} contradicts optional/variadic; expected one of the two spellings;"
            " fix: keep param_type only.",
            op,
            f"{key}.param_type",
        )
    return kind == "optional", kind == "dynamic"


def _parse_op(
    doc: _Document, node: yaml.Node, position: int, namespace: str = DEFAULT_NAMESPACE
) -> _ParsedOp:
    index: dict[tuple[Any, ...], yaml.Node] = {}
    entries = doc.mapping(node, f"op entry {position}", _OP_KEYS, "", "")
    op = _op_name(doc, node, entries, position, namespace)
    values: dict[str, Any] = {}
    for key, (key_node, value_node) in entries.items():
        index[(key,)] = value_node if isinstance(value_node, yaml.ScalarNode) else key_node
        values[key] = doc.typed(entries, key, _OP_KEYS[key], op, key)
    items = _parse_items(doc, node, entries, op, index)
    _index_translations(doc, entries, index)
    for n, item in enumerate(items["output_desc"]):
        _kind_flags(doc, item, "output_desc", index[("output_desc", n)], op)
    try:
        spec = _op_spec(doc, node, op, values, items, index)
    except SpecError as exc:
        raise _placed(doc, _ParsedOp(None, node, index), exc) from None  # type: ignore[arg-type]
    return _ParsedOp(spec, node, index)


def _op_name(
    doc: _Document,
    node: yaml.Node,
    entries: dict[str, tuple[yaml.Node, yaml.Node]],
    position: int,
    namespace: str,
) -> str:
    """The entry's qualified op name (``namespace::op`` when the entry names the op alone)."""
    if "op_name" not in entries:
        raise doc.error(
            node,
            f"op entry {position} has no op_name; expected e.g. op_name: 'acme::scale_add'.",
            key="op_name",
        )
    op = str(doc.value(entries["op_name"][1]))
    if ":" not in op:  # the op-plugin style names the op alone
        op = f"{namespace}::{op}"
    return op


def _parse_items(
    doc: _Document,
    node: yaml.Node,
    entries: dict[str, tuple[yaml.Node, yaml.Node]],
    op: str,
    index: dict[tuple[Any, ...], yaml.Node],
) -> dict[str, list[dict[str, Any]]]:
    """The entry's input/output/attribute lists, each item type-checked and indexed."""
    items: dict[str, list[dict[str, Any]]] = {}
    for list_key in ("input_desc", "output_desc", "attr_desc", "node_attr_desc"):
        if list_key not in entries:
            if list_key in ("input_desc", "output_desc"):
                raise doc.error(
                    node,
                    f"op {op} has no {list_key}; expected a list of {{name: ..., dtype: ...}}"
                    " entries.",
                    op,
                    list_key,
                )
            continue
        items[list_key] = [
            _parse_item(doc, item_node, list_key, i, op, index)
            for i, item_node in enumerate(entries[list_key][1].value)
        ]
    return items


def _parse_item(
    doc: _Document,
    item_node: yaml.Node,
    list_key: str,
    i: int,
    op: str,
    index: dict[tuple[Any, ...], yaml.Node],
) -> dict[str, Any]:
    item_entries = doc.mapping(
        item_node, f"{list_key}[{i}]", _ITEM_KEYS[list_key], op, f"{list_key}[{i}]"
    )
    index[(list_key, i)] = item_node
    item: dict[str, Any] = {}
    for key, (_, value_node) in item_entries.items():
        index[(list_key, i, key)] = value_node
        item[key] = doc.typed(
            item_entries, key, _ITEM_KEYS[list_key][key], op, f"{list_key}[{i}].{key}"
        )
    if "name" not in item:
        raise doc.error(
            item_node,
            f"{list_key}[{i}] has no name; expected e.g. {{name: x, dtype: [float32]}}.",
            op,
            f"{list_key}[{i}].name",
        )
    return item


def _index_translations(
    doc: _Document,
    entries: dict[str, tuple[yaml.Node, yaml.Node]],
    index: dict[tuple[Any, ...], yaml.Node],
) -> None:
    if "translations" in entries:
        for key_node, value_node in entries["translations"][1].value:
            opset = doc.value(key_node)
            index[("translations", opset)] = value_node
            if isinstance(value_node, yaml.MappingNode):  # {variant: translation}
                for variant_node, ref_node in value_node.value:
                    index[("translations", opset, doc.value(variant_node))] = ref_node


def _op_spec(
    doc: _Document,
    node: yaml.Node,
    op: str,
    values: dict[str, Any],
    items: dict[str, list[dict[str, Any]]],
    index: dict[tuple[Any, ...], yaml.Node],
) -> OpSpec:
    return OpSpec(
        name=op,
        op_type=values.get("op_type"),
        domain=values.get("domain"),
        doc=values.get("doc", ""),
        inputs=tuple(
            Input(
                i["name"],
                _dtypes(i.get("dtype")),
                *_kind_flags(doc, i, "input_desc", index[("input_desc", n)], op),
                i.get("format"),
                i.get("doc", ""),
            )
            for n, i in enumerate(items["input_desc"])
        ),
        outputs=tuple(
            Output(
                o["name"],
                _dtypes(o.get("dtype")),
                o.get("shape"),
                o.get("format"),
                o.get("doc", ""),
            )
            for o in items["output_desc"]
        ),
        attributes=tuple(
            Attribute(
                a["name"],
                a.get("dtype", ""),
                a.get("default_value", NO_DEFAULT),
                a.get("doc", ""),
                a.get("after"),
                a.get("node_default", NO_DEFAULT),
            )
            for a in items.get("attr_desc", [])
        ),
        node_attributes=tuple(
            Attribute(a["name"], a.get("dtype", ""), a.get("value", NO_DEFAULT), a.get("doc", ""))
            for a in items.get("node_attr_desc", [])
        ),
        check=values.get("check"),
        devices=tuple(values.get("devices", ())),
        impl=values.get("impl"),
        kernel=values.get("kernel"),
        backward=values.get("backward"),
        setup_context=values.get("setup_context"),
        shape=values.get("shape"),
        native=native_field(op, values.get("native", False), Path(doc.path).resolve().parent),
        function=values.get("function"),
        translations=values.get("translations", {}),
        source=f"{doc.path}:{node.start_mark.line + 1}",
    )


def _placed(doc: _Document, parsed: _ParsedOp, exc: SpecError) -> SpecError:
    """``exc`` (raised by OpSpec or registration) with the file, line and YAML key of its key."""
    node, label = parsed.locate(exc.key)
    return doc.error(node, exc.detail, exc.op, label)


def _files(path: str | os.PathLike[str]) -> list[Path]:
    if not isinstance(path, (str, os.PathLike)):
        raise SpecError(
            "load_specs expects a path to a YAML file or a folder of them; received"
            f" {type(path).__name__}."
        )
    target = Path(path)
    if target.is_dir():
        files = sorted([*target.glob("*.yaml"), *target.glob("*.yml")])
        if not files:
            raise SpecError(
                f"folder {str(target)!r} holds no *.yaml/*.yml files; expected op spec files"
                " there.",
                file=str(target),
            )
        return files
    if not target.is_file():
        raise SpecError(
            f"op spec file {str(target)!r} does not exist (not found); fix: check the path.",
            file=str(target),
        )
    return [target]


def _check_namespace(namespace: Any) -> str:
    if not isinstance(namespace, str) or not namespace.isidentifier():
        raise SpecError(
            "namespace must be a torch namespace (a Python identifier such as 'custom' or 'npu');"
            f" received {namespace!r}; fix: pass e.g. namespace='npu'."
        )
    return namespace


def _parse_file(
    path: Path, namespace: str = DEFAULT_NAMESPACE
) -> list[tuple[_Document, _ParsedOp]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            f"cannot read the op spec file: {exc}; expected a UTF-8 YAML file.", file=str(path)
        ) from None
    doc = _Document(str(path), text)
    root = doc.root
    if root is None:
        raise SpecError(
            "the file is empty; expected a list of ops (- op_name: ...).", file=str(path), line=1
        )
    nodes = root.value if isinstance(root, yaml.SequenceNode) else [root]
    parsed = [(doc, _parse_op(doc, node, i, namespace)) for i, node in enumerate(nodes)]
    names: dict[str, int] = {}
    for _, op in parsed:
        if op.spec.name in names:
            raise doc.error(
                op.node,
                f"op {op.spec.name} is declared twice in this file (also at line"
                f" {names[op.spec.name]}); fix: keep one.",
                op.spec.name,
                "op_name",
            )
        names[op.spec.name] = op.node.start_mark.line + 1
    return parsed


def parse_specs(
    path: str | os.PathLike[str], *, namespace: str = DEFAULT_NAMESPACE
) -> list[OpSpec]:
    """The specs a YAML file (or folder of them) declares, validated but not registered.
    ``namespace``: the torch namespace of bare op names (`DEFAULT_NAMESPACE`)."""
    namespace = _check_namespace(namespace)
    return [op.spec for file in _files(path) for _, op in _parse_file(file, namespace)]


def load_specs(path: str | os.PathLike[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[OpSpec]:
    """Load the specs of a YAML file (or a folder of ``*.yaml``) and register them all.

    All or nothing: if one fails to register, those registered by this call are unregistered
    again. Errors are `SpecError`s naming the file, line and key. Returns the specs in file order.
    ``namespace``: the torch namespace of bare op names (`DEFAULT_NAMESPACE`).
    """
    from onnx_custom.spec.generate import register_spec

    namespace = _check_namespace(namespace)
    parsed = [entry for file in _files(path) for entry in _parse_file(file, namespace)]
    done: list[Any] = []
    try:
        for doc, op in parsed:
            try:
                done.append(register_spec(op.spec))
            except SpecError as exc:
                raise _placed(doc, op, exc) from None
    except BaseException:
        for registration in reversed(done):
            registration.unregister()
        raise
    return [op.spec for _, op in parsed]

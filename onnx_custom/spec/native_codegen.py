"""C++ registration code for user kernels: one op spec + one C++ function -> one ORT custom op.

For every spec whose ``native`` is a `NativeKernel`, `generate` writes a class that reads the
spec's attributes (with their defaults) at kernel creation, checks the inputs' dtypes against
the spec's lists, allocates the outputs from the shape rules, calls the user's function with
``onnx_custom::Tensor<T>`` views (``onnx_custom/kernel.h``) and declares output types and
shapes to ONNX Runtime at graph time. The runtime it calls is ``ort_kernels/native/binding.h``.

Inputs sharing one dtype list of several dtypes share one template parameter; the function is
called once per combination of those parameters (``scale_add(x, y, out, alpha)``, deduced), so
a template kernel is instantiated exactly at the spec's dtypes. Shape rules (``like:x``,
``broadcast`` and expressions without comprehensions) become a C++ template evaluated on
run-time sizes and on graph-time dims; an output without a rule is allocated by the kernel.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnx_custom.errors import SpecError
from onnx_custom.spec.native_source import NativeKernel
from onnx_custom.spec.shape_rules import BroadcastRule, ExpressionRule, LikeRule
from onnx_custom.spec.spec import NO_DEFAULT, Attribute, OpSpec

__all__ = [
    "CPP_TYPES",
    "GeneratedOp",
    "GeneratedSource",
    "check_sources",
    "expected_signature",
    "generate_source",
    "user_ops_source",
]

# dtype name -> (C++ storage type, ONNX element constant of onnx_custom_ort_abi.h)
CPP_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "OC_ELEM_FLOAT"),
    "float64": ("double", "OC_ELEM_DOUBLE"),
    "float16": ("onnx_custom::float16", "OC_ELEM_FLOAT16"),
    "bfloat16": ("onnx_custom::bfloat16", "OC_ELEM_BFLOAT16"),
    "int8": ("int8_t", "OC_ELEM_INT8"),
    "int16": ("int16_t", "OC_ELEM_INT16"),
    "int32": ("int32_t", "OC_ELEM_INT32"),
    "int64": ("int64_t", "OC_ELEM_INT64"),
    "uint8": ("uint8_t", "OC_ELEM_UINT8"),
    "uint16": ("uint16_t", "OC_ELEM_UINT16"),
    "uint32": ("uint32_t", "OC_ELEM_UINT32"),
    "uint64": ("uint64_t", "OC_ELEM_UINT64"),
    "bool": ("bool", "OC_ELEM_BOOL"),
}
# spec attribute type -> (C++ type of the kernel parameter, binding reader)
_ATTR_CPP: dict[str, tuple[str, str]] = {
    "int": ("int64_t", "attr_int"),
    "bool": ("bool", "attr_bool"),
    "float": ("float", "attr_float"),
    "str": ("std::string", "attr_string"),
    "int[]": ("std::vector<int64_t>", "attr_ints"),
    "float[]": ("std::vector<float>", "attr_floats"),
    "str[]": ("std::vector<std::string>", "attr_strings"),
}


@dataclasses.dataclass(frozen=True)
class GeneratedOp:
    """Where one op's code sits in its generated file (to attribute compiler errors)."""

    spec: OpSpec
    first_line: int
    last_line: int
    dispatch: tuple[tuple[int, tuple[str, ...]], ...]  # (line, dtype per template parameter)
    call_line: int


@dataclasses.dataclass(frozen=True)
class GeneratedSource:
    """One generated C++ file: the binding of every op whose kernel lives in ``source``."""

    filename: str
    text: str
    source: Path
    adder: str  # C++ function adding the ops to the library
    ops: tuple[GeneratedOp, ...]


def _fail(spec: OpSpec, key: tuple[Any, ...], message: str) -> SpecError:
    return SpecError(
        f"op {spec.name}{f' ({spec.source})' if spec.source else ''}: {message}",
        op=spec.name,
        key=key,
    )


def _groups(spec: OpSpec) -> list[tuple[list[int], tuple[str, ...]]]:
    """Template parameters: inputs with one multi-dtype list share one (spec order)."""
    groups: list[tuple[list[int], tuple[str, ...]]] = []
    for index, item in enumerate(spec.inputs):
        dtypes = item.dtypes
        if len(dtypes) == 1:
            continue
        for members, group_dtypes in groups:
            if set(group_dtypes) == set(dtypes):
                members.append(index)
                break
        else:
            groups.append(([index], tuple(dtypes)))
    return groups


def _input_types(spec: OpSpec, groups: list[tuple[list[int], tuple[str, ...]]]) -> list[str]:
    types = []
    for index, item in enumerate(spec.inputs):
        group = next((g for g, (members, _) in enumerate(groups) if index in members), None)
        types.append(f"T{group}" if group is not None else CPP_TYPES[item.dtypes[0]][0])
    return types


def _output_types(spec: OpSpec, input_types: list[str]) -> list[str]:
    names = [i.name for i in spec.inputs]
    types = []
    for index in range(len(spec.outputs)):
        kind, value = spec.dtype_source(index)
        types.append(input_types[names.index(value)] if kind == "like" else CPP_TYPES[value][0])
    return types


def expected_signature(spec: OpSpec, dtypes: Sequence[str] = ()) -> str:
    """The C++ signature the spec asks of its kernel (template parameters bound to ``dtypes``)."""
    assert isinstance(spec.native, NativeKernel)
    groups = _groups(spec)
    bound = {f"T{g}": CPP_TYPES[d][0].removeprefix("onnx_custom::") for g, d in enumerate(dtypes)}
    in_types = [bound.get(t, t) for t in _input_types(spec, groups)]
    out_types = [bound.get(t, t) for t in _output_types(spec, _input_types(spec, groups))]
    params = []
    for item, typ in zip(spec.inputs, in_types, strict=True):
        params.append(
            f"const std::vector<Tensor<{typ}>>& {item.name}"
            if item.variadic
            else f"const Tensor<{typ}>& {item.name}"
        )
    params += [f"Tensor<{typ}>& {o.name}" for o, typ in zip(spec.outputs, out_types, strict=True)]
    params += [f"{_ATTR_CPP[a.type][0]} {a.name}" for a in _attributes(spec)]
    head = (
        ""
        if dtypes or not groups
        else "template <" + ", ".join(f"typename T{g}" for g in range(len(groups))) + "> "
    )
    return f"{head}void {spec.native.function}({', '.join(params)})"


def _attributes(spec: OpSpec) -> list[Attribute]:
    return [*spec.attributes, *spec.node_attributes]


# ---- literals ------------------------------------------------------------------------------------
def _float(value: float) -> str:
    text = repr(float(value))
    return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"


def _literal(attr: Attribute, value: Any) -> str:
    scalar = attr.type.removesuffix("[]")
    one = {
        "int": lambda v: f"int64_t{{{int(v)}}}",
        "bool": lambda v: "true" if v else "false",
        "float": _float,
        "str": lambda v: json.dumps(v),
    }[scalar]
    if attr.type.endswith("[]"):
        return f"{_ATTR_CPP[attr.type][0]}{{{', '.join(one(v) for v in value)}}}"
    return "std::string(" + one(value) + ")" if scalar == "str" else one(value)


# ---- shape rules ---------------------------------------------------------------------------------
class _RuleTranslator:
    """A shape-rule expression as C++ over ``V`` (a dim) and ``S`` (a shape)."""

    def __init__(self, spec: OpSpec, index: int, rule: ExpressionRule) -> None:
        self.spec, self.index, self.rule = spec, index, rule
        self.text = json.dumps(rule.text)

    def unsupported(self, what: str) -> SpecError:
        return _fail(
            self.spec,
            ("outputs", self.index, "shape"),
            f"the native binding cannot translate {what} in shape rule {self.rule.text!r} of output"
            f" {self.spec.outputs[self.index].name!r} to C++; it translates input shapes,"
            " int/bool/int[] attributes, x.0 / x[-1] / x[a:b] with literal indices, [..] with"
            " *unpacking, + - * // %, len, max, min; fix: simplify the rule, or drop it and"
            " allocate the output in the kernel (out.allocate(shape)).",
        )

    def literal_int(self, node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return int(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.literal_int(node.operand)
            return None if inner is None else -inner
        return None

    def visit(self, node: ast.AST) -> tuple[str, str]:
        if isinstance(node, ast.Name):
            inputs = {i.name: i for i in self.spec.inputs}
            if node.id in inputs:
                if inputs[node.id].variadic:
                    raise self.unsupported(f"the variadic input {node.id!r}")
                return "S", f"a_{node.id}"
            attr = self.spec.attribute(node.id)
            if attr.type in ("int", "bool"):
                return "V", f"a_{node.id}"
            if attr.type == "int[]":
                return "S", f"a_{node.id}"
            raise self.unsupported(f"the {attr.type} attribute {node.id!r}")
        value = self.literal_int(node)
        if value is not None:
            return "V", f"oc::binding::lit<V>({value})"
        if isinstance(node, ast.List):
            parts = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    kind, code = self.visit(elt.value)
                    if kind != "S":
                        raise self.unsupported("*unpacking of a dim")
                    parts.append(code)
                else:
                    kind, code = self.visit(elt)
                    if kind != "V":
                        raise self.unsupported("a nested list")
                    parts.append(f"S{{{code}}}")
            return "S", f"oc::binding::cat<S>({{{', '.join(parts)}}})" if parts else "S{}"
        if isinstance(node, ast.Subscript):
            kind, base = self.visit(node.value)
            if kind != "S":
                raise self.unsupported("indexing a dim")
            if isinstance(node.slice, ast.Slice):
                if node.slice.step is not None:
                    raise self.unsupported("a slice step")
                bounds = []
                for bound in (node.slice.lower, node.slice.upper):
                    number = None if bound is None else self.literal_int(bound)
                    if bound is not None and number is None:
                        raise self.unsupported("a computed slice bound")
                    bounds += ["false", "0"] if number is None else ["true", str(number)]
                return "S", f"oc::binding::slice({base}, {', '.join(bounds)})"
            number = self.literal_int(node.slice)
            if number is None:
                raise self.unsupported("a computed index")
            return "V", f"oc::binding::at({base}, {number}, {self.text})"
        if isinstance(node, ast.BinOp):
            (lk, left), (rk, right) = self.visit(node.left), self.visit(node.right)
            if isinstance(node.op, ast.Add) and lk == rk == "S":
                return "S", f"oc::binding::cat<S>({{{left}, {right}}})"
            names = {
                ast.Add: "add",
                ast.Sub: "sub",
                ast.Mult: "mul",
                ast.FloorDiv: "floordiv",
                ast.Mod: "mod",
            }
            if lk == rk == "V" and type(node.op) in names:
                return "V", f"oc::binding::{names[type(node.op)]}<V>({left}, {right})"
            raise self.unsupported(f"{type(node.op).__name__} of a shape")
        if isinstance(node, ast.UnaryOp):
            kind, code = self.visit(node.operand)
            if kind != "V":
                raise self.unsupported("a unary operator on a shape")
            return "V", code if isinstance(node.op, ast.UAdd) else f"oc::binding::neg<V>({code})"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = [self.visit(a) for a in node.args]
            if node.func.id == "len" and len(args) == 1 and args[0][0] == "S":
                return "V", f"oc::binding::len({args[0][1]})"
            if node.func.id in ("max", "min") and len(args) >= 2 and all(k == "V" for k, _ in args):
                return "V", f"oc::binding::v{node.func.id}<V>({{{', '.join(c for _, c in args)}}})"
            raise self.unsupported(f"{node.func.id}(...) with these arguments")
        raise self.unsupported(type(node).__name__)


# ---- one op --------------------------------------------------------------------------------------
class _OpWriter:
    def __init__(self, spec: OpSpec, ordinal: int) -> None:
        assert isinstance(spec.native, NativeKernel)
        self.spec, self.kernel, self.k = spec, spec.native, f"Op{ordinal}"
        self.groups = _groups(spec)
        self.in_types = _input_types(spec, self.groups)
        self.out_types = _output_types(spec, self.in_types)
        self.variadic = bool(spec.inputs) and spec.inputs[-1].variadic
        self.lines: list[str] = []
        self.dispatch: list[tuple[int, tuple[str, ...]]] = []
        self.call_line = 0

    def emit(self, text: str = "") -> None:
        self.lines.extend(text.split("\n"))

    def names(self, items: Sequence[Any]) -> str:
        return "{" + ", ".join(json.dumps(i.name) for i in items) + "}"

    def elem_of(self, typ: str) -> str:
        return f"onnx_custom::dtype<{typ}>::onnx"

    def rule_functions(self) -> dict[int, tuple[str, list[str]]]:
        """Output index -> (C++ function name, argument names) for expression rules."""
        out: dict[int, tuple[str, list[str]]] = {}
        for index in range(len(self.spec.outputs)):
            rule = self.spec.shape_rule(index)
            if not isinstance(rule, ExpressionRule):
                if isinstance(rule, LikeRule) and self.spec.input(rule.input).variadic:
                    raise _RuleTranslator(
                        self.spec,
                        index,
                        ExpressionRule(
                            str(rule), ast.Expression(body=ast.Constant(0)), frozenset()
                        ),
                    ).unsupported(f"like:{rule.input} (a variadic input)")
                continue
            translator = _RuleTranslator(self.spec, index, rule)
            kind, body = translator.visit(rule.tree.body)
            if kind != "S":
                raise translator.unsupported("a rule giving one dim instead of a list")
            args = sorted(rule.names)
            params = ", ".join(f"const {'S' if self._is_shape(n) else 'V'}& a_{n}" for n in args)
            name = f"{self.k}_rule{index}"
            self.emit(f"template <class V, class S>\nS {name}({params}) {{\n  return {body};\n}}\n")
            out[index] = (name, args)
        return out

    def _is_shape(self, name: str) -> bool:
        return (
            name in {i.name for i in self.spec.inputs} or self.spec.attribute(name).type == "int[]"
        )

    def write(self) -> None:
        spec = self.spec
        attrs = _attributes(spec)
        self.emit(
            f"// ---- {spec.name} -> node"
            f" {spec.node_type}{f' ({spec.source})' if spec.source else ''}"
        )
        rules = self.rule_functions()
        self.write_defaults(attrs)
        self.emit(f"\nclass {self.k} final : public oc::Kernel {{\n public:")
        self.write_constructor(attrs)
        self.write_compute()
        self.write_infer(rules)
        self.write_run(attrs, rules)
        for a in attrs:
            self.emit(f"  {_ATTR_CPP[a.type][0]} m_{a.name};")
        self.emit("};\n")

    def write_defaults(self, attrs: list[Attribute]) -> None:
        """The constants holding the attributes' ONNX defaults."""
        k = self.k
        for a in attrs:
            if a.onnx_default is not NO_DEFAULT:
                self.emit(
                    f"const {_ATTR_CPP[a.type][0]} {k}_default_{a.name} ="
                    f" {_literal(a, a.onnx_default)};"
                )
                if a.type in ("bool",):
                    self.emit(
                        f"const int64_t {k}_default_int_{a.name} = {int(bool(a.onnx_default))};"
                    )

    def write_constructor(self, attrs: list[Attribute]) -> None:
        """The constructor, reading each attribute into its member."""
        k = self.k
        inits = []
        for a in attrs:
            reader = _ATTR_CPP[a.type][1]
            fallback = (
                "nullptr"
                if a.onnx_default is NO_DEFAULT
                else (
                    f"{k}_default_{a.name}.c_str()" if a.type == "str" else f"&{k}_default_{a.name}"
                )
            )
            inits.append(
                f"m_{a.name}(oc::binding::{reader}(attrs, {json.dumps(a.name)}, {fallback}))"
            )
        self.emit(
            f"  explicit {k}(const oc::Attributes& attrs)"
            + (f"\n      : {', '.join(inits)}" if inits else "")
            + " {"
            + ("" if inits else " (void)attrs;")
            + "}"
        )

    def write_compute(self) -> None:
        """compute(): the dtype dispatch to run<T...>."""
        self.emit("\n  void compute(oc::Context& ctx) override {")
        self.emit(
            f"    const oc::binding::Inputs in(ctx, {self.names(self.spec.inputs)},"
            f" {str(self.variadic).lower()});"
        )
        for g, (members, dtypes) in enumerate(self.groups):
            allowed = ", ".join(CPP_TYPES[d][1] for d in dtypes)
            self.emit(
                f"    const int e{g} = in.group_elem({{{', '.join(map(str, members))}}},"
                f" {{{allowed}}});"
            )
        combos = list(itertools.product(*(d for _, d in self.groups)))
        for combo in combos:
            cond = " && ".join(f"e{g} == {CPP_TYPES[d][1]}" for g, d in enumerate(combo)) or "true"
            targs = ", ".join(CPP_TYPES[d][0] for d in combo)
            self.dispatch.append((len(self.lines) + 1, combo))  # 1-based within this op's block
            self.emit(
                f"    if ({cond}) return run<{targs}>(ctx, in);  //"
                f" {', '.join(combo) or 'fixed dtypes'}"
            )
        if self.groups:
            self.emit('    oc::fail("internal: no kernel instantiation for these dtypes");')
        self.emit("  }")

    def write_run(self, attrs: list[Attribute], rules: dict[int, tuple[str, list[str]]]) -> None:
        """run<T...>(): bind inputs and outputs, allocate outputs, call the kernel function."""
        self.emit("\n private:")
        tparams = ", ".join(f"typename T{g}" for g in range(len(self.groups)))
        self.emit(f"  template <{tparams}>" if tparams else "  template <int = 0>")
        self.emit("  void run(oc::Context& ctx, const oc::binding::Inputs& in) {")
        for index, (item, typ) in enumerate(zip(self.spec.inputs, self.in_types, strict=True)):
            if item.variadic:
                self.emit(
                    f"    const std::vector<onnx_custom::Tensor<{typ}>> a_{item.name} ="
                    f" in.variadic<{typ}>({index});"
                )
            else:
                self.emit(
                    f"    const onnx_custom::Tensor<{typ}> a_{item.name} ="
                    f" in.tensor<{typ}>({index});"
                )
        elems = ", ".join(self.elem_of(t) for t in self.out_types)
        self.emit(
            f"    oc::binding::Outputs outs(ctx, {self.names(self.spec.outputs)}, {{{elems}}});"
        )
        for index, (output, typ) in enumerate(zip(self.spec.outputs, self.out_types, strict=True)):
            self.emit(
                f"    onnx_custom::Tensor<{typ}> a_{output.name} = outs.tensor<{typ}>({index});"
            )
        for index, output in enumerate(self.spec.outputs):
            shape = self.runtime_shape(index, rules)
            if shape is not None:
                self.emit(f"    a_{output.name}.allocate({shape});")
        args = (
            [f"a_{i.name}" for i in self.spec.inputs]
            + [f"a_{o.name}" for o in self.spec.outputs]
            + [f"m_{a.name}" for a in attrs]
        )
        self.emit("    {")
        self.emit(
            "      oc::binding::Scope scope(ctx);  // onnx_custom::parallel_for uses this node's"
            " thread pool"
        )
        self.call_line = len(self.lines) + 1
        self.emit(f"      {self.kernel.function}({', '.join(args)});")
        self.emit("    }")
        self.emit("    outs.finish();")
        self.emit("  }\n")

    def runtime_shape(self, index: int, rules: dict[int, tuple[str, list[str]]]) -> str | None:
        rule = self.spec.shape_rule(index)
        names = [i.name for i in self.spec.inputs]
        if isinstance(rule, LikeRule):
            return f"in.shape({names.index(rule.input)})"
        if isinstance(rule, BroadcastRule):
            return "oc::binding::broadcast(in.present_shapes())"
        if index in rules:
            fn, args = rules[index]
            values = []
            for n in args:
                if n in names:
                    values.append(f"in.shape({names.index(n)})")
                else:
                    typ = self.spec.attribute(n).type
                    values.append(f"m_{n}" if typ == "int[]" else f"static_cast<int64_t>(m_{n})")
            return f"{fn}<int64_t, onnx_custom::Shape>({', '.join(values)})"
        return None

    def write_infer(self, rules: dict[int, tuple[str, list[str]]]) -> None:
        spec, k = self.spec, self.k
        names = [i.name for i in spec.inputs]
        self.emit("\n  static void infer(const oc::InferContext& ictx) {")
        self.emit(
            f"    const oc::binding::Infer inf(ictx, {self.names(spec.inputs)},"
            f" {str(self.variadic).lower()});"
        )
        for g, (members, dtypes) in enumerate(self.groups):
            allowed = ", ".join(CPP_TYPES[d][1] for d in dtypes)
            self.emit(
                f"    const int e{g} = inf.group_elem({{{', '.join(map(str, members))}}},"
                f" {{{allowed}}});"
            )
        for index, item in enumerate(spec.inputs):
            if len(item.dtypes) == 1:
                self.emit(f"    inf.require_elem({index}, {CPP_TYPES[item.dtypes[0]][1]});")
        for index, typ in enumerate(self.out_types):
            elem = f"e{typ[1:]}" if re.fullmatch(r"T\d+", typ) else self.elem_of(typ)
            rule = spec.shape_rule(index)
            if rule is None:
                # data-dependent: the kernel allocates it; ORT learns its shape at run time
                continue
            if isinstance(rule, LikeRule):
                needs, dims = [names.index(rule.input)], f"inf.dims({names.index(rule.input)})"
            elif isinstance(rule, BroadcastRule):
                needs, dims = list(range(len(names))), "inf.broadcast()"
            else:
                fn, args = rules[index]
                needs = [names.index(n) for n in args if n in names]
                values = []
                for n in args:
                    if n in names:
                        values.append(f"inf.dims({names.index(n)})")
                    else:
                        a = spec.attribute(n)
                        has = a.onnx_default is not NO_DEFAULT
                        if a.type == "int[]":
                            values.append(
                                f"oc::binding::ints_to<std::vector<oc::Dim>>(inf.attr_ints({json.dumps(n)},"
                                f" {f'&{k}_default_{n}' if has else 'nullptr'}))"
                            )
                        else:
                            default = (
                                (
                                    f"&{k}_default_int_{n}"
                                    if a.type == "bool"
                                    else f"&{k}_default_{n}"
                                )
                                if has
                                else "nullptr"
                            )
                            values.append(
                                f"oc::Dim::known(inf.attr_int({json.dumps(n)}, {default}))"
                            )
                dims = f"{fn}<oc::Dim, std::vector<oc::Dim>>({', '.join(values)})"
            known = f"inf.ranks_known({{{', '.join(str(i) for i in needs)}}})"
            if isinstance(rule, BroadcastRule):
                known = "true"
            self.emit(
                f"    if ({elem} != OC_ELEM_UNDEFINED && {known}) inf.set({index}, {elem}, {dims});"
            )
            rank = _fixed_rank(rule)
            if rank is not None and known != "true":
                # an input of unknown rank: the rule still fixes the output's rank, and ORT must
                # learn the dtype from us (its own guess may be another input's)
                self.emit(
                    f"    else if ({elem} != OC_ELEM_UNDEFINED) inf.set({index}, {elem},"
                    f" std::vector<oc::Dim>({rank}));"
                )
        self.emit("  }")


def _fixed_rank(rule: Any) -> int | None:
    """The output rank an expression rule fixes by itself (a list literal without ``*``),
    or None."""
    body = rule.tree.body if isinstance(rule, ExpressionRule) else None
    if isinstance(body, ast.List) and not any(isinstance(e, ast.Starred) for e in body.elts):
        return len(body.elts)
    return None


def _check_source(spec: OpSpec) -> Path:
    kernel = spec.native
    assert isinstance(kernel, NativeKernel)
    path = kernel.path()
    if not path.is_file():
        raise _fail(
            spec,
            ("native", "source"),
            f"native.source {kernel.source!r} does not exist (not found); expected the C++ file"
            f" holding {kernel.function}; fix: check the path (relative paths resolve against the"
            " YAML file's folder).",
        )
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise _fail(
            spec, ("native", "source"), f"cannot read native.source {str(path)!r} ({exc})."
        ) from None
    short = kernel.function.split("::")[-1]
    if not re.search(rf"\b{re.escape(short)}\b", text):
        raise _fail(
            spec,
            ("native", "function"),
            f"native.function {kernel.function!r} does not appear in {path.name}; expected a"
            f" function such as: {expected_signature(spec)}; fix: name the function the file"
            " defines.",
        )
    return path


def generate_source(
    source: Path,
    specs: Sequence[OpSpec],
    ordinal: int,
    *,
    filename: str | None = None,
    adder: str | None = None,
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> GeneratedSource:
    """The binding file of the ops whose kernels live in ``source``.

    ``filename`` and ``adder`` (the C++ function adding the ops) default to ordinal-numbered names;
    ``aliases`` maps an op's name to further ``domain::OpType`` nodes its kernel also serves (the
    shipped MSDA kernel serves ``mmdeploy::MMCVMultiScaleDeformableAttention`` this way)."""
    stem = re.sub(r"\W", "_", source.stem)
    filename = filename or f"binding_{ordinal:02d}_{stem}.cpp"
    header = [
        (
            f"// Generated by onnx-custom from op specs; kernels in {source.name}. Regenerate"
            " instead of editing."
        ),
        '#include "binding.h"',
        "",
        (
            "// The user's kernels, compiled in this unit so template kernels instantiate at the"
            " spec's dtypes."
        ),
        f'#include "{source.name}"',
        "",
        "namespace {",
        "",
    ]
    lines = list(header)
    ops: list[GeneratedOp] = []
    for i, spec in enumerate(specs):
        writer = _OpWriter(spec, ordinal * 100 + i)
        writer.write()
        first = len(lines) + 1
        ops.append(
            GeneratedOp(
                spec,
                first,
                first + len(writer.lines) - 1,
                tuple((first + line - 1, combo) for line, combo in writer.dispatch),
                first + writer.call_line - 1,
            )
        )
        lines += writer.lines
    adder = adder or f"add_user_ops_{ordinal:02d}"
    lines += ["}  // namespace", "", "namespace oc {", f"void {adder}(std::vector<OpDef>& ops) {{"]
    for i, spec in enumerate(specs):
        k = f"Op{ordinal * 100 + i}"
        kinds = ", ".join(
            (
                "OC_IO_VARIADIC"
                if item.variadic
                else "OC_IO_OPTIONAL"
                if item.optional
                else "OC_IO_REQUIRED"
            )
            for item in spec.inputs
        )
        outs = ", ".join("OC_IO_REQUIRED" for _ in spec.outputs)
        # Single-dtype inputs and outputs declare their type to ORT: its graph-time type guess for
        # the others (where our shape inference cannot run) then follows the right input (ORT
        # takes the last multi-dtype input's type). A single-dtype input FOLLOWED by a multi-dtype
        # one is left undeclared instead (the guess is unchanged): a wrong dtype there then reaches
        # our shape inference, whose error names the input and the fix (a Cast), where ORT's own
        # type check only says "invalid".
        last_multi = max(
            (n for n, item in enumerate(spec.inputs) if len(item.dtypes) != 1), default=-1
        )
        in_types = ", ".join(
            (
                CPP_TYPES[item.dtypes[0]][1]
                if len(item.dtypes) == 1 and n > last_multi
                else "OC_ELEM_UNDEFINED"
            )
            for n, item in enumerate(spec.inputs)
        )
        out_types = ", ".join(
            CPP_TYPES[d[0]][1] if len(d := spec.output_dtypes(o)) == 1 else "OC_ELEM_UNDEFINED"
            for o in range(len(spec.outputs))
        )
        for node in [f"{spec.domain}::{spec.op_type}", *(aliases or {}).get(spec.name, ())]:
            domain, _, op_type = node.rpartition("::")
            lines.append(
                f"  ops.push_back({{{json.dumps(domain)}, {json.dumps(op_type)}, {{{kinds}}},"
                f" {{{outs}}}, create_kernel<{k}>, {k}::infer, {{{in_types}}}, {{{out_types}}}}});"
            )
    lines += ["}", "}  // namespace oc", ""]
    return GeneratedSource(filename, "\n".join(lines), source, adder, tuple(ops))


def user_ops_source(generated: Sequence[GeneratedSource]) -> str:
    """``add_user_ops``: the entry library.cpp calls (OC_WITH_USER_OPS)."""
    lines = [
        "// Generated by onnx-custom: every user op of this library.",
        '#include "common.h"',
        "",
        "namespace oc {",
    ]
    lines += [f"void {g.adder}(std::vector<OpDef>& ops);" for g in generated]
    lines += [
        "void add_user_ops(std::vector<OpDef>& ops) {",
        *(f"  {g.adder}(ops);" for g in generated),
        "}",
        "}  // namespace oc",
        "",
    ]
    return "\n".join(lines)


def check_sources(specs: Sequence[OpSpec]) -> dict[Path, list[OpSpec]]:
    """Ops by the resolved C++ file holding their kernels (files checked; basenames unique)."""
    by_source: dict[Path, list[OpSpec]] = {}
    for spec in specs:
        by_source.setdefault(_check_source(spec), []).append(spec)
    names: dict[str, Path] = {}
    for path in by_source:
        if path.name in names and names[path.name] != path:
            spec = by_source[path][0]
            raise _fail(
                spec,
                ("native", "source"),
                f"two kernel sources share the file name {path.name!r} ({names[path.name]} and"
                f" {path}); the generated code includes them by name; fix: rename one.",
            )
        names[path.name] = path
    return by_source

"""Bad inputs across the public API: each row is one wrong call a user makes.

Every row asserts the error's type (always an `OnnxCustomError` subclass; the builtin it may also
be, such as `TypeError` or `FileNotFoundError`, is asserted too where ours subclasses it) and three
fragments of its message: what was expected, what was received, and the fix. Rows call the real
API (real exporters, real onnxruntime); nothing is mocked. Silent wrongs of the issue that need
more than one call are tests below the table (and in test_export_safety.py,
test_registry_validation.py, test_host_errors.py, test_host_memory.py).
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
import onnx_custom.ops.seed  # registers onnx_custom::my_add
from onnx_custom import (
    DynamicShapesError,
    ExtensionBuildError,
    KernelError,
    OnnxCustomError,
    OpSpec,
    Registry,
    SymbolicError,
    UnsupportedOpError,
    VerificationError,
    load_specs,
    register_spec,
)
from onnx_custom.errors import InvalidArgumentError, OpsetError, OutputPathError
from onnx_custom.ops import DeformConv2d, deform_conv2d
from onnx_custom.ops.deform_conv import DeformConv2dDtypeError, DeformConv2dError
from onnx_custom.runtime import InferenceSession, KernelRegistry
from onnx_custom.runtime.native import build_library
from onnx_custom.runtime.session import ModelLoadError, ModelNotFoundError
from onnx_custom.spec.spec import SpecError
from onnx_custom.verification.trial_shapes import ShapeSpecError


class MyAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x, y)


class RaisesInForward(torch.nn.Module):
    """Its forward raises: a row using it proves the argument was refused before tracing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the export ran before its arguments were checked")


ARGS = (torch.randn(2, 3), torch.randn(2, 3))
GOOD = {"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32)}


@functools.cache
def _proto() -> onnx.ModelProto:
    return onnx_custom.export(MyAdd(), ARGS, exporter="torchscript", opset=17)


@functools.cache
def _session() -> InferenceSession:
    return InferenceSession(_proto())


def _custom_node_model() -> onnx.ModelProto:
    node = helper.make_node("NoKernel", ["x"], ["y"], domain="nosuch", name="n0")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("nosuch", 1)],
        ir_version=10,
    )


def _translation(fn: Callable[..., Any]) -> Registry:
    reg = onnx_custom.default_registry().copy()
    reg.symbolic("onnx_custom::my_add", opset=1, replace=True)(fn)
    return reg


def _export_with(fn: Callable[..., Any], exporter: str = "torchscript") -> Any:
    return onnx_custom.export(
        MyAdd(),
        ARGS,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        registry=_translation(fn),
    )


def _kernel(name: str = "d::Op", fn: Any = lambda x: x, **kw: Any) -> Any:
    kw.setdefault("inputs", ["x"])
    kw.setdefault("outputs", ["y"])
    return KernelRegistry().kernel(name, **kw)(fn)


def _two_translations() -> None:
    """Two different lambdas for one (op, opset): the second silently replaced the first."""
    registry = Registry()
    registry.symbolic("mylib::twice", opset=9)(lambda g, x: g.op("Relu", x))
    registry.symbolic("mylib::twice", opset=9)(lambda g, x: g.op("Elu", x))


def _export_meta_spec(meta: Callable[..., Any], exporter: str = "dynamo") -> Any:
    """A spec whose meta function (shape=) is wrong, exported: the error names it."""
    spec = OpSpec(
        "badmeta::neg",
        inputs=["x"],
        outputs=["y"],
        impl=lambda x: -x,
        shape=meta,
        translations={9: lambda g, x: g.op("Neg", x)},
    )
    with onnx_custom.spec.spec_scope():
        op = register_spec(spec).op

        class M(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return op(x)

        return onnx_custom.export(
            M(),
            (torch.randn(2, 3),),
            exporter=exporter,
            opset=17 if exporter == "torchscript" else 18,
        )


def _yaml(folder: Path, input_line: str) -> Path:
    path = folder / "vendor.yaml"
    path.write_text(
        f"- op_name: vendor_op\n  op_type: VendorOp\n  input_desc:\n{input_line}\n  output_desc:\n "
        "   - {name: y}\n"
    )
    return path


def _two_kernels() -> None:
    kernels = KernelRegistry()
    kernels.kernel("d::Op", inputs=["x"], outputs=["y"])(lambda x: x)
    kernels.kernel("d::Op", inputs=["x"], outputs=["y"])(lambda x: x + 1)


def _registered(**kw: Any) -> Any:
    with onnx_custom.registered(**kw):
        pass


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _closed_buffer() -> io.BytesIO:
    buffer = io.BytesIO()
    buffer.close()
    return buffer


def _dcn(**kw: Any) -> Any:
    args = {
        "input": torch.randn(1, 3, 5, 5),
        "offset": torch.zeros(1, 18, 3, 3),
        "weight": torch.randn(4, 3, 3, 3),
    }
    args.update(kw)
    return deform_conv2d(**args)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[Path], Any]
    error: type[BaseException]
    expected: str  # the message names what was expected ...
    received: str  # ... what was received ...
    fix: str  # ... and the fix.


CASES = [
    # -- onnx_custom.export: arguments checked before tracing -------------------------------------
    Case(
        "export/model-class",
        lambda t: onnx_custom.export(MyAdd, ARGS),
        InvalidArgumentError,
        "torch.nn.Module instance",
        "the class MyAdd",
        "MyAdd()",
    ),
    Case(
        "export/model-function",
        lambda t: onnx_custom.export(torch.add, ARGS),
        InvalidArgumentError,
        "torch.nn.Module instance",
        "add",
        "wrap it in a module",
    ),
    Case(
        "export/args-list",
        lambda t: onnx_custom.export(MyAdd(), list(ARGS)),
        InvalidArgumentError,
        "a tuple of example inputs",
        "received list",
        "args=tuple(args)",
    ),
    Case(
        "export/args-int",
        lambda t: onnx_custom.export(MyAdd(), 3),
        InvalidArgumentError,
        "a tuple of example inputs",
        "int (3)",
        "args=(x,)",
    ),
    Case(
        "export/exporter-typo",
        lambda t: onnx_custom.export(MyAdd(), ARGS, exporter="torchscipt"),
        InvalidArgumentError,
        "('dynamo', 'torchscript')",
        "'torchscipt'",
        "exporter='torchscript'",
    ),
    Case(
        "export/opset-str",
        lambda t: onnx_custom.export(MyAdd(), ARGS, opset="18"),
        InvalidArgumentError,
        "an int such as 18",
        "str ('18')",
        "opset=18",
    ),
    Case(
        "export/opset-bool",
        lambda t: onnx_custom.export(MyAdd(), ARGS, opset=True),
        InvalidArgumentError,
        "an int",
        "bool (True)",
        "Fix: pass opset=",
    ),
    Case(
        "export/dynamo-opset-99",
        lambda t: onnx_custom.export(MyAdd(), ARGS, opset=99),
        OpsetError,
        "supports opsets 7..",
        "opset=99",
        "pass an opset in 7..",
    ),
    Case(
        "export/torchscript-opset-21",
        lambda t: onnx_custom.export(MyAdd(), ARGS, exporter="torchscript", opset=21),
        OpsetError,
        "maximum 20",
        "opset=21",
        "exporter='dynamo'",
    ),
    Case(
        "export/torchscript-opset-6",
        lambda t: onnx_custom.export(MyAdd(), ARGS, exporter="torchscript", opset=6),
        OpsetError,
        "opsets 7..20",
        "opset=6",
        "an opset in 7..20",
    ),
    Case(
        "export/registry-dict",
        lambda t: onnx_custom.export(MyAdd(), ARGS, registry={}),
        InvalidArgumentError,
        "onnx_custom.Registry or None",
        "dict ({})",
        "onnx_custom.Registry()",
    ),
    Case(
        "export/keep-failed-without-verify",
        lambda t: onnx_custom.export(MyAdd(), ARGS, keep_failed=t / "k.onnx"),
        InvalidArgumentError,
        "needs verify=True",
        "verify=False",
        "pass verify=True",
    ),
    Case(
        "export/input-names-str",
        lambda t: onnx_custom.export(MyAdd(), ARGS, input_names="xy"),
        InvalidArgumentError,
        "a list of non-empty strings",
        "str ('xy')",
        "input_names=['xy']",
    ),
    Case(
        "export/output-names-int",
        lambda t: onnx_custom.export(MyAdd(), ARGS, output_names=3),
        InvalidArgumentError,
        "a list of non-empty strings",
        "int (3)",
        "output_names=['x']",
    ),
    Case(
        "export/too-many-input-names",
        lambda t: onnx_custom.export(MyAdd(), ARGS, input_names=["a", "b", "c"]),
        DynamicShapesError,
        "takes 2 tensor input(s)",
        "3 names ['a', 'b', 'c']",
        "at most one name per tensor input",
    ),
    Case(
        "export/dynamic-shapes-unknown-key",
        lambda t: onnx_custom.export(MyAdd(), ARGS, dynamic_shapes={"z": {0: "batch"}}),
        DynamicShapesError,
        "Valid keys: ['x', 'y']",
        "key(s) ['z']",
        "key the dict by those names",
    ),
    Case(
        "export/dynamic-shapes-bad-axis",
        lambda t: onnx_custom.export(MyAdd(), ARGS, dynamic_shapes={"x": {5: "batch"}, "y": None}),
        DynamicShapesError,
        "has 2 dim(s)",
        "names axis 5",
        "use an axis in 0..1",
    ),
    Case(
        "export/unknown-keyword",
        lambda t: onnx_custom.export(MyAdd(), ARGS, opsett=18),
        InvalidArgumentError,
        "parameters of torch.onnx.export",
        "opsett=",
        "Rename or remove it",
    ),
    Case(
        "export/torch-keyword-we-own",
        lambda t: onnx_custom.export(MyAdd(), ARGS, opset_version=17),
        InvalidArgumentError,
        "set by onnx_custom.export itself",
        "opset_version=",
        "use opset= instead",
    ),
    Case(
        "export/f-int",
        lambda t: onnx_custom.export(MyAdd(), ARGS, 123),
        InvalidArgumentError,
        "must be a file path",
        "received int (123)",
        "f='model.onnx'",
    ),
    Case(
        "export/f-missing-folder",
        lambda t: onnx_custom.export(MyAdd(), ARGS, t / "no" / "m.onnx"),
        OutputPathError,
        "expected an existing folder",
        "does not exist",
        "os.makedirs",
    ),
    Case(
        "export/f-is-a-folder",
        lambda t: onnx_custom.export(MyAdd(), ARGS, t),
        OutputPathError,
        "expected a file path",
        "is a folder",
        "name a file inside it",
    ),
    Case(
        "export/f-text-stream",
        lambda t: onnx_custom.export(MyAdd(), ARGS, io.StringIO()),
        InvalidArgumentError,
        "binary file object",
        "text stream",
        "mode 'wb'",
    ),
    Case(
        "export/f-read-only-file-object",
        lambda t: onnx_custom.export(MyAdd(), ARGS, io.BufferedReader(io.BytesIO())),
        InvalidArgumentError,
        "open for writing",
        "not writable",
        "open(path, 'wb')",
    ),
    Case(
        "export/f-closed",
        lambda t: onnx_custom.export(MyAdd(), ARGS, _closed_buffer()),
        InvalidArgumentError,
        "open for writing",
        "closed",
        "open(path, 'wb')",
    ),
    Case(
        "export/keep-failed-missing-folder",
        lambda t: onnx_custom.export(MyAdd(), ARGS, verify=True, keep_failed=t / "no" / "k.onnx"),
        OutputPathError,
        "expected an existing folder",
        "does not exist",
        "os.makedirs",
    ),
    Case(
        "export/program-to-torchscript",
        lambda t: onnx_custom.export(
            torch.export.export(MyAdd(), ARGS), ARGS, exporter="torchscript"
        ),
        InvalidArgumentError,
        "traces an nn.Module",
        "ExportedProgram",
        "exporter='dynamo'",
    ),
    Case(
        "export/kernels-str",
        lambda t: onnx_custom.export(RaisesInForward(), ARGS[:1], verify=True, kernels="python"),
        KernelError,
        "KernelRegistry, None or 'native'",
        "received 'python'",
        "kernels='native'",
    ),
    # -- the translation a user wrote, through the builder g ------------------------------------
    Case(
        "g.op/misspelt-standard-op",
        lambda t: _export_with(lambda g, a, b: g.op("Reluu", a)),
        SymbolicError,
        "expected an ONNX operator type",
        "received 'Reluu'",
        "did you mean 'Relu'",
    ),
    Case(
        "g.op/misspelt-standard-op-dynamo",
        lambda t: _export_with(lambda g, a, b: g.op("Addd", a, b), "dynamo"),
        SymbolicError,
        "expected an ONNX operator type",
        "received 'Addd'",
        "did you mean 'Add'",
    ),
    Case(
        "g.op/ill-formed-node-type",
        lambda t: _export_with(lambda g, a, b: g.op("bad name::X", a)),
        SymbolicError,
        "expected 'OpType' for the default domain or 'domain::OpType'",
        "'bad name::X'",
        "e.g. 'Asinh', 'onnx_custom::my_add'",
    ),
    Case(
        "g.op/int-attribute-past-int64",
        lambda t: _export_with(lambda g, a, b: g.op("mylib::X", a, n=2**70)),
        SymbolicError,
        "int64 range",
        "1180591620717411303424",
        "pass a value in that range",
    ),
    Case(
        "g.op/outputs-0",
        lambda t: _export_with(lambda g, a, b: g.op("Add", a, b, outputs=0)),
        SymbolicError,
        "a positive int",
        "received 0",
        "outputs=1 or more",
    ),
    Case(
        "g.op/python-scalar-input",
        lambda t: _export_with(lambda g, a, b: g.op("Add", a, 2.0)),
        SymbolicError,
        "graph value",
        "float",
        "g.constant(value, like=x)",
    ),
    Case(
        "translation/returns-float",
        lambda t: _export_with(lambda g, a, b: 2.0),
        SymbolicError,
        "expected a graph value",
        "a Python float (2.0)",
        "g.constant(2.0, like=<an input>)",
    ),
    Case(
        "attr.ints/a-string",
        lambda t: onnx_custom.attr.ints("12"),
        SymbolicError,
        "a list of ints",
        "'12'",
        "attr.ints([1, 2])",
    ),
    Case(
        "attr.strings/a-string",
        lambda t: onnx_custom.attr.strings("abc"),
        SymbolicError,
        "a list of strings",
        "'abc'",
        "attr.strings(['a', 'b'])",
    ),
    Case(
        "attr.floats/none",
        lambda t: onnx_custom.attr.floats([1.0, None]),
        SymbolicError,
        "a list of floats",
        "None is a NoneType",
        "attr.floats([0.5, 1.0])",
    ),
    # -- onnx_custom.verify ------------------------------------------------------------------------
    Case(
        "verify/model-class",
        lambda t: onnx_custom.verify(MyAdd, ARGS, _proto()),
        InvalidArgumentError,
        "torch.nn.Module instance",
        "the class MyAdd",
        "MyAdd()",
    ),
    Case(
        "verify/model-not-callable",
        lambda t: onnx_custom.verify(3, ARGS, _proto()),
        InvalidArgumentError,
        "torch.nn.Module instance",
        "int (3)",
        "export(MyModel(), (x,))",
    ),
    Case(
        "verify/args-list",
        lambda t: onnx_custom.verify(MyAdd(), list(ARGS), _proto()),
        InvalidArgumentError,
        "a tuple of example inputs",
        "received list",
        "args=tuple(args)",
    ),
    Case(
        "verify/trials-0",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), trials=0),
        InvalidArgumentError,
        "a positive int",
        "received 0",
        "trials=1",
    ),
    Case(
        "verify/rtol-without-atol",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), rtol=1e-3),
        InvalidArgumentError,
        "rtol and atol go together",
        "rtol=0.001 without atol",
        "pass both",
    ),
    Case(
        "verify/negative-atol",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), rtol=0.0, atol=-1.0),
        InvalidArgumentError,
        "non-negative number",
        "received -1.0",
        "atol=1e-5",
    ),
    Case(
        "verify/unknown-backend",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), backends=("tensorrt",)),
        InvalidArgumentError,
        "subset of ('onnxruntime', 'reference', 'onnxruntime-bodies', 'onnxruntime-native')",
        "['tensorrt']",
        "backends=('onnxruntime',)",
    ),
    Case(
        "verify/missing-file",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, t / "none.onnx"),
        ModelNotFoundError,
        "ONNX model file",
        "does not exist",
        "export it first",
    ),
    Case(
        "verify/garbage-bytes",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, b"garbage"),
        ModelLoadError,
        "not a valid ONNX model",
        "the given bytes",
        "re-export the model",
    ),
    Case(
        "verify/model-int",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, 12),
        ModelLoadError,
        "onnx.ModelProto, bytes or a file path",
        "received int (12)",
        "pass onnx_custom.export(...)'s result",
    ),
    Case(
        "verify/folder-as-model",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, t),
        ModelLoadError,
        "expected an .onnx model file",
        "is not a file",
        "the .onnx file inside it",
    ),
    Case(
        "verify/too-few-args",
        lambda t: onnx_custom.verify(MyAdd(), ARGS[:1], _proto()),
        VerificationError,
        "takes 2 input(s) ['x', 'y']",
        "hold 1 tensor(s)",
        "Fix: pass the same example inputs used for export",
    ),
    Case(
        "verify/shapes-unknown-name",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), shapes=[{"nodim": 3}]),
        ShapeSpecError,
        "expected a dynamic dim name",
        "unknown name 'nodim'",
        "Fix: use one of those names",
    ),
    Case(
        "verify/kernels-str",
        lambda t: onnx_custom.verify(MyAdd(), ARGS, _proto(), kernels=3),
        KernelError,
        "KernelRegistry or None",
        "int (3)",
        "KernelRegistry()",
    ),
    # -- onnx_custom.check -----------------------------------------------------------------------
    Case(
        "check/exporter",
        lambda t: onnx_custom.check(MyAdd(), ARGS, exporter="onnx"),
        InvalidArgumentError,
        "('dynamo', 'torchscript')",
        "'onnx'",
        "Fix: pass exporter=",
    ),
    Case(
        "check/model-class",
        lambda t: onnx_custom.check(MyAdd, ARGS),
        InvalidArgumentError,
        "torch.nn.Module instance",
        "the class MyAdd",
        "MyAdd()",
    ),
    Case(
        "check/opset-0",
        lambda t: onnx_custom.check(MyAdd(), ARGS, opset=0),
        OpsetError,
        "supports opsets 7..",
        "opset=0",
        "pass an opset in 7..",
    ),
    Case(
        "check/args-list",
        lambda t: onnx_custom.check(MyAdd(), list(ARGS)),
        InvalidArgumentError,
        "a tuple of example inputs",
        "received list",
        "args=tuple(args)",
    ),
    Case(
        "check/registry-str",
        lambda t: onnx_custom.check(MyAdd(), ARGS, registry="default"),
        InvalidArgumentError,
        "onnx_custom.Registry or None",
        "str ('default')",
        "onnx_custom.Registry()",
    ),
    Case(
        "check/exported-program",
        lambda t: onnx_custom.check(torch.export.export(MyAdd(), ARGS), ARGS),
        InvalidArgumentError,
        "traces an nn.Module",
        "ExportedProgram",
        "program.module()",
    ),
    # -- translations: Registry, symbolic, registered ----------------------------------------------
    Case(
        "symbolic/unqualified-name",
        lambda t: Registry().symbolic("asinhh", opset=9)(lambda g, x: x),
        SymbolicError,
        "expected 'namespace::op'",
        "'asinhh'",
        "Did you mean 'aten::asinhh'",
    ),
    Case(
        "symbolic/bad-namespace",
        lambda t: Registry().symbolic("my lib::op", opset=9)(lambda g, x: x),
        SymbolicError,
        "expected 'namespace::op'",
        "'my lib::op'",
        "e.g. 'aten::asinh'",
    ),
    Case(
        "symbolic/opset-0",
        lambda t: Registry().symbolic("mylib::foo", opset=0)(lambda g, x: x),
        SymbolicError,
        "must be a positive int",
        "received 0",
        "opset=9",
    ),
    Case(
        "symbolic/opset-str",
        lambda t: Registry().symbolic("mylib::foo", opset="9")(lambda g, x: x),
        SymbolicError,
        "must be a positive int",
        "received '9'",
        "opset=9",
    ),
    Case(
        "symbolic/not-callable",
        lambda t: Registry().symbolic("mylib::foo", opset=9)(3),
        SymbolicError,
        "must be callable",
        "received int (3)",
        "def my_translation(g, x)",
    ),
    Case(
        "symbolic/target-int",
        lambda t: Registry().symbolic(3, opset=9)(lambda g, x: x),
        SymbolicError,
        "a qualified name 'ns::op[.overload]'",
        "target 3 of type int",
        "torch.autograd.Function subclass",
    ),
    Case(
        "symbolic/keyword-not-in-schema",
        lambda t: Registry().symbolic("aten::add.Tensor", opset=9)(
            lambda g, self, other, *, alfa: self
        ),
        SymbolicError,
        "def <lambda>(g, self, other, *, alpha)",
        "it requires ['alfa']",
        "Fix:",
    ),
    Case(
        "symbolic/second-different-translation",
        lambda t: _two_translations(),
        SymbolicError,
        "already registered: test_bad_input_matrix._two_translations.<locals>.<lambda>"
        " (test_bad_input_matrix.py:",
        "different translation for mylib::twice at opset 9",
        "replace=True",
    ),
    Case(
        "registry/lookup-missing",
        lambda t: Registry().lookup("mylib::foo", 9),
        UnsupportedOpError,
        "No translation registered",
        "mylib::foo",
        "@onnx_custom.symbolic('mylib::foo')",
    ),
    Case(
        "registry/remove-missing",
        lambda t: Registry().remove("mylib::foo", opset=9),
        SymbolicError,
        "expected one of the registered opsets []",
        "mylib::foo at opset 9",
        "the opset it was registered with",
    ),
    Case(
        "registry/unknown-variant",
        lambda t: Registry().with_variants("fast"),
        SymbolicError,
        "expected variants this registry has: []",
        "['fast']",
        "variant=<name>",
    ),
    Case(
        "registered/registry-int",
        lambda t: _registered(registry=3),
        InvalidArgumentError,
        "onnx_custom.Registry or None",
        "received int",
        "onnx_custom.Registry()",
    ),
    Case(
        "registered/opset-str",
        lambda t: _registered(opset="17"),
        InvalidArgumentError,
        "an int in 7..20",
        "received '17'",
        "opset=17",
    ),
    Case(
        "registered/opset-99",
        lambda t: _registered(opset=99),
        InvalidArgumentError,
        "an int in 7..20",
        "received 99",
        "opset=17",
    ),
    Case(
        "translation_table/opset-str",
        lambda t: onnx_custom.translation_table(opset="18"),
        SymbolicError,
        "a positive int",
        "received '18'",
        "opset=18",
    ),
    # -- kernels: KernelRegistry / kernel ------------------------------------------------------
    Case(
        "kernel/unqualified-name",
        lambda t: _kernel("Op"),
        SymbolicError,
        "'domain::OpType'",
        "received 'Op'",
        "qualify the op type with its domain",
    ),
    Case(
        "kernel/inputs-str",
        lambda t: _kernel(inputs="x"),
        SymbolicError,
        "a list of names such as ['x', 'mask?', 'rest*']",
        "received 'x'",
        "['x', 'mask?', 'rest*']",
    ),
    Case(
        "kernel/duplicate-inputs",
        lambda t: _kernel(inputs=["x", "x"], fn=lambda x, y: x),
        SymbolicError,
        "expected unique names",
        "duplicate inputs names ['x']",
        "its own name",
    ),
    Case(
        "kernel/bad-input-name",
        lambda t: _kernel(inputs=["1x"]),
        SymbolicError,
        "expected an identifier",
        "'1x'",
        "e.g. 'x', 'mask?', 'rest*'",
    ),
    Case(
        "kernel/variadic-not-last",
        lambda t: _kernel(inputs=["xs*", "y"], fn=lambda *a: a[0]),
        SymbolicError,
        "must be the last one",
        "at position 0 of ['xs*', 'y']",
        "move it to the end",
    ),
    Case(
        "kernel/no-outputs",
        lambda t: _kernel(outputs=[]),
        SymbolicError,
        "at least one output",
        "outputs=[]",
        "outputs=['y']",
    ),
    Case(
        "kernel/not-callable",
        lambda t: _kernel(fn=5),
        SymbolicError,
        "expected a callable",
        "received int (5)",
        "def my_kernel(x)",
    ),
    Case(
        "kernel/function-arity",
        lambda t: _kernel(inputs=["x", "y"], outputs=["z"], fn=lambda x: x),
        SymbolicError,
        "declares 2 input(s) ['x', 'y']",
        "takes 1 positional argument(s) ['x']",
        "def <lambda>(x, y, *, <attributes>)",
    ),
    Case(
        "kernel/attribute-keyword-missing",
        lambda t: _kernel(attrs={"alpha": "float"}),
        SymbolicError,
        "`def f(a, b, *, alpha)`",
        "does not accept attribute keyword(s) ['alpha']",
        "add them to its signature",
    ),
    Case(
        "kernel/attribute-type",
        lambda t: _kernel(attrs={"a": "complex"}, fn=lambda x, *, a: x),
        SymbolicError,
        "expected one of int, float, string",
        "has type 'complex'",
        "attrs={'a': 'float'}",
    ),
    Case(
        "kernel/attribute-default-type",
        lambda t: _kernel(attrs={"a": ("int", "3")}, fn=lambda x, *, a: x),
        SymbolicError,
        "must be a int",
        "received '3'",
        "pass a int default",
    ),
    Case(
        "kernel/attribute-default-past-int64",
        lambda t: _kernel(attrs={"a": ("int", 2**70)}, fn=lambda x, *, a: x),
        SymbolicError,
        "int64 range",
        "1180591620717411303424",
        "fits in 64 bits",
    ),
    Case(
        "kernel/attribute-named-out",
        lambda t: _kernel(attrs={"out": "int"}, fn=lambda x, *, out: x),
        SymbolicError,
        "must not be 'out'",
        "attrs with 'out'",
        "rename the attribute",
    ),
    Case(
        "kernel/unknown-dtype",
        lambda t: _kernel(dtypes="float33"),
        SymbolicError,
        "expected names from float32",
        "['float33']",
        "dtypes=['float32', 'float64']",
    ),
    Case(
        "kernel/dtypes-unknown-name",
        lambda t: _kernel(dtypes={"z": "float32"}),
        SymbolicError,
        "expected among ['x', 'y']",
        "dtypes= names ['z']",
        "key dtypes= by those names",
    ),
    Case(
        "kernel/tensor-type",
        lambda t: _kernel(tensor_type="jax"),
        SymbolicError,
        "'numpy' or 'torch'",
        "received 'jax'",
        "tensor_type='numpy'",
    ),
    Case(
        "kernel/shape-fn-unknown-input",
        lambda t: _kernel(shape_fn="like:z"),
        SymbolicError,
        "one of the declared inputs ('like:x')",
        "shape_fn='like:z'",
        "name a declared input",
    ),
    Case(
        "kernel/registered-twice",
        lambda t: _two_kernels(),
        KernelError,
        "register under another 'domain::OpType'",
        "'d::Op' is already registered",
        "replace=True",
    ),
    Case(
        "kernel/registered-twice-names-both",
        lambda t: _two_kernels(),
        KernelError,
        "expected one kernel per 'domain::OpType'",
        "received another one (test_bad_input_matrix._two_kernels.<locals>.<lambda> at"
        " test_bad_input_matrix.py:",
        "replace=True",
    ),
    Case(
        "spec/meta-returns-none",
        lambda t: _export_meta_spec(lambda x: None),
        SpecError,
        "expected 1 tensor(s) ['y']",
        "returned None",
        "torch.empty(..., device='meta')",
    ),
    Case(
        "spec/meta-wrong-rank",
        lambda t: _export_meta_spec(
            lambda x: torch.empty(x.shape[0], device="meta"), "torchscript"
        ),
        SpecError,
        "expected the same",
        "rank 1",
        "fix: correct the meta function",
    ),
    Case(
        "spec/tensor-torch-argument",
        lambda t: OpSpec(
            "bad::t",
            inputs=["x"],
            outputs=["y"],
            attributes=[onnx_custom.spec.Attribute("w", "tensor", np.ones(2))],
            translations={1: lambda g, x: x},
        ),
        SpecError,
        "expected one of int, float",
        "type 'tensor'",
        "fix: make it an input, or a node attribute",
    ),
    Case(
        "yaml/vendor-format-type",
        lambda t: load_specs(_yaml(t, "    - {name: x, dtype: [fp16], format: 3}")),
        SpecError,
        "expected a layout label (ND, NCHW, ...) or a list of them",
        "received int 3",
        "fix: write a layout label",
    ),
    Case(
        "yaml/vendor-param-type",
        lambda t: load_specs(_yaml(t, "    - {name: x, param_type: maybe}")),
        SpecError,
        "expected one of required, optional, dynamic",
        "received str 'maybe'",
        "fix: write one of",
    ),
    Case(
        "kernel/remove-missing",
        lambda t: KernelRegistry().remove("d::Op"),
        KernelError,
        "one of the registered names: (none)",
        "'d::Op'",
        "register it first",
    ),
    Case(
        "kernel/alias-of-missing",
        lambda t: KernelRegistry().alias("d::B", "d::A"),
        KernelError,
        "one of the registered names",
        "'d::A'",
        "register it first",
    ),
    Case(
        "kernel/add-not-a-spec",
        lambda t: KernelRegistry().add({}),
        KernelError,
        "expected a KernelSpec",
        "received dict",
        "@registry.kernel('domain::Op'",
    ),
    # -- onnx_custom.InferenceSession ------------------------------------------------------------
    Case(
        "session/missing-file",
        lambda t: InferenceSession(t / "none.onnx"),
        ModelNotFoundError,
        "ONNX model file",
        "does not exist",
        "export it first",
    ),
    Case(
        "session/model-int",
        lambda t: InferenceSession(5),
        ModelLoadError,
        "onnx.ModelProto, bytes or a file path",
        "received int (5)",
        "open(path, 'rb').read()",
    ),
    Case(
        "session/garbage-bytes",
        lambda t: InferenceSession(b"\x08garbage"),
        ModelLoadError,
        "not a valid ONNX model",
        "the given bytes",
        "re-export the model",
    ),
    Case(
        "session/kernels-typo",
        lambda t: InferenceSession(_proto(), kernels="nativ"),
        KernelError,
        "KernelRegistry, None or 'native'",
        "received 'nativ'",
        "kernels='native'",
    ),
    Case(
        "session/no-kernel-for-a-node",
        lambda t: InferenceSession(_custom_node_model()),
        KernelError,
        "have no Python kernel",
        "nosuch::NoKernel (node n0)",
        "@onnx_custom.runtime.kernel('domain::OpType', ...)",
    ),
    Case(
        "session.run/unknown-input",
        lambda t: _session().run(None, {"z": GOOD["x"], "y": GOOD["y"]}),
        InvalidArgumentError,
        "Expected inputs: 'x' (tensor(float)",
        "'z' is not an input of the model",
        "Fix: pass run(None",
    ),
    Case(
        "session.run/missing-input",
        lambda t: _session().run(None, {"x": GOOD["x"]}),
        InvalidArgumentError,
        "Expected inputs: 'x'",
        "input 'y' (tensor(float), shape [2, 3]) is missing",
        "Fix: pass run(None",
    ),
    Case(
        "session.run/wrong-dtype",
        lambda t: _session().run(None, {**GOOD, "x": GOOD["x"].astype(np.int64)}),
        InvalidArgumentError,
        "declares tensor(float) (numpy float32)",
        "input 'x' is int64",
        ".astype(np.float32)",
    ),
    Case(
        "session.run/wrong-rank",
        lambda t: _session().run(None, {**GOOD, "x": GOOD["x"][0]}),
        InvalidArgumentError,
        "declares 2: [2, 3]",
        "has 1 dim(s) [3]",
        "declared dtype and rank",
    ),
    Case(
        "session.run/unknown-output",
        lambda t: _session().run(["nope"], GOOD),
        InvalidArgumentError,
        "outputs: '",
        "output 'nope' is not an output",
        "[output names]",
    ),
    Case(
        "session.run/feed-not-a-dict",
        lambda t: _session().run(None, [GOOD["x"], GOOD["y"]]),
        InvalidArgumentError,
        "a dict {input name: array}",
        "received list",
        "{input name: numpy array",
    ),
    # -- op specs: OpSpec, load_specs, register_spec -----------------------------------------------
    Case(
        "OpSpec/bad-name",
        lambda t: OpSpec("bad name", inputs=["x"], outputs=["y"]),
        SpecError,
        "expected 'namespace::op'",
        "'bad name'",
        "Did you mean",
    ),
    Case(
        "OpSpec/no-output",
        lambda t: OpSpec("d::op", inputs=["x"], outputs=[]),
        SpecError,
        "expected at least one",
        "declares no output",
        "outputs=[Output('y')]",
    ),
    Case(
        "load_specs/missing-file",
        lambda t: load_specs(t / "none.yaml"),
        SpecError,
        "op spec file",
        "does not exist",
        "check the path",
    ),
    Case(
        "load_specs/bad-yaml",
        lambda t: load_specs(_write(t / "bad.yaml", "ops: [unclosed\n")),
        SpecError,
        "not valid YAML",
        "expected ','",
        "correct the YAML syntax",
    ),
    Case(
        "load_specs/unknown-key",
        lambda t: load_specs(_write(t / "k.yaml", "- op_name: d::op\n  colour: red\n")),
        SpecError,
        "expected one of op_name, op_type",
        "unknown key 'colour'",
        "rename or remove it",
    ),
    Case(
        "register_spec/not-a-spec",
        lambda t: register_spec(3),
        SpecError,
        "an onnx_custom.OpSpec",
        "received int",
        "OpSpec(...) or load_specs(path)",
    ),
    # -- the native library ------------------------------------------------------------------------
    Case(
        "library_path/sanitize-str",
        lambda t: onnx_custom.library_path(sanitize="no"),
        InvalidArgumentError,
        "True or False",
        "received 'no'",
        "sanitize=True",
    ),
    Case(
        "build_library/output-is-a-file",
        lambda t: build_library(_write(t / "file", "")),
        ExtensionBuildError,
        "expected a writable folder",
        "/file: ",
        "pass a writable folder",
    ),
    # -- deform_conv2d / DeformConv2d ------------------------------------------------------------
    Case(
        "deform_conv2d/offset-shape",
        lambda t: _dcn(offset=torch.zeros(1, 18, 4, 4)),
        DeformConv2dError,
        "= (1, 18, 3, 3)",
        "got (1, 18, 4, 4)",
        "produce the offset with 18 channels",
    ),
    Case(
        "deform_conv2d/mask-shape",
        lambda t: _dcn(mask=torch.zeros(1, 5, 3, 3)),
        DeformConv2dError,
        "= (1, 9, 3, 3)",
        "got (1, 5, 3, 3)",
        "or pass mask=None",
    ),
    Case(
        "deform_conv2d/3d-input",
        lambda t: _dcn(input=torch.randn(3, 5, 5)),
        DeformConv2dError,
        "must be 4-D",
        "input [3, 5, 5]",
        ".unsqueeze(0)",
    ),
    Case(
        "deform_conv2d/int-input",
        lambda t: _dcn(input=torch.ones(1, 3, 5, 5, dtype=torch.int64)),
        DeformConv2dDtypeError,
        "float32, float64, float16, bfloat16",
        "torch.int64",
        ".float()",
    ),
    Case(
        "deform_conv2d/stride-0",
        lambda t: _dcn(stride=0),
        DeformConv2dError,
        "must be positive",
        "got 0",
        "pass 1 or more",
    ),
    Case(
        "deform_conv2d/bias-shape",
        lambda t: _dcn(bias=torch.zeros(5)),
        DeformConv2dError,
        "out channels 4",
        "bias shape (5,)",
        "shape (4,)",
    ),
    Case(
        "DeformConv2d/groups",
        lambda t: DeformConv2d(3, 4, 3, groups=2),
        DeformConv2dError,
        "divisible by groups=2",
        "in_channels=3",
        "pick groups dividing both",
    ),
    Case(
        "DeformConv2d/kernel-size-0",
        lambda t: DeformConv2d(3, 4, 0),
        DeformConv2dError,
        "expected positive sizes",
        "kernel_size=(0, 0)",
        "kernel_size=3",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path) -> None:
    with pytest.raises(case.error) as info:
        case.call(tmp_path)
    error = info.value
    assert isinstance(error, OnnxCustomError), f"{type(error).__name__} is not an OnnxCustomError"
    message = str(error)
    for what, fragment in (
        ("expected", case.expected),
        ("received", case.received),
        ("fix", case.fix),
    ):
        assert fragment in message, (
            f"the message does not name the {what} ({fragment!r}):\n{message}"
        )


def test_matrix_size_and_error_types() -> None:
    """The table covers the API broadly: at least 60 rows and a dozen distinct error types."""
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    assert len({c.error for c in CASES}) >= 12


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (InvalidArgumentError, TypeError),
        (InvalidArgumentError, ValueError),
        (OutputPathError, OSError),
        (ModelNotFoundError, FileNotFoundError),
        (ModelLoadError, ValueError),
        (SymbolicError, ValueError),
        (OpsetError, ValueError),
        (DynamicShapesError, ValueError),
    ],
)
def test_typed_errors_keep_the_builtin_they_replace(
    error: type[BaseException], builtin: type[BaseException]
) -> None:
    """Code written against the builtin errors (``except FileNotFoundError``) keeps working."""
    assert issubclass(error, OnnxCustomError) and issubclass(error, builtin)


# -- silent wrongs that need more than one call -------------------------------------------------

NUL = "ab\x00cd"


@pytest.mark.parametrize(("exporter", "opset"), [("torchscript", 17), ("dynamo", 18)])
def test_strings_with_nul_reach_the_kernel_whole(exporter: str, opset: int) -> None:
    """A string attribute holding NUL reaches the file and the Python kernel intact (the shim's
    ``PyUnicode_FromString`` cut it at the NUL: the kernel saw ``"ab"``)."""
    seen: list[Any] = []
    kernels = KernelRegistry()

    @kernels.kernel(
        "nultest::Tag",
        inputs=["x"],
        outputs=["y"],
        attrs={"s": "string", "names": "strings"},
        shape_fn="like:x",
    )
    def tag(x: np.ndarray, *, s: str, names: list[str]) -> np.ndarray:
        seen.append((s, list(names)))
        return x + len(s) + len(names[1])

    registry = _translation(
        lambda g, a, b: g.op("nultest::Tag", g.op("Add", a, b), s=NUL, names=["x", NUL + "\x00"])
    )
    proto = onnx_custom.export(MyAdd(), ARGS, exporter=exporter, opset=opset, registry=registry)
    (node,) = [n for n in proto.graph.node if n.op_type == "Tag"]
    attrs = {a.name: a for a in node.attribute}
    assert attrs["s"].s == NUL.encode() and list(attrs["names"].strings) == [
        b"x",
        (NUL + "\x00").encode(),
    ]
    (got,) = InferenceSession(proto, kernels=kernels).run(
        None, {"x": ARGS[0].numpy(), "y": ARGS[1].numpy()}
    )
    assert seen[-1] == (NUL, ["x", NUL + "\x00"])
    np.testing.assert_allclose(got, (ARGS[0] + ARGS[1]).numpy() + 5 + 6, rtol=1e-6)

"""Bad native-kernel specs and sources: typed errors naming the op, the file and line, and the fix.

Compile errors run the real compiler on small user files: the message must carry the first
error with its file:line, attributed to the op (and dtype), not a template dump.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from onnx_custom.errors import NativeCompileError, SpecError
from onnx_custom.spec import (
    Attribute,
    Input,
    NativeKernel,
    OpSpec,
    Output,
    build_native_library,
    parse_specs,
)

HEADER = "#include <onnx_custom/kernel.h>\nusing onnx_custom::Tensor;\n"
GOOD = HEADER + textwrap.dedent("""
    template <typename T>
    void twice(const Tensor<T>& x, Tensor<T>& out, float k) {
      for (int64_t i = 0; i < x.size(); ++i) out[i] = T(k * float(x[i]));
    }
    """)


def spec_yaml(
    tmp_path: Path,
    native: str,
    *,
    dtypes: str = "[float32]",
    shape: str = "like:x",
    source: str = GOOD,
) -> Path:
    (tmp_path / "k.cpp").write_text(source)
    path = tmp_path / "ops.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        # test ops
        - op_name: "bad::twice"
          op_type: Twice
          input_desc:
            - {{name: x, dtype: {dtypes}}}
          output_desc:
            - {{name: out, shape: "{shape}"}}
          attr_desc:
            - {{name: k, dtype: float, default_value: 2.0}}
          native: {native}
        """)
    )
    return path


# ---- refused before compiling: SpecError with file:line and key ----------------------------------
@pytest.mark.parametrize(
    ("native", "kwargs", "message"),
    [
        (
            "{source: nope.cpp, function: twice}",
            {},
            r"ops.yaml:2\): native.source '.*nope.cpp' does not exist",
        ),
        (
            "{source: k.cpp, function: thrice}",
            {},
            (
                r"native.function 'thrice' does not appear in k.cpp; expected a function such as:"
                r" void thrice\(const Tensor<float>& x, Tensor<float>& out, float k\)"
            ),
        ),
        (
            "{source: k.cpp, function: twice}",
            {"shape": "[d for d in x]"},
            (
                r"cannot translate ListComp in shape rule '\[d for d in x\]' of output 'out' to"
                r" C\+\+.*allocate the output in the kernel"
            ),
        ),
    ],
    ids=["missing-source", "missing-function", "untranslatable-shape-rule"],
)
def test_spec_errors_before_compiling(
    tmp_path: Path, native: str, kwargs: dict[str, str], message: str
) -> None:
    specs = parse_specs(spec_yaml(tmp_path, native, **kwargs))
    with pytest.raises(SpecError, match=message):
        build_native_library(specs, name="bad")


@pytest.mark.parametrize(
    ("native", "message"),
    [
        ("{source: k.cpp}", r"ops.yaml:10: key native: op bad::twice: native names no function"),
        (
            "{source: k.cpp, function: twice, flags: -O0}",
            r"ops.yaml:10: key native.*unknown key\(s\) \['flags'\]",
        ),
        (
            "{source: k.cpp, function: 'not a name'}",
            r"native.function 'not a name' is not a C\+\+ function name",
        ),
        (
            "[k.cpp, twice]",
            (
                r"ops.yaml:10: key native: expected a boolean, 'domain::OpType' or \{source,"
                r" function\}"
            ),
        ),
    ],
    ids=["no-function", "unknown-key", "bad-function-name", "wrong-type"],
)
def test_yaml_native_key_errors(tmp_path: Path, native: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_specs(spec_yaml(tmp_path, native))


def test_python_spec_and_api_errors(tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text(GOOD)
    spec = OpSpec(
        "bad::twice",
        op_type="Twice",
        inputs=[Input("x", ["float32"])],
        outputs=[Output("out", shape="like:x")],
        attributes=[Attribute("k", "float", 2.0)],
        native={"source": str(tmp_path / "k.cpp"), "function": "twice"},
    )
    assert spec.native == NativeKernel(str(tmp_path / "k.cpp"), "twice")
    plain = OpSpec(
        "bad::plain", op_type="Plain", inputs=[Input("x")], outputs=[Output("y", shape="like:x")]
    )
    with pytest.raises(
        SpecError,
        match=(
            r"op\(s\) bad::plain have no C\+\+ kernel: expected native: \{source: file.cpp,"
            r" function: name\}"
        ),
    ):
        build_native_library([spec, plain])
    with pytest.raises(SpecError, match=r"library name 'no-dash' is not an identifier"):
        build_native_library([spec], name="no-dash")
    with pytest.raises(SpecError, match=r"expects a list of OpSpec"):
        build_native_library(["bad::twice"])  # type: ignore[list-item]


# ---- the compiler's verdict, attributed to the op ------------------------------------------------
@pytest.mark.parametrize(
    ("source", "dtypes", "message"),
    [
        (
            HEADER
            + "template <typename T>\nvoid twice(const Tensor<T>& x, Tensor<T>& out, float k) {\n "
            " out[0] = x[0] +;\n}\n",
            "[float32]",
            (
                r"op bad::twice \(.*ops.yaml:2\): its C\+\+ kernel does not compile: k.cpp:5:\d+:"
                r" expected primary-expression"
            ),
        ),
        (
            HEADER + "template <typename T>\nvoid twice(const Tensor<T>& x, Tensor<T>& out) {}\n",
            "[float32]",
            (
                r"op bad::twice .*: the C\+\+ function twice in k.cpp cannot be called as the spec"
                r" declares it; expected void twice\(const Tensor<float>& x, Tensor<float>& out,"
                r" float k\)"
            ),
        ),
        (
            HEADER
            + "void twice(const Tensor<float>& x, Tensor<float>& out, float k) { out[0] = k *"
            " x[0]; }\n",
            "[float32, float16]",
            (
                r"cannot be called as the spec declares it at dtype float16; expected void"
                r" twice\(const Tensor<float16>& x, Tensor<float16>& out, float k\)"
            ),
        ),
    ],
    ids=["syntax-error", "signature-mismatch", "dtype-not-instantiated"],
)
def test_compile_errors_name_op_file_and_line(
    tmp_path: Path, source: str, dtypes: str, message: str
) -> None:
    specs = parse_specs(
        spec_yaml(tmp_path, "{source: k.cpp, function: twice}", dtypes=dtypes, source=source)
    )
    with pytest.raises(NativeCompileError, match=message) as info:
        build_native_library(specs, tmp_path / "dist", name="bad")
    assert info.value.op == "bad::twice" and info.value.output  # the full output stays available
    assert len(str(info.value).splitlines()) < 15  # the first errors, not a template dump
    assert not (tmp_path / "dist").exists()  # nothing half-written

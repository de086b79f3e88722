"""YAML op specs: every error names the file, the line and the key, and nothing is half-loaded."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import onnx_custom
from onnx_custom.spec import SpecError, parse_specs, registered_specs, spec_scope

GOOD = """\
- op_name: "ytest::scale_add"
  op_type: "ScaleAdd"
  input_desc:
    - {name: x, dtype: [float32]}
    - {name: y, dtype: [float32]}
  output_desc:
    - {name: out, shape: "like:x"}
  attr_desc:
    - {name: alpha, dtype: float, default_value: 2.0}
  impl: "ytest_ops:scale_add"
  kernel: "ytest_ops:scale_add_np"
"""

OPS = """\
def scale_add(x, y, *, alpha):
    return alpha * x + y


def scale_add_np(x, y, *, alpha):
    return (x.dtype.type(alpha) * x + y).astype(x.dtype)


def bad_kernel(a, b, *, alpha):
    return a
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "ytest_ops.py").write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ytest_ops", raising=False)
    with spec_scope():
        yield tmp_path
    sys.modules.pop("ytest_ops", None)


def _edit(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


# (id, file text, line, key, what the message must also say)
BAD = [
    (
        "unknown-op-key",
        _edit('  impl: "ytest_ops:scale_add"', '  implementation: "ytest_ops:scale_add"'),
        10,
        "implementation",
        [
            "unknown key 'implementation' in op entry 0",
            "did you mean 'impl'?",
            "expected one of op_name, op_type",
            "fix: rename or remove it",
        ],
    ),
    (
        "unknown-item-key",
        _edit("{name: x, dtype: [float32]}", "{name: x, dtypes: [float32]}"),
        4,
        "input_desc[0].dtypes",
        ["unknown key 'dtypes' in input_desc[0]", "did you mean 'dtype'?"],
    ),
    (
        "unknown-attr-key",
        _edit("default_value: 2.0", "default: 2.0"),
        9,
        "attr_desc[0].default",
        ["did you mean 'default_value'?"],
    ),
    (
        "list-is-mapping",
        _edit(
            "  input_desc:\n    - {name: x, dtype: [float32]}\n    - {name: y, dtype: [float32]}",
            "  input_desc: {name: x}",
        ),
        3,
        "input_desc",
        ["expected a list", "received dict"],
    ),
    (
        "dtype-is-number",
        _edit("{name: y, dtype: [float32]}", "{name: y, dtype: 32}"),
        5,
        "input_desc[1].dtype",
        ["expected a dtype list", "received int 32", "fix: write a dtype list here"],
    ),
    (
        "flag-is-string",
        _edit("{name: y, dtype: [float32]}", "{name: y, dtype: [float32], optional: yes please}"),
        5,
        "input_desc[1].optional",
        ["expected a boolean", "received str 'yes please'"],
    ),
    (
        "op-type-is-list",
        _edit('op_type: "ScaleAdd"', "op_type: [ScaleAdd]"),
        2,
        "op_type",
        ["expected a string", "received list"],
    ),
    (
        "duplicate-key",
        _edit(
            '  impl: "ytest_ops:scale_add"\n',
            '  impl: "ytest_ops:scale_add"\n  impl: "ytest_ops:other"\n',
        ),
        11,
        "impl",
        ["key 'impl' appears twice in op entry 0", "fix: keep one"],
    ),
    (
        "item-not-mapping",
        _edit("    - {name: y, dtype: [float32]}", "    - y"),
        5,
        "input_desc[1]",
        ["input_desc[1] must be a mapping", "received a scalar"],
    ),
    (
        "item-without-name",
        _edit("{name: y, dtype: [float32]}", "{dtype: [float32]}"),
        5,
        "input_desc[1].name",
        ["input_desc[1] has no name"],
    ),
    (
        "no-op-name",
        _edit('- op_name: "ytest::scale_add"\n  op_type', "- op_type"),
        1,
        "op_name",
        ["op entry 0 has no op_name"],
    ),
    (
        "no-outputs",
        _edit('  output_desc:\n    - {name: out, shape: "like:x"}\n', ""),
        1,
        "output_desc",
        ["op ytest::scale_add has no output_desc"],
    ),
    (
        "bad-dtype-name",
        _edit("{name: y, dtype: [float32]}", "{name: y, dtype: [float23]}"),
        5,
        "input_desc[1].dtype",
        ["unknown dtype(s) ['float23']"],
    ),
    (
        "bad-shape-rule",
        _edit('shape: "like:x"', 'shape: "[q.0]"'),
        7,
        "output_desc[0].shape",
        ["names ['q']", "neither inputs ['x', 'y']"],
    ),
    (
        "bad-attr-type",
        _edit("dtype: float, default_value", "dtype: tensor, default_value"),
        9,
        "attr_desc[0].dtype",
        ["type 'tensor'", "expected one of int, float"],
    ),
    (
        "bad-default",
        _edit("default_value: 2.0", "default_value: [2.0]"),
        9,
        "attr_desc[0].default_value",
        ["has default [2.0]", "expected a float"],
    ),
    (
        "bad-op-name",
        _edit('op_name: "ytest::scale_add"', 'op_name: "ytest:scale_add"'),
        1,
        "op_name",
        ["Ill-formed op name", "double colon"],
    ),
    (
        "kernel-mismatch",
        _edit('kernel: "ytest_ops:scale_add_np"', 'kernel: "ytest_ops:bad_kernel"'),
        11,
        "kernel",
        ["takes parameter 'a' where input 'x' (position 0) is expected"],
    ),
    (
        "impl-not-found",
        _edit('impl: "ytest_ops:scale_add"', 'impl: "ytest_ops:scale_ad"'),
        10,
        "impl",
        ["has no attribute 'scale_ad'", "Did you mean 'scale_add'"],
    ),
    (
        "yaml-syntax",
        _edit("    - {name: y, dtype: [float32]}", "    - {name: y, dtype: [float32]"),
        6,
        "",
        ["not valid YAML"],
    ),
    (
        "python-tag",
        _edit('impl: "ytest_ops:scale_add"', "impl: !!python/name:os.system ''"),
        10,
        "impl",
        ["cannot read this value", "could not determine a constructor"],
    ),
    (
        "translations-not-mapping",
        GOOD + "  translations: [1, 2]\n",
        12,
        "translations",
        ["expected a mapping", "received list"],
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "key", "parts"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_yaml_names_file_line_and_key(
    folder: Path, text: str, line: int, key: str, parts: list[str]
) -> None:
    path = folder / "ops.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        onnx_custom.load_specs(path)
    error = info.value
    assert (error.file, error.line) == (str(path), line), str(error)
    assert str(error).startswith(f"{path}:{line}: ")
    if key:
        assert f"key {key}: " in str(error)
    for part in parts:
        assert part in str(error), (part, str(error))
    assert "ytest::scale_add" not in registered_specs()


def test_one_bad_op_loads_none(folder: Path) -> None:
    second = GOOD.replace("ytest::scale_add", "ytest::scale_add2").replace(
        '"ytest_ops:scale_add_np"', '"ytest_ops:bad_kernel"'
    )
    (folder / "ops.yaml").write_text(GOOD + second)
    with pytest.raises(SpecError, match=r"ops.yaml:22: key kernel: op ytest::scale_add2"):
        onnx_custom.load_specs(folder / "ops.yaml")
    assert registered_specs() == {}  # the first op was taken back too
    assert torch._C._jit_get_schemas_for_operator("ytest::scale_add") == []


def test_op_declared_twice_in_a_file(folder: Path) -> None:
    (folder / "ops.yaml").write_text(GOOD + GOOD)
    with pytest.raises(
        SpecError,
        match=(
            r"ops.yaml:12: key op_name: op ytest::scale_add is declared twice in this file \(also"
            r" at line 1\)"
        ),
    ):
        parse_specs(folder / "ops.yaml")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.yaml", None, "does not exist (not found); fix: check the path"),
        ("", None, "holds no *.yaml/*.yml files"),
        ("empty.yaml", b"", "the file is empty; expected a list of ops"),
        ("bytes.yaml", b"\xff\xfe\x00", "expected a UTF-8 YAML file"),
        ("scalar.yaml", b"42\n", "op entry 0 must be a mapping"),
    ],
    ids=["missing", "empty-folder", "empty-file", "not-utf8", "scalar"],
)
def test_bad_paths_and_files(
    tmp_path: Path, name: str, content: bytes | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SpecError) as info:
        parse_specs(path)
    assert message in str(info.value)


def test_load_specs_needs_a_path() -> None:
    with pytest.raises(
        SpecError, match="expects a path to a YAML file or a folder of them; received int"
    ):
        onnx_custom.load_specs(42)  # type: ignore[arg-type]


def test_every_documented_key_is_accepted(folder: Path) -> None:
    """All keys at once, each with a meaningful value."""
    (folder / "ytest_more.py").write_text(
        "import torch\n"
        "def fwd(x, bias=None, *, k, names, flag, mode, dims, ratio):\n"
        "    return x * k\n"
        "def bwd(ctx, grad):\n"
        "    return grad * ctx.k, None, None, None, None, None, None, None\n"
        "def save(ctx, inputs, output):\n"
        "    ctx.k = inputs[2]\n"
        "def meta(x, bias=None, *, k, names, flag, mode, dims, ratio):\n"
        "    return torch.empty_like(x)\n"
        "def onnx13(g, x, bias, **attrs):\n"
        "    return g.op('Mul', x, g.constant(float(attrs['k']), like=x))\n"
    )
    (folder / "all.yaml").write_text("""\
- op_name: "ytest::everything"
  op_type: "Everything"
  domain: "com.ytest"
  doc: "x * k"
  input_desc:
    - {name: x, dtype: [float32, float64], format: ND, doc: "the input"}
    - {name: bias, dtype: [float32, float64], optional: true, variadic: false}
  output_desc:
    - {name: y, dtype: "like:x", format: ND, doc: "the output"}
  attr_desc:
    - {name: k, dtype: int, doc: "the factor"}
    - {name: names, dtype: "str[]"}
    - {name: flag, dtype: bool, default_value: true}
    - {name: mode, dtype: str, default_value: "fast"}
    - {name: dims, dtype: listInt, default_value: [0, 1]}
    - {name: ratio, dtype: "float[]", default_value: [0.5]}
  impl: "ytest_more:fwd"
  backward: "ytest_more:bwd"
  setup_context: "ytest_more:save"
  shape: "ytest_more:meta"
  native: true
  translations: {13: "ytest_more:onnx13"}
""")
    (spec,) = onnx_custom.load_specs(folder / "all.yaml")
    assert spec.node_type == "com.ytest::Everything" and spec.native is True
    assert (
        spec.schema
        == '(Tensor x, Tensor? bias, int k, str[] names, bool flag=True, str mode="fast", int[]'
        " dims=[0, 1], float[] ratio=[0.5]) -> Tensor"
    )
    assert spec.attributes[0].doc == "the factor" and spec.inputs[0].format == "ND"
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = torch.ops.ytest.everything(x, None, 3, ["a"])
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))

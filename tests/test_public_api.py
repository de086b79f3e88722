"""The package's public surface: ``__all__`` is exactly what ``onnx_custom`` loads on first use,
and the shipped torch ops answer under ``torch.ops.onnx_custom`` after ``import onnx_custom``
alone, in either import order, without that import loading torch."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import onnx_custom
from onnx_custom.common import builtins


def test_all_is_the_lazy_table() -> None:
    # translation_table is the one public function the package defines itself
    assert set(onnx_custom.__all__) == {*onnx_custom._LAZY, "translation_table"}
    assert onnx_custom.__all__ == sorted(onnx_custom.__all__)
    assert len(set(onnx_custom.__all__)) == len(onnx_custom.__all__)


def test_every_public_name_is_declared_for_type_checkers() -> None:
    """The TYPE_CHECKING imports name every lazy entry, so IDEs and mypy see them."""
    tree = ast.parse(Path(onnx_custom.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n))
    declared = {
        alias.asname or alias.name
        for node in ast.walk(guarded)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert set(onnx_custom._LAZY) <= declared


def test_the_op_modules_listed_define_ops_of_the_namespace() -> None:
    assert all(m.startswith("onnx_custom.ops") for m in builtins.OP_MODULES)


_CHECK = """
import sys
{first}
assert "onnx_custom.ops" not in sys.modules
ns = torch.ops.onnx_custom
a, b = torch.ones(2, 3), torch.full((2, 3), 0.5)
assert torch.equal(ns.my_add(a, b), 2 * a + b)
for name in ("deform_conv2d", "multi_scale_deformable_attn", "bev_pool_v2", "custom_linear",
             "numpy_sin", "multi_out", "multi_out3"):
    assert callable(getattr(ns, name)), name
assert not hasattr(ns, "no_such_op")
assert type(torch.__spec__.loader).__module__.startswith("_frozen_importlib"), torch.__spec__.loader
assert torch.__loader__ is torch.__spec__.loader
assert not [f for f in sys.meta_path if "op_namespace" in type(f).__module__], sys.meta_path
print("ok")
"""

_FIRSTS = {
    "onnx_custom-then-torch": (
        "import onnx_custom\nassert 'torch' not in sys.modules  # no torch for --help\nimport torch"
    ),
    "torch-then-onnx_custom": "import torch\nimport onnx_custom",
}


@pytest.mark.parametrize("order", sorted(_FIRSTS))
def test_torch_ops_namespace_after_plain_import(order: str) -> None:
    code = textwrap.dedent(_CHECK).format(first=_FIRSTS[order])
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]

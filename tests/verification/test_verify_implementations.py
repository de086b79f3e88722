"""`verify`'s report names which implementation ran each custom node: a Python
kernel, a native kernel (the shipped ``libonnx_custom_ops.so`` or a user's library), the file's
ONNX function body, or an op ONNX Runtime has built in (a ``com.microsoft`` contrib op) — in the
text report, the structured (JSON) report and the ``onnx-custom verify`` output.

Files are small onnx.helper graphs run in real ONNX Runtime; the PyTorch side is plain torch
math written independently of every kernel, so each row also verifies for real.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_custom
from onnx_custom.cli.main import main
from onnx_custom.runtime import KernelRegistry
from onnx_custom.verification.report import report_to_dict, summary_text, write_report

SHAPE = [2, 3]


def _graph(
    nodes: list[onnx.NodeProto],
    inputs: list[str],
    opsets: dict[str, int],
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
    )
    imports = [helper.make_opsetid(d, v) for d, v in {"": 18, **opsets}.items()]
    return helper.make_model(graph, ir_version=10, opset_imports=imports, functions=list(functions))


def my_add_model() -> onnx.ModelProto:
    """onnx_custom::my_add (alpha * a + b): a shipped op with a Python and a native kernel."""
    return _graph(
        [helper.make_node("my_add", ["a", "b"], ["y"], domain="onnx_custom", alpha=2.0)],
        ["a", "b"],
        {"onnx_custom": 1},
    )


def double_body() -> onnx.FunctionProto:
    return helper.make_function(
        "toy",
        "Double",
        ["x"],
        ["y"],
        [helper.make_node("Add", ["x", "x"], ["y"])],
        [helper.make_opsetid("", 18)],
    )


def double_model() -> onnx.ModelProto:
    """toy::Double with a function body in the file (2x)."""
    return _graph(
        [helper.make_node("Double", ["x"], ["y"], domain="toy")], ["x"], {"toy": 1}, [double_body()]
    )


def gelu_model() -> onnx.ModelProto:
    """com.microsoft::Gelu: an ONNX Runtime contrib op (exact erf GELU)."""
    return _graph(
        [helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")],
        ["x"],
        {"com.microsoft": 1},
    )


def acme_model() -> onnx.ModelProto:
    """acme::ScaleAdd (alpha * x + y), served by the user's C++ kernel in its own library."""
    return _graph(
        [helper.make_node("ScaleAdd", ["x", "y_in"], ["y"], domain="acme", alpha=3.0)],
        ["x", "y_in"],
        {"acme": 1},
    )


def double_kernels() -> KernelRegistry:
    reg = KernelRegistry()

    @reg.kernel("toy::Double", inputs=["x"], outputs=["y"], shape_fn="like:x")
    def double_kernel(x: np.ndarray) -> np.ndarray:
        return x * np.float32(2)

    return reg


def acme_library() -> Any:
    from onnx_custom.spec import build_native_library, parse_specs

    return [
        build_native_library(
            parse_specs(Path(__file__).parents[1] / "spec" / "native_user" / "acme.yaml"),
            name="acme_test",
        )
    ]


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    model: Callable[[], onnx.ModelProto]
    eager: Callable[..., torch.Tensor]
    kernels: Callable[[], Any]
    # backend -> (node type, kind, words of the source)
    expect: dict[str, tuple[str, str, str]]


ROWS = [
    Row(
        "python-kernel-my_add",
        my_add_model,
        lambda a, b: 2.0 * a + b,
        lambda: None,
        {"onnxruntime": ("onnx_custom::my_add", "python", "my_add")},
    ),
    Row(
        "native-shipped-my_add",
        my_add_model,
        lambda a, b: 2.0 * a + b,
        lambda: "native",
        {"onnxruntime": ("onnx_custom::my_add", "native", "libonnx_custom_ops.so")},
    ),
    Row(
        "native-user-acme",
        acme_model,
        lambda x, y_in: 3.0 * x + y_in,
        acme_library,
        {"onnxruntime": ("acme::ScaleAdd", "native", "acme_test")},
    ),
    Row(
        "function-body-only",
        double_model,
        lambda x: x + x,
        lambda: None,
        {
            "onnxruntime": ("toy::Double", "function", "toy::Double"),
            "onnxruntime-bodies": ("toy::Double", "function", "toy::Double"),
        },
    ),
    Row(
        "kernel-wins-over-body",
        double_model,
        lambda x: x + x,
        double_kernels,
        {
            "onnxruntime": ("toy::Double", "python", "double_kernel"),
            "onnxruntime-bodies": ("toy::Double", "function", "toy::Double"),
        },
    ),
    Row(
        "contrib-gelu",
        gelu_model,
        lambda x: torch.nn.functional.gelu(x),
        lambda: None,
        {"onnxruntime": ("com.microsoft::Gelu", "builtin", "com.microsoft")},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_report_names_the_implementation(row: Row, tmp_path: Path) -> None:
    if row.kernels is acme_library or row.kernels() == "native":
        pytest.importorskip("onnx_custom.runtime.native")
    proto = row.model()
    names = [i.name for i in proto.graph.input]
    args = tuple(
        torch.randn(SHAPE, generator=torch.Generator().manual_seed(i)) for i in range(len(names))
    )

    def eager(*xs: torch.Tensor) -> torch.Tensor:
        return row.eager(*xs)

    # verify matches inputs by parameter name, as it does for forward(self, a, b)
    eager.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    )  # type: ignore[attr-defined]
    report = onnx_custom.verify(eager, args, proto, trials=2, kernels=row.kernels())
    assert report.passed
    assert set(report.implementations) == set(report.backends) and set(row.expect) == set(
        report.backends
    )
    for backend, (node_type, kind, source) in row.expect.items():
        (found,) = report.implementations[backend]
        assert (found.node_type, found.kind, found.count) == (node_type, kind, 1)
        assert source in found.source
        # the text report (what the CLI prints), str(report) and the JSON report
        line = f"  {found.describe()}"
        assert (
            f"Custom nodes in {backend}:" in summary_text(report)
            and line in summary_text(report).splitlines()
        )
        assert line in str(report).splitlines()
        data = report_to_dict(report)["implementations"][backend]
        assert data == [
            {
                "node_type": node_type,
                "kind": kind,
                "source": found.source,
                "count": 1,
                "describe": found.describe(),
            }
        ]
    write_report(tmp_path / "r.json", report)
    assert (
        json.loads((tmp_path / "r.json").read_text())["implementations"].keys() == row.expect.keys()
    )


def test_standard_only_file_lists_no_custom_nodes() -> None:
    proto = _graph([helper.make_node("Add", ["x", "x"], ["y"])], ["x"], {})
    report = onnx_custom.verify(lambda x: x + x, (torch.randn(SHAPE),), proto)
    assert report.implementations == {"onnxruntime": ()} and "Custom nodes in" not in summary_text(
        report
    )


def test_cli_verify_prints_the_implementation(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "my_add.onnx"
    model = "onnx_custom.models.my_add:Model"
    assert main(["export", model, "--variant", "custom", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["verify", model, str(out), "--report", str(tmp_path / "r.json")]) == 0
    printed = capsys.readouterr().out
    assert "Custom nodes in onnxruntime:" in printed
    assert "onnx_custom::my_add (1 node): Python kernel " in printed
    data = json.loads((tmp_path / "r.json").read_text())
    assert [i["kind"] for i in data["implementations"]["onnxruntime"]] == ["python"]

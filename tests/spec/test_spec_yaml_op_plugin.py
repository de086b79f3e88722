"""The op-plugin YAML of the op-adaptation articles loads as written.

The file below is written the way the Ascend op-adaptation article writes its op description:
a bare ``op_name``, ``format`` as a list per tensor, vendor dtype spellings, ``attr_desc`` with
``default_value``, and none of onnx-custom's own keys. The user's torch op is defined the
article's way (``torch.library.custom_op`` plus a Meta function on the meta device) and its
ONNX Runtime kernel with ``@onnx_custom.kernel``. Loading the file adopts that op, and the model
exports with both exporters and verifies in ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.runtime.registry import user_kernel_registry
from onnx_custom.spec import SpecError, load_specs, parse_specs, spec_scope
from onnx_custom.spec.yaml_loader import DEFAULT_NAMESPACE

OP_PLUGIN_YAML = """\
- op_name: custom_linear
  op_type: CustomLinear
  input_desc:
    - name: x
      dtype: [fp16, float]
      format: [ND, ND]
    - name: weight
      dtype: [fp16, float]
      format: [ND, ND]
    - name: bias
      param_type: optional
      dtype: [fp16, float]
      format: [ND, ND]
  output_desc:
    - name: y
      dtype: [fp16, float]
      format: [ND, ND]
  attr_desc:
    - name: alpha
      dtype: float
      default_value: 1.0
"""


@pytest.fixture
def op_plugin_file(tmp_path: Path) -> Path:
    path = tmp_path / "custom_linear.yaml"
    path.write_text(OP_PLUGIN_YAML)
    return path


def test_op_plugin_yaml_parses_verbatim_and_keeps_vendor_keys(op_plugin_file: Path) -> None:
    (spec,) = parse_specs(op_plugin_file)
    assert DEFAULT_NAMESPACE == "custom"
    assert spec.name == "custom::custom_linear" and spec.node_type == "custom::CustomLinear"
    assert [i.name for i in spec.inputs] == ["x", "weight", "bias"] and spec.inputs[2].optional
    assert spec.inputs[0].dtype == ("float16", "float32")
    assert [i.format for i in spec.inputs] == [("ND", "ND")] * 3 and spec.outputs[0].format == (
        "ND",
        "ND",
    )
    assert spec.schema == "(Tensor x, Tensor weight, Tensor? bias=None, float alpha=1.0) -> Tensor"
    (npu,) = parse_specs(op_plugin_file, namespace="npu")
    assert npu.name == "npu::custom_linear" and npu.node_type == "npu::CustomLinear"


# -- the user's code, the article's way -----------------------------------------------------


@pytest.fixture
def user_custom_linear() -> Iterator[None]:
    @torch.library.custom_op("custom::custom_linear", mutates_args=())
    def custom_linear(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, alpha: float = 1.0
    ) -> torch.Tensor:
        y = alpha * torch.matmul(x, weight.t())
        return y if bias is None else y + bias

    @custom_linear.register_fake
    def custom_linear_meta(x, weight, bias=None, alpha=1.0):
        return torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device="meta")

    @onnx_custom.kernel(
        "custom::CustomLinear",
        inputs=["x", "weight", "bias?"],
        outputs=["y"],
        attrs={"alpha": ("float", 1.0)},
        dtypes=["float16", "float32"],
    )
    def custom_linear_kernel(x, weight, bias=None, *, alpha):
        y = alpha * (x.astype(np.float32) @ weight.astype(np.float32).T)
        return (y if bias is None else y + bias).astype(x.dtype)

    try:
        with spec_scope():
            yield
    finally:
        user_kernel_registry().remove("custom::CustomLinear")
        from torch._library import custom_ops

        custom_ops.OPDEF_TO_LIB.pop("custom::custom_linear")._destroy()


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 4))
        self.bias = torch.nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.custom.custom_linear(x, self.weight, self.bias, 0.5).relu()


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_op_plugin_yaml_exports_and_verifies(
    user_custom_linear: None, op_plugin_file: Path, exporter: str, tmp_path: Path
) -> None:
    (spec,) = load_specs(op_plugin_file)
    model, x = Linear(), torch.randn(3, 4)
    path = tmp_path / f"linear_{exporter}.onnx"
    onnx_custom.export(
        model,
        (x,),
        path,
        exporter=exporter,
        opset=17 if exporter == "torchscript" else 18,
        dynamic_shapes={"x": {0: "batch"}},
    )
    import onnx

    nodes = [(n.domain, n.op_type) for n in onnx.load(path).graph.node if n.domain]
    assert nodes == [("custom", "CustomLinear")]
    report = onnx_custom.verify(model, (x,), path, trials=3)
    assert report.passed, report
    # Another batch size, against plain torch math (independent of the op and the kernel).
    other = torch.randn(5, 4)
    (got,) = onnx_custom.InferenceSession(path).run(None, {"x": other.numpy()})
    want = (0.5 * other @ model.weight.detach().t() + model.bias.detach()).relu()
    torch.testing.assert_close(torch.from_numpy(got), want)
    assert spec.inputs[0].format == ("ND", "ND")


# -- bad vendor keys: typed errors naming the file, line, key, expected and received ----------

BAD = [
    (
        "format-number",
        "      format: [ND, ND]\n    - name: weight",
        "      format: 3\n    - name: weight",
        6,
        "input_desc[0].format",
        ["expected a layout label (ND, NCHW, ...) or a list of them", "received int 3", "fix:"],
    ),
    (
        "format-list-of-numbers",
        "      format: [ND, ND]\n  attr_desc",
        "      format: [1, 2]\n  attr_desc",
        17,
        "output_desc[0].format",
        ["expected a layout label", "received list [1, 2]"],
    ),
    (
        "param-type-unknown",
        "      param_type: optional",
        "      param_type: sometimes",
        11,
        "input_desc[2].param_type",
        ["expected one of required, optional, dynamic", "received str 'sometimes'"],
    ),
    (
        "format-empty-list",
        "      format: [ND, ND]\n    - name: weight",
        "      format: []\n    - name: weight",
        6,
        "input_desc[0].format",
        ["expected a layout label", "received list []"],
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "line", "key", "phrases"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_vendor_key_with_wrong_type_is_a_spec_error(
    tmp_path: Path, old: str, new: str, line: int, key: str, phrases: list[str]
) -> None:
    assert old in OP_PLUGIN_YAML
    path = tmp_path / "bad.yaml"
    path.write_text(OP_PLUGIN_YAML.replace(old, new, 1))
    with pytest.raises(SpecError) as info:
        parse_specs(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert f"key {key}" in message, message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def test_bad_namespace_argument_is_a_spec_error(op_plugin_file: Path) -> None:
    with pytest.raises(
        SpecError,
        match=(
            r"namespace must be a torch namespace.*received 'a::b'.*fix: pass e.g. namespace='npu'"
        ),
    ):
        parse_specs(op_plugin_file, namespace="a::b")

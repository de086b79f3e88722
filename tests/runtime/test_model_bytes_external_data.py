"""A model handed over as bytes whose tensors live in an external data file elsewhere: the
refusal names the data file it would need."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from onnx_custom.errors import ModelLoadError
from onnx_custom.runtime.session import load_model


def _model() -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(np.arange(1024, dtype=np.float32), "weight")
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "weight"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1024])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1024])],
        [weight],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize("location", ["weights.bin", "data/model.weights"])
def test_bytes_with_external_data_name_the_data_file(location: str, tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    (tmp_path / "data").mkdir()
    onnx.save_model(_model(), path, save_as_external_data=True, location=location, size_threshold=0)
    with pytest.raises(ModelLoadError, match=rf"external data file\(s\) \['{location}'\]"):
        load_model(path.read_bytes())
    load_model(path)  # by path it loads: the data file is beside it

"""Each shipped translation must emit the same ONNX nodes under both exporters."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

import onnx_custom
from onnx_custom.translate.builder import record_nodes
from onnx_custom.zoo import discover


def _pairs() -> list[tuple[str, int, str | None]]:
    """(model, opset, variant) for which the model's zoo rows cover both exporters."""
    pairs = []
    for name, module_name in discover().items():
        try:
            module = importlib.import_module(module_name)
        except (
            Exception
        ):  # optional models (e.g. a C++ extension without a compiler) are tested elsewhere
            continue
        rows = [c for c in getattr(module, "ZOO", ()) if not c.expect_error and not c.dynamic]
        variants = {c.variant for c in rows}
        for variant in sorted(variants, key=str):
            ts = {c.opset for c in rows if c.exporter == "torchscript" and c.variant == variant}
            dyn = {c.opset for c in rows if c.exporter == "dynamo" and c.variant == variant}
            if ts and dyn:
                # One opset both exporters handle (TorchScript stops at 20, dynamo starts at 18).
                common = ts & dyn
                opset = max(common) if common else max(dyn) if max(dyn) <= 20 else max(ts)
                pairs.append((name, opset, variant))
    return pairs


@pytest.mark.parametrize(("name", "opset", "variant"), _pairs(), ids=lambda v: str(v))
def test_same_nodes_both_exporters(name: str, opset: int, variant: str | None) -> None:
    module = importlib.import_module(f"onnx_custom.models.{name}")
    reg = onnx_custom.default_registry()
    if variant:
        reg = reg.with_variants(variant)
    records = {}
    for exporter in ("torchscript", "dynamo"):
        with record_nodes() as log:
            onnx_custom.export(
                module.Model().eval(),
                module.example_inputs(),
                exporter=exporter,
                opset=opset,
                registry=reg,
            )
        # The dynamo exporter dispatches on overloads (aten::asinh.default); compare op names.
        records[exporter] = [dataclasses.replace(r, target=r.target.split(".")[0]) for r in log]
    assert records["torchscript"], "no translation of ours ran"
    assert records["torchscript"] == records["dynamo"]


def test_pairs_cover_every_model_with_translations() -> None:
    assert {p[0] for p in _pairs()} >= {"asinh", "my_add", "multi_out"}
    assert torch  # keep import used

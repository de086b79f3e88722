"""Deployer-style: every custom-node zoo model runs in plain onnxruntime with only the native
library.

Each custom-variant zoo row (and deform_conv below opset 19) is exported with its exporter here;
then ONE fresh interpreter that imports only onnxruntime and numpy (it asserts so) registers
``libonnx_custom_ops.so`` with ``SessionOptions.register_custom_ops_library`` and runs every file;
its outputs are compared with PyTorch eager using torch.testing's default tolerances. Models that
declare dynamic shapes are exported with them and also run at a size other than the export size.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _native_util import run_script

import onnx_custom
from onnx_custom.runtime.native import library_path
from onnx_custom.zoo import ZooCase, discover

_DEPLOYER = r"""
import json, sys
import numpy as np
import onnxruntime as ort

manifest, library = sys.argv[1], sys.argv[2]
for case in json.load(open(manifest)):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(library)
    sess = ort.InferenceSession(case["model"], so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for run in case["runs"]:
        feeds = {n: np.load(p) for n, p in zip(names, run["inputs"])}
        for k, out in enumerate(sess.run(None, feeds)):
            np.save(run["prefix"] + f"out{k}.npy", out)
banned = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx_custom", "onnx"))
assert not banned, f"the deployer process imported {banned}"
print("ok")
"""


def _rows() -> list[tuple[str, ZooCase]]:
    rows = []
    for short, module_name in discover().items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a zoo model whose C++ extension cannot build here
            if getattr(exc, "skip_reason", None):
                continue
            raise
        for case in getattr(module, "ZOO", ()):
            custom = case.variant == "custom" or (short == "deform_conv" and case.opset < 19)
            if custom and not case.expect_error:
                rows.append((short, case))
    return rows


ROWS = _rows()


def _resized(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
    """Example inputs with every dynamic dim changed (None when the model has no dynamic dims)."""
    spec = getattr(module, "dynamic_shapes", None)
    if spec is None:
        return None
    g = torch.Generator().manual_seed(7)
    out = []
    for arg, dims in zip(args, spec, strict=True):
        shape = list(arg.shape)
        for axis in dims or {}:
            shape[axis] = shape[axis] + (8 if shape[axis] >= 8 else 1)
        out.append(torch.randn(*shape, generator=g, dtype=arg.dtype))
    return tuple(out)


def test_every_custom_zoo_model_runs_with_only_the_native_library(tmp_path: Path) -> None:
    assert {name for name, _ in ROWS} >= {
        "my_add",
        "multi_out",
        "multi_out3",
        "deform_conv",
        "bev_pool",
        "custom_linear",
    }
    manifest, expected = [], {}
    for i, (name, case) in enumerate(ROWS):
        module = importlib.import_module(f"onnx_custom.models.{name}")
        model = module.Model().eval()
        args = module.example_inputs()
        registry = onnx_custom.default_registry()
        if case.variant:
            registry = registry.with_variants(case.variant)
        dynamic = getattr(module, "dynamic_shapes", None)
        if case.exporter == "dynamo" and case.opset < 15:
            dynamic = None  # the dynamo exporter cannot lower dynamic shapes below opset 15
        path = tmp_path / f"{i}-{name}-{case.label}.onnx"
        proto = onnx_custom.export(
            model,
            args,
            path,
            exporter=case.exporter,
            opset=case.opset,
            registry=registry,
            dynamic_shapes=dynamic,
        )
        assert any(n.domain not in ("", "ai.onnx") for n in proto.graph.node), (
            f"{name}: no custom node"
        )
        runs = []
        resized = _resized(module, args) if dynamic is not None else None
        for j, inputs in enumerate(x for x in (args, resized) if x is not None):
            prefix = str(tmp_path / f"{i}-{j}-")
            files = []
            for k, t in enumerate(inputs):
                np.save(prefix + f"in{k}.npy", t.numpy())
                files.append(prefix + f"in{k}.npy")
            with torch.inference_mode():
                out = model(*inputs)
            expected[prefix] = (
                f"{name} {case.label} inputs {[tuple(t.shape) for t in inputs]}",
                out if isinstance(out, tuple) else (out,),
            )
            runs.append({"inputs": files, "prefix": prefix})
        manifest.append({"model": str(path), "runs": runs})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    proc = run_script(_DEPLOYER, str(tmp_path / "manifest.json"), str(library_path()))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
    for prefix, (label, outs) in expected.items():
        for k, want in enumerate(outs):
            got = torch.from_numpy(np.load(prefix + f"out{k}.npy"))
            torch.testing.assert_close(
                got, want, msg=lambda m, label=label, k=k: f"{label} output {k}: {m}"
            )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_native_session_serves_zoo_dcn_without_python_kernels(exporter: str) -> None:
    """onnx_custom.InferenceSession(kernels="native") uses no Python kernel for these nodes."""
    from onnx_custom.models import deform_conv as dcn

    model = dcn.Model().eval()
    args = dcn.example_inputs()
    proto = onnx_custom.export(model, args, exporter=exporter, opset=11)
    sess = onnx_custom.InferenceSession(proto, kernels="native")
    assert sess.kernel_specs == ()
    (got,) = sess.run(None, {sess.get_inputs()[0].name: args[0].numpy()})
    with torch.inference_mode():
        torch.testing.assert_close(torch.from_numpy(got), model(*args))

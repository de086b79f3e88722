"""Every custom-node zoo file runs the way a deployer runs it: exported with ``functions=True`` and
executed by a separate Python process that imports only onnxruntime and numpy (nothing
registered), then compared to PyTorch eager; and by ``onnx.reference`` on the function bodies.

Rows: every ``models/*.py`` ZOO row with ``variant="custom"``, plus deform_conv at opset 11 (where
``onnx_custom::DeformConv2d`` is the default translation).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import onnx_custom
from onnx_custom.zoo import ZooCase, discover

PLAIN_ORT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxruntime as ort

    for row in json.load(open(sys.argv[1])):
        sess = ort.InferenceSession(row["model"], providers=["CPUExecutionProvider"])
        for feeds_path, out_path in row["trials"]:
            with np.load(feeds_path) as feeds:
                outs = sess.run(None, dict(feeds))
            np.savez(out_path, *outs)
    loaded = sorted({name.split(".")[0] for name in sys.modules})
    assert "torch" not in loaded and "onnx_custom" not in loaded, loaded
    print(json.dumps(loaded))
    """)


def _rows() -> list[Any]:
    rows = []
    for short, module_name in discover().items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # e.g. the C++ extension of my_add_ext cannot build here
            rows.append(
                pytest.param(short, None, marks=pytest.mark.skip(reason=str(exc)[:200]), id=short)
            )
            continue
        for case in getattr(module, "ZOO", ()):
            wanted = case.variant == "custom" or (short == "deform_conv" and case.opset == 11)
            if wanted and not case.expect_error and not case.skip:
                rows.append(pytest.param(short, case, id=f"{short}-{case.label}"))
    return rows


ROWS = _rows()


def _trial_inputs(module: Any, case: ZooCase) -> list[tuple[torch.Tensor, ...]]:
    """The example inputs; dynamic rows also at another batch size than the export's."""
    args = tuple(module.example_inputs())
    trials = [args]
    if case.dynamic:
        generator = torch.Generator().manual_seed(1)
        trials.append(
            tuple(torch.randn(3 * a.shape[0] + 1, *a.shape[1:], generator=generator) for a in args)
        )
    return trials


def _eager(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Export every row (functions=True), run all files in ONE plain-ORT subprocess."""
    root = tmp_path_factory.mktemp("zoo_bodies")
    results: dict[str, Any] = {}
    manifest = []
    for param in ROWS:
        short, case = param.values
        if case is None:
            continue
        key = f"{short}-{case.label}"
        module = importlib.import_module(discover([short])[short])
        model = module.Model().eval()
        trials = _trial_inputs(module, case)
        registry = (
            onnx_custom.default_registry().with_variants(case.variant) if case.variant else None
        )
        dynamic = getattr(module, "dynamic_shapes", None) if case.dynamic else None
        try:
            proto = onnx_custom.export(
                model,
                trials[0],
                exporter=case.exporter,
                opset=case.opset,
                registry=registry,
                dynamic_shapes=dynamic,
                functions=True,
            )
        except Exception as exc:
            results[key] = exc
            continue
        path = root / f"{key}.onnx"
        path.write_bytes(proto.SerializeToString())
        names = [i.name for i in proto.graph.input]
        pairs = []
        for t, args in enumerate(trials):
            feeds_path, out_path = root / f"{key}.{t}.in.npz", root / f"{key}.{t}.out.npz"
            np.savez(feeds_path, **{n: a.numpy() for n, a in zip(names, args, strict=True)})
            pairs.append((str(feeds_path), str(out_path)))
        manifest.append({"model": str(path), "trials": pairs})
        results[key] = {
            "proto": proto,
            "model": model,
            "trials": trials,
            "outputs": [p[1] for p in pairs],
        }
    (root / "manifest.json").write_text(json.dumps(manifest))
    script = root / "plain_ort.py"
    script.write_text(PLAIN_ORT)
    # -I: isolated (no PYTHONPATH, no user site, no script-dir on sys.path); cwd away from the repo.
    done = subprocess.run(
        [sys.executable, "-I", str(script), str(root / "manifest.json")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    results["_subprocess"] = done
    return results


@pytest.mark.parametrize(("short", "case"), ROWS)
def test_zoo_file_runs_in_plain_onnxruntime(
    exported: dict[str, Any], short: str, case: ZooCase
) -> None:
    done = exported["_subprocess"]
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "onnxruntime" in loaded and "torch" not in loaded
    row = exported[f"{short}-{case.label}"]
    if isinstance(row, Exception):
        raise row
    proto: onnx.ModelProto = row["proto"]
    custom = {(n.domain, n.op_type) for n in proto.graph.node if n.domain}
    assert custom and custom <= {(f.domain, f.name) for f in proto.functions}
    onnx.checker.check_model(proto, full_check=True)  # bodies' opsets agree with the model's
    for args, out_path in zip(row["trials"], row["outputs"], strict=True):
        with np.load(out_path) as saved:
            got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        expected = _eager(row["model"], args)
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(torch.from_numpy(g), e)


@pytest.mark.parametrize(("short", "case"), ROWS)
def test_zoo_function_bodies_in_onnx_reference(
    exported: dict[str, Any], short: str, case: ZooCase
) -> None:
    row = exported[f"{short}-{case.label}"]
    if isinstance(row, Exception):
        raise row
    proto: onnx.ModelProto = row["proto"]
    args = row["trials"][0]
    feeds = {i.name: a.numpy() for i, a in zip(proto.graph.input, args, strict=True)}
    got = ReferenceEvaluator(proto).run(None, feeds)
    for g, e in zip(got, _eager(row["model"], args), strict=True):
        torch.testing.assert_close(torch.from_numpy(np.asarray(g)), e)

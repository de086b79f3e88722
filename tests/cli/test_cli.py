"""The onnx-custom command line, in-process through ``main`` and as real processes (the entry
point, lazy imports, seeding across processes, user modules given with --import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import pytest
from test_spec_yaml import GOOD as SPEC_YAML  # the op-spec file and kernels test_spec_yaml checks
from test_spec_yaml import OPS as SPEC_KERNELS

from onnx_custom.cli.main import DEFAULT_OPSET, build_parser, main

EXE = str(Path(sys.executable).with_name("onnx-custom"))


def _run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *argv], capture_output=True, text=True, cwd=cwd, timeout=600)


# ---------------------------------------------------------------------------- export / verify


def test_export_verify_prints_the_summary_then_writes(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "asinh.onnx"
    assert (
        main(
            [
                "export",
                "models/asinh.py:Model",
                "--exporter",
                "torchscript",
                "--opset",
                "9",
                "-o",
                str(out),
                "--verify",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert (
        "Verification PASSED" in printed
        and "#0 output (ONNX " in printed
        and f"wrote {out}" in printed
    )
    assert [n.op_type for n in onnx.load(str(out)).graph.node if n.op_type != "Constant"] == [
        "Asinh",
        "Mul",
    ]
    made = {p.key: p.value for p in onnx.load(str(out)).metadata_props}["onnx_custom.cli"]
    assert json.loads(made) == {
        "model": "models/asinh.py:Model",
        "seed": 0,
        "exporter": "torchscript",
        "variants": [],
    }
    assert main(["verify", "asinh", str(out), "--trials", "3"]) == 0
    assert "Verification PASSED" in capsys.readouterr().out


def test_export_custom_variant_with_input_specs(tmp_path: Path) -> None:
    out = tmp_path / "my_add.onnx"
    code = main(
        [
            "export",
            "onnx_custom.models.my_add:Model",
            "--input",
            "2x4:float32",
            "--input",
            "2x4",
            "--variant",
            "custom",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    assert ("onnx_custom", "my_add") in {
        (n.domain, n.op_type) for n in onnx.load(str(out)).graph.node
    }


@pytest.fixture(scope="module")
def dynamic_asinh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dyn") / "d.onnx"
    assert main(["export", "asinh", "--dynamic", "-o", str(out)]) == 0
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    return out


def test_verify_tries_three_other_batch_sizes_by_default(dynamic_asinh: Path, capsys: Any) -> None:
    assert main(["verify", "asinh", str(dynamic_asinh)]) == 0
    shapes = [line for line in capsys.readouterr().out.splitlines() if "(shape)" in line]
    assert len(shapes) == 3 and all("PASSED" in line for line in shapes), shapes
    assert "batch=3" not in " ".join(shapes)  # 3 is the export size: the others differ from it


def test_verify_shape_flags(dynamic_asinh: Path, capsys: Any) -> None:
    assert (
        main(["verify", "asinh", str(dynamic_asinh), "--shape", "batch=5", "--shape", "x=9x4"]) == 0
    )
    shapes = [line.strip() for line in capsys.readouterr().out.splitlines() if "(shape)" in line]
    assert [s.split(":")[0] for s in shapes] == [
        "trial 1 (shape) batch=5",
        "trial 2 (shape) batch=9",
    ], shapes
    assert main(["verify", "asinh", str(dynamic_asinh), "--no-shape-trials"]) == 0
    out = capsys.readouterr().out
    assert "(shape)" not in out and "0 at other sizes" in out


def test_verify_report_flag_writes_markdown(
    dynamic_asinh: Path, tmp_path: Path, capsys: Any
) -> None:
    report = tmp_path / "r.md"
    assert main(["verify", "asinh", str(dynamic_asinh), "--report", str(report)]) == 0
    text = report.read_text()
    assert "## Shapes tried" in text and "batch=1" in text and "## Failing outputs" not in text
    assert f"report written to {report}" in capsys.readouterr().err


RANDOM_MODEL = textwrap.dedent("""
    import torch

    class Net(torch.nn.Module):  # random init: only --seed makes two processes agree
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    def example_inputs():
        return (torch.randn(2, 8),)
""")


def test_random_weights_verify_across_processes(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(RANDOM_MODEL)
    exported = _run("export", "net.py:Net", "-o", "net.onnx", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    same = _run("verify", "net.py:Net", "net.onnx", cwd=tmp_path)
    assert same.returncode == 0 and "Verification PASSED" in same.stdout, same.stdout + same.stderr
    assert "warning" not in same.stderr.lower()
    other = _run("verify", "net.py:Net", "net.onnx", "--seed", "1", cwd=tmp_path)
    assert other.returncode == 1 and "Verification FAILED" in other.stdout
    warning = [line for line in other.stderr.splitlines() if "warning" in line]
    assert warning == [
        "onnx-custom: warning: the file's weights differ from the model's (lin.weight, lin.bias); "
        "the file was exported with --seed 0, this run used --seed 1"
    ], other.stderr


# ---------------------------------------------------------------------------- --import

USER_OPS = textwrap.dedent("""
    import numpy as np
    import torch
    import onnx_custom

    @torch.library.custom_op("userlib::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    @onnx_custom.symbolic("userlib::twice", opset=1, emits=["userdomain::Twice"])
    def twice_onnx(g, x):
        return g.op("userdomain::Twice", x)

    @onnx_custom.kernel("userdomain::Twice", inputs=["x"], outputs=["y"], shape_fn="like:x")
    def twice_kernel(x):
        return np.asarray(x * 2)

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.ops.userlib.twice(x) + 1

    def example_inputs():
        return (torch.randn(2, 3),)
""")


@pytest.fixture(scope="module")
def user_ops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user_ops")
    (root / "user_ops.py").write_text(USER_OPS)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Twice", ["x"], ["y"], domain="userdomain")],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("userdomain", 1)],
    )
    onnx.save(model, str(root / "twice.onnx"))
    return root


def test_inspect_import_finds_user_kernels(user_ops: Path) -> None:
    alone = _run("inspect", "twice.onnx", cwd=user_ops)
    assert alone.returncode == 1 and "nothing can run this node" in alone.stdout
    helped = _run("inspect", "twice.onnx", "--import", "user_ops.py", cwd=user_ops)
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "userdomain::Twice" in helped.stdout and "nothing can run" not in helped.stdout


def test_ops_and_check_import_user_translations(user_ops: Path) -> None:
    listed = _run("ops", "--import", "user_ops.py", cwd=user_ops)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("userlib::twice"))
    assert "userdomain::Twice" in row and " yes " in f" {row} "
    checked = _run("check", "user_ops.py:Model", "--import", "user_ops.py", cwd=user_ops)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_import_yaml_op_specs(tmp_path: Path) -> None:
    """A spec's impl/kernel modules sit next to the YAML file (found without PYTHONPATH)."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "ytest_ops.py").write_text(SPEC_KERNELS)
    (tmp_path / "specs" / "ops.yaml").write_text(SPEC_YAML)
    listed = _run("ops", "--import", "specs/ops.yaml", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("ytest::scale_add") for line in listed.stdout.splitlines()), (
        listed.stdout
    )
    broken = _run("ops", "--import", "specs/missing.yaml", cwd=tmp_path)
    assert (
        broken.returncode == 2
        and "op-spec file 'specs/missing.yaml' does not exist" in broken.stderr
    )


# ---------------------------------------------------------------------------- the parser


def test_help_is_plain_and_shows_defaults(capsys: Any) -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, sub in commands.items():  # type: ignore[union-attr]
        text = sub.format_help()
        assert "`" not in text, f"raw backticks in `{name} --help`"
        if name in ("export", "check"):
            assert "(default: dynamo)" in text and f"(default: {DEFAULT_OPSET})" in text
        if name in ("export", "verify", "check"):
            assert "(default: 0)" in text  # --seed
    assert "`" not in parser.format_help()


def test_default_opset_matches_the_exporters() -> None:
    from onnx_custom.exporter.pipeline import DEFAULT_OPSET as EXPORTER_DEFAULT

    assert DEFAULT_OPSET == EXPORTER_DEFAULT


def test_version(capsys: Any) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"onnx-custom {metadata.version('onnx-custom')}"


def test_help_imports_no_torch() -> None:
    """`onnx-custom --help` must not pay for torch (it took 2-4 s): every import is lazy."""
    code = (
        "import sys, onnx_custom, onnx_custom.cli; onnx_custom.cli.build_parser().format_help();"
        " print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result


def test_console_script_entry_point() -> None:
    result = _run("--help")
    assert result.returncode == 0 and "zoo" in result.stdout and result.stderr == ""


def test_lazy_package_attributes() -> None:
    import importlib

    import onnx_custom

    importlib.import_module("onnx_custom.api")
    importlib.import_module("onnx_custom.verification.verifier")
    assert callable(onnx_custom.export) and onnx_custom.export.__module__ == "onnx_custom.api"
    assert (
        callable(onnx_custom.verify)
        and onnx_custom.verify.__module__ == "onnx_custom.verification.verifier"
    )
    for name in onnx_custom.__all__:
        assert getattr(onnx_custom, name) is not None
    assert set(onnx_custom.__all__) <= set(dir(onnx_custom))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        onnx_custom.nope  # noqa: B018


# ---------------------------------------------------------------------------- ops / zoo


def test_ops_lists_registry(capsys: Any) -> None:
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "aten::asinh" in out and "onnx_custom::my_add" in out and "variants: " in out


def test_zoo_list(capsys: Any) -> None:
    assert main(["zoo", "--list", "bev_pool"]) == 0
    out = capsys.readouterr().out
    assert "torchscript-opset17-custom-dynamic  (skip: no dynamic batch" in out


def test_zoo_subset(capsys: Any) -> None:
    assert main(["zoo", "asinh"]) == 0
    out = capsys.readouterr().out
    assert (
        "[1/6] asinh" in out
        and "torchscript-opset9" in out
        and "6 passed, 0 failed, 0 skipped in " in out
    )  # 4 export + 2 compile rows


def test_zoo_run_is_quiet_and_streams() -> None:
    """A real zoo run with dynamo rows (they used to log 4 torchvision lines per export) prints no
    torch, torchvision or ONNX Runtime warning line; rows stream with [n/N], progress has an ETA."""
    env = dict(os.environ, PYTHONWARNINGS="default")
    result = subprocess.run(
        [EXE, "zoo", "asinh"], capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    noise = [
        line
        for line in result.stderr.splitlines()
        if any(w in line.lower() for w in ("warn", "torchvision", "onnxruntime", "[w:", "[e:"))
    ]
    assert noise == [], noise
    rows = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert [r[:5] for r in rows] == [f"[{i}/6]" for i in range(1, 7)], (
        result.stdout
    )  # incl. the 2 compile rows
    progress = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 6 and all("elapsed" in line and "ETA" in line for line in progress), (
        result.stderr
    )


# ---------------------------------------------------------------------------- one-time builds


@pytest.mark.slow
def test_build_library_announces_a_fresh_build(tmp_path: Path) -> None:
    """A real compile into an empty cache (~15-45 s),
    then the cache hit says nothing of building."""
    env = dict(os.environ, ONNX_CUSTOM_CACHE_DIR=str(tmp_path))
    fresh = subprocess.run(
        [EXE, "build-library"], capture_output=True, text=True, env=env, timeout=600
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stderr.startswith(
        "onnx-custom: building libonnx_custom_ops.so (the native kernel library, release build)"
        " (one time"
    ), fresh.stderr
    assert "onnx-custom: built libonnx_custom_ops.so" in fresh.stderr
    assert Path(fresh.stdout.strip()).is_relative_to(tmp_path)
    cached = subprocess.run(
        [EXE, "build-library"], capture_output=True, text=True, env=env, timeout=600
    )
    assert (
        cached.returncode == 0 and "building" not in cached.stderr and cached.stdout == fresh.stdout
    )

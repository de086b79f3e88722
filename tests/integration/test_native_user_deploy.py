"""The "Write a kernel in C++" docs page, run as written, then deployed without Python.

The section's blocks (acme_ops.py, acme_kernels.cpp, acme.yaml, the build command) are written
into an empty folder and run in order, as a user would. Then: a model calling
torch.ops.acme.scale_add is exported by onnx_custom.export (both exporters, dynamic batch) at
float32 and float16; a process importing only onnxruntime and numpy registers dist/*.so and runs
each file at another batch size; its outputs must match eager torch (and an independent float64
numpy computation) at the dtype's tolerance. The C example runs the float32 file too, and the
standalone CMake project builds with cmake alone (slow suite).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import onnx_custom
from onnx_custom.runtime.native import NativeLibrary
from onnx_custom.spec import spec_scope

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "howto" / "cpp-kernel.md"
BIN = Path(sys.executable).parent
TOL = {"float32": (1.3e-6, 1e-5), "float16": (1e-3, 1e-5)}


def readme_blocks() -> dict[str, tuple[str, str]]:
    """``{file name or "build": (language, text)}`` of the section's fenced blocks."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("# Write a kernel in C++\n") :]
    section = section[: section.index("\n## ", 10)] if "\n## " in section[10:] else section
    section = section[: section.index("\n### ")] if "\n### " in section else section
    blocks: dict[str, tuple[str, str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        first = body.splitlines()[0]
        name = re.sub(r"^(#|//)\s*", "", first).strip() if lang != "bash" else "build"
        blocks[name] = (lang, body)
    return blocks


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(cwd),
        **env,
    }
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900, env=full)


def test_readme_section_has_the_contracts_blocks() -> None:
    blocks = readme_blocks()
    assert [(name, lang) for name, (lang, _) in blocks.items()] == [
        ("acme_ops.py", "python"),
        ("acme_kernels.cpp", "cpp"),
        ("acme.yaml", "yaml"),
        ("build", "bash"),
    ]
    assert "native:" in blocks["acme.yaml"][1] and "dist/" in blocks["build"][1]


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty folder with the page's files written and its build command run."""
    folder = tmp_path_factory.mktemp("acme")
    for name, (lang, body) in readme_blocks().items():
        if lang == "bash":
            proc = run(["bash", "-e", "-c", body], folder)
            assert proc.returncode == 0, proc.stderr
        else:
            (folder / name).write_text(body, encoding="utf-8")
    return folder


COMBOS = [(d, e) for d in ("float32", "float16") for e in ("torchscript", "dynamo")]

EXPORT = textwrap.dedent("""
    import sys, numpy as np, torch, onnx_custom
    onnx_custom.load_specs("acme.yaml")
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.acme.scale_add(x, y, 0.5)
    for combo in sys.argv[1:]:
        name, exporter = combo.split(":")
        dtype = getattr(torch, name)
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(4, 3, generator=g).to(dtype), torch.randn(4, 3, generator=g).to(dtype)
        onnx_custom.export(M(), (x, y), f"m_{name}_{exporter}.onnx", exporter=exporter,
                           dynamic_shapes={"x": {0: "batch"}, "y": {0: "batch"}})
        # another batch size, non-contiguous on the torch side (ORT gets a contiguous copy)
        x5 = torch.randn(3, 5, generator=g).to(dtype).t()
        y5 = torch.randn(5, 3, generator=g).to(dtype)
        np.save(f"x_{name}.npy", x5.contiguous().numpy()); np.save(f"y_{name}.npy", y5.numpy())
        np.save(f"eager_{name}.npy", M()(x5, y5).numpy())
    """)

DEPLOY = textwrap.dedent("""
    import glob, sys
    import numpy as np, onnxruntime as ort
    libs = glob.glob("dist/*.so")
    assert len(libs) == 1, libs
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(libs[0])
    for model in sys.argv[1:]:
        dtype = model.split("_")[1]
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        (out,) = sess.run(None, {"x": np.load(f"x_{dtype}.npy"), "y": np.load(f"y_{dtype}.npy")})
        np.save(f"ort_{model}.npy", out)
    loaded = [m for m in sys.modules if m == "torch" or m.startswith("onnx_custom")]
    assert not loaded, sorted(sys.modules)
    print("modules ok")
    """)


@pytest.fixture(scope="module")
def exported(user_folder: Path) -> Path:
    """Every dtype x exporter file exported by onnx_custom.export (one process), then run by a
    process importing only onnxruntime and numpy."""
    proc = run([sys.executable, "-c", EXPORT, *(f"{d}:{e}" for d, e in COMBOS)], user_folder)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run([sys.executable, "-c", DEPLOY, *(f"m_{d}_{e}.onnx" for d, e in COMBOS)], user_folder)
    assert proc.returncode == 0 and "modules ok" in proc.stdout, proc.stderr[-3000:]
    return user_folder


@pytest.mark.parametrize(("dtype", "exporter"), COMBOS)
def test_plain_onnxruntime_runs_the_exported_file(
    exported: Path, dtype: str, exporter: str
) -> None:
    assert [p.name for p in (exported / "dist").iterdir()] == ["libacme_ops.so"]  # exactly one .so
    out = np.load(exported / f"ort_m_{dtype}_{exporter}.onnx.npy")
    eager = np.load(exported / f"eager_{dtype}.npy")
    assert out.dtype == np.dtype(dtype) and out.shape == (5, 3)  # not the export batch size (4)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(eager), rtol=rtol, atol=atol)
    x, y = (np.load(exported / f"{n}_{dtype}.npy").astype(np.float64) for n in "xy")
    np.testing.assert_allclose(
        out.astype(np.float64), (0.5 * x + y).astype(dtype), rtol=rtol, atol=atol
    )


def test_c_program_runs_the_exported_file(exported: Path, tmp_path: Path) -> None:
    from test_native_example import (  # the C example's helpers
        ort_library,
        read_tensor,
        write_tensor,
    )

    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip(f"C compiler {cc!r} not found")
    program = tmp_path / "run_model"
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-O2",
            f"-I{REPO / 'onnx_custom' / 'runtime' / 'include'}",
            str(REPO / "examples" / "run_model.c"),
            "-ldl",
            "-o",
            str(program),
        ],
        check=True,
        capture_output=True,
    )
    user_folder = exported
    x, y = np.load(user_folder / "x_float32.npy"), np.load(user_folder / "y_float32.npy")
    write_tensor(tmp_path / "x.tensor", x)
    write_tensor(tmp_path / "y.tensor", y)
    proc = subprocess.run(
        [
            str(program),
            str(ort_library()),
            str(user_folder / "dist" / "libacme_ops.so"),
            str(user_folder / "m_float32_torchscript.onnx"),
            str(tmp_path / "out.tensor"),
            str(tmp_path / "x.tensor"),
            str(tmp_path / "y.tensor"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(
        read_tensor(tmp_path / "out.tensor"),
        np.load(user_folder / "eager_float32.npy"),
        rtol=1.3e-6,
        atol=1e-5,
    )


@pytest.fixture
def acme_spec(user_folder: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[onnx_custom.OpSpec]:
    monkeypatch.syspath_prepend(str(user_folder))
    with spec_scope():
        (spec,) = onnx_custom.load_specs(user_folder / "acme.yaml")
        yield spec


class ScaleAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.acme.scale_add(x, y, 0.5)


@pytest.mark.parametrize(
    "exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)]
)
def test_verify_runs_the_user_library_on_non_contiguous_inputs(
    user_folder: Path, acme_spec: onnx_custom.OpSpec, tmp_path: Path, exporter: str
) -> None:
    lib = NativeLibrary.load(user_folder / "dist" / "libacme_ops.so")
    assert lib.ops == ("acme::ScaleAdd",)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 6, generator=g).t()  # permuted
    y = torch.randn(6, 8, generator=g)[:, ::2].contiguous(memory_format=torch.contiguous_format)[
        :, :3
    ]  # sliced
    path = tmp_path / "m.onnx"
    onnx_custom.export(
        ScaleAdd(),
        (x, y),
        path,
        exporter=exporter,
        dynamic_shapes={"x": {0: "batch"}, "y": {0: "batch"}},
    )
    report = onnx_custom.verify(ScaleAdd(), (x, y), path, kernels=lib)
    assert report.passed, report
    sess = onnx_custom.InferenceSession(path, kernels=lib)
    assert sess.kernel_specs == ()  # no Python kernel: the node ran natively


def test_check_op_exercises_the_native_kernel(acme_spec: onnx_custom.OpSpec) -> None:
    g = torch.Generator().manual_seed(4)
    samples = [(torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g), 0.5)]
    report = onnx_custom.testing.check_op(acme_spec, samples, exporters=("torchscript",))
    native = [c for c in report.cases if c.name.startswith("native kernel of acme::ScaleAdd")]
    assert [c.name.split(" at ")[1].split(",")[0] for c in native] == ["float32", "float16"], report
    assert all(c.passed for c in native), report
    assert all("libacme_ops.so" in c.detail for c in native), report
    # acme_kernels.cpp reads y[i] for every i of x (equal shapes): the file names y's dims apart
    # (like:x leaves them free), and the trial at different sizes must be refused by eager, not
    # fed to the kernel, nor send check_op into moving y's batch alone to 1 (eager broadcasts it,
    # and the kernel read y out of bounds: a crash)
    for case in native:
        ran = [re.findall(r"\[[^\]]*\]", s) for s in case.shapes if "skipped" not in s]
        assert ran and all(x == y for x, y in ran), case.shapes
        assert sum("skipped" in s for s in case.shapes) == 1, case.shapes


def test_native_case_fails_when_the_kernel_is_wrong(
    user_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that disagrees with eager must make check_op fail
    (a verifier that cannot fail is no test)."""
    for name in ("acme_ops.py", "acme.yaml"):
        shutil.copy(user_folder / name, tmp_path / name)
    wrong = (
        (user_folder / "acme_kernels.cpp")
        .read_text()
        .replace("alpha * float(x[i])", "alpha * float(x[i]) * 1.01f")
    )
    (tmp_path / "acme_kernels.cpp").write_text(wrong)
    monkeypatch.syspath_prepend(str(tmp_path))
    with spec_scope():
        (spec,) = onnx_custom.load_specs(tmp_path / "acme.yaml")
        report = onnx_custom.testing.check_op(
            spec,
            [(torch.randn(4, 3), torch.randn(4, 3), 0.5)],
            exporters=("torchscript",),
            dtypes=False,
            raise_on_failure=False,
        )
    native = [c for c in report.cases if c.name.startswith("native kernel of")]
    assert native and not any(c.passed for c in native), report


@pytest.mark.slow
def test_cmake_project_builds_with_cmake_alone(exported: Path, tmp_path: Path) -> None:
    user_folder = exported
    if shutil.which("cmake") is None:
        pytest.skip("cmake not found")
    proc = run(
        [
            "onnx-custom",
            "build-library",
            "--spec",
            "acme.yaml",
            "-o",
            str(tmp_path / "ignored"),
            "--cmake",
            str(tmp_path / "project"),
        ],
        user_folder,
    )
    assert proc.returncode == 0, proc.stderr
    project = tmp_path / "project"
    # the project stands alone: moved away from the sources, built without Python on PATH
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for cmd in (
        ["cmake", "-S", str(project), "-B", str(tmp_path / "build"), "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", str(tmp_path / "build"), "-j", "2"],
    ):
        built = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (lib,) = (tmp_path / "build").glob("libacme_ops.so")
    script = DEPLOY.replace('glob.glob("dist/*.so")', f"[{str(lib)!r}]").replace(
        'np.save(f"ort_{model}', 'np.save(f"cmake_{model}'
    )
    proc = run(
        [sys.executable, "-c", script, "m_float32_torchscript.onnx", "m_float16_dynamo.onnx"],
        user_folder,
    )
    assert proc.returncode == 0 and "modules ok" in proc.stdout, proc.stderr[-3000:]
    for dtype, model in (
        ("float32", "m_float32_torchscript.onnx"),
        ("float16", "m_float16_dynamo.onnx"),
    ):
        rtol, atol = TOL[dtype]
        np.testing.assert_allclose(
            np.load(user_folder / f"cmake_{model}.npy").astype(np.float64),
            np.load(user_folder / f"eager_{dtype}.npy").astype(np.float64),
            rtol=rtol,
            atol=atol,
        )


def test_package_writes_model_library_and_readme(exported: Path, tmp_path: Path) -> None:
    proc = run(
        [
            "onnx-custom",
            "package",
            "m_float16_dynamo.onnx",
            "-o",
            str(tmp_path / "pkg"),
            "--spec",
            "acme.yaml",
        ],
        exported,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == [
        "README.md",
        "libacme_ops.so",
        "m_float16_dynamo.onnx",
    ]
    readme = (tmp_path / "pkg" / "README.md").read_text()
    assert (
        "register_custom_ops_library" in readme
        and "run_model" in readme
        and "RegisterCustomOpsLibrary" in readme
    )
    for name in ("x_float16.npy", "y_float16.npy"):
        shutil.copy(exported / name, tmp_path / "pkg" / name)
    script = DEPLOY.replace('np.save(f"ort_{model}', 'np.save(f"pkg_{model}').replace(
        'glob.glob("dist/*.so")', 'glob.glob("./*.so")'
    )
    proc = run([sys.executable, "-c", script, "m_float16_dynamo.onnx"], tmp_path / "pkg")
    assert proc.returncode == 0 and "modules ok" in proc.stdout, proc.stderr[-3000:]
    torch.testing.assert_close(
        torch.from_numpy(np.load(tmp_path / "pkg" / "pkg_m_float16_dynamo.onnx.npy")),
        torch.from_numpy(np.load(exported / "eager_float16.npy")),
        rtol=1e-3,
        atol=1e-5,
    )


def test_package_refuses_nodes_without_native_kernel(exported: Path, tmp_path: Path) -> None:
    proc = run(
        ["onnx-custom", "package", "m_float32_torchscript.onnx", "-o", str(tmp_path / "pkg")],
        exported,
    )
    assert proc.returncode != 0
    assert (
        "1 custom op type(s)" in proc.stderr
        and "acme::ScaleAdd" in proc.stderr
        and "--spec" in proc.stderr
    ), proc.stderr
    assert not (tmp_path / "pkg").exists()  # nothing half-written

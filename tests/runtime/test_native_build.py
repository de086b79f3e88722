"""Building and loading libonnx_custom_ops.so: cache, CLI, plain-ORT loading, domain selection,
kernels="native", missing tools, and (slow) the Python-free Makefile / CMake / one-line builds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _native_util import node_model

import onnx_custom
from onnx_custom.cli import main as cli_main
from onnx_custom.errors import ExtensionBuildError, KernelError
from onnx_custom.runtime import native
from onnx_custom.runtime.shim_build import abi_include_dir

EXPECTED_OPS = (
    "onnx_custom::my_add",
    "onnx_custom::multi_out",
    "onnx_custom::MultiOut3",
    "onnx_custom::DeformConv2d",
    "onnx_custom::BEVPoolV2",
    "onnx_custom::CustomLinear",
    "onnx_custom::MultiScaleDeformableAttn",
    "mmdeploy::MMCVMultiScaleDeformableAttention",
)


def my_add_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    m = node_model(
        "my_add",
        "onnx_custom",
        [("a", "float32", [2]), ("b", "float32", [2])],
        [("y", "float32", None)],
    )
    return m, {"a": np.array([1.0, 2.0], np.float32), "b": np.array([10.0, 20.0], np.float32)}


def test_library_path_is_cached_and_exported_from_the_package() -> None:
    path = onnx_custom.library_path()
    assert path.is_absolute() and path.name == "libonnx_custom_ops.so" and path.exists()
    assert path == native.library_path()  # built once, then reused
    assert native.native_ops() == EXPECTED_OPS
    assert path.parent.parent == native.cache_root() / "native"


def test_library_needs_neither_python_nor_torch_nor_onnxruntime_at_link_time() -> None:
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("ldd not available")
    needed = subprocess.run(
        [ldd, str(native.library_path())], capture_output=True, text=True
    ).stdout
    for banned in ("libpython", "libtorch", "libc10", "libonnxruntime"):
        assert banned not in needed, needed
    nm = shutil.which("nm")
    if nm is not None:
        symbols = subprocess.run(
            [nm, "-D", "--defined-only", str(native.library_path())], capture_output=True, text=True
        ).stdout
        assert " RegisterCustomOps" in symbols and " OnnxCustomNativeOps" in symbols


def test_plain_onnxruntime_loads_it() -> None:
    m, feeds = my_add_model()
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(onnx_custom.library_path()))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, feeds)[0], [12.0, 24.0])


def test_cli_build_library_copies_it_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["build-library", "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr()
    copy = tmp_path / "out" / "libonnx_custom_ops.so"
    assert printed.out.strip() == str(copy.resolve())
    assert "onnx_custom::DeformConv2d" in printed.err
    assert copy.read_bytes() == native.library_path().read_bytes()
    assert not [p for p in copy.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_cli_build_library_without_output_prints_the_cached_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["build-library"]) == 0
    assert capsys.readouterr().out.strip() == str(native.library_path())


def test_build_library_into_an_unwritable_place_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ExtensionBuildError, match="cannot write libonnx_custom_ops.so into .*fix"):
        native.build_library(blocker / "sub")


def test_missing_compiler_names_the_tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler anywhere
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ExtensionBuildError) as info:
        native._compiler()
    text = str(info.value)
    assert "C++17 compiler" in text and "g++" in text and "clang++" in text and "fix" in text


def test_compiler_errors_surface_with_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ONNX_CUSTOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")  # exists, fails every compile
    monkeypatch.setattr(native, "_built", {})
    with pytest.raises(ExtensionBuildError, match=r"compiling .*failed .*\n.*command: false"):
        native.library_path()
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-written


def test_cache_key_follows_flags_and_sources() -> None:
    cxx = native._compiler()
    assert native._build_key(cxx, ("-O3",)) != native._build_key(cxx, ("-O2",))
    assert native._build_key(cxx, ("-O3",)) == native._build_key(cxx, ("-O3",))


# ---- domain selection and kernels="native" -------------------------------------------------------
def test_domain_selection_config_entry() -> None:
    m, _feeds = my_add_model()
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.add_session_config_entry(native.DOMAINS_KEY, "onnx_custom")
    so.register_custom_ops_library(str(native.library_path()))
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])  # served
    left_out = ort.SessionOptions()
    left_out.log_severity_level = 4
    left_out.add_session_config_entry(native.DOMAINS_KEY, ",")  # no domain at all
    left_out.register_custom_ops_library(str(native.library_path()))
    with pytest.raises(Exception, match="my_add"):  # our domain left out on purpose
        ort.InferenceSession(m.SerializeToString(), left_out, providers=["CPUExecutionProvider"])
    bad = ort.SessionOptions()
    bad.add_session_config_entry(native.DOMAINS_KEY, "onnx_custom,acme")
    with pytest.raises(
        Exception, match="names domain 'acme'.*expected a comma-separated subset of onnx_custom"
    ):
        bad.register_custom_ops_library(str(native.library_path()))


def test_native_session_uses_no_python_kernel_when_the_library_serves_everything() -> None:
    m, feeds = my_add_model()
    sess = onnx_custom.InferenceSession(m, kernels="native")
    assert sess.kernel_specs == ()
    np.testing.assert_array_equal(sess.run(None, feeds)[0], [12.0, 24.0])


def test_native_session_falls_back_to_python_for_a_shared_domain() -> None:
    from onnx import TensorProto, helper

    from onnx_custom.runtime import KernelRegistry

    reg = KernelRegistry()
    reg.kernel("onnx_custom::negate_only_in_python", inputs=["x"], outputs=["y"])(lambda x: -x)
    nodes = [
        helper.make_node("my_add", ["a", "b"], ["t"], domain="onnx_custom"),
        helper.make_node("negate_only_in_python", ["t"], ["y"], domain="onnx_custom"),
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "g",
        [vi("a", TensorProto.FLOAT, [2]), vi("b", TensorProto.FLOAT, [2])],
        [vi("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("onnx_custom", 1)]
    )
    domains, specs = native.plan_kernels(
        m, onnx_custom.runtime.default_kernel_registry().copy().update(reg)
    )
    assert domains == frozenset() and {s.name for s in specs} == {
        "onnx_custom::my_add",
        "onnx_custom::negate_only_in_python",
    }
    with pytest.raises(
        KernelError,
        match=r"neither a native nor a Python kernel: onnx_custom::negate_only_in_python.*fix",
    ):
        native.plan_kernels(m)


def test_native_session_rejects_unknown_kernel_names() -> None:
    m, _ = my_add_model()
    with pytest.raises(
        KernelError, match="expects a KernelRegistry, None or 'native' .*; received 'fast'"
    ):
        onnx_custom.InferenceSession(m, kernels="fast")


def test_register_library_twice_on_one_options_is_harmless() -> None:
    m, feeds = my_add_model()
    so = native.register_library(native.register_library(ort.SessionOptions()))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, feeds)[0], [12.0, 24.0])


# ---- builds without Python (slow: each compiles the library) -------------------------------------
def _check_built(path: Path) -> None:
    m, feeds = my_add_model()
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(path))
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, feeds)[0], [12.0, 24.0])


# The sources and the ORT ABI header as a repository checkout and as an installed package lay
# them out: the build files must find the header (onnx_custom/runtime/include) in both.
LAYOUTS = {
    "repository": ("ort_kernels/native", "onnx_custom/runtime/include"),
    "installed": ("onnx_custom/ort_kernels/native", "onnx_custom/runtime/include"),
}


def _lay_out(root: Path, layout: str) -> Path:
    sources, include = LAYOUTS[layout]
    shutil.copytree(native.sources_dir(), root / sources)
    shutil.copytree(abi_include_dir(), root / include)
    return root / sources


@pytest.mark.slow
def test_one_line_compiler_command_builds_it(tmp_path: Path) -> None:
    _lay_out(tmp_path, "repository")
    subprocess.run(native.ONE_LINE, shell=True, check=True, cwd=tmp_path, timeout=900)
    _check_built(tmp_path / "libonnx_custom_ops.so")


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_makefile_builds_it(tmp_path: Path, layout: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    src = _lay_out(tmp_path, layout)
    subprocess.run(["make", "-j2"], check=True, cwd=src, timeout=900, capture_output=True)
    _check_built(src / "libonnx_custom_ops.so")


@pytest.mark.slow
def test_cmake_builds_it(tmp_path: Path) -> None:
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    src = _lay_out(tmp_path / "installed", "installed")
    subprocess.run(
        ["cmake", "-S", str(src), "-B", str(tmp_path / "b")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(
        ["cmake", "--build", str(tmp_path / "b"), "-j2"],
        check=True,
        capture_output=True,
        timeout=900,
    )
    _check_built(tmp_path / "b" / "libonnx_custom_ops.so")


@pytest.mark.slow
def test_fresh_cache_builds_once(tmp_path: Path) -> None:
    """First use compiles into an empty cache; a second process reuses it without compiling."""
    env = dict(os.environ, ONNX_CUSTOM_CACHE_DIR=str(tmp_path))
    code = (
        "import time; t = time.time(); from onnx_custom.runtime.native import library_path;"
        " print(library_path(), time.time() - t)"
    )
    first = subprocess.run(
        ["python", "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    second = subprocess.run(
        ["python", "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    path1, secs1 = first.stdout.split()
    path2, secs2 = second.stdout.split()
    assert path1 == path2 and float(secs2) < float(secs1)
    print(f"fresh build {float(secs1):.1f} s, cached {float(secs2):.2f} s")

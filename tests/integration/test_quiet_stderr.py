"""Nothing but our own words on stderr: no ONNX Runtime log line
(``[E:onnxruntime`` / ``[W:onnxruntime``) and no torch exporter chatter ("torchvision is not
installed") from a representative run of the public API and the command line, including the
failing paths that used to print them: a kernel that raises (reported once, by KernelRunError), a
verify trial ORT refuses, check() and a zoo row. Each runs in its own interpreter, as a user's
script does, and the stderr of the whole process is inspected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("onnx-custom"))
ORT_LOG_MARKS = ("[E:onnxruntime", "[W:onnxruntime", "[I:onnxruntime")
# The CUDA_HOME line: torch.utils.cpp_extension at import, regular (CUDA) wheels on a CPU machine.
CHATTER = ("torchvision is not installed", "No CUDA runtime is found")

API_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, onnx, torch
    from onnx import TensorProto, helper
    import onnx_custom, onnx_custom.ops.seed
    from onnx_custom.runtime import InferenceSession, KernelRegistry, KernelRunError

    out = sys.argv[1]

    class MyAdd(torch.nn.Module):
        def forward(self, a, b):
            return torch.ops.onnx_custom.my_add(a, b)

    args = (torch.randn(2, 3), torch.randn(2, 3))
    for exporter in ("torchscript", "dynamo"):
        onnx_custom.export(MyAdd(), args, f"{out}/m_{exporter}.onnx", exporter=exporter, opset=18,
                           dynamic_shapes={"a": {0: "batch"}, "b": {0: "batch"}})
        assert onnx_custom.verify(MyAdd(), args, f"{out}/m_{exporter}.onnx", trials=2).passed
        assert onnx_custom.check(MyAdd(), args, exporter=exporter).ok

    # a failing kernel: reported once, by KernelRunError
    reg = KernelRegistry()

    @reg.kernel("test::Boom", inputs=["x"], outputs=["y"], shape_fn="like0")
    def boom(x):
        raise ValueError("boom from the kernel")

    graph = helper.make_graph(
        [helper.make_node("Boom", ["x"], ["y"], domain="test")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("test", 1)]
    model = helper.make_model(graph, ir_version=10, opset_imports=opsets)
    try:
        InferenceSession(model, kernels=reg).run(None, {"x": np.ones(2, np.float32)})
    except KernelRunError as exc:
        print("KernelRunError:", str(exc).splitlines()[0], file=sys.stderr)
    else:
        raise SystemExit("the kernel did not fail")

    # a verify trial ORT refuses: the file claims a dynamic batch but reshapes to a fixed size
    class Flatten(torch.nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], -1) * 2

    x = torch.randn(2, 3, 4)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["shape"],
                          value=helper.make_tensor("s", TensorProto.INT64, [2], [2, 12])),
         helper.make_node("Reshape", ["x", "shape"], ["r"]),
         helper.make_node("Constant", [], ["two"],
                          value=helper.make_tensor("t", TensorProto.FLOAT, [], [2.0])),
         helper.make_node("Mul", ["r", "two"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])])
    bad = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(bad, f"{out}/bad.onnx")
    report = onnx_custom.verify(
        Flatten(), (x,), f"{out}/bad.onnx", trials=3, raise_on_mismatch=False)
    assert not report.passed, report
    print("verify failed as expected", file=sys.stderr)

    # one zoo row
    from onnx_custom.zoo import run_zoo
    assert all(r.status in ("pass", "skip") for r in run_zoo(["my_add"])), "zoo row failed"
    """)


def _no_noise(stderr: str) -> None:
    noisy = [
        line
        for line in stderr.splitlines()
        if any(mark in line for mark in ORT_LOG_MARKS + CHATTER)
    ]
    assert not noisy, "\n".join(noisy[:10])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ONNX_CUSTOM_ORT_LOG_SEVERITY", None)
    return env


def test_api_run_prints_no_ort_log_lines(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", API_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KernelRunError: kernel test::Boom failed" in proc.stderr
    assert proc.stderr.count("boom from the kernel") == 1  # once, by our error; not again by ORT
    _no_noise(proc.stderr)


@pytest.mark.ort_logs
def test_ort_logs_come_back_when_asked(tmp_path: Path) -> None:
    """The escape hatch: $ONNX_CUSTOM_ORT_LOG_SEVERITY brings ORT's own log lines back."""
    script = API_SCRIPT.split("# a verify trial ORT refuses")[0].split(
        "# a failing kernel: reported once, by KernelRunError\n"
    )[1]
    script = (
        "import sys, numpy as np\nfrom onnx import TensorProto, helper\nfrom onnx_custom.runtime"
        " import InferenceSession, KernelRegistry, KernelRunError\n" + textwrap.dedent(script)
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "ONNX_CUSTOM_ORT_LOG_SEVERITY": "3"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[E:onnxruntime" in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "my_add", "-o", "{tmp}/m.onnx", "--verify"],
        ["verify", "my_add", "{tmp}/m.onnx", "--trials", "2"],
        ["check", "my_add", "--exporter", "dynamo"],
        ["inspect", "{tmp}/m.onnx"],
        ["zoo", "my_add"],
    ],
    ids=lambda a: a[0],
)
def test_cli_commands_print_no_ort_log_lines(
    argv: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.getbasetemp() / "quiet_cli"
    tmp.mkdir(exist_ok=True)
    if argv[0] in ("verify", "inspect") and not (tmp / "m.onnx").exists():
        subprocess.run(
            [EXE, "export", "my_add", "-o", str(tmp / "m.onnx")],
            check=True,
            capture_output=True,
            timeout=600,
        )
    proc = subprocess.run(
        [EXE, *(a.format(tmp=tmp) for a in argv)],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _no_noise(proc.stderr)


def test_cuda_home_notice_is_dropped_and_other_records_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The CUDA wheels log the notice at import only where a CUDA toolkit exists without a GPU;
    the filter is checked directly so that every machine and torch build runs this test."""
    import logging

    from onnx_custom.common.torch_notices import CPP_EXTENSION_LOGGER, drop_cuda_home_notice

    drop_cuda_home_notice()
    drop_cuda_home_notice()  # idempotent
    logger = logging.getLogger(CPP_EXTENSION_LOGGER)
    with caplog.at_level(logging.WARNING, logger=CPP_EXTENSION_LOGGER):
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        logger.warning("Error checking compiler version for %s", "c++")
    assert [r.getMessage() for r in caplog.records] == ["Error checking compiler version for c++"]

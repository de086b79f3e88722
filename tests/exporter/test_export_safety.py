"""Silent wrongs of the export path, each refused or fixed, and files written whole.

Each test here failed (or passed wrongly) before: a translation returning None/a float/an eager
tensor, an opset the dynamo exporter silently ignored, ``export(f=...)`` writing in place (a
failing write destroyed the previous file), ``verify=True`` leaving a failing model at ``f``,
``functions=True`` ignoring ``kernels=``, 0-d constants exported as [1], torch's chatter (and the
hiding of the user's own warnings) during our exports.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnx_custom
import onnx_custom.ops.seed  # registers onnx_custom::my_add
from onnx_custom import OnnxCustomError, Registry, SymbolicError, VerificationError
from onnx_custom.common.atomic import atomic_open, atomic_path, atomic_write
from onnx_custom.common.external_data import referenced_data_files
from onnx_custom.errors import OpsetError, OutputPathError
from onnx_custom.exporter.arguments import dynamo_max_opset
from onnx_custom.exporter.pipeline import save_model
from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.runtime import KernelRegistry

EXPORTERS = [("torchscript", 13), ("dynamo", 18)]
IDS = [e for e, _ in EXPORTERS]
ARGS2 = (torch.randn(2, 3), torch.randn(2, 3))


class MyAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.onnx_custom.my_add(x, y)


def _registry(fn: Any) -> Registry:
    reg = onnx_custom.default_registry().copy()
    reg.symbolic("onnx_custom::my_add", opset=1, replace=True)(fn)
    return reg


def _no_temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- a translation's result is checked under both exporters ---------------------------------

BAD_RESULTS = [
    (lambda g, a, b: None, "returned None", "a missing `return`?"),
    (lambda g, a, b: 2.0, "returned a Python float (2.0)", "g.constant(2.0, like=<an input>)"),
    (
        lambda g, a, b: torch.ones(2, 3),
        "an eager torch.Tensor (shape [2, 3], torch.float32)",
        "compute it in the graph with g.op",
    ),
]


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=IDS)
@pytest.mark.parametrize(
    ("fn", "received", "fix"), BAD_RESULTS, ids=["None", "float", "eager-tensor"]
)
def test_translation_result_that_is_not_a_graph_value(
    exporter: str, opset: int, fn: Any, received: str, fix: str
) -> None:
    with pytest.raises(SymbolicError) as info:
        onnx_custom.export(MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_registry(fn))
    message = str(info.value)
    assert (
        "The translation of onnx_custom::my_add" in message
        and received in message
        and fix in message
    )
    assert "expected a graph value" in message


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class UsesDouble(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Double.apply(x)


@pytest.mark.parametrize(
    ("fn", "received", "fix"),
    [(lambda g, x: None, "returned None", "a missing `return`?")],
    ids=["None"],
)
def test_autograd_function_translation_result_is_checked(fn: Any, received: str, fix: str) -> None:
    reg = Registry()
    reg.symbolic(Double, opset=1)(fn)
    with pytest.raises(SymbolicError) as info:
        onnx_custom.export(
            UsesDouble(), (torch.randn(3),), exporter="torchscript", opset=13, registry=reg
        )
    assert "Double" in str(info.value) and received in str(info.value) and fix in str(info.value)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=IDS)
def test_translation_exception_names_the_translation_and_line(exporter: str, opset: int) -> None:
    def broken(g: Any, a: Any, b: Any) -> Any:
        return {}["missing key"]  # type: ignore[index]

    with pytest.raises(SymbolicError) as info:
        onnx_custom.export(
            MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_registry(broken)
        )
    message = str(info.value)
    assert "The translation of onnx_custom::my_add" in message and "broken" in message
    assert "raised KeyError: 'missing key'" in message and f"{Path(__file__).name}:" in message
    assert "submit a PR to PyTorch" not in message and len(message) < 600
    assert isinstance(info.value.__cause__, KeyError)


# -- opsets an exporter cannot produce --------------------------------------------------------


def test_dynamo_opset_above_its_maximum_names_the_maximum() -> None:
    maximum = dynamo_max_opset()
    for opset in (maximum + 1, 99):
        with pytest.raises(OpsetError) as info:
            onnx_custom.export(MyAdd(), ARGS2, exporter="dynamo", opset=opset)
        assert f"maximum {maximum}" in str(info.value) and f"opset={opset}" in str(info.value)
        assert info.value.maximum == maximum


def test_dynamo_maximum_opset_is_real() -> None:
    """The advertised maximum is produced for real (not opset 18 relabelled) and loads in ORT."""
    proto = onnx_custom.export(MyAdd(), ARGS2, exporter="dynamo", opset=dynamo_max_opset())
    assert {o.domain: o.version for o in proto.opset_import}[""] == dynamo_max_opset()
    session = onnx_custom.InferenceSession(proto)
    (got,) = session.run(None, {"x": ARGS2[0].numpy(), "y": ARGS2[1].numpy()})
    torch.testing.assert_close(torch.from_numpy(got), 2 * ARGS2[0] + ARGS2[1])


def test_torchscript_opset_above_its_maximum() -> None:
    with pytest.raises(
        OpsetError, match=r"maximum 20\); received opset=21\. Fix: .*exporter='dynamo'"
    ):
        onnx_custom.export(MyAdd(), ARGS2, exporter="torchscript", opset=21)


# -- files: whole or not at all ---------------------------------------------------------------


def _model(values: np.ndarray) -> onnx.ModelProto:
    init = onnx.numpy_helper.from_array(values, "w")
    node = onnx.helper.make_node("Add", ["x", "w"], ["y"])
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [values.size])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [values.size])],
        [init],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


_FAILING_WRITE = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np, onnx
    from onnx_custom.exporter.pipeline import save_model
    folder = sys.argv[1]
    big = onnx.numpy_helper.from_array(np.arange(500_000, dtype=np.float32), "w")
    model = onnx.load(folder + "/single.onnx")
    model.graph.initializer[0].CopyFrom(big)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    hard_limit = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, hard_limit))
    for name, external in (("single.onnx", False), ("external.onnx", True)):
        try:
            save_model(model, folder + "/" + name, external_data=external)
            print(name, "written")
        except OSError as exc:
            print(name, "failed", exc.errno)
    """)


def test_a_write_failing_midway_keeps_the_previous_file(tmp_path: Path) -> None:
    """A real failing write (the file-size limit hit midway through the data) leaves the previous
    model and its external data intact and no temporary file; in place, it truncated them."""
    good = np.arange(1000, dtype=np.float32)
    save_model(_model(good), tmp_path / "single.onnx")
    save_model(_model(good), tmp_path / "external.onnx", external_data=True)
    assert referenced_data_files(tmp_path / "external.onnx")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = subprocess.run(
        [sys.executable, "-c", _FAILING_WRITE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "single.onnx failed 27" in result.stdout and "external.onnx failed 27" in result.stdout
    )  # EFBIG
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    for name in ("single.onnx", "external.onnx"):
        loaded = onnx.load(str(tmp_path / name))
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(loaded.graph.initializer[0]), good)


def test_external_data_save_leaves_the_model_in_memory_whole(tmp_path: Path) -> None:
    """onnx.save_model moves tensors out of the proto it writes;
    the returned model must keep them."""
    model = _model(np.arange(4096, dtype=np.float32))
    before = model.SerializeToString()
    save_model(model, tmp_path / "m.onnx", external_data=True)
    assert model.SerializeToString() == before
    pointer = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert pointer.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    (data,) = referenced_data_files(tmp_path / "m.onnx")
    assert (
        tmp_path / data
    ).stat().st_size == 4096 + 4096 * 4  # a 4 KiB header (the write's token), then the data
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(loaded.graph.initializer[0]), np.arange(4096, dtype=np.float32)
    )


@pytest.mark.parametrize("how", ["atomic_write", "atomic_open", "atomic_path"])
def test_atomic_helpers_keep_the_previous_file_on_failure(tmp_path: Path, how: str) -> None:
    target = tmp_path / "report.md"
    target.write_text("previous\n")

    def fail() -> None:
        if how == "atomic_write":

            class Unwritable(str):
                def encode(self, *args: Any, **kwargs: Any) -> bytes:
                    raise KeyboardInterrupt  # Ctrl-C while serializing

            atomic_write(target, Unwritable("new"))
        elif how == "atomic_open":
            with atomic_open(target, "w") as handle:
                handle.write("half of the new ")
                raise RuntimeError("failed while writing")
        else:
            with atomic_path(target) as temporary:
                temporary.write_text("half")
                raise RuntimeError("the compiler failed")

    with pytest.raises((KeyboardInterrupt, RuntimeError)):
        fail()
    assert target.read_text() == "previous\n" and _no_temporaries(tmp_path) == []
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n" and _no_temporaries(tmp_path) == []


def test_atomic_write_keeps_mode_and_symlinks(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    atomic_write(target, b"one")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # as open() would create it
    target.chmod(0o640)
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    atomic_write(link, b"two")
    assert link.is_symlink() and target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_failing_export_leaves_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    onnx_custom.export(MyAdd(), ARGS2, path)
    before = path.read_bytes()
    with pytest.raises(SymbolicError):
        onnx_custom.export(MyAdd(), ARGS2, path, registry=_registry(lambda g, a, b: None))
    assert path.read_bytes() == before and _no_temporaries(tmp_path) == []


def _three_a_plus_b(g: Any, a: Any, b: Any) -> Any:
    return g.op("Add", g.op("Mul", a, g.constant(3.0, like=a)), b)


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=IDS)
def test_verify_runs_before_writing(tmp_path: Path, exporter: str, opset: int) -> None:
    path = tmp_path / "model.onnx"
    onnx_custom.export(MyAdd(), ARGS2, path, exporter=exporter, opset=opset)
    before = path.read_bytes()
    with pytest.raises(VerificationError) as info:
        onnx_custom.export(
            MyAdd(),
            ARGS2,
            path,
            exporter=exporter,
            opset=opset,
            registry=_registry(_three_a_plus_b),
            verify=True,
        )
    assert f"Nothing was written to {str(path)!r}" in str(info.value) and "keep_failed=" in str(
        info.value
    )
    assert path.read_bytes() == before and info.value.kept is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_keep_failed_keeps_the_failing_model_and_says_where(tmp_path: Path) -> None:
    path, failing = tmp_path / "model.onnx", tmp_path / "failing.onnx"
    with pytest.raises(VerificationError) as info:
        onnx_custom.export(
            MyAdd(),
            ARGS2,
            path,
            registry=_registry(_three_a_plus_b),
            verify=True,
            keep_failed=failing,
        )
    assert not path.exists() and info.value.kept == str(failing)
    assert f"The failing model was kept at {str(failing)!r}" in str(info.value)
    kept = onnx.load(str(failing))
    (got,) = onnx_custom.InferenceSession(kept).run(
        None, {"x": ARGS2[0].numpy(), "y": ARGS2[1].numpy()}
    )
    torch.testing.assert_close(
        torch.from_numpy(got), 3 * ARGS2[0] + ARGS2[1]
    )  # the planted bug, kept


class CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + 1


def _read_only_folder(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if not Path("/sys").is_dir():
        pytest.skip("running as root without /sys: no read-only folder to test with")
    return Path("/sys")  # sysfs refuses new files even to root


@pytest.mark.parametrize(
    ("make_f", "error", "fragments"),
    [
        (
            lambda tmp: 123,
            OnnxCustomError,
            ["must be a file path", "received int (123)", "f='model.onnx'"],
        ),
        (
            lambda tmp: tmp / "missing" / "m.onnx",
            OutputPathError,
            ["does not exist", "expected an existing folder", "os.makedirs"],
        ),
        (
            lambda tmp: tmp,
            OutputPathError,
            ["is a folder", "expected a file path", "name a file inside it"],
        ),
        (
            lambda tmp: _read_only_folder(tmp) / "m.onnx",
            OutputPathError,
            [
                "cannot create files",
                "expected a writable folder",
                "choose a folder you can write to",
            ],
        ),
    ],
    ids=["int", "missing-folder", "a-folder", "read-only-folder"],
)
def test_bad_f_is_refused_before_the_export_runs(
    tmp_path: Path, make_f: Any, error: type, fragments: list[str]
) -> None:
    model = CountsCalls()
    with pytest.raises(error) as info:
        onnx_custom.export(
            model, (torch.randn(2),), make_f(tmp_path), exporter="torchscript", opset=13
        )
    assert all(f in str(info.value) for f in fragments), str(info.value)
    assert model.calls == 0  # refused before tracing


def test_functions_use_the_given_kernel_registry() -> None:
    """``export(functions=True, kernels=reg)`` embeds ``reg``'s bodies (it used the default one)."""

    @torch.library.custom_op("safety::triple", mutates_args=())
    def triple(x: torch.Tensor) -> torch.Tensor:
        return 3 * x

    @triple.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    class Triple(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return triple(x)

    reg = Registry()
    reg.symbolic("safety::triple", opset=1)(lambda g, x: g.op("safety::Triple", x))
    kernels = KernelRegistry()
    body = TranslationBody(lambda g, x: g.op("Mul", x, g.constant(3.0, like=x)))
    kernels.kernel("safety::Triple", inputs=["x"], outputs=["y"], shape_fn="like0", function=body)(
        lambda x: 3 * x
    )
    for exporter, opset in EXPORTERS:
        proto = onnx_custom.export(
            Triple(),
            (torch.randn(4),),
            exporter=exporter,
            opset=opset,
            registry=reg,
            functions=True,
            kernels=kernels,
            verify=True,
        )
        assert [(f.domain, f.name) for f in proto.functions] == [("safety", "Triple")]
        x = np.arange(4, dtype=np.float32)
        plain = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )  # no kernels of ours
        np.testing.assert_allclose(plain.run(None, {proto.graph.input[0].name: x})[0], 3 * x)


# -- 0-d constants --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exporter", "opset"), [("torchscript", 7), ("torchscript", 17), ("dynamo", 18)]
)
def test_scalar_constant_keeps_a_scalar_output_scalar(exporter: str, opset: int) -> None:
    """``g.constant(a)`` is 0-d: ``Mul(x0d, const)`` stays 0-d (np.ascontiguousarray made it [1]:
    the dynamo file then returned shape [1], the TorchScript export refused its own output)."""

    @torch.library.custom_op("safety::scale0d", mutates_args=())
    def scale0d(x: torch.Tensor, a: float) -> torch.Tensor:
        return a * x

    @scale0d.register_fake
    def _(x: torch.Tensor, a: float) -> torch.Tensor:
        return torch.empty_like(x)

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scale0d(x, -1.5)

    reg = Registry()
    reg.symbolic("safety::scale0d", opset=1)(
        lambda g, x, *, a: g.op("Mul", x, g.constant(a, like=x))
    )
    proto = onnx_custom.export(
        Scale(), (torch.randn(()),), exporter=exporter, opset=opset, registry=reg
    )
    constants = [
        onnx.numpy_helper.to_array(a.t)
        for n in proto.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
    ]
    constants += [onnx.numpy_helper.to_array(t) for t in proto.graph.initializer]
    assert [c.shape for c in constants] == [()]
    assert [d for d in proto.graph.output[0].type.tensor_type.shape.dim] == []
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {proto.graph.input[0].name: np.array(2.0, dtype=np.float32)})
    assert got.shape == () and float(got) == -3.0


# -- noise: torch's is hidden, the user's is not --------------------------------------------


class WarnsInForward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("user warning from forward", UserWarning, stacklevel=1)
        return x + 1


@pytest.mark.parametrize(("exporter", "opset"), EXPORTERS, ids=IDS)
def test_user_warnings_reach_the_user_and_torch_chatter_does_not(
    exporter: str, opset: int, capfd: pytest.CaptureFixture[str]
) -> None:
    def warns(g: Any, a: Any, b: Any) -> Any:
        warnings.warn("user warning from a translation", UserWarning, stacklevel=1)
        return g.op("Add", g.op("Add", a, a), b)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        onnx_custom.export(WarnsInForward(), (torch.randn(2),), exporter=exporter, opset=opset)
        onnx_custom.export(
            MyAdd(), ARGS2, exporter=exporter, opset=opset, registry=_registry(warns)
        )
    messages = [str(w.message) for w in caught]
    assert "user warning from forward" in messages and "user warning from a translation" in messages
    assert all(w.category is UserWarning and "user warning" in str(w.message) for w in caught), (
        messages
    )
    err = capfd.readouterr().err
    assert "is not installed. Skipping" not in err and "Torch IR graph" not in err


def test_torchscript_error_prints_no_graph_dump(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SymbolicError):
        onnx_custom.export(
            MyAdd(),
            ARGS2,
            exporter="torchscript",
            opset=13,
            registry=_registry(lambda g, a, b: None),
        )
    assert "Torch IR graph at exception" not in capfd.readouterr().err


def test_export_to_a_named_pipe_writes_into_it_and_keeps_the_pipe(tmp_path: Path) -> None:
    """A device or pipe (/dev/null, /dev/stdout, a FIFO) is written in place, never replaced by a
    regular file (as root, replacing /dev/null broke the machine)."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    onnx_custom.export(MyAdd(), ARGS2, fifo, exporter="torchscript", opset=13)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert onnx.load_from_string(received[0]).graph.node
    assert _no_temporaries(tmp_path) == []


@pytest.mark.parametrize("kind", ["NamedTemporaryFile", "gzip"])
def test_export_accepts_file_objects_that_are_not_iobase(tmp_path: Path, kind: str) -> None:
    import gzip
    import tempfile

    if kind == "gzip":
        with gzip.open(tmp_path / "m.onnx.gz", "wb") as handle:
            onnx_custom.export(MyAdd(), ARGS2, handle, exporter="torchscript", opset=13)
        data = gzip.decompress((tmp_path / "m.onnx.gz").read_bytes())
    else:
        with tempfile.NamedTemporaryFile(dir=tmp_path) as handle:
            onnx_custom.export(MyAdd(), ARGS2, handle, exporter="torchscript", opset=13)
            handle.flush()
            data = Path(handle.name).read_bytes()
    assert [n.op_type for n in onnx.load_from_string(data).graph.node]

"""Meta functions written the way the op-adaptation articles write them.

The articles' Meta function for a custom op builds its output with
``torch.empty(..., device="meta")`` (or ``x.new_empty``, or even a tensor on the CPU). Given as an
`OpSpec`'s ``shape=``, any of these makes a fake kernel whose outputs are on the inputs' fake
device, so `onnx_custom.testing.check_op` (opcheck's fake-tensor test), torch.export and both
exporters pass. A meta function returning None or the wrong rank is a `SpecError` naming the op,
what it returned, what was expected and the fix — never an empty graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import onnx_custom
from onnx_custom.spec import Attribute, Input, OpSpec, Output, SpecError, spec_scope
from onnx_custom.testing import check_op

# -- the user's code, as the article writes it -------------------------------------------------


def custom_linear(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return alpha * torch.matmul(x, weight.t())


def custom_linear_meta(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    # The article's Meta function: shape and dtype only, on the meta device.
    return torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device="meta")


def custom_linear_new_empty(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def custom_linear_cpu(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return torch.zeros(x.shape[0], weight.shape[0], dtype=x.dtype, device="cpu")


def custom_linear_onnx(g: Any, x: Any, weight: Any, *, alpha: float) -> Any:
    product = g.op("MatMul", x, g.op("Transpose", weight, perm=[1, 0]))
    return g.op("Mul", product, g.constant(alpha, like=x))


def meta_returns_none(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> None:
    torch.empty(x.shape[0], weight.shape[0], device="meta")  # forgot the return


def meta_wrong_rank(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return torch.empty(x.shape[0], device="meta")  # rank 1; impl gives rank 2


def meta_wrong_dtype(x: torch.Tensor, weight: torch.Tensor, *, alpha: float) -> torch.Tensor:
    return torch.empty(x.shape[0], weight.shape[0], dtype=torch.float64, device="meta")


def meta_two_outputs(
    x: torch.Tensor, weight: torch.Tensor, *, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(1), x.new_empty(1)


def _spec(name: str, meta: Any) -> OpSpec:
    return OpSpec(
        f"metatest::{name}",
        inputs=[Input("x", ["float32", "float64"]), Input("weight", ["float32", "float64"])],
        outputs=[Output("y")],
        attributes=[Attribute("alpha", "float", 1.0)],
        impl=custom_linear,
        shape=meta,
        translations={9: custom_linear_onnx},
    )


@pytest.fixture(autouse=True)
def _scope() -> Iterator[None]:
    with spec_scope():
        yield


def _samples() -> list[tuple[Any, ...]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(4, 3, generator=g), torch.randn(5, 3, generator=g), 0.5),
        (torch.randn(1, 3, generator=g), torch.randn(2, 3, generator=g), 2.0),
    ]


# Each style of meta function passes check_op: opcheck (fake tensor vs real), both exporters at
# their opsets, verified in ONNX Runtime at the samples' sizes.
STYLES = [
    ("meta-device", custom_linear_meta),
    ("new-empty", custom_linear_new_empty),
    ("cpu-tensor", custom_linear_cpu),
]


@pytest.mark.parametrize("meta", [m for _, m in STYLES], ids=[i for i, _ in STYLES])
def test_article_meta_function_passes_check_op(meta: Any) -> None:
    spec = _spec(f"linear_{meta.__name__}", meta)
    report = check_op(spec, _samples())
    assert report.passed, str(report)
    names = " ".join(c.name for c in report.cases if c.passed)
    assert "opcheck" in names and "torchscript" in names and "dynamo" in names, str(report)


def test_meta_device_outputs_are_on_the_fake_device_under_torch_export() -> None:
    spec = _spec("linear_export", custom_linear_meta)
    handle = onnx_custom.register_spec(spec)

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return handle.op(x, w, 0.5).relu()

    x, w = torch.randn(4, 3), torch.randn(5, 3)
    program = torch.export.export(
        M(), (x, w), dynamic_shapes=({0: torch.export.Dim("batch")}, None)
    )
    (node,) = [n for n in program.graph.nodes if n.target == handle.op]
    fake = node.meta["val"]
    assert fake.device == x.device, fake  # the fake device, not "meta"
    assert isinstance(fake.shape[0], torch.SymInt), fake.shape  # the batch dim stayed symbolic
    torch.testing.assert_close(program.module()(torch.randn(7, 3), w).shape, torch.Size([7, 5]))


# -- bad meta functions: typed errors at export (dynamo: the fake kernel; TorchScript: the eager
# call compares the impl's outputs with the meta function's) --------------------------------

BAD = [
    (
        "none",
        meta_returns_none,
        ["returned None", "expected 1 tensor(s) ['y']", "a missing `return`?", "fix:"],
    ),
    ("wrong-rank", meta_wrong_rank, ["rank 1", "rank 2", "fix: correct the meta function"]),
    ("wrong-dtype", meta_wrong_dtype, ["as torch.float64", "expected torch.float32", "fix:"]),
    ("two-outputs", meta_two_outputs, ["with 2 item(s)", "expected 1 tensor(s)", "fix:"]),
]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(
    ("meta", "phrases"), [(m, p) for _, m, p in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_meta_function_is_a_spec_error_at_export(
    meta: Any, phrases: list[str], exporter: str, tmp_path: Path
) -> None:
    spec = _spec(f"bad_{meta.__name__}", meta)
    handle = onnx_custom.register_spec(spec)

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return handle.op(x, w, 0.5)

    path = tmp_path / "bad.onnx"
    # The dynamo exporter traces the fake kernel; it then runs the impl once on the example
    # inputs and refuses the meta function's other rank: a FakeKernelError.
    dynamo_rank = exporter == "dynamo" and meta is meta_wrong_rank
    with pytest.raises(onnx_custom.FakeKernelError if dynamo_rank else SpecError) as info:
        onnx_custom.export(M(), (torch.randn(4, 3), torch.randn(5, 3)), path, exporter=exporter)
    assert not path.exists()
    message = str(info.value)
    if dynamo_rank:
        phrases = [*phrases, "dynamo exporter writes the meta function's shapes"]
    assert spec.name in message
    for phrase in phrases:
        assert phrase in message, (phrase, message)


def _positives(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0]


def _positives_meta(x: torch.Tensor) -> torch.Tensor:
    n = torch.library.get_ctx().new_dynamic_size()  # data-dependent: only valid in fake mode
    return x.new_empty(n)


def test_data_dependent_meta_function_still_runs_eagerly() -> None:
    """The eager shape check skips meta functions that only run in fake mode."""
    spec = OpSpec(
        "metatest::positives",
        inputs=[Input("x", ["float32"])],
        outputs=[Output("y")],
        impl=_positives,
        shape=_positives_meta,
        translations={9: lambda g, x: x},
    )
    handle = onnx_custom.register_spec(spec)
    x = torch.tensor([1.0, -2.0, 3.0])
    torch.testing.assert_close(handle.op(x), torch.tensor([1.0, 3.0]))

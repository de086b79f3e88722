"""Shapes and the hand-off: ``dynamic=True`` keeps one graph and one session across batch sizes,
static compiles share an LRU session cache, and inputs/outputs of every awkward kind
(non-contiguous, bool, returned inputs, SymInts) cross between torch and ORT correctly. Reference:
eager PyTorch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _compile_util import ZOO_MODELS, load_zoo
from torch.fx.experimental.proxy_tensor import make_fx

import onnx_custom
from onnx_custom.compile.backend import OnnxCustomBackend

SWEEP = [2, 3, 5, 8, 13, 31, 64]


def _resized(module: Any, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The zoo model's example inputs with every dynamic dim 0 set to ``batch`` (fresh values)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for tensor, spec in zip(module.example_inputs(), module.dynamic_shapes, strict=True):
        shape = list(tensor.shape)
        if spec and 0 in spec:
            shape[0] = batch
        out.append(torch.randn(shape, generator=g, dtype=tensor.dtype))
    return tuple(out)


DYNAMIC_ZOO = [n for n in ZOO_MODELS if n != "bev_pool"]  # bev_pool: batch fixed by its BEV shape
# torch's own fake conv2d guards 2 <= batch <= 15 (its channels-last heuristic, not this backend):
# a DCN batch past 15 recompiles under any backend, aot_eager included.
CONV_SWEEP = [2, 3, 5, 8, 13, 15]


@pytest.mark.parametrize("name", DYNAMIC_ZOO)
def test_dynamic_batch_sweep_one_graph_one_session(name: str) -> None:
    module = load_zoo(name)
    model = module.Model().eval()
    backend = onnx_custom.compile_backend(variants=("custom",))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for batch in CONV_SWEEP if name == "deform_conv" else SWEEP:
            args = _resized(module, batch, seed=batch)
            torch.testing.assert_close(
                compiled(*args), model(*args), msg=lambda m, b=batch: f"batch {b}: {m}"
            )
    assert [r.kind for r in backend.records] == ["inference"], "recompiled"
    assert backend.sessions.created == len(backend.records[0].partitions) == 1


def test_full_sweep_2_to_64_no_recompile() -> None:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    ).eval()
    backend = onnx_custom.compile_backend()
    compiled = torch.compile(mlp, backend=backend, dynamic=True)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for batch in range(2, 65):
            x = torch.randn(batch, 64)
            torch.testing.assert_close(compiled(x), mlp(x))
    assert len(backend.records) == 1 and backend.sessions.created == 1


def test_static_compiles_share_an_lru_session_cache() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    backend = onnx_custom.compile_backend(cache_size=2)
    with torch.no_grad():
        for batch in (3, 4, 5):
            torch._dynamo.reset()  # a static compile per size (no automatic dynamic)
            x = torch.randn(batch, 8)
            torch.testing.assert_close(
                torch.compile(model, backend=backend, dynamic=False)(x), model(x)
            )
        assert backend.sessions.created == 3 and len(backend.sessions) == 2
        torch._dynamo.reset()
        x = torch.randn(5, 8)  # still cached (most recent): the recompiled graph reuses its session
        torch.testing.assert_close(
            torch.compile(model, backend=backend, dynamic=False)(x), model(x)
        )
        assert backend.sessions.created == 3
        torch._dynamo.reset()
        x = torch.randn(3, 8)  # evicted (least recently used): a new session
        torch.testing.assert_close(
            torch.compile(model, backend=backend, dynamic=False)(x), model(x)
        )
        assert backend.sessions.created == 4 and len(backend.sessions) == 2


def _add_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2.0 + y


BASE = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(1))
NON_CONTIGUOUS = {
    "permuted": lambda: BASE.permute(2, 0, 1),
    "sliced": lambda: torch.randn(4, 12, 5)[:, 3:9, :],
    "stepped": lambda: torch.randn(8, 6, 10)[::2, :, ::2],
    "expanded": lambda: torch.randn(1, 6, 5).expand(4, 6, 5),
    "transposed-0d-stride": lambda: torch.randn(5, 6).t().unsqueeze(0).expand(4, 6, 5),
}


@pytest.mark.parametrize("make", NON_CONTIGUOUS.values(), ids=NON_CONTIGUOUS.keys())
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_non_contiguous_inputs(make: Any, dynamic: bool) -> None:
    x = make()
    y = torch.randn(x.shape)
    assert not x.is_contiguous()
    got = torch.compile(_add_mul, backend=onnx_custom.compile_backend(), dynamic=dynamic)(x, y)
    torch.testing.assert_close(got, _add_mul(x, y))


def test_channels_last_conv_input() -> None:
    module = load_zoo("deform_conv")
    model = module.Model().eval()
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    with torch.no_grad():
        got = torch.compile(model, backend=onnx_custom.compile_backend())(x)
        torch.testing.assert_close(got, model(x))


def test_bool_int_and_scalar_outputs() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x > 0, (x * 3).to(torch.int64), x.sum()

    x = torch.randn(5, 7)
    got = torch.compile(f, backend=onnx_custom.compile_backend(), dynamic=True)(x)
    for a, b in zip(got, f(x), strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_symint_inputs_dynamic() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1) * x.shape[0] + x.shape[1]

    backend = onnx_custom.compile_backend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    for batch in (2, 7, 11):
        x = torch.randn(batch, 3, 4)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(backend.records) == 1


def test_output_plan_inputs_none_duplicates_and_symints() -> None:
    """A graph returning an input as is, None, one value twice and a SymInt: ORT computes the
    distinct value once; the rest is put back in place (as aot_autograd's graphs need)."""

    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[Any, ...]:
        z = x * y + 1
        return x, None, z, z, x.shape[0]

    x, y = torch.randn(4, 3), torch.randn(4, 3)
    gm = make_fx(f, tracing_mode="symbolic")(x, y)
    backend = OnnxCustomBackend()
    compiled = backend._compile(gm, [x, y], kind="forward", index=0)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    real = [
        4 if isinstance(p.meta["val"], torch.SymInt) else t
        for p, t in zip(placeholders, [x, y], strict=False)
    ]
    got = compiled(*real)
    assert got[0] is x and got[1] is None and got[4] == 4 and isinstance(got[4], int)
    torch.testing.assert_close(got[2], x * y + 1)
    assert got[2] is got[3]
    assert len(backend.records[0].partitions) == 1


def test_inputs_on_other_device_raise() -> None:
    meta = torch.empty(3, 4, device="meta")
    with pytest.raises(onnx_custom.CompileError, match="CPU only"):
        OnnxCustomBackend()._check_devices([meta])


_ODD = torch.Generator().manual_seed(3)  # inputs fixed, whatever the collection order drew before
ODD_INPUTS = {
    "zero-size": (torch.randn(0, 5, generator=_ODD), torch.randn(0, 5, generator=_ODD)),
    "0-d": (torch.tensor(1.5), torch.tensor(-2.0)),
    "float16": (torch.randn(3, 4, generator=_ODD).half(), torch.randn(3, 4, generator=_ODD).half()),
    "float64": (
        torch.randn(3, 4, generator=_ODD, dtype=torch.float64),
        torch.randn(3, 4, generator=_ODD, dtype=torch.float64),
    ),
}


@pytest.mark.parametrize(("x", "y"), ODD_INPUTS.values(), ids=ODD_INPUTS.keys())
def test_zero_size_0d_and_other_dtypes_in_ort(x: torch.Tensor, y: torch.Tensor) -> None:
    backend = onnx_custom.compile_backend()
    got = torch.compile(_add_mul, backend=backend)(x, y)
    want = _add_mul(x, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    # float16: ORT and eager both round after Sin, Mul and Add, but their Sin may differ by an
    # ulp of the intermediate; allow one ulp of the largest output (the verifier's fp16 rule).
    ulp = (
        float(want.abs().max()) * 2.0**-10 if want.dtype == torch.float16 and want.numel() else 0.0
    )
    torch.testing.assert_close(got, want, **({"rtol": 1e-3, "atol": max(1e-5, ulp)} if ulp else {}))
    assert not [f for r in backend.records for f in r.fallbacks]


def test_bfloat16_runs_eager_with_the_reason() -> None:
    """ORT's OrtValue wrapping has no bfloat16 (numpy has none): such nodes stay in PyTorch."""
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    backend = onnx_custom.compile_backend()
    with pytest.warns(UserWarning, match="nothing in"):
        got = torch.compile(_add_mul, backend=backend)(x, x)
    torch.testing.assert_close(got, _add_mul(x, x))
    reasons = {f.reason for r in backend.records for f in r.fallbacks}
    assert reasons == {"dtype torch.bfloat16 is not handed to ONNX Runtime"}

"""The fake-kernel answers remembered across TorchScript exports (`output_meta.cached_run_fake`)
must never outlive what they were computed from: each file's declared output types are checked
against the eager op's real output (dtype, rank, sizes) and the dim names asked for in that export.

Cases that fail without the invalidation: a fake kernel re-registered between two exports, a
fake kernel reading a global that changed (the trace check), scalar arguments equal as dict keys
(2 == 2.0), one op at other dtypes / ranks / dim names. Also a translation that raises only on
its second call, and a ``registered()`` block left by an exception.
"""

from __future__ import annotations

import io
from typing import Any

import onnx
import pytest
import sympy
import torch

import onnx_custom
from onnx_custom import SymbolicError
from onnx_custom.exporter.output_meta import DimNames, TensorDesc, cached_run_fake
from onnx_custom.exporter.torchscript import registered

# -- test ops (own namespace) ------------------------------------------------------------------


@torch.library.custom_op("octfake::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x])


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((2 * x.shape[0], *x.shape[1:]))


OUT_DTYPE = {"value": torch.float32}  # read by `convert`'s kernels: invisible to any fingerprint


@torch.library.custom_op("octfake::convert", mutates_args=())
def convert(x: torch.Tensor) -> torch.Tensor:
    return x.to(OUT_DTYPE["value"], copy=True)


@convert.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=OUT_DTYPE["value"])


# A Scalar argument: 2 and 2.0 are equal dict keys but give other output dtypes (int64 x).
_LIB = torch.library.Library("octfake", "FRAGMENT")
_LIB.define("scale(Tensor x, Scalar factor) -> Tensor")
_LIB.impl("scale", lambda x, factor: x * factor, "CPU")
torch.library.register_fake(
    "octfake::scale",
    lambda x, factor: torch.empty_like(x, dtype=torch.result_type(x, factor)),
    lib=_LIB,
)
scale = torch.ops.octfake.scale.default


CALLS = {"twice": 0}
RAISE_ON_CALL = {"twice": -1}


def _registry() -> onnx_custom.Registry:
    reg = onnx_custom.Registry()

    @reg.symbolic("octfake::twice")
    def _twice(g: Any, x: Any) -> Any:
        CALLS["twice"] += 1
        if CALLS["twice"] == RAISE_ON_CALL["twice"]:
            raise ValueError("second call refused")
        return g.op("octfake::Twice", x)

    @reg.symbolic("octfake::convert")
    def _convert(g: Any, x: Any) -> Any:
        return g.op("octfake::Convert", x)

    @reg.symbolic("octfake::scale")
    def _scale(g: Any, x: Any, *, factor: float) -> Any:
        return g.op("octfake::Scale", x, factor=float(factor))

    return reg


class One(torch.nn.Module):
    def __init__(self, op: Any, *extra: Any) -> None:
        super().__init__()
        self.op = op
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, *self.extra)


def _export(
    model: torch.nn.Module, x: torch.Tensor, dynamic: dict[int, str] | None = None
) -> onnx.ModelProto:
    buffer = io.BytesIO()
    shapes = None if dynamic is None else {"x": dynamic}
    onnx_custom.export(
        model,
        (x,),
        buffer,
        exporter="torchscript",
        opset=17,
        registry=_registry(),
        dynamic_shapes=shapes,
    )
    return onnx.load_from_string(buffer.getvalue())


def _output_type(model: onnx.ModelProto) -> tuple[int, list[int | str]]:
    tensor = model.graph.output[0].type.tensor_type
    return tensor.elem_type, [d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim]


def _expected(
    out: torch.Tensor, names: dict[int, str] | None = None
) -> tuple[int, list[int | str]]:
    """The reference: the eager op's real output, with the dims the test names."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=out.dtype).numpy().dtype)
    return elem, [(names or {}).get(axis, size) for axis, size in enumerate(out.shape)]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    CALLS["twice"] = 0
    RAISE_ON_CALL["twice"] = -1
    OUT_DTYPE["value"] = torch.float32
    yield
    twice.register_fake(lambda x: x.new_empty((2 * x.shape[0], *x.shape[1:])))


# -- the same op at other dtypes, ranks and dim names ------------------------------------------

SEQUENCES = {
    "f32[4,3]-f64[4,3]-f32[4,3,2]": [
        (torch.float32, (4, 3), None),
        (torch.float64, (4, 3), None),
        (torch.float32, (4, 3, 2), None),
    ],
    "batch-then-n-then-static": [
        (torch.float32, (4, 3), {0: "batch"}),
        (torch.float32, (4, 3), {0: "n"}),
        (torch.float32, (4, 3), None),
    ],
    "f16[5]-dyn-then-f32[5]-dyn": [
        (torch.float16, (5,), {0: "len"}),
        (torch.float32, (5,), {0: "len"}),
    ],
}


@pytest.mark.parametrize("sequence", list(SEQUENCES.values()), ids=list(SEQUENCES))
def test_each_export_types_its_own_call(
    sequence: list[tuple[torch.dtype, tuple[int, ...], dict[int, str] | None]],
) -> None:
    torch.manual_seed(0)
    for dtype, shape, dynamic in sequence:
        x = torch.randn(shape).to(dtype)
        names = None if dynamic is None else {axis: f"2*{name}" for axis, name in dynamic.items()}
        assert _output_type(_export(One(twice), x, dynamic)) == _expected(twice(x), names)


# -- invalidation ------------------------------------------------------------------------------


def test_reregistered_fake_kernel_is_not_served_from_the_cache() -> None:
    """At the example's batch of 4 the trace cannot tell ``batch + 4`` from ``2*batch``:
    only the fingerprint can."""
    x = torch.randn(4, 3)
    # wrong on purpose, yet right at the example's batch of 4: the trace agrees with both fakes
    twice.register_fake(lambda x: x.new_empty((x.shape[0] + 4, *x.shape[1:])))
    assert _output_type(_export(One(twice), x, {0: "batch"}))[1] == ["batch + 4", 3]
    twice.register_fake(lambda x: x.new_empty((2 * x.shape[0], *x.shape[1:])))
    assert _output_type(_export(One(twice), x, {0: "batch"})) == _expected(twice(x), {0: "2*batch"})


def test_reregistered_fake_kernel_direct() -> None:
    root = sympy.Symbol("ts999", integer=True, positive=True)
    dims = DimNames()
    args = [TensorDesc(torch.float32, (root, 3))]
    twice.register_fake(lambda x: x.new_empty(x.shape))
    first = cached_run_fake(torch.ops.octfake.twice.default, args, dims)
    twice.register_fake(lambda x: x.new_empty((2 * x.shape[0], *x.shape[1:])))
    second = cached_run_fake(torch.ops.octfake.twice.default, args, dims)
    assert first == [TensorDesc(torch.float32, (root, 3))]
    assert second == [TensorDesc(torch.float32, (2 * root, 3))]


def test_fake_kernel_reading_a_changed_global_follows_the_trace() -> None:
    x = torch.randn(2, 3)
    assert _output_type(_export(One(convert), x)) == _expected(convert(x))
    OUT_DTYPE["value"] = torch.float64
    assert _output_type(_export(One(convert), x)) == _expected(convert(x))


@pytest.mark.parametrize("factors", [(2, 2.0), (1.0, 1)], ids=["int-then-float", "float-then-int"])
def test_equal_scalars_of_other_types_are_other_keys(factors: tuple[Any, ...]) -> None:
    x = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    for factor in factors:
        assert _output_type(_export(One(scale, factor), x)) == _expected(scale(x, factor))


def test_translation_raising_on_its_second_call_raises_there() -> None:
    x = torch.randn(4, 3)
    RAISE_ON_CALL["twice"] = 2
    assert _output_type(_export(One(twice), x)) == _expected(twice(x))
    with pytest.raises(SymbolicError, match="second call refused"):
        _export(One(twice), x)
    assert _output_type(_export(One(twice), x)) == _expected(twice(x))


def test_registered_block_left_by_an_exception_leaves_no_state() -> None:
    x = torch.randn(4, 3)
    reg = _registry()
    with pytest.raises(RuntimeError, match="boom"), registered(reg, opset=17):
        torch.onnx.export(One(twice), (x,), io.BytesIO(), dynamo=False, opset_version=17)
        raise RuntimeError("boom")
    OUT_DTYPE["value"] = torch.float64
    assert _output_type(_export(One(convert), x)) == _expected(convert(x))
    assert _output_type(_export(One(twice), x, {0: "batch"})) == _expected(twice(x), {0: "2*batch"})


@pytest.mark.parametrize("factors", [(2, 2.0), (1.0, 1)], ids=["int-then-float", "float-then-int"])
def test_equal_scalars_of_other_types_are_other_keys_direct(factors: tuple[Any, ...]) -> None:
    """Without the trace check (``agrees=None``) the key alone must tell 2 from 2.0."""
    x = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    for factor in factors:
        outputs = cached_run_fake(scale, [TensorDesc(torch.int64, (2, 3)), factor], DimNames())
        assert outputs == [TensorDesc(scale(x, factor).dtype, (2, 3))]

"""Every shipped op, one table: opcheck with gradients, ``torch.compile(fullgraph=True)`` forward
and backward, and one dtype list per op (the spec's) that the eager op, the Python kernel and the
native kernel all accept — exactly, probed by running each dtype, not by reading declarations."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from _native_util import node_model, run_native, run_python

from onnx_custom.ops import extension
from onnx_custom.ops.bev_pool import BEV_POOL_V2, prepare_bev_ranks, synthetic_frustum
from onnx_custom.ops.custom_linear import CUSTOM_LINEAR
from onnx_custom.ops.deform_conv import DEFORM_CONV2D
from onnx_custom.ops.msda import MSDA
from onnx_custom.ops.multi_out3 import MULTI_OUT3
from onnx_custom.ops.numpy_sin import NUMPY_SIN
from onnx_custom.ops.seed import MULTI_OUT, MY_ADD
from onnx_custom.runtime.native import native_ops
from onnx_custom.spec import OpSpec

# every dtype torch, numpy and ONNX Runtime all have: what the probe tries
CANDIDATES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)

Arrays = dict[str, "np.ndarray | None"]


@dataclasses.dataclass(frozen=True)
class Case:
    """A shipped op with a small sample: ``make(dtype, size)`` -> (named inputs as numpy arrays,
    the op's attributes); ``varied``: the inputs ``dtype`` applies to (the others keep theirs)."""

    id: str
    spec: OpSpec
    make: Callable[[str, int], tuple[Arrays, dict[str, Any]]]
    varied: tuple[str, ...]
    needs_extension: bool = False
    trials: int = 2  # check_op's verification trials (random inputs after the sample's own)


def _np_dtype(dtype: str) -> Any:
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def _rand(dtype: str, shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    if dtype == "bool":
        return values > 0
    if dtype.startswith(("int", "uint")):
        values = np.abs(values * 3) if dtype.startswith("uint") else values * 3
        return np.round(values).astype(dtype)
    return values.astype(_np_dtype(dtype))


def _my_add(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    return {"a": _rand(dtype, (n, 3), 1), "b": _rand(dtype, (n, 3), 2)}, {}


def _one_x(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    return {"x": _rand(dtype, (n, 3), 3)}, {}


def _multi_out3(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    return {"x": _rand(dtype, (n, 3), 4)}, {"repeats": [2, 1], "scale": 0.5}


def _linear(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    return {
        "x": _rand(dtype, (n, 4), 5),
        "weight": _rand(dtype, (3, 4), 6, 0.5),
        "bias": _rand(dtype, (3,), 7),
    }, {}


def _bev(float_dtype: str, index_dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    cameras = n  # a second size: one more camera, so P and K change too
    coor = synthetic_frustum(
        batch=1, cameras=cameras, depth_bins=4, feat_hw=(3, 5), depth_range=(1, 12)
    )
    ranks = prepare_bev_ranks(coor, (-12.8, -12.8, -5.0), (3.2, 3.2, 8.0), (8, 8, 1))
    rb, rd, rf, starts, lengths = (r.numpy().astype(index_dtype) for r in ranks)
    inputs = {
        "depth": np.abs(_rand(float_dtype, (1, cameras, 4, 3, 5), 8)),
        "feat": _rand(float_dtype, (1, cameras, 3, 5, 4), 9),
        "ranks_depth": rd,
        "ranks_feat": rf,
        "ranks_bev": rb,
        "interval_starts": starts,
        "interval_lengths": lengths,
    }
    return inputs, {"bev_feat_shape": [1, 1, 8, 8, 4]}


def _deform(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    inputs = {
        "input": _rand(dtype, (n, 2, 4, 4), 10),
        "weight": _rand(dtype, (3, 2, 3, 3), 11, 0.5),
        "offset": _rand(dtype, (n, 18, 2, 2), 12),
        "mask": np.abs(_rand(dtype, (n, 9, 2, 2), 13)),
        "bias": _rand(dtype, (3,), 14),
    }
    attrs = {
        "stride_h": 1,
        "stride_w": 1,
        "pad_h": 0,
        "pad_w": 0,
        "dilation_h": 1,
        "dilation_w": 1,
        "groups": 1,
        "offset_groups": 1,
        "use_mask": True,
    }
    return inputs, attrs


def _msda(dtype: str, n: int) -> tuple[Arrays, dict[str, Any]]:
    levels = np.array([[2, 3], [1, 2]], dtype=np.int64)  # 8 keys
    unit = np.random.default_rng(15).random((n, 3, 2, 2, 2, 2)) * 1.2 - 0.1  # some outside [0, 1]
    inputs = {
        "value": _rand(dtype, (n, 8, 2, 3), 16),
        "spatial_shapes": levels,
        "level_start_index": np.array([0, 6], dtype=np.int64),
        "sampling_locations": (
            unit.astype(_np_dtype(dtype))
            if dtype in ("float32", "float64", "float16", "bfloat16")
            else _rand(dtype, unit.shape, 17)
        ),
        "attention_weights": np.abs(_rand(dtype, (n, 3, 2, 2, 2), 18)),
    }
    return inputs, {"im2col_step": 64}


_FLOATS_BEV = ("depth", "feat")
_INDEX_BEV = ("ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths")
CASES = [
    Case("onnx_custom::my_add", MY_ADD, _my_add, ("a", "b")),
    Case("onnx_custom_ext::my_add", extension.MY_ADD, _my_add, ("a", "b"), needs_extension=True),
    Case("onnx_custom::multi_out", MULTI_OUT, _one_x, ("x",)),
    Case("onnx_custom::multi_out3", MULTI_OUT3, _multi_out3, ("x",)),
    Case("onnx_custom::numpy_sin", NUMPY_SIN, _one_x, ("x",)),
    Case("onnx_custom::custom_linear", CUSTOM_LINEAR, _linear, ("x", "weight", "bias")),
    # trials=1: the standard-op translation holds only for ranks as voxel_pooling_prepare_v2 makes
    # them (symbolics/bev_pool.py), not for random index tensors
    Case(
        "onnx_custom::bev_pool_v2",
        BEV_POOL_V2,
        lambda d, n: _bev(d, "int32", n),
        _FLOATS_BEV,
        trials=1,
    ),
    Case(
        "onnx_custom::bev_pool_v2[indices]",
        BEV_POOL_V2,
        lambda d, n: _bev("float32", d, n),
        _INDEX_BEV,
    ),
    Case(
        "onnx_custom::deform_conv2d",
        DEFORM_CONV2D,
        _deform,
        ("input", "weight", "offset", "mask", "bias"),
    ),
    Case(
        "onnx_custom::multi_scale_deformable_attn",
        MSDA,
        _msda,
        ("value", "sampling_locations", "attention_weights"),
    ),
]
OPS = [c for c in CASES if not c.id.endswith("]")]  # one row per op


def _maybe_skip(case: Case) -> None:
    if case.needs_extension:
        ok, detail = extension.extension_available()
        if not ok:
            pytest.skip(detail)


def _to_torch(a: np.ndarray | None) -> torch.Tensor | None:
    if a is None:
        return None
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _op(spec: OpSpec) -> Any:
    return getattr(getattr(torch.ops, spec.namespace), spec.op_name).default


def _torch_sample(
    case: Case, dtype: str, n: int, grad: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    arrays, attrs = case.make(dtype, n)
    tensors = {k: _to_torch(v) for k, v in arrays.items()}
    if grad:
        for name in case.varied:
            t = tensors[name]
            if t is not None and t.dtype.is_floating_point:
                t.requires_grad_()
    return tensors, attrs


def _call(spec: OpSpec, tensors: dict[str, Any], attrs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    out = _op(spec)(**tensors, **attrs)  # keywords: bev's attribute sits between its inputs
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ------------------------------------------------------------------------------------- opcheck
GRAD_CASES = [c for c in OPS if c.spec.backward is not None or c.needs_extension]


def test_every_shipped_op_has_autograd() -> None:
    assert [c.id for c in GRAD_CASES] == [c.id for c in OPS]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_opcheck_with_requires_grad(case: Case) -> None:
    _maybe_skip(case)
    tensors, attrs = _torch_sample(case, "float64", 2, grad=True)
    assert any(t is not None and t.requires_grad for t in tensors.values())
    names = [a.name for a in case.spec.arguments]  # opcheck takes positional args: schema order
    values = {**tensors, **attrs}
    torch.library.opcheck(_op(case.spec), tuple(values[n] for n in names))


# ------------------------------------------------------------------------------- torch.compile
def _loss(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    # a different weight per output, so a swapped gradient cannot cancel out
    return sum(
        ((o.float() * (i + 1)).square().sum() for i, o in enumerate(outputs)), torch.zeros(())
    )


def _check_compiled(case: Case, backend: str, dynamic: bool) -> None:
    _maybe_skip(case)
    torch._dynamo.reset()
    spec = case.spec
    names = [n for n in case.varied]

    def step(*leaves: torch.Tensor, **rest: Any) -> torch.Tensor:
        return _loss(
            _call(spec, {**dict(zip(names, leaves, strict=True)), **rest["tensors"]}, rest["attrs"])
        )

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=dynamic)
    for n in (2, 3):  # the second size is not the first compile's
        tensors, attrs = _torch_sample(case, "float32", n, grad=True)
        leaves = [tensors.pop(name) for name in names]
        expected = step(*leaves, tensors=tensors, attrs=attrs)
        expected_grads = torch.autograd.grad(expected, leaves)
        got = compiled(*leaves, tensors=tensors, attrs=attrs)
        got_grads = torch.autograd.grad(got, leaves)
        torch.testing.assert_close(got, expected)
        for name, a, b in zip(names, got_grads, expected_grads, strict=True):
            torch.testing.assert_close(
                a, b, msg=lambda m, nm=name, size=n: f"grad {nm} at size {size}: {m}"
            )


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", OPS, ids=[c.id for c in OPS])
def test_compile_aot_eager(case: Case, dynamic: bool) -> None:
    _check_compiled(case, "aot_eager", dynamic)


@pytest.mark.slow  # inductor compiles C++ per graph: minutes on a loaded 2-core machine
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", OPS, ids=[c.id for c in OPS])
def test_compile_inductor(case: Case, dynamic: bool) -> None:
    _check_compiled(case, "inductor", dynamic)


def _check_my_add_function(backend: str, dynamic: bool) -> None:
    ok, detail = extension.extension_available()
    if not ok:
        pytest.skip(detail)
    torch._dynamo.reset()

    def step(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return extension.MyAddFunction.apply(a, b).square().sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=dynamic)
    for n in (2, 5):
        a, b = (
            torch.randn(n, 3, generator=torch.Generator().manual_seed(n + i), requires_grad=True)
            for i in (0, 1)
        )
        got = compiled(a, b)
        ga, gb = torch.autograd.grad(got, (a, b))
        # independent: y = 2a + b, so d/da sum(y^2) = 4y and d/db = 2y
        y = (2 * a + b).detach()
        torch.testing.assert_close(got, y.square().sum())
        torch.testing.assert_close(ga, 4 * y)
        torch.testing.assert_close(gb, 2 * y)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_my_add_function_compiles_aot_eager(dynamic: bool) -> None:
    _check_my_add_function("aot_eager", dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_my_add_function_compiles_inductor(dynamic: bool) -> None:
    _check_my_add_function("inductor", dynamic)


# ------------------------------------------------------------------------------ one dtype list
def _eager_accepts(case: Case, dtype: str) -> bool:
    tensors, attrs = _torch_sample(case, dtype, 2, grad=False)
    try:
        _call(case.spec, tensors, attrs)
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        return False
    return True


def _node_model(case: Case, arrays: Arrays, attrs: dict[str, Any]) -> Any:
    spec = case.spec
    inputs = [
        (
            (
                name,
                str(np.dtype(a.dtype)) if a is not None else "float32",
                list(a.shape) if a is not None else None,
            )
            if a is not None
            else ("", "float32", None)
        )
        for name, a in arrays.items()
    ]
    outputs = []
    for index, output in enumerate(spec.outputs):
        kind, value = spec.dtype_source(index)
        like = arrays[value] if kind == "like" else None
        outputs.append(
            (output.name, str(np.dtype(like.dtype)) if like is not None else value, None)
        )
    node_attrs = {k: int(v) if isinstance(v, bool) else v for k, v in attrs.items()}
    node_attrs.update({a.name: a.default for a in spec.node_attributes})
    assert spec.node_type is not None
    domain, op_type = spec.node_type.split("::")
    return node_model(op_type, domain, inputs, outputs, **node_attrs)


def _runtime_accepts(case: Case, dtype: str, run: Callable[..., Any]) -> bool:
    arrays, attrs = case.make(dtype, 2)
    model = _node_model(case, arrays, attrs)
    try:
        run(model, {k: v for k, v in arrays.items() if v is not None})
    except Exception:  # refusals come from the host, ORT or the library, each typed its own way
        return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_eager_python_and_native_kernels_accept_the_specs_dtypes(case: Case) -> None:
    _maybe_skip(case)
    declared = {d for name in case.varied for d in case.spec.input(name).dtypes}
    assert len({case.spec.input(name).dtypes for name in case.varied}) == 1, "one list per op"
    accepted = {"eager": {d for d in CANDIDATES if _eager_accepts(case, d)}}
    if case.spec.node_type is not None:
        accepted["python kernel"] = {d for d in CANDIDATES if _runtime_accepts(case, d, run_python)}
        if case.spec.node_type in native_ops():
            accepted["native kernel"] = {
                d for d in CANDIDATES if _runtime_accepts(case, d, run_native)
            }
    for where, dtypes in accepted.items():
        assert dtypes == declared, (
            f"{case.id}: the {where} accepts {sorted(dtypes)}; the spec declares {sorted(declared)}"
            f" (extra: {sorted(dtypes - declared)}, missing: {sorted(declared - dtypes)})"
        )


def test_every_custom_node_of_a_shipped_op_is_served_natively() -> None:
    nodes = {c.spec.node_type for c in CASES if c.spec.node_type is not None}
    assert nodes <= set(native_ops()), sorted(nodes - set(native_ops()))


# ------------------------------------------------------------------- the spec's generated tests
@pytest.mark.parametrize("case", OPS, ids=[c.id for c in OPS])
def test_check_op_on_every_shipped_spec(case: Case) -> None:
    """opcheck, both exporters at their opsets (custom node and standard translations), ORT
    verification at two sizes, the other declared float dtypes, the function body and the native
    kernel: everything `check_op` derives from the spec."""
    from onnx_custom.testing import check_op

    _maybe_skip(case)
    samples = []
    for n in (2, 3):
        tensors, attrs = _torch_sample(case, "float32", n, grad=False)
        samples.append({**tensors, **attrs})
    report = check_op(case.spec, samples, trials=case.trials)
    assert report.cases, "check_op ran nothing"
    ran = [c for c in report.cases if c.passed and c.detail.startswith("verified in ONNX Runtime")]
    assert ran, "nothing ran in ONNX Runtime"
    for c in ran:  # every case lists its shapes; other sizes ran, or the detail says why not
        assert c.shapes and f"at {len(c.shapes)} shape(s)" in c.detail, c
        if (
            case.trials == 1
        ):  # index inputs (bev_pool's precomputed ranks fix the sizes): the samples only
            assert "trials=1" in c.detail and len(c.shapes) <= len(samples), c
        else:
            assert len(c.shapes) > len(samples), c  # sizes beyond the samples'


class SeedOps(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.onnx_custom.multi_out(torch.ops.onnx_custom.my_add(a, b))


@pytest.mark.parametrize(
    ("exporter", "opset"), [("torchscript", 17), ("dynamo", 18)], ids=["torchscript", "dynamo"]
)
@pytest.mark.parametrize("dtype", MY_ADD.inputs[0].dtypes)
def test_seed_default_translations_run_every_declared_dtype(
    dtype: str, exporter: str, opset: int
) -> None:
    """The standard-op translations, not only the custom node, serve the spec's whole dtype list
    (ORT's CPU Mul/Add have no bfloat16: those run in float32 and cast back)."""
    import onnx_custom

    torch.manual_seed(0)
    a, b = ((torch.randn(4, 3) * 4).to(getattr(torch, dtype)) for _ in range(2))
    proto = onnx_custom.export(SeedOps(), (a, b), exporter=exporter, opset=opset)
    assert onnx_custom.verify(SeedOps(), (a, b), proto, shapes=()).passed

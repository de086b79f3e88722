"""Every shipped op x {float16, bfloat16} x both exporters x {default, every variant, function
body}: the exported file loads and runs in ONNX Runtime's CPU provider and matches a float64
reference computed on the same rounded inputs and weights — or the export refuses, naming why.

Custom-node rows run with our kernels (`onnx_custom.InferenceSession`); function-body rows run in
*plain* ONNX Runtime (nothing registered), so the bodies themselves are what executes. Each row
also runs `onnx_custom.verify`, which must agree with ONNX Runtime (never PASS a file it refuses).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import onnx_custom
from onnx_custom.errors import HalfPrecisionError, OnnxCustomError, SymbolicError
from onnx_custom.function_bodies import embed_functions
from onnx_custom.runtime import KernelRegistry
from onnx_custom.runtime.session import missing_kernels
from onnx_custom.verification.runner import run_onnx

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Whole models round at every op, so the bound is a few units in the last place of the dtype,
# relative to the output's magnitude: |ort - ref| <= ulps * eps * (|ref| + max|ref|).
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
ULPS = 8


@dataclasses.dataclass(frozen=True)
class Row:
    model: str  # module in models/
    exporter: str
    opset: int
    variant: str | None = None
    bodies: bool = False  # embed function bodies and run them in plain ONNX Runtime
    refused: str | None = None  # the export must refuse with this text (both dtypes unless `only`)
    only: str | None = None  # the refusal applies to this dtype only
    # Deep bf16 graphs: PyTorch's eager bf16 rounds differently enough that `verify` (same-dtype
    # comparison) may flag an element; then ORT must be the one closer to float64.
    eager_rounding: bool = False
    slow: bool = False

    @property
    def id(self) -> str:
        parts = [self.model, self.exporter, f"opset{self.opset}", self.variant or "default"]
        return "-".join(parts + (["bodies"] if self.bodies else []))


_AUTOGRAD_DYNAMO = "dynamo exporter ignores Function translations"
_DEFORMCONV_BF16 = "DeformConv supports float32, float64 and float16"
_BF16_OPSET = r"Cast cannot convert bfloat16 at opset \d+ \(bfloat16 needs opset 13\+\)"
# custom_linear's model calls the op with and without its optional bias; the body's bf16 Gemm
# would need Cast(bias), which cannot exist for a call without one.
_ABSENT_BIAS = r"(?s)CPUExecutionProvider.*Gemm.*bfloat16.*'bias' is absent in some calls"

ROWS = [
    Row("asinh", "torchscript", 9, refused=_BF16_OPSET, only="bfloat16"),
    Row("asinh", "dynamo", 18),
    Row("my_add", "torchscript", 13),
    Row("my_add", "dynamo", 18),
    Row("my_add", "torchscript", 13, "custom"),
    Row("my_add", "dynamo", 18, "custom"),
    Row("my_add", "torchscript", 13, "custom", bodies=True),
    Row("my_add", "dynamo", 18, "custom", bodies=True),
    Row("multi_out", "torchscript", 13),
    Row("multi_out", "dynamo", 18),
    Row("multi_out", "torchscript", 13, "custom"),
    Row("multi_out", "dynamo", 18, "custom"),
    Row("multi_out", "torchscript", 13, "custom", bodies=True),
    Row("multi_out", "dynamo", 18, "custom", bodies=True),
    Row("multi_out3", "torchscript", 11, refused=_BF16_OPSET, only="bfloat16"),
    Row("multi_out3", "torchscript", 13),
    Row("multi_out3", "dynamo", 18),
    Row("multi_out3", "torchscript", 13, "custom"),
    Row("multi_out3", "dynamo", 18, "custom"),
    Row("multi_out3", "torchscript", 13, "custom", bodies=True),
    Row("multi_out3", "dynamo", 18, "custom", bodies=True),
    Row("numpy_sin", "torchscript", 13),
    Row("numpy_sin", "torchscript", 17),
    Row("numpy_sin", "dynamo", 18),
    Row("custom_linear", "torchscript", 17),
    Row("custom_linear", "dynamo", 18),
    Row("custom_linear", "torchscript", 17, "gemm"),
    Row("custom_linear", "dynamo", 18, "gemm"),
    Row("custom_linear", "torchscript", 17, "custom"),
    Row("custom_linear", "dynamo", 18, "custom"),
    Row(
        "custom_linear",
        "torchscript",
        17,
        "custom",
        bodies=True,
        refused=_ABSENT_BIAS,
        only="bfloat16",
    ),
    Row(
        "custom_linear", "dynamo", 18, "custom", bodies=True, refused=_ABSENT_BIAS, only="bfloat16"
    ),
    Row("bev_pool", "torchscript", 17, slow=True),
    Row("bev_pool", "dynamo", 18, slow=True),
    Row("bev_pool", "torchscript", 17, "custom", slow=True),
    Row("bev_pool", "dynamo", 18, "custom", slow=True),
    Row("bev_pool", "dynamo", 18, "custom", bodies=True, slow=True),
    Row("my_add_ext", "torchscript", 17, slow=True),
    Row("my_add_ext", "dynamo", 18, slow=True),
    Row("my_add_ext", "torchscript", 17, "custom", slow=True),
    Row("my_add_ext", "dynamo", 18, "custom", slow=True),
    Row("my_add_ext", "dynamo", 18, "custom", bodies=True, slow=True),
    Row("autograd_fn", "torchscript", 17, slow=True),
    Row("autograd_fn", "torchscript", 17, "custom", slow=True),
    Row("autograd_fn", "dynamo", 18, refused=_AUTOGRAD_DYNAMO, slow=True),
    # opset 11 (the zoo's): ONNX has bfloat16 from opset 13 on, so bf16 is refused there
    Row("deform_conv", "torchscript", 11, refused=_BF16_OPSET, only="bfloat16", slow=True),
    Row("deform_conv", "dynamo", 11, refused=_BF16_OPSET, only="bfloat16", slow=True),
    Row(
        "deform_conv",
        "torchscript",
        11,
        "standard",
        refused=_BF16_OPSET,
        only="bfloat16",
        slow=True,
    ),
    Row("deform_conv", "dynamo", 11, "standard", refused=_BF16_OPSET, only="bfloat16", slow=True),
    Row("deform_conv", "dynamo", 11, bodies=True, refused=_BF16_OPSET, only="bfloat16", slow=True),
    Row("deform_conv", "torchscript", 17, slow=True),
    Row("deform_conv", "dynamo", 18, slow=True),
    Row("deform_conv", "torchscript", 17, "standard", eager_rounding=True, slow=True),
    Row("deform_conv", "dynamo", 18, "standard", eager_rounding=True),
    Row("deform_conv", "torchscript", 17, bodies=True, slow=True),
    Row("deform_conv", "dynamo", 18, bodies=True, slow=True),
    Row("deform_conv", "torchscript", 19, refused=_DEFORMCONV_BF16, only="bfloat16", slow=True),
    Row("deform_conv", "dynamo", 19, refused=_DEFORMCONV_BF16, only="bfloat16", slow=True),
]


def _params() -> list[Any]:
    out = []
    for row in ROWS:
        for dtype in DTYPES:
            marks = [pytest.mark.slow] if row.slow else []
            out.append(pytest.param(row, dtype, id=f"{row.id}-{dtype}", marks=marks))
    return out


def _load(name: str) -> Any:
    try:
        return importlib.import_module(f"onnx_custom.models.{name}")
    except OnnxCustomError as exc:  # a C++ extension that cannot build here
        reason = getattr(exc, "skip_reason", None)
        if reason:
            pytest.skip(reason)
        raise


def _cast(value: Any, dtype: torch.dtype) -> Any:
    return (
        value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
    )


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(proto: Any, args: tuple[Any, ...], bodies: bool) -> list[np.ndarray]:
    if bodies:  # nothing registered: ONNX Runtime itself must run every function body
        session = ort.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
    else:
        session = onnx_custom.InferenceSession(proto)
    return run_onnx(session, proto, args)


@pytest.mark.parametrize(("row", "dtype"), _params())
def test_half_precision_runs_in_onnxruntime(row: Row, dtype: str) -> None:
    module = _load(row.model)
    half = DTYPES[dtype]
    model = module.Model().eval().to(half)
    args = tuple(_cast(a, half) for a in module.example_inputs())
    registry = onnx_custom.default_registry()
    if row.variant:
        registry = registry.with_variants(row.variant)
    export = dict(exporter=row.exporter, opset=row.opset, registry=registry, functions=row.bodies)
    if row.refused and row.only in (None, dtype):
        with pytest.raises(OnnxCustomError, match=row.refused):
            onnx_custom.export(model, args, **export)
        return
    proto = onnx_custom.export(model, args, **export)
    if row.bodies:
        lacking = missing_kernels(proto, KernelRegistry())
        assert not lacking, f"custom nodes without a function body: {lacking}"
    got = _run(proto, args, row.bodies)

    reference = copy.deepcopy(model).to(torch.float64)  # the same rounded weights, in float64
    with torch.no_grad():
        expected = _flat(reference(*(_cast(a, torch.float64) for a in args)))
    assert len(got) == len(expected)
    for index, (value, want) in enumerate(zip(got, expected, strict=True)):
        value64 = torch.from_numpy(np.asarray(value).astype(np.float64))
        assert value.dtype.name == dtype or not want.is_floating_point(), (
            f"output {index} is {value.dtype}"
        )
        scale = float(want.abs().max()) if want.numel() else 0.0
        bound = ULPS * EPS[dtype] * (want.abs() + scale)
        excess = (value64 - want).abs() - bound
        assert bool((excess <= 0).all()), (
            f"output {index}: max abs diff {float((value64 - want).abs().max()):.3g} over the bound"
            f" (max {float(bound.max()):.3g}) at {int((excess > 0).sum())} of {want.numel()}"
            " elements"
        )
    if not row.bodies:  # verify runs our kernels: it must agree that the file runs and matches
        report = onnx_custom.verify(model, args, proto, raise_on_mismatch=False, shapes=())
        if not report.passed and row.eager_rounding:
            # verify compares with PyTorch in the same dtype; where that differs by more than the
            # dtype's tolerance, ONNX Runtime must be the one closer to float64 (PyTorch's own
            # half-precision rounding is the larger error).
            with torch.no_grad():
                eager = _flat(model(*args))
            for value, mine, want in zip(got, eager, expected, strict=True):
                ort_error = (torch.from_numpy(np.asarray(value).astype(np.float64)) - want).abs()
                eager_error = (mine.to(torch.float64) - want).abs()
                assert bool((ort_error <= eager_error + ULPS * EPS[dtype] * want.abs().max()).all())
            return
        assert report.passed, str(report)


def test_strict_refuses_naming_op_dtype_and_provider() -> None:
    module = _load("numpy_sin")
    model = module.Model().eval().to(torch.bfloat16)
    args = tuple(_cast(a, torch.bfloat16) for a in module.example_inputs())
    for exporter in ("torchscript", "dynamo"):
        with pytest.raises(
            HalfPrecisionError,
            match=(
                r"(?s)CPUExecutionProvider.*Sin \(opset"
                r" \d+.*bfloat16.*half_precision='float32-compute'"
            ),
        ):
            onnx_custom.export(model, args, exporter=exporter, half_precision="strict")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_off_leaves_a_file_onnxruntime_refuses(exporter: str) -> None:
    """The opt-out really is one: a schema-valid bfloat16 Gemm stays (ORT's CPU provider has no
    kernel for it; other providers do), and the widening is what makes that file run."""
    module = _load("custom_linear")
    model = module.Model().eval().to(torch.bfloat16)
    args = tuple(_cast(a, torch.bfloat16) for a in module.example_inputs())
    proto = onnx_custom.export(model, args, exporter=exporter, opset=18, half_precision="off")
    with pytest.raises(Exception, match="Gemm|MatMul"):
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_off_still_refuses_a_node_its_schema_refuses(exporter: str) -> None:
    """No runtime takes a bfloat16 Sin at opset 18 (bfloat16 joined Sin at 22): with the pass
    off, the translations' type check refuses it at export instead of writing an invalid file."""
    module = _load("numpy_sin")
    model = module.Model().eval().to(torch.bfloat16)
    args = tuple(_cast(a, torch.bfloat16) for a in module.example_inputs())
    with pytest.raises(SymbolicError, match=r"Sin \(opset \d+\).*bfloat16.*does not accept"):
        onnx_custom.export(model, args, exporter=exporter, opset=18, half_precision="off")


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_verify_runs_function_bodies_in_plain_onnxruntime(exporter: str) -> None:
    """With our kernels a body is never run; verify also runs the file as plain ONNX Runtime does,
    so a body ORT refuses (bf16 Mul, not widened here) can never PASS."""
    module = _load("my_add")
    model = module.Model().eval().to(torch.bfloat16)
    args = tuple(_cast(a, torch.bfloat16) for a in module.example_inputs())
    registry = onnx_custom.default_registry().with_variants("custom")
    opset = 18 if exporter == "dynamo" else 15
    good = onnx_custom.export(
        model, args, exporter=exporter, opset=opset, registry=registry, functions=True
    )
    report = onnx_custom.verify(model, args, good, shapes=())
    assert report.passed and "onnxruntime-bodies" in report.backends
    plain = onnx_custom.export(model, args, exporter=exporter, opset=opset, registry=registry)
    broken = embed_functions(plain, half_precision="off")  # the main graph widened, the body not
    with pytest.raises(OnnxCustomError, match=r"(?s)onnxruntime-bodies.*Mul"):
        onnx_custom.verify(model, args, broken, shapes=())

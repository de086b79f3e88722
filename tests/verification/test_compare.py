"""compare_arrays against a slow float64 reference: every statistic identical, for every dtype.

The reference is the whole-tensor float64 algorithm (what compare_arrays did before its fast
path): candidates picked in float32 must never change a count, a maximum or a histogram.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from torch.testing._comparison import default_tolerances

from onnx_custom.errors import OnnxCustomError
from onnx_custom.verification.compare import OutputComparison, compare_arrays, to_numpy, to_tensor
from onnx_custom.verification.report import histogram

TINY = torch.finfo(torch.float64).tiny


def reference(
    expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float
) -> dict[str, Any]:
    """Float64 over every element: NaN/Inf positions, |e - a|, relative to max(|e|, tiny)."""
    if expected.dtype == torch.bool or not (expected.is_floating_point() or expected.is_complex()):
        bad = expected != actual
        diff = (
            (expected.double() - actual.double()).abs()
            if expected.dtype != torch.bool
            else bad.double()
        )
        rel = diff / expected.double().abs().clamp_min(1)
        return {
            "max_abs_diff": float(diff.max()),
            "max_rel_diff": float(rel.max()),
            "mismatched": int(bad.sum()),
            "nonfinite_mismatch": 0,
            "abs_diffs": diff.numpy().ravel(),
        }
    wide = torch.complex128 if expected.is_complex() else torch.float64
    e, a = expected.to(wide), actual.to(wide)
    fe, fa = torch.isfinite(e), torch.isfinite(a)
    nonfinite_bad = (fe != fa) | (~fe & ~fa & ~((e == a) | (e.isnan() & a.isnan())))
    both = fe & fa
    diff = torch.zeros(e.shape, dtype=torch.float64)
    diff[both] = (e[both] - a[both]).abs()
    rel = torch.zeros_like(diff)
    rel[both] = diff[both] / e[both].abs().clamp_min(TINY)
    bad = nonfinite_bad | (both & (diff > atol + rtol * e.abs()))
    return {
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float(rel.max()),
        "mismatched": int(bad.sum()),
        "nonfinite_mismatch": int(nonfinite_bad.sum()),
        "abs_diffs": diff[both].numpy().ravel(),
    }


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _near(
    dtype: torch.dtype, shape: tuple[int, ...], scale: float, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(expected, actual): actual = expected + noise of relative size ``scale``,
    rounded to dtype."""
    e = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
    a = e * (1 + scale * torch.randn(shape, generator=_gen(seed + 1), dtype=torch.float64))
    return e.to(dtype), a.to(dtype)


def _at_tolerance(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Differences straddling atol + rtol*|e| by one unit in the last place
    (float32 rounding territory)."""
    rtol, atol = default_tolerances(dtype)
    e = torch.randn(4000, generator=_gen(2), dtype=torch.float64).to(dtype)
    tol = atol + rtol * e.double().abs()
    step = torch.randint(-2, 3, (4000,), generator=_gen(3))
    a = (e.double() + tol).to(dtype)
    for _ in range(2):  # walk by whole ulps so some land exactly on, just inside and just outside
        a = torch.where(step > 0, torch.nextafter(a, torch.full_like(a, float("inf"))), a)
        a = torch.where(step < 0, torch.nextafter(a, torch.full_like(a, float("-inf"))), a)
        step = step - step.sign()
    return e, a


def _special(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros, signed zeros, subnormals, huge values, one side zero, sign flips."""
    info = torch.finfo(dtype)
    e = torch.tensor(
        [0.0, -0.0, 0.0, info.tiny / 4, info.tiny, 1e-30, info.max, -info.max, 1.0, -2.0, 3.0, 0.5],
        dtype=torch.float64,
    ).to(dtype)
    a = torch.tensor(
        [
            0.0,
            0.0,
            info.tiny / 8,
            info.tiny / 2,
            -info.tiny,
            -1e-30,
            info.max,
            info.max,
            1.0,
            -2.0,
            3.0,
            0.25,
        ],
        dtype=torch.float64,
    ).to(dtype)
    return e, a


def _nonfinite(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    nan, inf = float("nan"), float("inf")
    e = torch.tensor([nan, inf, -inf, 1.0, inf, nan, 2.0, 3.0], dtype=dtype)
    a = torch.tensor([nan, inf, inf, nan, 1.0, 0.0, 2.0, 3.5], dtype=dtype)
    return e, a


def _transposed(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    e, a = pair
    return e.transpose(-1, -2), a.transpose(-1, -2).contiguous()


def _ints(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.randint(-1000, 1000, (7, 9), generator=_gen(4)).to(dtype)
    a = e.clone()
    a[2, 3] += 5
    a[6, 0] -= 1
    return e, a


CasePair = Callable[[], tuple[torch.Tensor, torch.Tensor]]
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CASES: list[tuple[str, CasePair, tuple[float, float] | None]] = []
for _dt in FLOATS:
    _n = str(_dt).removeprefix("torch.")
    CASES += [
        (f"{_n}-1x64x56x56-close", lambda dt=_dt: _near(dt, (1, 64, 56, 56), 1e-7), None),
        (f"{_n}-3x5-far", lambda dt=_dt: _near(dt, (3, 5), 1e-1), None),
        (f"{_n}-4000-at-tolerance", lambda dt=_dt: _at_tolerance(dt), None),
        # far failures (counted in float32) next to boundary elements (rechecked in float64)
        (
            f"{_n}-4015-far-and-at-tolerance",
            lambda dt=_dt: tuple(
                torch.cat([p.reshape(-1), q.reshape(-1)])
                for p, q in zip(_at_tolerance(dt), _near(dt, (3, 5), 1e-1), strict=True)
            ),
            None,
        ),
        (f"{_n}-12-special", lambda dt=_dt: _special(dt), None),
        (f"{_n}-12-special-atol0", lambda dt=_dt: _special(dt), (1e-3, 0.0)),
        (f"{_n}-8-nonfinite", lambda dt=_dt: _nonfinite(dt), None),
        (
            f"{_n}-0d",
            lambda dt=_dt: (torch.tensor(1.5, dtype=dt), torch.tensor(1.25, dtype=dt)),
            None,
        ),
        (
            f"{_n}-equal-0d",
            lambda dt=_dt: (torch.tensor(1.5, dtype=dt), torch.tensor(1.5, dtype=dt)),
            None,
        ),
        (f"{_n}-6x4-transposed", lambda dt=_dt: _transposed(_near(dt, (4, 6), 1e-3)), None),
        (
            f"{_n}-8x8-sliced",
            lambda dt=_dt: (
                _near(dt, (8, 16), 1e-3)[0][:, ::2],
                _near(dt, (8, 16), 1e-3)[1][:, ::2],
            ),
            None,
        ),
        (
            f"{_n}-5x7-expanded",
            lambda dt=_dt: (
                torch.ones(5, 1, dtype=dt).expand(5, 7),
                torch.full((5, 7), 1.0001, dtype=dt),
            ),
            None,
        ),
        (
            f"{_n}-3x5-scaled-all-tie",
            lambda dt=_dt: (torch.ones(3, 5, dtype=dt), torch.full((3, 5), 2.0, dtype=dt)),
            None,
        ),
        (f"{_n}-4x4-user-tol", lambda dt=_dt: _near(dt, (4, 4), 1e-2), (1e-2, 1e-3)),
    ]
CASES += [
    (
        "complex64-3x4",
        lambda: (
            torch.randn(3, 4, dtype=torch.complex64, generator=_gen(5)),
            torch.randn(3, 4, dtype=torch.complex64, generator=_gen(5)) + 1e-3,
        ),
        None,
    ),
    ("int64-7x9", lambda: _ints(torch.int64), None),
    ("int32-7x9-user-tol-ignored", lambda: _ints(torch.int32), (1.0, 10.0)),
    ("int64-huge-2^60", lambda: (torch.tensor([2**60, 5]), torch.tensor([2**60 + 1, 5])), None),
    (
        "uint8-equal",
        lambda: (torch.arange(10, dtype=torch.uint8), torch.arange(10, dtype=torch.uint8)),
        None,
    ),
    (
        "bool-2x3",
        lambda: (
            torch.tensor([[True, False, True], [False, False, True]]),
            torch.tensor([[True, True, True], [False, False, False]]),
        ),
        None,
    ),
    ("bool-0d", lambda: (torch.tensor(True), torch.tensor(True)), None),
]


@pytest.mark.parametrize(("make", "tolerance"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_statistics_equal_the_float64_reference(
    make: CasePair, tolerance: tuple[float, float] | None
) -> None:
    expected, actual_t = make()
    rtol, atol = tolerance if tolerance else (None, None)
    c = compare_arrays(expected, to_numpy(actual_t), name="y", trial=0, rtol=rtol, atol=atol)
    want = reference(expected, actual_t, c.rtol, c.atol)
    assert c.shape == tuple(expected.shape) and c.total == expected.numel()
    assert (c.max_abs_diff, c.max_rel_diff, c.mismatched, c.nonfinite_mismatch) == (
        want["max_abs_diff"],
        want["max_rel_diff"],
        want["mismatched"],
        want["nonfinite_mismatch"],
    )
    assert c.abs_diffs is not None
    np.testing.assert_array_equal(c.abs_diffs, want["abs_diffs"])
    assert histogram(c.abs_diffs, c.nonfinite_mismatch) == histogram(
        want["abs_diffs"], want["nonfinite_mismatch"]
    )


def test_at_tolerance_cases_really_straddle() -> None:
    """The boundary case must hold passing and failing elements, or it tests nothing."""
    for dtype in FLOATS:
        e, a = _at_tolerance(dtype)
        c = compare_arrays(e, to_numpy(a), name="y", trial=0)
        assert 0 < c.mismatched < c.total, dtype


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool], ids=str
)
def test_zero_d_compares_as_zero_d(dtype: torch.dtype) -> None:
    value = torch.tensor(1, dtype=dtype)
    c = compare_arrays(value, to_numpy(value), name="y", trial=0)
    assert c.passed and c.shape == () and c.total == 1 and "ONNX" not in c.tolerance_source
    assert compare_arrays(
        value, np.asarray(to_numpy(value)).reshape(1), name="y", trial=0
    ).tolerance_source.endswith("ONNX shape [1] vs []")


def test_bfloat16_from_ml_dtypes_is_exact() -> None:
    """ORT hands bfloat16 as ml_dtypes arrays; the values must arrive bit for bit."""
    e = torch.tensor([1.0, 3.140625, -2.0e-3, 65280.0], dtype=torch.bfloat16)
    actual = np.array([1.0, 3.140625, -2.0e-3, 65280.0], dtype=ml_dtypes.bfloat16)
    assert to_tensor(actual).equal(e)
    c = compare_arrays(e, actual, name="y", trial=0, rtol=0.0, atol=0.0)
    assert c.passed and c.max_abs_diff == 0.0
    off = actual.copy()
    off[1] = ml_dtypes.bfloat16(3.15625)  # one bfloat16 ulp above 3.140625
    assert compare_arrays(e, off, name="y", trial=0, rtol=0.0, atol=0.0).mismatched == 1


@pytest.mark.parametrize(
    "actual",
    [
        pytest.param(lambda a: a[::-1].copy()[::-1], id="negative-strides"),
        pytest.param(lambda a: a.astype(a.dtype.newbyteorder(">")), id="big-endian"),
        pytest.param(lambda a: np.broadcast_to(a, a.shape), id="read-only"),
        pytest.param(lambda a: np.asfortranarray(a), id="fortran-order"),
        pytest.param(lambda a: a.T.copy().T, id="transposed-view"),
    ],
)
def test_unusual_numpy_layouts(actual: Callable[[np.ndarray], np.ndarray]) -> None:
    e = torch.randn(3, 4, generator=_gen(7))
    c = compare_arrays(e, actual(e.numpy().copy()), name="y", trial=0)
    assert c.passed and c.max_abs_diff == 0.0 and c.shape == (3, 4)


def test_failing_output_keeps_its_differences() -> None:
    """A failing output's differences are taken at comparison time:
    later edits cannot change them."""
    e, a = _near(torch.float32, (100,), 1e-3)
    actual = a.numpy().copy()
    c = compare_arrays(e, actual, name="y", trial=0)
    assert not c.passed
    want = reference(e, torch.from_numpy(actual.copy()), c.rtol, c.atol)["abs_diffs"]
    e.add_(1.0)
    actual[:] = 0
    np.testing.assert_array_equal(c.abs_diffs, want)


@pytest.mark.parametrize("edit", ["torch-in-place", "numpy-write"])
def test_passing_output_modified_after_comparison_is_refused(edit: str) -> None:
    """Passing outputs compute their differences on first read; edits in between are an error,
    never a histogram of other values."""
    e, a = _near(torch.float32, (64,), 1e-8)
    actual = a.numpy().copy()
    c = compare_arrays(e, actual, name="out0", trial=2)
    assert c.passed
    if edit == "torch-in-place":
        e.mul_(2.0)
    else:
        actual[3] += 1.0
    with pytest.raises(
        OnnxCustomError,
        match=r"abs_diffs of output 'out0' \(trial 2\): the compared tensors were modified.*Fix:",
    ):
        _ = c.abs_diffs
    untouched = compare_arrays(e, e.numpy().copy(), name="y", trial=0)
    assert untouched.abs_diffs is not None and not untouched.abs_diffs.any()


def test_comparison_pickles_and_keeps_no_thunk() -> None:
    e, a = _near(torch.float32, (10,), 1e-2)
    c = compare_arrays(e, to_numpy(a), name="y", trial=0)
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.abs_diffs is not None
    np.testing.assert_array_equal(back.abs_diffs, c.abs_diffs)


def test_keep_diffs_false_and_constructor_compat() -> None:
    e, a = _near(torch.float32, (10,), 1e-2)
    assert compare_arrays(e, to_numpy(a), name="y", trial=0, keep_diffs=False).abs_diffs is None
    plain = OutputComparison(0, "y", (3,), "float32", 1.0, 1.0, 0, 3, 1e-5, 1e-5, "x")
    assert plain.abs_diffs is None and plain.passed
    given = OutputComparison(
        0, "y", (3,), "float32", 1.0, 1.0, 0, 3, 1e-5, 1e-5, "x", abs_diffs=np.zeros(3)
    )
    assert given.abs_diffs is not None and given.abs_diffs.shape == (3,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_atol_is_one_ulp_of_the_largest_output(dtype: torch.dtype) -> None:
    """2a + b - 1 rounded once (eager) vs after Mul, Add and Sub (ONNX Runtime): one ulp at the
    largest value survives the cancellation near 0; two ulps do not."""
    from onnx_custom.verification.compare import compare_arrays, to_numpy

    expected = torch.tensor([4.0, 0.0078125], dtype=dtype)
    ulp = float(torch.finfo(dtype).eps) * 4.0
    one = to_numpy(expected + torch.tensor([0.0, ulp], dtype=dtype))
    two = to_numpy(expected + torch.tensor([0.0, 2.5 * ulp], dtype=dtype))
    assert compare_arrays(expected, one, name="y", trial=0).passed
    result = compare_arrays(expected, two, name="y", trial=0)
    assert not result.passed and "1 ulp of max|expected|" in result.tolerance_source
    assert not compare_arrays(
        expected, one, name="y", trial=0, rtol=1e-3, atol=1e-5
    ).passed  # explicit tolerances are kept

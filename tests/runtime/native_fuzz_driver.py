"""Fuzz driver for libonnx_custom_ops.so (run by tests/runtime/test_native_fuzz.py in a subprocess).

usage: python native_fuzz_driver.py LIBRARY SEED ROUNDS

Imports only numpy, onnx (to build the models) and onnxruntime, so it also runs with an
AddressSanitizer build of the library preloaded. Every round draws, for every native op, one
random VALID case (must run; outputs checked against numpy where the math is cheap, shapes always)
and one random INVALID case (must fail with an ONNX Runtime error naming our kernel and the
problem). A crash or sanitizer report kills the process: the caller sees it. Prints one line per
problem and "fuzz ok: N cases" at the end; exit status 1 when any case misbehaved.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ELEM = {
    np.dtype("float32"): TensorProto.FLOAT,
    np.dtype("float64"): TensorProto.DOUBLE,
    np.dtype("float16"): TensorProto.FLOAT16,
    np.dtype("int32"): TensorProto.INT32,
    np.dtype("int64"): TensorProto.INT64,
    np.dtype("int8"): TensorProto.INT8,
    np.dtype("uint8"): TensorProto.UINT8,
    np.dtype("bool"): TensorProto.BOOL,
    np.dtype("object"): TensorProto.STRING,
}
Case = tuple[str, str, dict[str, Any], list[tuple[str, Any]], int, Callable[..., Any] | None, str]
# (op, domain, attrs, [(input name, array or None=absent)], n outputs, check(outs), error keyword)


def session(
    library: str,
    op: str,
    domain: str,
    attrs: dict[str, Any],
    inputs: list[tuple[str, Any]],
    n_out: int,
) -> ort.InferenceSession:
    node = helper.make_node(
        op,
        [n if a is not None else "" for n, a in inputs],
        [f"y{i}" for i in range(n_out)],
        domain=domain,
        name="fuzzed",
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "fuzz",
        [helper.make_tensor_value_info(n, ELEM[a.dtype], None) for n, a in inputs if a is not None],
        [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)],  # types left to inference
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
        ir_version=8,
    )
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 2
    so.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# ---- generators: each returns a valid case and an invalid one ------------------------------------
def shape(rng: np.random.Generator, rank: int, lo: int = 0, hi: int = 6) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.integers(lo, hi + 1, size=rank))


def floats(rng: np.random.Generator, s: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return np.asarray(rng.standard_normal(s)).astype(dtype)


def my_add(rng: np.random.Generator) -> tuple[Case, Case]:
    dtype = str(
        rng.choice(["float32", "float64", "float16", "int32", "int8", "uint8"])
    )  # ops/seed.yaml
    a_shape = shape(rng, int(rng.integers(0, 4)))
    b_shape = tuple(
        d if rng.random() < 0.6 else 1 for d in a_shape[int(rng.integers(0, len(a_shape) + 1)) :]
    )
    a = floats(rng, a_shape).astype(dtype)
    b = floats(rng, b_shape).astype(dtype)
    alpha = float(rng.choice([2.0, -1.5, 0.0]))

    def check(outs: list[np.ndarray]) -> None:
        assert outs[0].shape == np.broadcast_shapes(a.shape, b.shape) and outs[0].dtype == a.dtype
        if a.dtype.kind == "f":  # integer casts of a negative alpha are numpy-version specific
            expect = (a * np.asarray(alpha, dtype=a.dtype) + b).astype(a.dtype)
            np.testing.assert_allclose(
                outs[0].astype(np.float64), expect.astype(np.float64), rtol=2e-3, atol=1e-3
            )

    valid: Case = ("my_add", "onnx_custom", {"alpha": alpha}, [("a", a), ("b", b)], 1, check, "")
    bad = rng.integers(0, 3)
    if bad == 0:  # shapes that do not broadcast
        inputs = [("a", floats(rng, (3, 4))), ("b", floats(rng, (5,)))]
        key = "do not broadcast"
    elif bad == 1:
        inputs = [("a", floats(rng, (2,), "float32")), ("b", floats(rng, (2,), "float64"))]
        key = "expected one dtype"
    else:
        inputs = [("a", floats(rng, (2, 1))), ("b", floats(rng, (2, 3, 4)))]
        key = "do not broadcast"
    return valid, ("my_add", "onnx_custom", {}, inputs, 1, None, key)


def multi_out(rng: np.random.Generator) -> tuple[Case, Case]:
    x = floats(
        rng, shape(rng, int(rng.integers(0, 4))), str(rng.choice(["float32", "float16", "int64"]))
    )
    scale, shift = float(rng.normal()), float(rng.normal())

    def check(outs: list[np.ndarray]) -> None:
        assert outs[0].shape == x.shape and outs[1].shape == x.shape

    valid: Case = (
        "multi_out",
        "onnx_custom",
        {"scale": scale, "shift": shift},
        [("x", x)],
        2,
        check,
        "",
    )
    # a string tensor: no numeric kernel for it
    return valid, (
        "multi_out",
        "onnx_custom",
        {},
        [("x", np.array(["a", "b"], dtype=object))],
        2,
        None,
        "dtype",
    )


def multi_out3(rng: np.random.Generator) -> tuple[Case, Case]:
    s = shape(rng, int(rng.integers(1, 4)))
    x = floats(rng, s, str(rng.choice(["float32", "float64", "float16"])))
    reps = [int(r) for r in rng.integers(0, 3, size=len(s))]

    def check(outs: list[np.ndarray]) -> None:
        np.testing.assert_array_equal(outs[1], np.tile(x, reps))
        assert outs[2].shape == s[:-1]

    valid: Case = (
        "MultiOut3",
        "onnx_custom",
        {"repeats": reps, "scale": 0.5},
        [("x", x)],
        3,
        check,
        "",
    )
    bad = rng.integers(0, 5)
    if bad == 0:
        return valid, (
            "MultiOut3",
            "onnx_custom",
            {"repeats": [*reps, 1], "scale": 1.0},
            [("x", x)],
            3,
            None,
            "one repeat per dimension",
        )
    if bad == 1:
        return valid, (
            "MultiOut3",
            "onnx_custom",
            {"scale": 1.0},
            [("x", x)],
            3,
            None,
            "lacks the required attribute repeats",
        )
    if bad == 2:
        return valid, (
            "MultiOut3",
            "onnx_custom",
            {"repeats": reps},
            [("x", x)],
            3,
            None,
            "lacks the required attribute scale",
        )
    if bad == 3:
        return valid, (
            "MultiOut3",
            "onnx_custom",
            {"repeats": [-1] * len(s), "scale": 1.0},
            [("x", x)],
            3,
            None,
            "non-negative",
        )
    return valid, (
        "MultiOut3",
        "onnx_custom",
        {"repeats": [1], "scale": 1.0},
        [("x", np.arange(3, dtype=np.int32))],
        3,
        None,
        "dtype int32",
    )


def custom_linear(rng: np.random.Generator) -> tuple[Case, Case]:
    dtype = str(rng.choice(["float32", "float64", "float16"]))
    k, n = int(rng.integers(0, 40)), int(rng.integers(1, 40))
    x = floats(rng, (*shape(rng, int(rng.integers(0, 3)), 0, 5), k), dtype)
    w = floats(rng, (n, k), dtype)
    bias = floats(rng, (n,), dtype) if rng.random() < 0.5 else None

    def check(outs: list[np.ndarray]) -> None:
        ref = x.astype(np.float64) @ w.T.astype(np.float64) + (
            0 if bias is None else bias.astype(np.float64)
        )
        np.testing.assert_allclose(
            outs[0].astype(np.float64), ref, rtol=2e-2, atol=2e-2 * max(1, k)
        )

    valid: Case = (
        "CustomLinear",
        "onnx_custom",
        {},
        [("x", x), ("w", w), ("b", bias)],
        1,
        check,
        "",
    )
    bad = rng.integers(0, 5)
    f = lambda *s: floats(rng, s, dtype)  # noqa: E731
    inputs = [
        [("x", f(2, 3)), ("w", f(4, 5)), ("b", None)],
        [("x", f(2, 3)), ("w", f(4, 3, 1)), ("b", None)],
        [("x", f(2, 3)), ("w", f(4, 3)), ("b", f(5))],
        [("x", np.asarray(floats(rng, ())).astype(dtype)), ("w", f(4, 3)), ("b", None)],
        [
            ("x", f(2, 3)),
            ("w", floats(rng, (4, 3), "float64" if dtype != "float64" else "float32")),
            ("b", None),
        ],
    ][bad]
    key = [
        "do not match",
        "do not match",
        "does not match weight",
        "do not match",
        "expected one dtype",
    ][bad]
    return valid, ("CustomLinear", "onnx_custom", {}, inputs, 1, None, key)  # type: ignore[return-value]


def bev_pool(rng: np.random.Generator) -> tuple[Case, Case]:
    b, n, d, fh, fw, c = (
        1,
        int(rng.integers(1, 3)),
        int(rng.integers(1, 5)),
        int(rng.integers(1, 4)),
        int(rng.integers(1, 5)),
        int(rng.integers(1, 41)),
    )
    z, y, xg = 1, int(rng.integers(1, 6)), int(rng.integers(1, 6))
    idx = str(rng.choice(["int32", "int64"]))
    dtype = str(rng.choice(["float32", "float64", "float16"]))
    depth, feat = floats(rng, (b, n, d, fh, fw), dtype), floats(rng, (b, n, fh, fw, c), dtype)
    p = int(rng.integers(0, 30))
    cells = np.sort(rng.integers(0, b * z * y * xg, size=p))
    starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]]) if p else np.zeros(0, np.int64)
    lengths = np.diff(np.r_[starts, p])
    ranks = [
        rng.integers(0, depth.size, size=p),
        rng.integers(0, feat.size // c, size=p),
        cells,
        starts,
        lengths,
    ]
    ranks = [np.asarray(r).astype(idx) for r in ranks]
    names = ["ranks_depth", "ranks_feat", "ranks_bev", "interval_starts", "interval_lengths"]
    attrs = {"bev_feat_shape": [b, z, y, xg, c]}

    def check(outs: list[np.ndarray]) -> None:
        assert outs[0].shape == (b, c, z, y, xg) and np.isfinite(outs[0].astype(np.float64)).all()

    inputs = [("depth", depth), ("feat", feat), *zip(names, ranks, strict=True)]
    valid: Case = ("BEVPoolV2", "onnx_custom", attrs, inputs, 1, check, "")
    bad = int(rng.integers(0, 9))
    broken = [list(x) for x in inputs]
    key = ""
    if bad == 0:  # a rank past the end of depth
        broken[2][1] = np.r_[ranks[0], depth.size].astype(idx)
        broken[3][1] = np.r_[ranks[1], 0].astype(idx)
        broken[4][1] = np.r_[ranks[2], 0].astype(idx)
        key = "ranks_depth must lie in"
    elif bad == 1:
        broken[4][1] = np.r_[ranks[2], -1].astype(idx)
        broken[2][1] = np.r_[ranks[0], 0].astype(idx)
        broken[3][1] = np.r_[ranks[1], 0].astype(idx)
        key = "ranks_bev must lie in"
    elif bad == 2:  # interval running past the ranks
        broken[5][1] = np.r_[ranks[3], max(p - 1, 0)].astype(idx)
        broken[6][1] = np.r_[ranks[4], 5].astype(idx)
        key = "must lie within"
    elif bad == 3:
        broken[6][1] = np.r_[ranks[4], -2].astype(idx)
        broken[5][1] = np.r_[ranks[3], 0].astype(idx)
        key = "must lie within"
    elif bad == 4:
        broken[0][1] = floats(rng, (b, n, d, fh), dtype)
        key = "depth must be 5-D"
    elif bad == 5:
        broken[5][1] = ranks[3].astype(np.float32)
        key = "interval_starts has dtype float32"
    elif bad == 6:
        return valid, (
            "BEVPoolV2",
            "onnx_custom",
            {"bev_feat_shape": [b, z, y, xg]},
            inputs,
            1,
            None,
            "5 values",
        )
    elif bad == 7:
        return valid, (
            "BEVPoolV2",
            "onnx_custom",
            {},
            inputs,
            1,
            None,
            "lacks the required attribute bev_feat_shape",
        )
    else:
        return valid, (
            "BEVPoolV2",
            "onnx_custom",
            {"bev_feat_shape": [b, 1 << 30, 1 << 30, 4, c]},
            inputs,
            1,
            None,
            "more than 2^40",
        )
    return valid, ("BEVPoolV2", "onnx_custom", attrs, [tuple(x) for x in broken], 1, None, key)


def deform_conv(rng: np.random.Generator) -> tuple[Case, Case]:
    dtype = str(rng.choice(["float32", "float64", "float16"]))
    groups, og = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    c = groups * og * int(rng.integers(1, 3))
    cout = groups * int(rng.integers(1, 3))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    sh, sw, ph, pw, dh, dw = (int(v) for v in rng.integers(1, 3, size=6))
    ph, pw = ph - 1, pw - 1
    h, w = int(rng.integers(kh * dh, 12)), int(rng.integers(kw * dw, 12))
    n = int(rng.integers(0, 3))
    ho, wo = (
        (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1,
        (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1,
    )
    use_mask = int(rng.integers(0, 2))
    attrs = dict(
        stride_h=sh,
        stride_w=sw,
        pad_h=ph,
        pad_w=pw,
        dilation_h=dh,
        dilation_w=dw,
        groups=groups,
        offset_groups=og,
        use_mask=use_mask,
    )
    off = floats(rng, (n, 2 * og * kh * kw, ho, wo), dtype) * np.asarray(
        rng.choice([1, 5, 1e4]), dtype
    )
    inputs = [
        ("input", floats(rng, (n, c, h, w), dtype)),
        ("weight", floats(rng, (cout, c // groups, kh, kw), dtype)),
        ("offset", off),
        ("mask", floats(rng, (n, og * kh * kw, ho, wo), dtype) if use_mask else None),
        ("bias", floats(rng, (cout,), dtype) if rng.random() < 0.5 else None),
    ]

    def check(outs: list[np.ndarray]) -> None:
        assert outs[0].shape == (n, cout, ho, wo)

    valid: Case = ("DeformConv2d", "onnx_custom", attrs, inputs, 1, check, "")
    bad = int(rng.integers(0, 9))
    broken = [list(x) for x in inputs]
    a2 = dict(attrs)
    if bad == 0:
        a2["groups"] = c + 1
        key = "weight.shape[1] * groups"
    elif bad == 1:
        broken[2][1] = floats(rng, (n, 2 * og * kh * kw + 1, ho, wo), dtype)
        key = "offset must have shape"
    elif bad == 2:
        a2["use_mask"] = 1
        broken[3][1] = floats(rng, (n, og * kh * kw, ho + 1, wo), dtype)
        key = "mask must have shape"
    elif bad == 3:
        a2["use_mask"] = 1
        broken[3][1] = None
        key = "mask input is absent"
    elif bad == 4:
        broken[4][1] = floats(rng, (cout + 1,), dtype)
        key = "bias"
    elif bad == 5:
        a2["stride_h"] = 0
        key = "stride_h must be in"
    elif bad == 6:
        a2["pad_w"] = 1 << 40
        key = "pad_w must be in"
    elif bad == 7:
        broken[1][1] = floats(rng, (cout, c // groups, kh), dtype)
        key = "weight must be 4-D"
    else:
        broken[0][1] = floats(rng, (n, c, h, w), "float64" if dtype != "float64" else "float32")
        key = "expected one dtype"
    return valid, ("DeformConv2d", "onnx_custom", a2, [tuple(x) for x in broken], 1, None, key)


def msda(rng: np.random.Generator) -> tuple[Case, Case]:
    dtype = str(rng.choice(["float32", "float64", "float16"]))
    bs, q, m, d, p = (
        int(rng.integers(0, 3)),
        int(rng.integers(0, 6)),
        int(rng.integers(1, 4)),
        int(rng.integers(1, 9)),
        int(rng.integers(1, 4)),
    )
    levels = [
        (int(rng.integers(0, 6)), int(rng.integers(0, 6))) for _ in range(int(rng.integers(1, 4)))
    ]
    shapes = np.asarray(levels, np.int64).reshape(-1, 2)
    sizes = shapes.prod(1)
    starts = np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64)
    keys, nl = int(sizes.sum()), len(levels)
    scale = np.asarray(rng.choice([1.0, 3.0, 1e4]), dtype)  # locations far outside [0, 1] too
    loc = (floats(rng, (bs, q, m, nl, p, 2), dtype) * scale + np.asarray(0.5, dtype)).astype(dtype)
    if loc.size and rng.random() < 0.3:
        loc.reshape(-1)[int(rng.integers(0, loc.size))] = np.nan  # defined: contributes 0
    inputs = [
        ("value", floats(rng, (bs, keys, m, d), dtype)),
        ("spatial_shapes", shapes),
        ("level_start_index", starts),
        ("sampling_locations", loc),
        ("attention_weights", floats(rng, (bs, q, m, nl, p), dtype)),
    ]

    def check(outs: list[np.ndarray]) -> None:
        assert outs[0].shape == (bs, q, m * d) and np.isfinite(outs[0].astype(np.float64)).all()

    attrs = {"im2col_step": 64}
    valid: Case = ("MultiScaleDeformableAttn", "onnx_custom", attrs, inputs, 1, check, "")
    bad = int(rng.integers(0, 9))
    broken = [list(x) for x in inputs]
    if bad == 0:
        broken[0][1] = floats(rng, (bs, keys + 1, m, d), dtype)
        key = "value has num_keys"
    elif bad == 1:
        broken[2][1] = starts + np.int64(1)
        key = "does not match spatial_shapes"
    elif bad == 2:
        broken[1][1] = np.r_[shapes.reshape(-1)[:-1], -1].reshape(-1, 2).astype(np.int64)
        key = "invalid size"
    elif bad == 3:
        broken[1][1] = np.r_[shapes.reshape(-1)[:-1], 1 << 40].reshape(-1, 2).astype(np.int64)
        key = "invalid size"
    elif bad == 4:
        broken[3][1] = floats(rng, (bs, q, m + 1, nl, p, 2), dtype)
        key = "sampling_locations must be"
    elif bad == 5:
        broken[4][1] = floats(rng, (bs, q, m, nl, p + 1), dtype)
        key = "attention_weights must have shape"
    elif bad == 6:
        return valid, (
            "MultiScaleDeformableAttn",
            "onnx_custom",
            {"im2col_step": 0},
            inputs,
            1,
            None,
            "im2col_step must be positive",
        )
    elif bad == 7:
        broken[3][1] = floats(rng, (3,), dtype)  # too small a rank for the shape rule
        key = "out of range"
    else:
        broken[3][1] = loc.astype("float64" if dtype != "float64" else "float32")
        key = "but input 'value' has"
    return valid, (
        "MultiScaleDeformableAttn",
        "onnx_custom",
        attrs,
        [tuple(x) for x in broken],
        1,
        None,
        key,
    )


GENERATORS = [my_add, multi_out, multi_out3, custom_linear, bev_pool, deform_conv, msda]


def run_case(library: str, case: Case) -> str | None:
    """None when the case behaved; else a description of the problem."""
    op, domain, attrs, inputs, n_out, check, key = case
    label = (
        f"{op} attrs={attrs}"
        f" inputs={[(n, None if a is None else (a.dtype.name, a.shape)) for n, a in inputs]}"
    )
    feeds = {n: a for n, a in inputs if a is not None}
    try:
        outs = session(library, op, domain, attrs, inputs, n_out).run(None, feeds)
    except Exception as exc:  # onnxruntime's error types differ between creation and run
        text = str(exc)
        if not key:
            return f"VALID case failed: {label}: {text[:600]}"
        if "onnx-custom native kernel" not in text or key not in text:
            return f"INVALID case gave an unclear message (expected {key!r}): {label}: {text[:600]}"
        return None
    if key:
        return f"INVALID case ran without an error (expected {key!r}): {label}"
    try:
        if check is not None:
            check(outs)
    except AssertionError as exc:
        return f"VALID case gave wrong results: {label}: {str(exc)[:600]}"
    return None


def main() -> int:
    library, seed, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(seed)
    problems, cases = [], 0
    for _ in range(rounds):
        for gen in GENERATORS:
            for case in gen(rng):
                cases += 1
                problem = run_case(library, case)
                if problem:
                    problems.append(problem)
                    print(problem, flush=True)
    print(
        f"fuzz {'ok' if not problems else 'FAILED'}: {cases} cases, {len(problems)} problems",
        flush=True,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

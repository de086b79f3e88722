"""The per-tap standard-op deform_conv2d (symbolics/deform_conv_decomposed.py) on shapes that
stress it: a Loop over the taps in the function body, unrolled taps in a translation with a static
weight, all taps at once when the weight's kernel size is dynamic. References: the eager op and
ONNX Runtime's own ``DeformConv`` (opset 19), an implementation independent of ours."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_function_bodies_dcn import (
    NAMES,
    STANDARD,
    Config,
    _assert_close,
    _Op,
    _run_standard,
    body_model,
)

import onnx_custom

# kernel 1x1, 5x5, rectangular, dilation > 1, offset groups and groups both > 1 (OG < G, OG > G)
STRESS = [
    Config(
        2,
        8,
        (10, 9),
        8,
        (5, 3),
        stride=(1, 2),
        pad=(2, 1),
        dilation=(2, 2),
        groups=4,
        offset_groups=2,
    ),
    Config(1, 8, (9, 9), 4, (3, 3), pad=(1, 1), groups=2, offset_groups=4, offsets="far"),
    Config(
        2, 6, (7, 8), 6, (1, 3), pad=(0, 3), dilation=(1, 3), groups=3, offset_groups=3, mask=False
    ),
    Config(2, 4, (6, 7), 5, (1, 1), stride=(2, 2)),
    Config(
        1, 6, (11, 12), 6, (5, 5), pad=(4, 4), dilation=(2, 2), groups=6, offset_groups=2
    ),  # depthwise
]


def _ort_deformconv(cfg: Config, tensors: tuple[torch.Tensor, ...]) -> np.ndarray:
    """ONNX Runtime's built-in DeformConv (opset 19) on the same inputs."""
    names = ["x", "w", "offset", "bias"] + (["mask"] if cfg.mask else [])
    node = helper.make_node(
        "DeformConv",
        names,
        ["y"],
        kernel_shape=list(cfg.k),
        strides=list(cfg.stride),
        pads=[*cfg.pad, *cfg.pad],
        dilations=list(cfg.dilation),
        group=cfg.groups,
        offset_group=cfg.offset_groups,
    )
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 19)])
    x, w, offset, mask, bias = (t.numpy() for t in tensors)
    feeds = {"x": x, "w": w, "offset": offset, "bias": bias} | ({"mask": mask} if cfg.mask else {})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("opset", [11, 16, 18, 21])
@pytest.mark.parametrize("cfg", STRESS, ids=lambda c: c.id)
def test_body_loop_matches_eager_and_ort_deformconv(cfg: Config, opset: int) -> None:
    model = body_model(cfg.params(), cfg.dtype, opset)
    (loop,) = [
        n for n in model.functions[0].node if n.op_type == "Loop"
    ]  # a chunk of pixels per iteration
    assert loop.attribute[0].name == "body"
    assert len(loop.input) == 2 and len(loop.output) == 1  # no carried sum: a stacked output
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    h, w = cfg.hw
    sizes = [(cfg.n, h, w), (cfg.n + 1, h + 2, w + 3)] + ([(0, h, w)] if opset >= 14 else [])
    for seed, (n, hh, ww) in enumerate(sizes):
        tensors = cfg.tensors(n, hh, ww, seed)
        (got,) = session.run(None, {k: t.numpy() for k, t in zip(NAMES, tensors, strict=True)})
        _assert_close(got, cfg.eager(tensors))
        if n and cfg.offsets == "normal":
            _assert_close(got, torch.from_numpy(_ort_deformconv(cfg, tensors)))


@pytest.mark.parametrize("values", [1, 700, 5000], ids=lambda v: f"chunk_values{v}")
@pytest.mark.parametrize("cfg", [STRESS[0], STRESS[1], STRESS[4]], ids=lambda c: c.id)
def test_body_loop_chunks_match_eager(
    cfg: Config, values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks (1 pixel; a few pixels that leave a ragged last chunk; more) against the eager
    op: chunk borders, the padded pixels dropped, a zero batch (no iteration)."""
    from onnx_custom.symbolics import deform_conv_decomposed

    monkeypatch.setattr(deform_conv_decomposed, "CHUNK_VALUES", values)
    kh, kw = cfg.k
    per_pixel = 4 * kh * kw * cfg.c
    assert (
        values // per_pixel + 1 < cfg.n * cfg.out_hw(*cfg.hw)[0] * cfg.out_hw(*cfg.hw)[1]
    )  # several chunks
    session = ort.InferenceSession(
        body_model(cfg.params(), cfg.dtype, 18).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    h, w = cfg.hw
    for seed, (n, hh, ww) in enumerate([(cfg.n, h, w), (cfg.n + 1, h + 1, w + 2), (0, h, w)]):
        tensors = cfg.tensors(n, hh, ww, seed)
        (got,) = session.run(None, {k: t.numpy() for k, t in zip(NAMES, tensors, strict=True)})
        _assert_close(got, cfg.eager(tensors))


def test_body_loop_in_onnx_reference() -> None:
    cfg = STRESS[0]
    tensors = cfg.tensors(cfg.n, *cfg.hw)
    feeds = {k: t.numpy() for k, t in zip(NAMES, tensors, strict=True)}
    got: Any = ReferenceEvaluator(body_model(cfg.params(), cfg.dtype, 18)).run(None, feeds)
    _assert_close(got[0], cfg.eager(tensors))


def _export(
    cfg: Config, tensors: tuple[torch.Tensor, ...], exporter: str, opset: int, kernel_dims: bool
) -> onnx.ModelProto:
    auto = torch.export.Dim.AUTO
    spatial = {0: auto, 2: auto, 3: auto}
    weight = {2: auto, 3: auto} if kernel_dims else None
    taps = (
        {**spatial, 1: auto} if kernel_dims else spatial
    )  # offset and mask channels: 2*OG*K, OG*K
    shapes = (spatial, weight, taps, taps if cfg.mask else {0: auto}, None)
    return onnx_custom.export(
        _Op(cfg.params()),
        tensors,
        exporter=exporter,
        opset=opset,
        registry=STANDARD,
        input_names=NAMES,
        dynamic_shapes=shapes,
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("cfg", STRESS[:3], ids=lambda c: c.id)
def test_standard_variant_unrolls_static_taps(cfg: Config, exporter: str) -> None:
    tensors = cfg.tensors(cfg.n + 1, *cfg.hw)
    proto = _export(cfg, tensors, exporter, 18, kernel_dims=False)
    taps = cfg.k[0] * cfg.k[1]
    # per tap: the corner sum and the tap's GEMM; never a Loop in a translation
    assert sum(n.op_type == "MatMul" for n in proto.graph.node) == 2 * taps
    assert not [n for n in proto.graph.node if n.op_type == "Loop"]
    for seed, (n, h, w) in enumerate([(cfg.n + 1, *cfg.hw), (1, cfg.hw[0] + 3, cfg.hw[1] + 1)]):
        run = cfg.tensors(n, h, w, seed)
        _assert_close(_run_standard(proto, run), cfg.eager(run))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_standard_variant_dynamic_kernel_size_takes_all_taps_at_once(exporter: str) -> None:
    """A weight whose kernel size is dynamic: no static tap count to unroll, so all taps go
    through one GEMM per group; the file runs at another kernel size than the export's."""
    cfg = STRESS[1]
    proto = _export(cfg, cfg.tensors(cfg.n + 1, *cfg.hw), exporter, 18, kernel_dims=True)
    assert sum(n.op_type == "MatMul" for n in proto.graph.node) == 2
    other = Config(
        1, 8, (9, 9), 4, (5, 3), pad=(1, 1), groups=2, offset_groups=4
    )  # same attributes
    for case in (cfg, other):
        run = case.tensors(2, *case.hw, seed=3)
        _assert_close(_run_standard(proto, run), case.eager(run))


def test_function_builder_loop_runs_in_ort_and_onnx_reference() -> None:
    """FunctionBuilder.loop: outer values used inside, carried state, names kept apart."""
    from onnx_custom.function_bodies.builder import FunctionBuilder

    g = FunctionBuilder(18, "test::cumsum", {"x": torch.float32})
    x, steps = g.input("x"), g.input("steps")
    count = g.op("Reshape", steps, g.constant(np.zeros(0, np.int64)))

    def body(sub: Any, i: Any, state: list[Any]) -> list[Any]:
        scaled = sub.op(
            "Mul",
            x,
            sub.op("Cast", sub.op("Add", i, sub.constant(np.int64(1))), to=TensorProto.FLOAT),
        )
        return [sub.op("Add", state[0], scaled), state[1], scaled]

    total, same, stacked = g.loop(count, [x, x], body, scans=1)
    assert g.dtype(stacked) == torch.float32
    g.bind_outputs([total, same, stacked], ["y", "z", "s"], ["x", "steps"])
    names = [o for n in g.nodes for o in n.output] + [
        o for n in g.nodes for a in n.attribute if a.g.node for m in a.g.node for o in m.output
    ]
    assert len(names) == len(set(names))
    function = helper.make_function(
        "test", "CumSum", ["x", "steps"], ["y", "z", "s"], g.nodes, [helper.make_opsetid("", 18)]
    )
    node = helper.make_node("CumSum", ["x", "steps"], ["y", "z", "s"], domain="test")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("steps", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "z", "s")],
    )
    model = helper.make_model(
        graph,
        ir_version=9,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("test", 1)],
    )
    feeds: dict[str, np.ndarray] = {
        "x": np.array([1.0, 2.0, -3.0], np.float32),
        "steps": np.array([4], np.int64),
    }
    expected = feeds["x"] * (1 + 1 + 2 + 3 + 4)
    runners: list[Any] = [
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
        ReferenceEvaluator(model),
    ]
    for runner in runners:
        y, z, stacked = runner.run(None, feeds)
        np.testing.assert_allclose(y, expected)
        np.testing.assert_array_equal(z, feeds["x"])
        np.testing.assert_allclose(
            stacked, feeds["x"] * np.arange(1, 5, dtype=np.float32)[:, None]
        )  # one row per iteration


def test_function_builder_loop_refuses_a_body_returning_the_wrong_count() -> None:
    from onnx_custom.errors import SymbolicError
    from onnx_custom.function_bodies.builder import FunctionBuilder

    g = FunctionBuilder(18, "test::bad_loop")
    x = g.input("x")
    count = g.constant(np.int64(2))
    with pytest.raises(
        SymbolicError,
        match=r"test::bad_loop: a loop body returned 1 values for 2 carried and 0 scanned",
    ):
        g.loop(count, [x, x], lambda sub, i, state: [state[0]])
    with pytest.raises(SymbolicError, match=r"returned 2 values for 2 carried and 1 scanned"):
        g.loop(count, [x, x], lambda sub, i, state: state, scans=1)

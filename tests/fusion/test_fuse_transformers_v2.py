"""``fuse=True`` on transformers' v2 deformable attention (RT-DETRv2, D-FINE, DEIMv2): each
family's attention module (small configs, seeded random weights) with equal and unequal point
counts per level and both sampling methods, against the unfused model; whole zoo models (slow)."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from fusion_cases import op_counts
from torch import Tensor, nn

import onnx_custom
from onnx_custom.fusion import fusion_report
from onnx_custom.fusion.msda import msda_v2_from_function_args

pytest.importorskip("transformers")

CUSTOM = onnx_custom.default_registry().with_variants("custom")
STANDARD = onnx_custom.default_registry().with_variants("standard")
LEVELS = ((6, 5), (3, 4), (2, 2))  # (H, W) per level
D_MODEL, HEADS, QUERIES = 16, 2, 5

# family (its modeling module) -> (config class, attention class, config key of the level count)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "rt_detr_v2": ("RTDetrV2Config", "RTDetrV2MultiscaleDeformableAttention", "decoder_n_levels"),
    "d_fine": ("DFineConfig", "DFineMultiscaleDeformableAttention", "num_feature_levels"),
    "deimv2": ("Deimv2Config", "Deimv2MultiscaleDeformableAttention", "num_feature_levels"),
}


def _modeling(family: str) -> Any:
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def _attention(family: str, points: Any = 2, method: str = "default") -> nn.Module:
    config_name, class_name, levels_key = FAMILIES[family]
    transformers = importlib.import_module("transformers")
    config = getattr(transformers, config_name)(
        d_model=D_MODEL,
        decoder_attention_heads=HEADS,
        decoder_n_points=points,
        decoder_method=method,
        **{levels_key: len(LEVELS)},
    )
    torch.manual_seed(0)
    return getattr(_modeling(family), class_name)(config).eval()  # type: ignore[no-any-return]


class V2Model(nn.Module):
    """An attention module called as the families' decoder layers call it (box references)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attn = attention
        self.register_buffer("shapes", torch.tensor(LEVELS, dtype=torch.int64))

    def forward(self, queries: Tensor, memory: Tensor, boxes: Tensor) -> Tensor:
        out = self.attn(
            hidden_states=queries,
            encoder_hidden_states=memory,
            reference_points=boxes,
            spatial_shapes=self.shapes,
            spatial_shapes_list=list(LEVELS),
        )
        return out[0]  # type: ignore[no-any-return]


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, the flattened feature maps and reference boxes (cx, cy, w, h): wide boxes near
    the border put some sampling points outside the maps (the zero padding counts)."""
    g = torch.Generator().manual_seed(seed)
    keys = sum(h * w for h, w in LEVELS)
    queries = torch.randn(1, QUERIES, D_MODEL, generator=g)
    memory = torch.randn(1, keys, D_MODEL, generator=g)
    centers = torch.rand(1, QUERIES, 1, 2, generator=g)
    sizes = torch.rand(1, QUERIES, 1, 2, generator=g) * 0.8 + 0.4
    return queries, memory, torch.cat([centers, sizes], -1)


# ---------------------------------------------------------------------------- the replacement

POINT_LISTS = [(2, 2, 2), (3, 1, 2), (1, 4, 1)]


@pytest.mark.parametrize("points", POINT_LISTS, ids=lambda p: "points" + "-".join(map(str, p)))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_replacement_matches_the_library_function(family: str, points: tuple[int, ...]) -> None:
    """Our op, the points laid out per level (padded with weight 0 where a level has fewer),
    against transformers' own function; locations partly outside [0, 1]."""
    fn = _modeling(family).multi_scale_deformable_attention_v2
    g = torch.Generator().manual_seed(1)
    keys = sum(h * w for h, w in LEVELS)
    value = torch.randn(2, keys, HEADS, 4, generator=g)
    locations = torch.rand(2, QUERIES, HEADS, sum(points), 2, generator=g) * 1.4 - 0.2
    weights = torch.rand(2, QUERIES, HEADS, sum(points), generator=g).softmax(-1)
    expected = fn(value, list(LEVELS), locations, weights, list(points), "default")
    ours = msda_v2_from_function_args(value, list(LEVELS), locations, weights, list(points))
    torch.testing.assert_close(ours, expected)


# ---------------------------------------------------------------------------- fused exports


def _root(error: BaseException) -> str:
    """The first line of the error at the root of ``error``'s chain (not torch's next steps)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()[0][:160]


def _export_where_torch_can(
    model: nn.Module, args: tuple[Any, ...], exporter: str, **options: Any
) -> Any:
    """``onnx_custom.export``; where it fails under dynamo and torch's own exporter fails on the
    same model unfused too (a torch release that cannot export transformers' code), the test is
    skipped with both reasons."""
    try:
        return onnx_custom.export(model, args, exporter=exporter, **options)
    except Exception as ours:
        if exporter != "dynamo":
            raise
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.onnx.export(model, args, dynamo=True)
        except Exception as torchs:
            pytest.skip(
                f"on torch {torch.__version__} onnx_custom.export fails ({_root(ours)}) and"
                f" torch's own dynamo export fails too ({_root(torchs)})"
            )
        raise


def _export(model: nn.Module, exporter: str, registry: Any = CUSTOM) -> Any:
    return _export_where_torch_can(model, _inputs(), exporter, registry=registry, fuse=True)


CASES = [
    ("rt_detr_v2", 2),
    ("d_fine", 2),
    ("d_fine", [3, 1, 2]),
    ("deimv2", 3),
    ("deimv2", [1, 2, 4]),
]


def _case_id(case: tuple[str, Any]) -> str:
    family, points = case
    return f"{family}-points{'-'.join(map(str, points)) if isinstance(points, list) else points}"


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_v2_attention_is_fused(case: tuple[str, Any], exporter: str) -> None:
    family, points = case
    model = V2Model(_attention(family, points))
    proto = _export(model, exporter)
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == 1 and "GridSample" not in counts, counts
    report = fusion_report(proto)
    assert report is not None and not report.not_fused, str(report)
    (site,) = report.fused
    assert site.name == "attn" and site.calls == 1
    assert site.implementation.endswith(FAMILIES[family][1])
    verified = onnx_custom.verify(model, _inputs(), proto)  # the unfused model is the reference
    assert verified.passed, str(verified)
    assert onnx_custom.verify(model, _inputs(seed=3), proto).passed  # other inputs, same file


@pytest.mark.parametrize("variant", ["default", "standard"])
@pytest.mark.parametrize("case", [("rt_detr_v2", 2), ("d_fine", [3, 1, 2])], ids=_case_id)
def test_v2_translation_follows_the_registry(case: tuple[str, Any], variant: str) -> None:
    """The default registry writes the custom node; the standard variant our GridSample form
    (one per level, the padded points included); both match the unfused model."""
    family, points = case
    model = V2Model(_attention(family, points))
    registry = STANDARD if variant == "standard" else onnx_custom.default_registry()
    proto = _export(model, "torchscript", registry)
    counts = op_counts(proto)
    if variant == "standard":
        assert "MultiScaleDeformableAttn" not in counts and counts.get("GridSample") == len(LEVELS)
    else:
        assert counts.get("MultiScaleDeformableAttn") == 1 and "GridSample" not in counts
    assert len(fusion_report(proto).fused) == 1  # type: ignore[union-attr]
    assert onnx_custom.verify(model, _inputs(), proto).passed


@pytest.mark.parametrize(
    "family,exporter",
    [(family, "torchscript") for family in FAMILIES] + [("d_fine", "dynamo")],
)
def test_discrete_method_is_reported_not_fused(family: str, exporter: str) -> None:
    """The discrete method samples the nearest pixel: the module keeps its own code, the report
    says why, and the file still matches the model."""
    points = [3, 1, 2] if family == "d_fine" else 2
    model = V2Model(_attention(family, points, method="discrete"))
    proto = _export(model, exporter)
    assert "MultiScaleDeformableAttn" not in op_counts(proto)
    report = fusion_report(proto)
    assert report is not None and not report.fused
    (site,) = report.not_fused
    assert site.name == "attn" and "'discrete' sampling method" in site.reason, str(report)
    assert "not fused: attn" in str(report)
    assert onnx_custom.verify(model, _inputs(), proto).passed


class TwoLayers(nn.Module):
    """Two attention instances of one class, the second reading the first's output."""

    def __init__(self, first: nn.Module, second: nn.Module) -> None:
        super().__init__()
        self.first = V2Model(first)
        self.second = V2Model(second)

    def forward(self, queries: Tensor, memory: Tensor, boxes: Tensor) -> Tensor:
        return self.second(self.first(queries, memory, boxes), memory, boxes)  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["rt_detr_v2", "d_fine"])
def test_each_instance_is_its_own_site(family: str) -> None:
    """One site per attention instance: a default-method instance is fused, a discrete one in
    the same model keeps its own code, and the file matches the model."""
    model = TwoLayers(_attention(family), _attention(family, method="discrete"))
    proto = _export(model, "torchscript")
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1
    report = fusion_report(proto)
    assert report is not None
    assert [s.name for s in report.fused] == ["first.attn"]
    assert [s.name for s in report.not_fused] == ["second.attn"]
    assert onnx_custom.verify(model, _inputs(), proto).passed


def test_v2_class_named_in_the_list_is_fused_the_library_way() -> None:
    """fuse=[the v2 class] (no replacement) fuses it as fuse=True does."""
    model = V2Model(_attention("d_fine", [3, 1, 2]))
    cls = type(model.attn)
    proto = onnx_custom.export(
        model, _inputs(), exporter="torchscript", registry=CUSTOM, fuse=[cls]
    )
    assert op_counts(proto).get("MultiScaleDeformableAttn") == 1
    assert [s.name for s in fusion_report(proto).fused] == ["attn"]  # type: ignore[union-attr]


def test_patches_are_removed_after_the_export() -> None:
    """The module's forward, the module-level name and D-FINE's instance attribute holding the
    function are all restored."""
    modeling = _modeling("d_fine")
    fn = modeling.multi_scale_deformable_attention_v2
    attention = _attention("d_fine")
    _export(V2Model(attention), "torchscript")
    assert modeling.multi_scale_deformable_attention_v2 is fn
    assert attention.ms_deformable_attn_core is fn
    assert "forward" not in attention.__dict__


def test_same_names_elsewhere_are_not_recognised() -> None:
    """Recognition is by identity: a class and a function named like transformers' but defined
    elsewhere are left alone (no site, nothing fused)."""
    library = _modeling("rt_detr_v2").multi_scale_deformable_attention_v2

    def multi_scale_deformable_attention_v2(*args: Any) -> Tensor:
        return library(*args)  # type: ignore[no-any-return]

    class RTDetrV2MultiscaleDeformableAttention(nn.Module):
        def forward(self, value: Tensor, locations: Tensor, weights: Tensor) -> Tensor:
            return multi_scale_deformable_attention_v2(
                value, list(LEVELS), locations, weights, [2, 2, 2], "default"
            )

    g = torch.Generator().manual_seed(0)
    keys = sum(h * w for h, w in LEVELS)
    args = (
        torch.randn(1, keys, HEADS, 4, generator=g),
        torch.rand(1, QUERIES, HEADS, 6, 2, generator=g),
        torch.rand(1, QUERIES, HEADS, 6, generator=g).softmax(-1),
    )
    model = RTDetrV2MultiscaleDeformableAttention().eval()
    proto = onnx_custom.export(model, args, exporter="torchscript", registry=CUSTOM, fuse=True)
    assert "MultiScaleDeformableAttn" not in op_counts(proto)
    assert fusion_report(proto).sites == []  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- whole models


def _attention_modules(model: nn.Module, family: str) -> int:
    cls = getattr(_modeling(family), FAMILIES[family][1])
    return sum(isinstance(m, cls) for m in model.modules())


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize(
    "name,family", [("RTDetrV2", "rt_detr_v2"), ("DFine", "d_fine"), ("Deimv2", "deimv2")]
)
def test_zoo_model_is_fused(name: str, family: str, exporter: str) -> None:
    from onnx_custom.models.hf_detectors import build

    model, args = build(name)
    proto = _export_where_torch_can(model, args, exporter, registry=CUSTOM, fuse=True)
    expected = _attention_modules(model, family)
    assert expected >= 1
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == expected and "GridSample" not in counts
    assert len(fusion_report(proto).fused) == expected  # type: ignore[union-attr]
    verified = onnx_custom.verify(model, args, proto, fuse=True, rtol=1e-4, atol=1e-4)
    assert verified.passed, str(verified)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_d_fine_model_with_unequal_points(exporter: str) -> None:
    """A whole D-FINE, two decoder layers with points [3, 1, 2] per level: one node each."""
    from transformers import DFineConfig, DFineModel

    from onnx_custom.models import hf_detectors

    config = hf_detectors._rt_detr_config(DFineConfig, lqe_hidden_dim=8, max_num_bins=8)
    config.decoder_n_points, config.decoder_layers = [3, 1, 2], 2
    torch.manual_seed(0)
    model = hf_detectors.Outputs(DFineModel(config), ("last_hidden_state",)).eval()
    model = hf_detectors._untied(model, 0)
    args = (torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)),)
    proto = _export_where_torch_can(model, args, exporter, registry=CUSTOM, fuse=True)
    counts = op_counts(proto)
    assert counts.get("MultiScaleDeformableAttn") == 2 and "GridSample" not in counts
    assert len(fusion_report(proto).fused) == 2  # type: ignore[union-attr]
    verified = onnx_custom.verify(model, args, proto, fuse=True, rtol=1e-4, atol=1e-4)
    assert verified.passed, str(verified)


# ---------------------------------------------------------------------------- fuse_file


def _run(proto: Any, args: tuple[Tensor, ...]) -> Any:
    session = onnx_custom.InferenceSession(proto)
    names = [i.name for i in proto.graph.input]
    return session.run(None, {n: a.numpy() for n, a in zip(names, args, strict=True)})[0]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("case", [("rt_detr_v2", 2), ("d_fine", [3, 1, 2])], ids=_case_id)
def test_fuse_file_fuses_the_v2_form(case: tuple[str, Any], exporter: str) -> None:
    """A file exported unfused: fuse_file replaces the v2 chain with one node (proven in ONNX
    Runtime), and the fused file computes what the torch model computes."""
    family, points = case
    model = V2Model(_attention(family, points))
    proto = _export_where_torch_can(model, _inputs(), exporter)
    fused, report = onnx_custom.fuse_file(proto)
    assert report.count == 1 and report.proven and not report.near_misses, str(report)
    counts = op_counts(fused)
    assert counts.get("MultiScaleDeformableAttn") == 1 and "GridSample" not in counts, counts
    assert ("Pad" in counts) == isinstance(points, list)  # padding only for unequal counts
    for seed in (0, 3):
        args = _inputs(seed)
        with torch.no_grad():
            expected = model(*args)
        torch.testing.assert_close(torch.from_numpy(_run(fused, args)), expected)


def test_fuse_file_v2_near_miss_says_why() -> None:
    """A v2 chain that samples with another padding mode is a near-miss naming its levels."""
    model = V2Model(_attention("d_fine", [3, 1, 2]))
    proto = onnx_custom.export(model, _inputs(), exporter="torchscript")
    for node in proto.graph.node:
        if node.op_type == "GridSample":
            kept = [a for a in node.attribute if a.name != "padding_mode"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("padding_mode", "border")])
    fused, report = onnx_custom.fuse_file(proto)
    assert report.count == 0
    (miss,) = report.near_misses
    assert len(miss.nodes) == len(LEVELS) and "padding_mode='border'" in miss.reason, miss.reason
    assert op_counts(fused).get("GridSample") == len(LEVELS)


def _raw_torchscript(model: nn.Module, args: tuple[Tensor, ...], path: Path) -> Any:
    """The file ``torch.onnx.export`` itself writes (TorchScript slices each level's values when
    the level sizes are traced)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=18)
    return onnx.load(str(path))


ZOO = [("RTDetrV2", "rt_detr_v2"), ("DFine", "d_fine"), ("Deimv2", "deimv2")]
ZOO_FILES = [
    pytest.param(*ZOO[0], "torch-torchscript", id="RTDetrV2-torch-torchscript"),
    *(
        pytest.param(name, family, how, id=f"{name}-{how}", marks=pytest.mark.slow)
        for name, family in ZOO
        for how in ("torch-torchscript", "dynamo")
        if (name, how) != ("RTDetrV2", "torch-torchscript")
    ),
]


@pytest.mark.parametrize("name,family,how", ZOO_FILES)
def test_fuse_file_on_zoo_model_files(name: str, family: str, how: str, tmp_path: Path) -> None:
    """Whole models: raw torch.onnx.export's TorchScript file and our dynamo export, fused by
    fuse_file (one node per attention module, proven), compared with the torch model."""
    from onnx_custom.models.hf_detectors import build

    model, args = build(name)
    if how == "dynamo":
        proto = _export_where_torch_can(model, args, "dynamo")
    else:
        proto = _raw_torchscript(model, args, tmp_path / "model.onnx")
    fused, report = onnx_custom.fuse_file(proto)
    expected = _attention_modules(model, family)
    assert report.count == expected and report.proven and not report.near_misses, str(report)
    counts = op_counts(fused)
    assert counts.get("MultiScaleDeformableAttn") == expected and "GridSample" not in counts
    session = onnx_custom.InferenceSession(fused)
    outputs = session.run(None, {fused.graph.input[0].name: args[0].numpy()})
    with torch.no_grad():
        reference = model(*args)
    for ours, theirs in zip(outputs, reference, strict=True):
        torch.testing.assert_close(torch.from_numpy(ours), theirs, rtol=1e-4, atol=1e-4)

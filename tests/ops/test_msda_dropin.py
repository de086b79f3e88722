"""``onnx_custom.ops.MultiScaleDeformableAttention``: a drop-in for mmcv's module. A checkpoint laid
out as mmcv saves it loads unchanged (strict), and the forward matches mmcv's CPU path written
out here from mmcv's definition (projections + the grid_sample formulation), in every forward
mode mmcv has: sequence-first and batch-first, 2-d and 4-d reference points, query_pos,
key_padding_mask, identity."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _msda_reference import grid_sample_msda, level_start

from onnx_custom.errors import MultiScaleDeformableAttnError
from onnx_custom.ops import MultiScaleDeformableAttention

EMBED, HEADS, LEVELS, POINTS = 32, 4, 2, 3
SHAPES = torch.tensor([[6, 5], [3, 3]])
KEYS = int(SHAPES.prod(1).sum())


def _mmcv_checkpoint(
    embed: int = EMBED,
    heads: int = HEADS,
    levels: int = LEVELS,
    points: int = POINTS,
    ratio: float = 1.0,
) -> OrderedDict[str, torch.Tensor]:
    """Keys and shapes as mmcv's module saves them (nn.Linear weights are (out, in))."""
    gen = torch.Generator().manual_seed(1)
    vp = int(embed * ratio)
    layout = {
        "sampling_offsets": (heads * levels * points * 2, embed),
        "attention_weights": (heads * levels * points, embed),
        "value_proj": (vp, embed),
        "output_proj": (embed, vp),
    }
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, (out, inp) in layout.items():
        state[f"{name}.weight"] = torch.randn(out, inp, generator=gen) / math.sqrt(inp)
        state[f"{name}.bias"] = torch.randn(out, generator=gen) * 0.1
    return state


def _mmcv_forward(
    sd: dict[str, torch.Tensor],
    query: torch.Tensor,
    value: torch.Tensor | None,
    *,
    identity: Any = None,
    query_pos: Any = None,
    key_padding_mask: Any = None,
    reference_points: torch.Tensor,
    batch_first: bool,
    heads: int = HEADS,
    levels: int = LEVELS,
    points: int = POINTS,
) -> torch.Tensor:
    """mmcv's MultiScaleDeformableAttention.forward on CPU (eval mode), from the weights."""
    value = query if value is None else value
    identity = query if identity is None else identity
    if query_pos is not None:
        query = query + query_pos
    if not batch_first:
        query, value = query.transpose(0, 1), value.transpose(0, 1)
    bs, nq, _ = query.shape
    v = F.linear(value, sd["value_proj.weight"], sd["value_proj.bias"])
    if key_padding_mask is not None:
        v = v.masked_fill(key_padding_mask[..., None], 0.0)
    v = v.reshape(bs, value.shape[1], heads, -1)
    off = F.linear(query, sd["sampling_offsets.weight"], sd["sampling_offsets.bias"]).reshape(
        bs, nq, heads, levels, points, 2
    )
    w = F.linear(query, sd["attention_weights.weight"], sd["attention_weights.bias"]).reshape(
        bs, nq, heads, levels * points
    )
    w = torch.softmax(w, -1).reshape(bs, nq, heads, levels, points)
    ref = reference_points[:, :, None, :, None]
    if reference_points.shape[-1] == 2:
        wh = SHAPES.flip(-1).to(off.dtype)  # (W, H) per level: offsets are in pixels
        loc = ref + off / wh[None, None, None, :, None, :]
    else:
        loc = ref[..., :2] + off / points * ref[..., 2:] * 0.5
    out = F.linear(
        grid_sample_msda(v, SHAPES, loc, w), sd["output_proj.weight"], sd["output_proj.bias"]
    )
    if not batch_first:
        out = out.transpose(0, 1)
    return out + identity


def _inputs(
    bs: int, nq: int, batch_first: bool, box: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(bs * 10 + nq)
    q = torch.randn(bs, nq, EMBED, generator=gen)
    v = torch.randn(bs, KEYS, EMBED, generator=gen)
    ref = torch.rand(bs, nq, LEVELS, 4 if box else 2, generator=gen)
    if not batch_first:
        q, v = q.transpose(0, 1), v.transpose(0, 1)
    return q, v, ref


CASES = [  # (batch_first, box reference points, extras)
    (False, False, ()),
    (True, False, ()),
    (False, True, ()),
    (True, False, ("query_pos", "key_padding_mask", "identity")),
    (False, False, ("self_attention",)),
]


@pytest.mark.parametrize(
    ("batch_first", "box", "extras"),
    CASES,
    ids=["seq-first", "batch-first", "box-refs", "pos-mask-identity", "value=query"],
)
def test_mmcv_checkpoint_loads_and_matches_mmcv_forward(
    batch_first: bool, box: bool, extras: tuple[str, ...]
) -> None:
    sd = _mmcv_checkpoint()
    module = MultiScaleDeformableAttention(EMBED, HEADS, LEVELS, POINTS, batch_first=batch_first)
    assert list(module.state_dict()) == list(sd)  # same keys, same order
    module.load_state_dict(sd, strict=True)
    module.eval()
    nq = KEYS if "self_attention" in extras else 7
    q, v, ref = _inputs(2, nq, batch_first, box)
    kwargs: dict[str, Any] = {}
    if "query_pos" in extras:
        kwargs["query_pos"] = torch.randn_like(q)
    if "key_padding_mask" in extras:
        kwargs["key_padding_mask"] = torch.rand(2, KEYS) < 0.3
    if "identity" in extras:
        kwargs["identity"] = torch.randn_like(q)
    value = None if "self_attention" in extras else v
    got = module(
        q,
        value=value,
        reference_points=ref,
        spatial_shapes=SHAPES,
        level_start_index=level_start(SHAPES),
        **kwargs,
    )
    expected = _mmcv_forward(sd, q, value, reference_points=ref, batch_first=batch_first, **kwargs)
    assert got.shape == q.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_value_proj_ratio() -> None:
    sd = _mmcv_checkpoint(ratio=0.5)
    module = MultiScaleDeformableAttention(
        EMBED, HEADS, LEVELS, POINTS, value_proj_ratio=0.5, batch_first=True
    ).eval()
    module.load_state_dict(sd, strict=True)
    q, v, ref = _inputs(1, 4, True, False)
    got = module(
        q,
        value=v,
        reference_points=ref,
        spatial_shapes=SHAPES,
        level_start_index=level_start(SHAPES),
    )
    torch.testing.assert_close(
        got, _mmcv_forward(sd, q, v, reference_points=ref, batch_first=True), rtol=1e-5, atol=1e-5
    )


def test_initialization_is_mmcvs() -> None:
    """mmcv's init_weights: offsets' weight 0 and bias on the ring of head directions (max-norm
    1) times the point index; attention weights 0; projections Xavier with zero bias."""
    m = MultiScaleDeformableAttention(EMBED, HEADS, LEVELS, POINTS)
    assert (
        not m.sampling_offsets.weight.any()
        and not m.attention_weights.weight.any()
        and not m.attention_weights.bias.any()
    )
    bias = m.sampling_offsets.bias.view(HEADS, LEVELS, POINTS, 2)
    for h in range(HEADS):
        theta = 2 * math.pi * h / HEADS
        d = torch.tensor([math.cos(theta), math.sin(theta)])
        d = d / d.abs().max()
        for p in range(POINTS):
            torch.testing.assert_close(bias[h, :, p], (d * (p + 1)).expand(LEVELS, 2))
    bound = math.sqrt(6 / (EMBED + EMBED))
    assert m.value_proj.weight.abs().max() <= bound and not m.value_proj.bias.any()


def test_training_step_reaches_every_parameter() -> None:
    m = MultiScaleDeformableAttention(EMBED, HEADS, LEVELS, POINTS, batch_first=True)
    m.load_state_dict(_mmcv_checkpoint())
    q, v, ref = _inputs(2, 6, True, False)
    m(
        q,
        value=v,
        reference_points=ref,
        spatial_shapes=SHAPES,
        level_start_index=level_start(SHAPES),
    ).square().mean().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


BAD_CONSTRUCTORS = [
    (
        "heads-not-dividing",
        {"embed_dims": 30, "num_heads": 4},
        "embed_dims must be divisible by num_heads",
    ),
    ("zero-points", {"num_points": 0}, "num_points=0"),
    ("ratio", {"embed_dims": 32, "num_heads": 4, "value_proj_ratio": 0.1}, "value_proj_ratio=0.1"),
]


@pytest.mark.parametrize(
    ("kwargs", "match"), [b[1:] for b in BAD_CONSTRUCTORS], ids=[b[0] for b in BAD_CONSTRUCTORS]
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MultiScaleDeformableAttnError, match=match) as info:
        MultiScaleDeformableAttention(**kwargs)
    assert isinstance(info.value, ValueError)  # mmcv raises ValueError here


def test_bad_reference_points() -> None:
    m = MultiScaleDeformableAttention(EMBED, HEADS, LEVELS, POINTS, batch_first=True)
    q, v, _ = _inputs(1, 3, True, False)
    with pytest.raises(MultiScaleDeformableAttnError, match="must be 2 .x, y. or 4"):
        m(
            q,
            value=v,
            reference_points=torch.rand(1, 3, LEVELS, 3),
            spatial_shapes=SHAPES,
            level_start_index=level_start(SHAPES),
        )
    with pytest.raises(
        MultiScaleDeformableAttnError, match="num_keys"
    ):  # value of the wrong length
        m(
            q,
            value=v[:, :-2],
            reference_points=torch.rand(1, 3, LEVELS, 2),
            spatial_shapes=SHAPES,
            level_start_index=level_start(SHAPES),
        )

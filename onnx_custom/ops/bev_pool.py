"""``onnx_custom::bev_pool_v2``: BEVDet's voxel pooling ("BEVPoolv2"), eager PyTorch version.

Signature and semantics follow BEVDet's ``mmdet3d/ops/bev_pool_v2`` (CUDA kernel +
``bev_pool_v2()`` wrapper)::

    depth (B, N, D, fH, fW)   feat (B, N, fH, fW, C)
    ranks_depth, ranks_feat, ranks_bev: (P,) int32/int64, sorted by ranks_bev
    bev_feat_shape = [B, Z, Y, X, C];  interval_starts, interval_lengths: (K,)
    -> (B, C, Z, Y, X)

For every interval k and every point i in [starts[k], starts[k] + lengths[k]):
``bev[ranks_bev[starts[k]], :] += depth.flat[ranks_depth[i]] * feat_rows[ranks_feat[i], :]``
(the CUDA kernel assigns one sum per interval; intervals come from runs of equal ranks_bev, so
this is the same). Points outside every interval are ignored; an empty interval adds nothing.

On CPU the forward and backward are C++ (``csrc/bev_pool.cpp``, built on first use like
deform_conv2d's): gather, multiply and accumulate fused per interval, parallel over intervals,
accumulating in float32 (float64 for float64), so no (points x channels) temporary is made.
Without a C++ compiler, or on other devices, the same math runs in plain PyTorch
(:func:`bev_pool_v2_math`, ``index_add_``).

:func:`prepare_bev_ranks` is BEVDet's ``voxel_pooling_prepare_v2`` (rank computation, sorting,
intervals) and :func:`synthetic_frustum` makes a plausible 6-camera geometry for examples.

The op is declared once below (`BEV_POOL_V2`): schema, dtypes (float32/float64/float16/bfloat16
features, int32/int64 indices: eager, fake, Python and native kernels alike), shape rule,
validator, autograd, the ``onnx_custom::BEVPoolV2`` node (kernel math in
``ort_kernels/bev_pool.py``) and the standard-op translation at opset 16 (``symbolics/bev_pool.py``,
also the node's function body).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from onnx_custom.common.native_build import KernelModule
from onnx_custom.errors import ExtensionBuildError
from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.spec import Attribute, Input, OpSpec, Output, define_op, op_arguments

__all__ = [
    "BEV_POOL_V2",
    "FLOATS",
    "INDEX",
    "SPECS",
    "bev_arguments",
    "bev_pool_v2",
    "bev_pool_v2_backward",
    "bev_pool_v2_forward",
    "bev_pool_v2_grads",
    "bev_pool_v2_into",
    "bev_pool_v2_math",
    "bev_pool_v2_save",
    "build_directory",
    "check_bev_pool_inputs",
    "load_extension",
    "prepare_bev_ranks",
    "synthetic_frustum",
]

FLOATS = ("float32", "float64", "float16", "bfloat16")
INDEX = ("int32", "int64")
_INDEX_DTYPES = (torch.int32, torch.int64)
_EXTENSION = "onnx_custom_bev_pool"
_BEV = "onnx_custom.symbolics.bev_pool"
_OPS = "onnx_custom.ops.bev_pool"

BEV_POOL_V2 = OpSpec(
    "onnx_custom::bev_pool_v2",
    doc="BEVDet's voxel pooling: depth x feature rows summed into BEV cells, (B, C, Z, Y, X)",
    inputs=[
        Input("depth", FLOATS, format="(B, N, D, fH, fW)"),
        Input("feat", FLOATS, format="(B, N, fH, fW, C)"),
        *(
            Input(name, INDEX)
            for name in (
                "ranks_depth",
                "ranks_feat",
                "ranks_bev",
                "interval_starts",
                "interval_lengths",
            )
        ),
    ],
    attributes=[Attribute("bev_feat_shape", "int[]", after="ranks_bev", doc="[B, Z, Y, X, C]")],
    outputs=[
        Output(
            "bev",
            dtype="like:feat",
            shape="[bev_feat_shape.0, bev_feat_shape.4, *bev_feat_shape[1:4]]",
        )
    ],
    impl=f"{_OPS}:bev_pool_v2_forward",
    check=f"{_OPS}:check_bev_pool_inputs",
    backward=f"{_OPS}:bev_pool_v2_grads",
    setup_context=f"{_OPS}:bev_pool_v2_save",
    # not bev_pool_v2: TorchScript mistakes such a node for an onnxscript function
    op_type="BEVPoolV2",
    kernel="onnx_custom.ort_kernels.bev_pool:bev_pool_v2",
    native=True,  # ort_kernels/native/bev_pool.cpp
    function=TranslationBody(f"{_BEV}:bev_pool_v2", min_opset=16),
    translations={
        16: {"default": f"{_BEV}:bev_pool_v2", "custom": "node"}
    },  # ScatterND reduction: 16
)
SPECS = (BEV_POOL_V2,)
_SOURCE = Path(__file__).parent / "csrc" / "bev_pool.cpp"


def _cflags() -> list[str]:
    # The same flags as deform_conv2d's: -O3, OpenMP, AVX2/FMA where the CPU has them.
    from onnx_custom.ops.deform_conv import _cflags as deform_conv_cflags

    return deform_conv_cflags()


_KERNELS = KernelModule(_EXTENSION, _SOURCE, _cflags)
build_directory = (
    _KERNELS.directory
)  # the C++ kernels' build-cache folder (the zoo announces a build)
load_extension = _KERNELS.load  # build (first call) or load the cached C++ kernels


@functools.cache
def _extension_or_none() -> ModuleType | None:
    try:
        return load_extension()
    except ExtensionBuildError as exc:
        warnings.warn(
            "onnx_custom::bev_pool_v2: C++ kernels unavailable, using the slower PyTorch path"
            f" ({exc})",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _native(*tensors: torch.Tensor) -> ModuleType | None:
    """The C++ kernels when every tensor is on the CPU (else None: the PyTorch path)."""
    if any(t.device.type != "cpu" for t in tensors):
        return None
    return _extension_or_none()


@op_arguments(BEV_POOL_V2)
def check_bev_pool_inputs(args: Any) -> None:
    """Shape/dtype checks shared by the eager and fake kernels (no data access); takes the op's
    arguments as the op does."""
    depth, feat, bev_feat_shape = args.depth, args.feat, args.bev_feat_shape
    op = "onnx_custom::bev_pool_v2"
    if depth.dim() != 5 or feat.dim() != 5:
        raise ValueError(
            f"{op} expects depth (B, N, D, fH, fW) and feat (B, N, fH, fW, C), got depth "
            f"{list(depth.shape)} and feat {list(feat.shape)}"
        )
    if depth.shape[:2] != feat.shape[:2] or depth.shape[3:] != feat.shape[2:4]:
        raise ValueError(
            f"{op}: depth {list(depth.shape)} and feat {list(feat.shape)} disagree on "
            "(B, N, fH, fW)"
        )
    if not feat.dtype.is_floating_point or depth.dtype != feat.dtype:
        raise TypeError(
            f"{op} expects floating-point depth and feat of one dtype, got depth {depth.dtype} "
            f"and feat {feat.dtype}"
        )
    if len(bev_feat_shape) != 5:
        raise ValueError(f"{op} expects bev_feat_shape [B, Z, Y, X, C], got {list(bev_feat_shape)}")
    if bev_feat_shape[0] != depth.shape[0] or bev_feat_shape[4] != feat.shape[4]:
        raise ValueError(
            f"{op}: bev_feat_shape {list(bev_feat_shape)} must start with B={depth.shape[0]} "
            f"and end with C={feat.shape[4]}"
        )
    if any(int(s) < 1 for s in bev_feat_shape):
        raise ValueError(f"{op} expects positive bev_feat_shape, got {list(bev_feat_shape)}")
    ranks_depth, ranks_feat, ranks_bev = args.ranks_depth, args.ranks_feat, args.ranks_bev
    interval_starts, interval_lengths = args.interval_starts, args.interval_lengths
    named = {
        name: getattr(args, name)
        for name in (
            "ranks_depth",
            "ranks_feat",
            "ranks_bev",
            "interval_starts",
            "interval_lengths",
        )
    }
    for name, t in named.items():
        if t.dim() != 1 or t.dtype not in _INDEX_DTYPES:
            raise TypeError(
                f"{op} expects {name} as a 1-D int32/int64 tensor, got {t.dtype} "
                f"of shape {list(t.shape)}"
            )
    if not ranks_depth.shape == ranks_feat.shape == ranks_bev.shape:
        raise ValueError(
            f"{op} expects ranks_depth, ranks_feat, ranks_bev of one length P, got "
            f"{list(ranks_depth.shape)}, {list(ranks_feat.shape)}, {list(ranks_bev.shape)}"
        )
    if interval_starts.shape != interval_lengths.shape:
        raise ValueError(
            f"{op} expects interval_starts and interval_lengths of one length, got "
            f"{list(interval_starts.shape)} and {list(interval_lengths.shape)}"
        )


def _check_bounds(name: str, t: torch.Tensor, upper: int) -> None:
    # Eager only: needs the values. index_add_ would fail with a less helpful message.
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= upper):
        raise ValueError(
            f"onnx_custom::bev_pool_v2: {name} must lie in [0, {upper}), got values in "
            f"[{int(t.min())}, {int(t.max())}]"
        )


def _interval_points(
    interval_starts: torch.Tensor, interval_lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(point index, interval index) for every point inside an interval."""
    starts = interval_starts.long()
    lengths = interval_lengths.long()
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError("onnx_custom::bev_pool_v2: interval_lengths must be >= 0")
    interval = torch.repeat_interleave(torch.arange(starts.numel(), device=starts.device), lengths)
    first = torch.cumsum(lengths, 0) - lengths  # position of each interval's first point
    offset = torch.arange(interval.numel(), device=starts.device) - first[interval]
    return starts[interval] + offset, interval


@op_arguments(BEV_POOL_V2)
def bev_arguments(a: Any) -> Any:
    """The op's arguments, taken as the op takes them, as one named tuple (``args.depth``...)."""
    return a


def _gather_terms(a: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per contributing point: (flat depth index, feat row index, bev cell index)."""
    points, interval = _interval_points(a.interval_starts, a.interval_lengths)
    _check_bounds("interval points", points, a.ranks_bev.numel())
    d_idx = a.ranks_depth.long()[points]
    f_idx = a.ranks_feat.long()[points]
    cell = a.ranks_bev.long()[a.interval_starts.long()][interval]
    _check_bounds("ranks_depth", d_idx, a.depth.numel())
    _check_bounds("ranks_feat", f_idx, a.feat.numel() // a.feat.shape[-1])
    return d_idx, f_idx, cell


@op_arguments(BEV_POOL_V2)
def bev_pool_v2_math(a: Any) -> torch.Tensor:
    """The pooling in plain PyTorch; returns (B, C, Z, Y, X)."""
    b, z, y, x, c = (int(s) for s in a.bev_feat_shape)
    d_idx, f_idx, cell = _gather_terms(a)
    _check_bounds("ranks_bev", cell, b * z * y * x)
    values = a.depth.reshape(-1)[d_idx].unsqueeze(1) * a.feat.reshape(-1, c)[f_idx]
    out = a.feat.new_zeros(b * z * y * x, c).index_add_(0, cell, values)
    return out.reshape(b, z, y, x, c).permute(0, 4, 1, 2, 3).contiguous()


def _run_native(a: Any, out: torch.Tensor | None) -> torch.Tensor | None:
    """The C++ forward (into ``out`` when given); None when it cannot run here."""
    tensors = (
        a.depth,
        a.feat,
        a.ranks_depth,
        a.ranks_feat,
        a.ranks_bev,
        a.interval_starts,
        a.interval_lengths,
    )
    native = _native(*tensors, *(() if out is None else (out,)))
    if native is None:
        return None
    shape = [int(s) for s in a.bev_feat_shape]
    result, valid = native.forward(*tensors[:5], shape, *tensors[5:], out)
    if not valid:
        _raise_index_error(a)
    return result


@op_arguments(BEV_POOL_V2)
def bev_pool_v2_forward(a: Any) -> torch.Tensor:
    """BEVDet's bev_pool_v2 (including its final permute to channels-first): the C++ kernels on
    CPU, else the PyTorch math. The op has checked the arguments."""
    out = _run_native(a, None)
    return bev_pool_v2_math(*a) if out is None else out


def bev_pool_v2_into(out: torch.Tensor, args: Any) -> bool:
    """The forward of ``args`` (`bev_arguments`) straight into ``out`` (contiguous (B, C, Z, Y,
    X), feat's dtype) with the C++ kernels; False (nothing written) when they are unavailable.
    For ONNX Runtime kernels, whose output buffer is preallocated."""
    check_bev_pool_inputs(*args)
    return _run_native(args, out) is not None


def _raise_index_error(a: Any) -> None:
    """The C++ kernels found an index out of range: name it (slow path, PyTorch)."""
    b, z, y, x, _ = (int(s) for s in a.bev_feat_shape)
    _d, _f, cell = _gather_terms(a)
    _check_bounds("ranks_bev", cell, b * z * y * x)
    raise ValueError("onnx_custom::bev_pool_v2: an index lies out of range (ranks or intervals)")


@torch.library.custom_op("onnx_custom::bev_pool_v2_backward", mutates_args=())
def bev_pool_v2_backward(
    grad: torch.Tensor,
    depth: torch.Tensor,
    feat: torch.Tensor,
    ranks_depth: torch.Tensor,
    ranks_feat: torch.Tensor,
    ranks_bev: torch.Tensor,
    interval_starts: torch.Tensor,
    interval_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_depth, grad_feat), like BEVDet's backward kernel: grads scatter back along the gathers.

    An op of its own (not Python in the autograd formula) because it is data-dependent: traced
    backward graphs see one opaque node with a fake kernel, as BEVDet's CUDA backward.
    """
    ranks = (ranks_depth, ranks_feat, ranks_bev, interval_starts, interval_lengths)
    shape = [grad.shape[0], *grad.shape[2:], grad.shape[1]]  # bev_feat_shape [B, Z, Y, X, C]
    native = _native(grad, depth, feat, *ranks)
    if native is not None:
        grad_depth, grad_feat, valid = native.backward(grad, depth, feat, *ranks)
        if not valid:  # the named tuple only here: binding it costs a visible part of the backward
            _raise_index_error(bev_arguments(depth, feat, *ranks[:3], shape, *ranks[3:]))
        return grad_depth, grad_feat
    args = bev_arguments(depth, feat, *ranks[:3], shape, *ranks[3:])
    c = feat.shape[-1]
    d_idx, f_idx, cell = _gather_terms(args)
    g_rows = grad.permute(0, 2, 3, 4, 1).reshape(-1, c)[cell]
    feat_rows = feat.reshape(-1, c)
    depth_flat = depth.reshape(-1)
    grad_depth = torch.zeros_like(depth_flat).index_add_(
        0, d_idx, (g_rows * feat_rows[f_idx]).sum(1)
    )
    grad_feat = torch.zeros_like(feat_rows).index_add_(
        0, f_idx, g_rows * depth_flat[d_idx].unsqueeze(1)
    )
    return grad_depth.reshape(depth.shape), grad_feat.reshape(feat.shape)


@bev_pool_v2_backward.register_fake
def _bev_pool_v2_backward_fake(
    grad: torch.Tensor,
    depth: torch.Tensor,
    feat: torch.Tensor,
    *ranks: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(depth), torch.empty_like(feat)


def bev_pool_v2_save(ctx: Any, inputs: Any, output: Any) -> None:
    ranks = (
        inputs.ranks_depth,
        inputs.ranks_feat,
        inputs.ranks_bev,
        inputs.interval_starts,
        inputs.interval_lengths,
    )
    ctx.save_for_backward(inputs.depth, inputs.feat, *ranks)


def bev_pool_v2_grads(ctx: Any, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    grad_depth, grad_feat = bev_pool_v2_backward(grad.contiguous(), *ctx.saved_tensors)
    return {"depth": grad_depth, "feat": grad_feat}


bev_pool_v2 = define_op(BEV_POOL_V2)


# --------------------------------------------------------------------------- rank preparation
def prepare_bev_ranks(
    coor: torch.Tensor,
    grid_lower_bound: Sequence[float],
    grid_interval: Sequence[float],
    grid_size: Sequence[int],
    index_dtype: torch.dtype = torch.int32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """BEVDet's ``voxel_pooling_prepare_v2``.

    ``coor`` (B, N, D, fH, fW, 3) holds ego-frame (x, y, z) of every frustum point; ``grid_size``
    is (X, Y, Z). Returns (ranks_bev, ranks_depth, ranks_feat, interval_starts,
    interval_lengths), points outside the grid dropped, sorted by ranks_bev.
    """
    b, n, d, h, w, _ = coor.shape
    num_points = b * n * d * h * w
    device = coor.device
    ranks_depth = torch.arange(num_points, device=device)
    ranks_feat = (
        torch.arange(num_points // d, device=device)
        .reshape(b, n, 1, h, w)
        .expand(b, n, d, h, w)
        .flatten()
    )
    lower = torch.tensor(grid_lower_bound, dtype=coor.dtype, device=device)
    step = torch.tensor(grid_interval, dtype=coor.dtype, device=device)
    # floor (BEVDet truncates with .long(); same for points inside the grid)
    voxel = torch.floor((coor - lower) / step).long().reshape(num_points, 3)
    batch = torch.arange(b, device=device).repeat_interleave(num_points // b)
    gx, gy, gz = (int(s) for s in grid_size)
    kept = (
        (voxel[:, 0] >= 0)
        & (voxel[:, 0] < gx)
        & (voxel[:, 1] >= 0)
        & (voxel[:, 1] < gy)
        & (voxel[:, 2] >= 0)
        & (voxel[:, 2] < gz)
    )
    voxel, batch = voxel[kept], batch[kept]
    ranks_depth, ranks_feat = ranks_depth[kept], ranks_feat[kept]
    ranks_bev = batch * (gz * gy * gx) + voxel[:, 2] * (gy * gx) + voxel[:, 1] * gx + voxel[:, 0]
    order = ranks_bev.argsort(stable=True)
    ranks_bev, ranks_depth, ranks_feat = ranks_bev[order], ranks_depth[order], ranks_feat[order]
    starts_mask = torch.ones_like(ranks_bev, dtype=torch.bool)
    starts_mask[1:] = ranks_bev[1:] != ranks_bev[:-1]
    interval_starts = torch.nonzero(starts_mask).flatten()
    interval_lengths = torch.diff(
        interval_starts, append=torch.tensor([ranks_bev.numel()], device=device)
    )
    return tuple(  # type: ignore[return-value]
        t.to(index_dtype).contiguous()
        for t in (ranks_bev, ranks_depth, ranks_feat, interval_starts, interval_lengths)
    )


def synthetic_frustum(
    batch: int = 1,
    cameras: int = 6,
    depth_bins: int = 59,
    feat_hw: tuple[int, int] = (16, 44),
    depth_range: tuple[float, float] = (1.0, 60.0),
    fov_deg: float = 70.0,
) -> torch.Tensor:
    """Ego-frame (x, y, z) of every frustum point of a ring of cameras: (B, N, D, fH, fW, 3).

    Cameras look outwards at evenly spaced yaw angles; columns span the horizontal field of view
    and rows span heights from -2 m to +2 m, so the points land in a 128x128 BEV grid at 0.8 m.
    """
    fh, fw = feat_hw
    depths = torch.linspace(depth_range[0], depth_range[1], depth_bins)
    half = math.radians(fov_deg) / 2
    azimuth = torch.linspace(-half, half, fw)
    heights = torch.linspace(2.0, -2.0, fh)
    yaw = torch.arange(cameras, dtype=torch.float32) * (2 * math.pi / cameras)
    angle = yaw[:, None, None, None] + azimuth[None, None, None, :]  # (N, 1, 1, fW)
    radius = depths[None, :, None, None]  # (1, D, 1, 1)
    shape = (cameras, depth_bins, fh, fw)
    x = (radius * torch.cos(angle)).expand(shape)
    y = (radius * torch.sin(angle)).expand(shape)
    z = heights[None, None, :, None].expand(shape)
    coor = torch.stack((x, y, z), dim=-1)
    return coor.unsqueeze(0).expand(batch, *coor.shape).contiguous()

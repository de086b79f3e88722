"""``onnx_custom::multi_scale_deformable_attn``: multi-scale deformable attention (MSDA), CPU.

mmcv's ``MultiScaleDeformableAttnFunction`` semantics and argument order::

    multi_scale_deformable_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index,
                                Tensor sampling_locations, Tensor attention_weights,
                                int im2col_step) -> Tensor

``value (bs, num_keys, num_heads, head_dim)``; ``spatial_shapes (num_levels, 2)`` int64, (H, W) per
level; ``level_start_index (num_levels,)`` int64, the first key of each level (the exclusive
cumulative sum of H*W); ``sampling_locations (bs, num_queries, num_heads, num_levels, num_points,
2)`` as (x, y) in [0, 1]; ``attention_weights (bs, num_queries, num_heads, num_levels,
num_points)``. Output ``(bs, num_queries, num_heads * head_dim)``.

Each sample is bilinear with ``align_corners=False`` and zero padding: exactly what the
pure-PyTorch ``F.grid_sample`` formulation (grid ``2 * loc - 1``) computes, at borders and for
locations outside [0, 1] too, gradients included. **Non-finite sampling locations** (NaN, +-Inf)
are defined: such a sample is 0 and gets zero gradients (its attention weight still receives
``grad . 0 = 0``). NaN/Inf in ``value`` or ``attention_weights`` propagate as in grid_sample.
``im2col_step`` is mmcv's CUDA batching hint: any positive value, it does not change the result.

dtypes: float32, float64, float16 and bfloat16 for the three float tensors (one dtype for all;
the half types compute in float32 and round once). Any strides are accepted. The C++ kernels
(``csrc/msda.cpp``) are built on first use into ``$ONNX_CUSTOM_CACHE_DIR``.

The op is declared once below (`MSDA`): schema, validator (shared by the eager op and its fake
kernel, so export fails early with eager's message), shape rule, autograd, the custom node
``onnx_custom::MultiScaleDeformableAttn`` (Python kernel `msda_ort_kernel`: this op's checks and
C++ forward on ORT's buffers, writing into ORT's output; native
kernel in ``ort_kernels/native/msda.cpp``; function body: the gather decomposition) and the
translations in ``symbolics/msda.py`` (variants ``standard``: ``GridSample`` per level from
opset 16, gathers below; ``gather``: gathers at every opset; ``mmdeploy``:
``mmdeploy::MMCVMultiScaleDeformableAttention``).

``multi_scale_deformable_attn`` (mmcv's ``MultiScaleDeformableAttnFunction.apply`` argument
order) and ``MultiScaleDeformableAttention`` (mmcv's module: constructor, parameter names,
``state_dict`` keys, forward arguments) are drop-ins.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from onnx_custom.common.native_build import KernelModule
from onnx_custom.errors import MultiScaleDeformableAttnDtypeError, MultiScaleDeformableAttnError
from onnx_custom.function_bodies.builder import TranslationBody
from onnx_custom.runtime.native import sources_dir
from onnx_custom.spec import (
    NODE,
    Attribute,
    Input,
    NativeKernel,
    OpSpec,
    Output,
    define_op,
    op_arguments,
)

__all__ = [
    "DTYPES",
    "MSDA",
    "NATIVE_FUNCTION",
    "SPECS",
    "MultiScaleDeformableAttention",
    "MultiScaleDeformableAttnDtypeError",
    "MultiScaleDeformableAttnError",
    "build_directory",
    "check_level_layout",
    "load_extension",
    "msda_op",
    "msda_ort_kernel",
    "multi_scale_deformable_attn",
    "validate_msda",
]

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""The float dtypes the op accepts (eager, fake, Python and native kernels)."""
_FLOATS = tuple(str(d).removeprefix("torch.") for d in DTYPES)
_SYMBOLICS = "onnx_custom.symbolics.msda"
NATIVE_FUNCTION = "onnx_custom_msda::multi_scale_deformable_attn"
"""The C++ kernel (``ort_kernels/native/msda.cpp``) the spec's ``native`` names."""
_OPS = "onnx_custom.ops.msda"

MSDA = OpSpec(
    "onnx_custom::multi_scale_deformable_attn",
    doc=(
        "multi-scale deformable attention (mmcv semantics): bilinear samples of each level,"
        " weighted"
    ),
    inputs=[
        Input("value", _FLOATS, format="(bs, num_keys, num_heads, head_dim)"),
        Input("spatial_shapes", ("int64",), format="(num_levels, 2)"),
        Input("level_start_index", ("int64",), format="(num_levels,)"),
        Input(
            "sampling_locations",
            _FLOATS,
            format="(bs, num_queries, num_heads, num_levels, num_points, 2)",
        ),
        Input(
            "attention_weights",
            _FLOATS,
            format="(bs, num_queries, num_heads, num_levels, num_points)",
        ),
    ],
    attributes=[Attribute("im2col_step", "int", node_default=64)],
    outputs=[Output("output", shape="[value.0, sampling_locations.1, value.2 * value.3]")],
    impl=f"{_OPS}:msda_forward",
    check=f"{_OPS}:validate_msda",
    backward=f"{_OPS}:msda_backward",
    setup_context=f"{_OPS}:msda_save",
    op_type="MultiScaleDeformableAttn",
    domain="onnx_custom",
    # The node's Python kernel: this op's checks and C++ forward on torch views of ORT's buffers,
    # writing straight into ORT's output (kernel=EAGER would return a new tensor that the host
    # then copies into it: 5.6 MB, ~3% of the encoder-size call).
    kernel=f"{_OPS}:msda_ort_kernel",
    # The native kernel, written against the user kernel API (onnx_custom/kernel.h) and declared
    # the way users declare theirs; the shipped library's registration of it
    # (ort_kernels/native/msda_generated.cpp) is generated from this spec by the same code
    # generator (`python -m onnx_custom.ort_kernels.msda` rewrites it; a test holds it current).
    native=NativeKernel(str(sources_dir() / "msda.cpp"), NATIVE_FUNCTION),
    function=TranslationBody(f"{_SYMBOLICS}:msda_gather", min_opset=11),
    # The highest opset <= the export's wins before variants are preferred: the mmdeploy variant
    # is declared again at 16, where the GridSample form starts (the node is re-placed there).
    # "gather": the gather form at every opset (for backends that mishandle GridSample).
    translations={
        1: {
            "default": NODE,
            "mmdeploy": f"{_SYMBOLICS}:msda_mmdeploy",
            "standard": f"{_SYMBOLICS}:msda_gather",
            "gather": f"{_SYMBOLICS}:msda_gather",
        },
        16: {
            "mmdeploy": f"{_SYMBOLICS}:msda_mmdeploy",
            "standard": f"{_SYMBOLICS}:msda_grid_sample",
            "gather": f"{_SYMBOLICS}:msda_gather",
        },
    },
)
SPECS = (MSDA,)


def _compiler_is_gcc() -> bool:
    import subprocess

    from onnx_custom.common.torch_notices import drop_cuda_home_notice

    drop_cuda_home_notice()
    from torch.utils.cpp_extension import get_cxx_compiler

    try:
        banner = subprocess.run(
            [get_cxx_compiler(), "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "clang" not in banner.lower() and (
        "gcc" in banner.lower()
        or "g++" in banner.lower()
        or "free software foundation" in banner.lower()
    )


def _cflags() -> list[str]:
    flags = ["-O3", "-fopenmp"]  # -fopenmp turns at::parallel_for on; torch already loads libgomp
    # GCC's -O3 unroll-and-jam fuses pairs of samples in the kernels' chunk loops and then leaves
    # the fused loop scalar (2x slower forward); without it the chunk loops vectorize. Clang has
    # no such pass (and rejects the flag), so only GCC gets it.
    if _compiler_is_gcc():
        flags.append("-fno-loop-unroll-and-jam")
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]  # the D-wide axpy/dot loops vectorize 8 wide
    return flags


def _headers() -> list[tuple[str, Path]]:
    # The bilinear sample the native kernel runs too: the torch-free header in the runtime's
    # include folder (imported here: importing the op should not load the build machinery).
    from onnx_custom.runtime.shim_build import abi_include_dir

    name = "onnx_custom/kernels/msda.h"
    return [(name, abi_include_dir() / name)]


_KERNELS = KernelModule(
    "onnx_custom_msda", Path(__file__).parent / "csrc" / "msda.cpp", _cflags, headers=_headers
)
build_directory = _KERNELS.directory  # the C++ kernels' build-cache folder
load_extension = _KERNELS.load  # build (first call) or load the cached C++ kernels


def _shape(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.shape)


def _fail(message: str) -> MultiScaleDeformableAttnError:
    return MultiScaleDeformableAttnError(f"multi_scale_deformable_attn: {message}")


_RANKS = {
    "value": (4, "(bs, num_keys, num_heads, head_dim)"),
    "spatial_shapes": (2, "(num_levels, 2)"),
    "level_start_index": (1, "(num_levels,)"),
    "sampling_locations": (6, "(bs, num_queries, num_heads, num_levels, num_points, 2)"),
    "attention_weights": (5, "(bs, num_queries, num_heads, num_levels, num_points)"),
}


@op_arguments(MSDA)
def validate_msda(args: Any) -> None:
    """Dtypes, ranks and the dims the tensors share. Shared by the eager op and its fake kernel, so
    export fails early with eager's message; checks that read values live in `check_level_layout`.

    Raises `MultiScaleDeformableAttnDtypeError` (a ``TypeError``) for dtypes and
    `MultiScaleDeformableAttnError` (a ``ValueError``) for shapes and values; both are also
    ``RuntimeError``s, as mmcv's compiled op raises.
    """
    value, loc, attn = args.value, args.sampling_locations, args.attention_weights
    if value.dtype not in DTYPES:
        raise MultiScaleDeformableAttnDtypeError(
            f"multi_scale_deformable_attn: value has dtype {value.dtype}; expected one of "
            f"{', '.join(_FLOATS)}. Fix: cast it with value.float()."
        )
    for name, t in (("sampling_locations", loc), ("attention_weights", attn)):
        if t.dtype != value.dtype:
            raise MultiScaleDeformableAttnDtypeError(
                f"multi_scale_deformable_attn: {name} has dtype {t.dtype} but value has "
                f"{value.dtype}; the float tensors share one dtype. Fix: {name}.type_as(value) "
                "(onnx_custom.ops.multi_scale_deformable_attn casts them, as mmcv does)."
            )
    for name in ("spatial_shapes", "level_start_index"):
        t = getattr(args, name)
        if t.dtype != torch.int64:
            raise MultiScaleDeformableAttnDtypeError(
                f"multi_scale_deformable_attn: {name} has dtype {t.dtype}; expected int64. "
                f"Fix: {name}.long()."
            )
    for name, (rank, layout) in _RANKS.items():
        t = getattr(args, name)
        if t.dim() != rank:
            raise _fail(
                f"{name} must be {rank}-D {layout}, got shape {_shape(t)}. Fix: reshape it, e.g. "
                + (
                    "sampling_offsets.view(bs, num_queries, num_heads, num_levels, num_points, 2)."
                    if name == "sampling_locations"
                    else f"{name}.view{layout}."
                )
            )
    shapes, starts = args.spatial_shapes, args.level_start_index
    bs, _, heads, _ = value.shape
    if shapes.shape[1] != 2:
        raise _fail(
            "spatial_shapes must be (num_levels, 2) holding (H, W) per level, got shape"
            f" {_shape(shapes)}."
        )
    if loc.shape[5] != 2:
        raise _fail(
            f"sampling_locations' last dim holds (x, y) and must be 2, got shape {_shape(loc)}."
        )
    levels = shapes.shape[0]
    expected = (bs, loc.shape[1], heads, levels, loc.shape[4])
    if _shape(loc)[:5] != expected:
        raise _fail(
            f"sampling_locations {_shape(loc)} must be (bs, num_queries, num_heads, num_levels, "
            f"num_points, 2) with bs={bs} and num_heads={heads} from value {_shape(value)} and "
            f"num_levels={levels} from spatial_shapes {_shape(shapes)}."
        )
    if _shape(attn) != expected:
        raise _fail(
            "attention_weights must have shape (bs, num_queries, num_heads, num_levels, "
            f"num_points) = {expected} (sampling_locations {_shape(loc)}), got {_shape(attn)}."
        )
    if _shape(starts) != (levels,):
        raise _fail(
            f"level_start_index must have shape (num_levels,) = ({levels},) like spatial_shapes "
            f"{_shape(shapes)}, got {_shape(starts)}."
        )
    if args.im2col_step <= 0:
        raise _fail(
            f"im2col_step must be positive, got {args.im2col_step}. Fix: pass 64 (mmcv's default)."
        )
    for name in ("spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"):
        t = getattr(args, name)
        if t.device != value.device:
            raise _fail(
                f"{name} is on {t.device} but value on {value.device}. Fix:"
                f" .to({str(value.device)!r})."
            )


def check_level_layout(spatial_shapes: Any, level_start_index: Any, num_keys: int | None) -> None:
    """The contract between the level tensors' values and value's keys: every H, W >= 0,
    ``sum(H*W) == num_keys`` and ``level_start_index`` = the exclusive cumulative sum of H*W.
    Reads values, so it runs where they are known: eager, the ONNX Runtime kernels, and export
    when the level tensors are constants (``level_start_index=None`` or ``num_keys=None``: that
    part is unknown at export and not checked). Takes tensors or arrays."""
    hw = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    if any(h < 0 or w < 0 for h, w in hw):
        raise _fail(f"spatial_shapes holds a negative size: {hw}; expected (H, W) >= 0 per level.")
    sizes = [h * w for h, w in hw]
    if num_keys is not None and sum(sizes) != num_keys:
        raise _fail(
            f"spatial_shapes {hw} cover sum(H*W) = {sum(sizes)} keys but value has num_keys = "
            f"{num_keys}. Fix: value must be the levels' (H*W) features concatenated, in the order "
            "of spatial_shapes."
        )
    if level_start_index is None:
        return
    starts = [int(s) for s in level_start_index.tolist()]
    expected = [sum(sizes[:i]) for i in range(len(sizes))]
    if starts != expected:
        raise _fail(
            f"level_start_index {starts} does not match spatial_shapes {hw}: expected {expected}."
            " Fix: torch.cat((spatial_shapes.new_zeros((1,)),"
            " spatial_shapes.prod(1).cumsum(0)[:-1]))."
        )


@op_arguments(MSDA)
def msda_forward(args: Any) -> torch.Tensor:
    """The eager math: the C++ kernel, after the checks that read the level tensors' values."""
    if args.value.device.type != "cpu":
        raise _fail(
            f"only CPU tensors are supported, got {args.value.device}. Fix: move the tensors with"
            " .cpu()."
        )
    check_level_layout(args.spatial_shapes, args.level_start_index, args.value.shape[1])
    return load_extension().forward(*args)


def _torch_view(a: Any) -> torch.Tensor:
    """A torch view of an ONNX Runtime buffer (a numpy array; bfloat16 goes through int16, which
    numpy hands to torch)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(a)


def msda_ort_kernel(
    value: Any,
    spatial_shapes: Any,
    level_start_index: Any,
    sampling_locations: Any,
    attention_weights: Any,
    *,
    im2col_step: int = 64,
    out: tuple[Any, ...],
) -> None:
    """Python kernel of ``onnx_custom::MultiScaleDeformableAttn`` (and mmdeploy's node): the eager
    op's checks (`validate_msda`, `check_level_layout`), then its C++ forward writing into ONNX
    Runtime's output buffer ``out[0]`` (no result tensor to allocate and copy back)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ORT's inputs are read-only views; nothing writes them
        args = [
            _torch_view(a)
            for a in (
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
            )
        ]
    validate_msda(*args, im2col_step)
    check_level_layout(args[1], args[2], args[0].shape[1])
    load_extension().forward_out(*args, im2col_step, _torch_view(out[0]))


@torch.library.custom_op("onnx_custom::_multi_scale_deformable_attn_backward", mutates_args=())
def _msda_backward(
    grad: torch.Tensor,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    im2col_step: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients for (value, sampling_locations, attention_weights)."""
    grads = load_extension().backward(
        grad,
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        im2col_step,
    )
    return tuple(grads)


@_msda_backward.register_fake
def _(
    grad,
    value,
    spatial_shapes,
    level_start_index,
    sampling_locations,
    attention_weights,
    im2col_step,
):
    # Dense like the C++ kernel's results, whatever the inputs' strides.
    return tuple(t.new_empty(t.shape) for t in (value, sampling_locations, attention_weights))


def msda_save(ctx: Any, inputs: Any, output: torch.Tensor) -> None:
    ctx.save_for_backward(
        inputs.value,
        inputs.spatial_shapes,
        inputs.level_start_index,
        inputs.sampling_locations,
        inputs.attention_weights,
    )
    ctx.im2col_step = inputs.im2col_step


def msda_backward(ctx: Any, grad: torch.Tensor) -> dict[str, torch.Tensor | None]:
    gv, gl, ga = _msda_backward(grad, *ctx.saved_tensors, ctx.im2col_step)
    return {"value": gv, "sampling_locations": gl, "attention_weights": ga}


msda_op = define_op(MSDA)


def multi_scale_deformable_attn(
    value: Tensor,
    value_spatial_shapes: Tensor,
    value_level_start_index: Tensor,
    sampling_locations: Tensor,
    attention_weights: Tensor,
    im2col_step: int = 64,
) -> Tensor:
    """Drop-in for mmcv's ``MultiScaleDeformableAttnFunction.apply`` (same arguments and order).

    Like mmcv, ``sampling_locations`` and ``attention_weights`` are cast to ``value``'s dtype
    first (mixed precision: value float16, locations float32).
    """
    return torch.ops.onnx_custom.multi_scale_deformable_attn(
        value,
        value_spatial_shapes,
        value_level_start_index,
        sampling_locations.type_as(value),
        attention_weights.type_as(value),
        im2col_step,
    )


class MultiScaleDeformableAttention(nn.Module):
    """Drop-in for ``mmcv.ops.MultiScaleDeformableAttention`` (Deformable-DETR's MSDeformAttn):
    same constructor arguments, parameter names (``sampling_offsets``, ``attention_weights``,
    ``value_proj``, ``output_proj``), ``state_dict`` keys, initialization and ``forward``
    arguments, so mmcv checkpoints load unchanged. The sampling runs in
    ``onnx_custom::multi_scale_deformable_attn`` (C++ on CPU, exported by onnx-custom).

    ``norm_cfg`` and ``init_cfg`` are accepted for compatibility and ignored (mmcv's module does
    not use ``norm_cfg`` either; ``init_cfg`` drives mmengine's initializer).
    """

    def __init__(
        self,
        embed_dims: int = 256,
        num_heads: int = 8,
        num_levels: int = 4,
        num_points: int = 4,
        im2col_step: int = 64,
        dropout: float = 0.1,
        batch_first: bool = False,
        norm_cfg: dict[str, Any] | None = None,
        init_cfg: Any = None,
        value_proj_ratio: float = 1.0,
    ) -> None:
        super().__init__()
        sizes = {
            "embed_dims": embed_dims,
            "num_heads": num_heads,
            "num_levels": num_levels,
            "num_points": num_points,
            "im2col_step": im2col_step,
        }
        bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v <= 0}
        if bad:
            raise MultiScaleDeformableAttnError(
                f"MultiScaleDeformableAttention: {', '.join(f'{k}={v!r}' for k, v in bad.items())};"
                " expected positive ints. Fix: e.g. embed_dims=256, num_heads=8, num_levels=4,"
                " num_points=4."
            )
        if embed_dims % num_heads != 0:
            raise MultiScaleDeformableAttnError(
                "MultiScaleDeformableAttention: embed_dims must be divisible by num_heads, but got"
                f" {embed_dims} and {num_heads}. Fix: pick num_heads dividing embed_dims (e.g."
                f" {math.gcd(embed_dims, num_heads)})."
            )
        value_proj_size = int(embed_dims * value_proj_ratio)
        if value_proj_size <= 0 or value_proj_size % num_heads != 0:
            raise MultiScaleDeformableAttnError(
                f"MultiScaleDeformableAttention: value_proj_ratio={value_proj_ratio} makes value "
                f"channels int(embed_dims * ratio) = {value_proj_size}, which must be a positive "
                f"multiple of num_heads={num_heads}. Fix: a ratio giving such a size (1.0 works)."
            )
        dim_per_head = embed_dims // num_heads
        if dim_per_head & (dim_per_head - 1) != 0:
            warnings.warn(
                "You'd better set embed_dims in MultiScaleDeformAttention to make the dimension of"
                " each attention head a power of 2 which is more efficient in our CUDA"
                " implementation.",
                stacklevel=2,
            )  # mmcv's warning, kept for parity
        self.norm_cfg = norm_cfg
        self.init_cfg = init_cfg
        self.dropout = nn.Dropout(dropout)
        self.batch_first = batch_first
        self.im2col_step = im2col_step
        self.embed_dims = embed_dims
        self.num_levels = num_levels
        self.num_heads = num_heads
        self.num_points = num_points
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = nn.Linear(embed_dims, value_proj_size)
        self.output_proj = nn.Linear(value_proj_size, embed_dims)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's initialization: zero offsets' weights, offsets' bias on a ring of head
        directions scaled by point index, zero attention weights, Xavier-uniform projections."""
        nn.init.zeros_(self.sampling_offsets.weight)
        thetas = torch.arange(self.num_heads, dtype=torch.float32) * (
            2.0 * math.pi / self.num_heads
        )
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.num_heads, 1, 1, 2)
        grid = grid.repeat(1, self.num_levels, self.num_points, 1)
        grid = grid * torch.arange(1, self.num_points + 1, dtype=torch.float32).view(1, 1, -1, 1)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.view(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        identity: Tensor | None = None,
        query_pos: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        reference_points: Tensor | None = None,
        spatial_shapes: Tensor | None = None,
        level_start_index: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """mmcv's forward: ``query`` (num_query, bs, embed_dims), or (bs, num_query, embed_dims)
        with ``batch_first``; ``value`` likewise with num_key (default: ``query``);
        ``reference_points`` (bs, num_query, num_levels, 2 or 4) in [0, 1]; returns
        ``dropout(output_proj(attention)) + identity`` shaped like ``query``."""
        if reference_points is None or spatial_shapes is None or level_start_index is None:
            raise MultiScaleDeformableAttnError(
                "MultiScaleDeformableAttention.forward: reference_points, spatial_shapes and "
                "level_start_index are required (keyword arguments, as in mmcv)."
            )
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        bs, num_query, _ = query.shape
        _, num_value, _ = value.shape
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        offsets = self.sampling_offsets(query).view(
            bs, num_query, self.num_heads, self.num_levels, self.num_points, 2
        )
        weights = (
            self.attention_weights(query)
            .view(bs, num_query, self.num_heads, self.num_levels * self.num_points)
            .softmax(-1)
        )
        weights = weights.view(bs, num_query, self.num_heads, self.num_levels, self.num_points)
        if reference_points.shape[-1] == 2:
            normalizer = spatial_shapes.flip(-1)  # (W, H) per level; mmcv stacks two selects
            locations = (
                reference_points[:, :, None, :, None, :]
                + offsets / normalizer[None, None, None, :, None, :]
            )
        elif reference_points.shape[-1] == 4:
            locations = (
                reference_points[:, :, None, :, None, :2]
                + offsets / self.num_points * reference_points[:, :, None, :, None, 2:] * 0.5
            )
        else:
            raise MultiScaleDeformableAttnError(
                "MultiScaleDeformableAttention: last dim of reference_points must be 2 (x, y) or "
                f"4 (x, y, w, h), but got shape {tuple(reference_points.shape)}."
            )
        output = multi_scale_deformable_attn(
            value, spatial_shapes, level_start_index, locations, weights, self.im2col_step
        )
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity

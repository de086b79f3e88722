"""Does the file hold the model's weights? Initializers vs ``named_parameters``/``named_buffers``.

A file exported from a model built with other random weights (the CLI builds the model anew in
each process) fails verify for no fault of the translation; this says so up front.

Matching: an initializer with a parameter's (or buffer's) name is compared with it. A parameter
without a same-named initializer (the TorchScript exporter folds ``weight.t()`` into
``onnx::MatMul_12``, the dynamo exporter names folded constants ``val_3``) matches an unclaimed
initializer that holds its values (or their transpose for 2-D ones); failing that, it is paired
with the first unclaimed initializer of the same (or transposed) shape and dtype, in order
(reported as "shape+order": a folded constant that merely shares the shape can be paired by
mistake). Parameters with no candidate are not reported (folded into something else). When
every parameter the file holds under its own name equals the model's, such shape-and-order
pairings are folded constants and are not reported either.

Folded BatchNorm: the TorchScript exporter folds an eval-mode ``BatchNorm`` into the ``Conv``
(or ``Linear``) feeding it, so the file holds ``weight * gamma / sqrt(var + eps)`` per output
channel and a folded bias instead of either module's parameters. Each Conv/Linear followed by a
BatchNorm of its output width (consecutive modules under one parent, as in ``conv``/``norm``
blocks) is folded here the same way; an unclaimed initializer holding the folded weight explains
the pair (both modules' parameters and buffers, and the initializer holding the folded bias),
so nothing is reported. A file from other weights holds no such initializer: the parameters are
paired as usual and reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import warnings
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

__all__ = ["InitializerMismatch", "InitializerMismatchWarning", "compare_initializers"]


class InitializerMismatchWarning(UserWarning):
    """The ONNX file's initializers differ from the model's parameters/buffers."""


@dataclasses.dataclass(frozen=True)
class InitializerMismatch:
    """A parameter/buffer whose values differ from the initializer it was matched with."""

    parameter: str
    initializer: str
    matched_by: str  # "name" or "shape+order"
    shape: tuple[int, ...]
    max_abs_diff: float

    def describe(self) -> str:
        how = (
            "same name" if self.matched_by == "name" else "matched by shape and order, names differ"
        )
        return (
            f"initializer {self.initializer!r} differs from the model's {self.parameter!r} ({how},"
            f" shape {list(self.shape)}, max abs diff {self.max_abs_diff:.3g}): the file was"
            " exported from other weights (seed the model, or export and verify the same instance)"
        )


def _as_float(array: np.ndarray) -> np.ndarray:
    return array.astype(np.complex128 if np.iscomplexobj(array) else np.float64)


def _difference(param: np.ndarray, init: np.ndarray) -> float | None:
    """Max abs difference (also trying the transpose of 2-D values); None when shapes never fit."""
    best: float | None = None
    for candidate in (param, param.T) if param.ndim == 2 else (param,):
        if candidate.shape != init.shape:
            continue
        if _equal(candidate, init):  # the common case, without float64 copies
            return 0.0
        diff = float(np.max(np.abs(_as_float(candidate) - _as_float(init)), initial=0.0))
        best = diff if best is None else min(best, diff)
    return best


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(a, b, equal_nan=True)``, in one pass when no NaN is involved (its NaN
    handling copies both arrays through boolean masks: a tenth of a whole verify on 32 blocks)."""
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        with np.errstate(invalid="ignore"):
            if bool(np.equal(a, b).all()):
                return True
    return bool(np.array_equal(a, b, equal_nan=True))


# ONNX element types whose raw_data numpy can view as is (little-endian machines).
_VIEWABLE: dict[int, type[np.generic]] = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
}


def _initializer_array(init: onnx.TensorProto) -> np.ndarray:
    """The initializer's values: a read-only array over ``raw_data`` when possible (no further
    copy or byte-order pass), else `numpy_helper.to_array`."""
    dtype = _VIEWABLE.get(init.data_type)
    if (
        dtype is not None
        and sys.byteorder == "little"
        and init.HasField("raw_data")
        and init.data_location != onnx.TensorProto.EXTERNAL
    ):
        shape = tuple(init.dims)
        raw = init.raw_data  # protobuf hands out a copy per access: read it once
        if int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize == len(raw):
            return np.frombuffer(raw, dtype=dtype).reshape(shape)
    array = numpy_helper.to_array(init)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _same(param: np.ndarray, diff: float) -> bool:
    if diff == 0.0:  # the common case: no float64 copy of the parameter for its scale
        return True
    scale = float(np.max(np.abs(_as_float(param)), initial=0.0))
    return diff <= 1e-6 + 1e-5 * scale


@dataclasses.dataclass(frozen=True)
class _Fold:
    """A Conv/Linear followed by a BatchNorm, and what folding them into one node gives."""

    names: tuple[str, ...]  # the state entries of both modules
    weight_name: str  # the Conv/Linear weight's name (the dynamo exporter keeps it when folding)
    bias_name: str
    weight: np.ndarray
    bias: np.ndarray


_CONV_OR_LINEAR = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)
_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def _batch_norm_folds(model: torch.nn.Module) -> list[_Fold]:
    """Every Conv/Linear directly followed by a BatchNorm over its output channels (module doc)."""
    folds = []
    for parent_name, parent in model.named_modules():
        children = list(parent.named_children())
        for (name, first), (norm_name, norm) in itertools.pairwise(children):
            if not isinstance(first, _CONV_OR_LINEAR) or not isinstance(norm, _BATCH_NORMS):
                continue
            out = first.out_features if isinstance(first, torch.nn.Linear) else first.out_channels
            if norm.num_features != out or norm.running_var is None or norm.running_mean is None:
                continue
            fold = _fold(first, norm)
            prefix = f"{parent_name}." if parent_name else ""
            names = tuple(
                f"{prefix}{module}.{entry}"
                for module, sub in ((name, first), (norm_name, norm))
                for entry in sub.state_dict(keep_vars=True)
            )
            folds.append(_Fold(names, f"{prefix}{name}.weight", f"{prefix}{name}.bias", *fold))
    return folds


def _fold(first: Any, norm: Any) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        var = norm.running_var.double()
        scale = torch.rsqrt(var + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight.double()
        weight = first.weight.double()
        folded = weight * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        bias = (
            first.bias.double()
            if first.bias is not None
            else torch.zeros_like(var, dtype=torch.float64)
        )
        shift = norm.bias.double() if norm.bias is not None else 0.0
        folded_bias = (bias - norm.running_mean.double()) * scale + shift
    return folded.numpy(), folded_bias.numpy()


def _folded_close(expected: np.ndarray, init: np.ndarray) -> bool:
    """``init`` holds ``expected`` (computed in float64) up to the exporter's float32 rounding."""
    if expected.shape != init.shape:
        return False
    diff = float(np.max(np.abs(expected - _as_float(init)), initial=0.0))
    return diff <= 1e-5 + 1e-4 * float(np.max(np.abs(expected), initial=0.0))


def _claim_folds(
    model: torch.nn.Module, inits: dict[str, np.ndarray], unclaimed: list[str]
) -> set[str]:
    """The parameters explained by a folded BatchNorm whose folded weight the file holds (under
    the Conv's own name, as the dynamo exporter's optimizer leaves it, or a new one, as TorchScript
    names it); the initializers holding it (and the folded bias) leave ``unclaimed``."""
    explained: set[str] = set()
    for fold in _batch_norm_folds(model):
        weight = _holding(fold.weight, fold.weight_name, inits, unclaimed)
        if weight is None:
            continue
        bias = _holding(fold.bias, fold.bias_name, inits, unclaimed)
        for name in (weight, bias):
            if name in unclaimed:
                unclaimed.remove(name)
        explained.update(fold.names)
    return explained


def _holding(
    expected: np.ndarray, own: str, inits: dict[str, np.ndarray], unclaimed: list[str]
) -> str | None:
    candidates = [own] if own in inits else []
    return next((n for n in [*candidates, *unclaimed] if _folded_close(expected, inits[n])), None)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    t = tensor.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def compare_initializers(
    model: Any, proto: onnx.ModelProto, *, warn: bool = True
) -> list[InitializerMismatch]:
    """Parameters/buffers of ``model`` whose values differ from the file's (module doc)."""
    if not isinstance(model, torch.nn.Module):
        return []
    # Only the model's state (parameters and persistent buffers): a non-persistent buffer is a
    # derived constant (an index table, a grid) that exporters fold or rename freely, and pairing
    # it by shape and order with an unrelated constant reported weights that were never wrong.
    state = set(model.state_dict(keep_vars=True))
    params = {
        n: _to_numpy(t)
        for n, t in (*model.named_parameters(), *model.named_buffers())
        if t is not None and n in state
    }
    inits: dict[str, np.ndarray] = {}
    for init in proto.graph.initializer:
        try:
            inits[init.name] = _initializer_array(init)
        except Exception:  # external data not loaded, exotic types: nothing to compare
            continue
    found: list[InitializerMismatch] = []
    unclaimed = [n for n in inits if n not in params]
    unmatched = []
    has_norm = any(isinstance(m, _BATCH_NORMS) for m in model.modules())
    explained = _claim_folds(model, inits, unclaimed) if has_norm else set()
    for name, param in params.items():
        if name in explained:
            continue
        if name not in inits:
            unmatched.append(name)
            continue
        diff = _difference(param, inits[name])
        if diff is None or not _same(param, diff):
            found.append(
                InitializerMismatch(
                    name, name, "name", tuple(param.shape), float("inf") if diff is None else diff
                )
            )
    for name in unmatched:
        param = params[name]
        # the first unclaimed initializer (file order) holding the same values, else the first
        # that fits; the scan stops at the first equal one (files list the weights mostly in the
        # model's order, so a model of hundreds of same-shape biases is not compared all-to-all)
        first_fit: tuple[str, float] | None = None
        equal = None
        for n in unclaimed:
            if inits[n].dtype.kind != param.dtype.kind:
                continue
            d = _difference(param, inits[n])
            if d is None:
                continue
            if _same(param, d):
                equal = n
                break
            if first_fit is None:
                first_fit = (n, d)
        if equal is not None:
            unclaimed.remove(equal)
        elif first_fit is not None:
            unclaimed.remove(first_fit[0])
            found.append(
                InitializerMismatch(
                    name, first_fit[0], "shape+order", tuple(param.shape), first_fit[1]
                )
            )
    named = [n for n in params if n in inits and n not in explained]
    if named and not any(m.matched_by == "name" for m in found):
        # Every parameter the file holds by name is the model's: a parameter paired with a
        # differing initializer by shape and order alone was folded into a constant (the dynamo
        # exporter's optimizer folds ``bias + constant``), not exported from other weights.
        found = []
    if warn:
        for mismatch in found:
            warnings.warn(mismatch.describe(), InitializerMismatchWarning, stacklevel=3)
    return found

"""``fuse_file``: fuse the GridSample-based MSDA of an existing ONNX file into one node, proven.

1. find every MSDA subgraph (`onnx_custom.rewrite.msda_pattern`) and replace each with one
   ``onnx_custom::MultiScaleDeformableAttn`` node (or mmdeploy's node), everything else as it was
   (`onnx_custom.rewrite.apply`);
2. prove it: run the original and the fused model in ONNX Runtime (onnx-custom's kernels serve
   both node types) on seeded random inputs, at the file's sizes and, where inputs have symbolic
   dims, at a second size; any output differing beyond the tolerance raises `FuseProofError`.
   The two sessions open side by side in two threads (ONNX Runtime releases the GIL while it
   builds a session) with basic graph optimizations only (`PROOF_OPTIMIZATION`): on a
   file of tens of thousands of nodes opening the sessions is most of the proof's time, and
   ORT's extended/layout optimizers cost more there than they save on the one or two runs;
3. only then write ``output`` (atomically: the whole file or nothing; a model past protobuf's
   2 GiB limit as a model + external data pair).

A file without a match comes back unchanged (and is written byte for byte when ``output`` is
given); every GridSample left alone is a near-miss line in the report saying why.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnx_custom.common.atomic import atomic_write, check_output_path
from onnx_custom.common.external_data import (
    external_tensors,
    external_threshold,
    save_with_external_data,
    serialized_size,
)
from onnx_custom.errors import FuseProofError, InvalidArgumentError
from onnx_custom.rewrite.apply import VARIANTS, FusedNode, apply_matches
from onnx_custom.rewrite.graph_index import GraphIndex
from onnx_custom.rewrite.msda_pattern import NearMiss, find_msda
from onnx_custom.runtime.session import InferenceSession, load_model

__all__ = ["FuseReport", "OutputDiff", "fuse_file"]

DEFAULT_DIM = 2  # a symbolic input dim without a given size
RTOL, ATOL = 1e-4, 1e-5  # float32: summation order differs between GridSample and the fused kernel
# the proof sessions' graph optimizations: basic (constant folding, redundant nodes) opens a large
# file fastest; disabling them all leaves more nodes to build kernels for and is slower to open
PROOF_OPTIMIZATION = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


@dataclasses.dataclass(frozen=True)
class OutputDiff:
    """One output of one proof run: the largest difference and whether it is within tolerance."""

    trial: int
    output: str
    max_abs_diff: float
    ok: bool
    shape: tuple[int, ...]


@dataclasses.dataclass
class FuseReport:
    """What `fuse_file` did: fused nodes, near-misses, the proof's differences, timings."""

    variant: str
    fused: list[FusedNode]
    near_misses: list[NearMiss]
    nodes_before: int
    nodes_after: int
    proof: list[OutputDiff] = dataclasses.field(default_factory=list)
    proof_note: str = ""
    match_seconds: float = 0.0
    proof_seconds: float = 0.0
    written: str | None = None

    @property
    def count(self) -> int:
        return len(self.fused)

    @property
    def proven(self) -> bool:
        return bool(self.proof) and all(d.ok for d in self.proof)

    def __str__(self) -> str:
        domain, op_type = VARIANTS[self.variant]
        lines = [
            f"fused {self.count} multi-scale deformable attention subgraph(s) into"
            f" {domain}::{op_type} ({self.nodes_before} -> {self.nodes_after} nodes,"
            f" {self.match_seconds:.2f} s)"
        ]
        if not self.fused:
            lines[0] = "no multi-scale deformable attention subgraph found: the model is unchanged"
        lines += [f"  fused {f.describe()}" for f in self.fused]
        lines += [f"  near-miss: {m.describe()}" for m in self.near_misses]
        if self.proof:
            worst = max(self.proof, key=lambda d: d.max_abs_diff)
            trials = len({d.trial for d in self.proof})
            verdict = "proven" if self.proven else "NOT proven"
            lines.append(
                f"  {verdict}: ONNX Runtime outputs of the original and the fused model agree on"
                f" {trials} seeded input(s) (max |diff| {worst.max_abs_diff:.3g} on"
                f" {worst.output!r}, {self.proof_seconds:.2f} s)"
                if self.proven
                else f"  {verdict}: "
                + "; ".join(
                    f"trial {d.trial} {d.output!r} max |diff| {d.max_abs_diff:.3g}"
                    for d in self.proof
                    if not d.ok
                )
            )
        if self.proof_note:
            lines.append(f"  {self.proof_note}")
        if self.written:
            lines.append(f"  written: {self.written}")
        return "\n".join(lines)


def _load(model: Any) -> tuple[onnx.ModelProto, bytes | None, bool]:
    """(proto with every tensor's data, the file's bytes when it has no external data, whether
    the input kept tensors in external data)."""
    if isinstance(model, onnx.ModelProto):
        if external_tensors(model):
            load_model(model)  # raises ModelLoadError with the fix
        return model, None, False
    proto, source = load_model(model)
    if external_tensors(proto):
        proto, _ = load_model(model, with_data=True)
        return proto, None, True
    raw = Path(source).read_bytes() if isinstance(source, str) else source
    return proto, raw, False


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval_dim(text: str, dims: Mapping[str, int], size: int) -> int:
    """A symbolic dim: given in ``dims``, else an arithmetic expression of dim names as the
    dynamo exporter writes them (``4*h``: each name from ``dims`` or ``size``), else ``size``."""
    if text in dims:
        return int(dims[text])

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return int(dims.get(node.id, size))
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            return value(node.left) // max(value(node.right), 1)
        raise ValueError(text)

    try:
        return max(value(ast.parse(text, mode="eval").body), 1)
    except (SyntaxError, ValueError):
        return size


def _dims_of(info: onnx.ValueInfoProto, dims: Mapping[str, int], size: int) -> list[int]:
    return [
        d.dim_value if d.HasField("dim_value") else _eval_dim(d.dim_param, dims, size)
        for d in info.type.tensor_type.shape.dim
    ]


def _random_feeds(
    model: onnx.ModelProto, seed: int, dims: Mapping[str, int], size: int
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in initializers:
            continue
        elem = info.type.tensor_type.elem_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        shape = _dims_of(info, dims, size)
        if dtype == np.bool_:
            feeds[info.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[info.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _symbolic(model: onnx.ModelProto) -> bool:
    initializers = {t.name for t in model.graph.initializer}
    return any(
        not d.HasField("dim_value")
        for info in model.graph.input
        if info.name not in initializers
        for d in info.type.tensor_type.shape.dim
    )


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also returns ``names`` (untyped: ONNX Runtime infers them)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    copy.graph.output.extend(
        onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in present
    )
    return copy


def _proof_session(model: onnx.ModelProto, kernels: Any) -> InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = PROOF_OPTIMIZATION
    return InferenceSession(model, sess_options=options, kernels=kernels)


def _prove(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    report: FuseReport,
    *,
    probes: list[str],
    seed: int,
    dims: Mapping[str, int],
    inputs: Mapping[str, Any] | None,
    rtol: float,
    atol: float,
    kernels: Any,
) -> None:
    started = time.perf_counter()
    try:
        # each fused node's value is compared too, not only what reaches the graph outputs
        # (random weights may hide an attention output, e.g. a zero-initialised projection)
        with ThreadPoolExecutor(max_workers=2) as pool:
            opening = [
                pool.submit(_proof_session, _with_outputs(model, probes), kernels)
                for model in (original, fused)
            ]
            ref_session, new_session = (future.result() for future in opening)
    except Exception as exc:  # either file refused by ORT: say which, write nothing
        raise FuseProofError(
            f"fuse_file could not prove the fused model: ONNX Runtime refused a model ({exc});"
            " expected both the original and the fused model to run. Fix: check that the"
            " original runs in onnx_custom.InferenceSession; nothing was written.",
            report,
        ) from exc
    names = [o.name for o in ref_session.get_outputs()]
    trials = [(DEFAULT_DIM, seed)]
    if inputs is None and _symbolic(original):
        trials.append((DEFAULT_DIM + 1, seed + 1))
    for trial, (size, trial_seed) in enumerate(trials):
        feeds = (
            dict(inputs) if inputs is not None else _random_feeds(original, trial_seed, dims, size)
        )
        try:
            expected = ref_session.run(names, feeds)
        except Exception as exc:
            if trial > 0:  # the original itself refuses these sizes: nothing to compare
                report.proof_note = f"trial {trial} skipped: the original refuses sizes {size}"
                break
            raise FuseProofError(
                f"fuse_file could not prove the fused model: the original model fails in ONNX"
                f" Runtime on seeded random inputs ({exc}). Fix: pass inputs= (or dims=) the model"
                " accepts; nothing was written.",
                report,
            ) from exc
        try:
            actual = new_session.run(names, feeds)
        except Exception as exc:
            raise FuseProofError(
                f"fuse_file refused to write: the fused model fails in ONNX Runtime where the"
                f" original runs ({exc}); expected both to run. Fix: report the file; nothing"
                " was written.",
                report,
            ) from exc
        for name, want, got in zip(names, expected, actual, strict=True):
            want, got = np.asarray(want), np.asarray(got)
            if want.shape != got.shape:
                diff, ok = float("inf"), False
            elif np.issubdtype(want.dtype, np.floating):
                w64, g64 = want.astype(np.float64), got.astype(np.float64)
                finite = np.isfinite(w64) & np.isfinite(g64)
                scale = float(np.abs(w64[finite]).max()) if finite.any() else 0.0
                # atol shrinks with a value's scale: random weights can make an attention
                # output tiny (1e-17), where an absolute 1e-5 would accept anything
                close = np.isclose(g64, w64, rtol=rtol, atol=atol * min(1.0, scale), equal_nan=True)
                diff = float(np.abs(w64 - g64)[finite].max()) if finite.any() else 0.0
                ok = bool(close.all())
            else:
                ok = bool(np.array_equal(want, got))
                diff = 0.0 if ok else float("inf")
            report.proof.append(OutputDiff(trial, name, diff, ok, tuple(want.shape)))
    report.proof_seconds = time.perf_counter() - started
    if not report.proven:
        raise FuseProofError(
            "fuse_file refused to write: the fused model's ONNX Runtime outputs differ from the"
            f" original's beyond rtol={rtol}, atol={atol}:\n{report}\nExpected equal outputs."
            " Fix: report the file; fuse_file(..., prove=True) never writes an unproven model.",
            report,
        )


def fuse_file(
    model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    *,
    variant: str = "custom",
    output: str | os.PathLike[str] | None = None,
    prove: bool = True,
    inputs: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    rtol: float = RTOL,
    atol: float = ATOL,
    kernels: Any = None,
) -> tuple[onnx.ModelProto, FuseReport]:
    """Fuse every GridSample-based multi-scale deformable attention of ``model`` into one node.

    ``model``: a path, bytes or ``onnx.ModelProto`` (a file with external data: pass its path).
    ``variant``: ``"custom"`` (``onnx_custom::MultiScaleDeformableAttn``) or ``"mmdeploy"``
    (``mmdeploy::MMCVMultiScaleDeformableAttention``, for mmdeploy's TensorRT plugin).
    ``prove``: run both models in ONNX Runtime (seeded random ``inputs``, symbolic input dims
    from ``dims`` or 2, then 3) and raise `FuseProofError` when an output differs beyond
    ``rtol``/``atol``; ``prove=False`` returns the unproven model and cannot write.
    ``output``: write the fused model there, atomically, only once proven.
    ``kernels``: as for `onnx_custom.InferenceSession` (``"native"`` for the C++ library).

    Returns ``(fused model, FuseReport)``; with no match the model is returned unchanged.
    """
    if variant not in VARIANTS:
        raise InvalidArgumentError(
            f"variant must be one of {sorted(VARIANTS)}; received {variant!r}. Fix: pass"
            " variant='custom' (onnx_custom::MultiScaleDeformableAttn) or variant='mmdeploy'."
        )
    if output is not None and not prove:
        raise InvalidArgumentError(
            "fuse_file writes only proven models; received output= with prove=False. Fix: drop"
            " prove=False, or drop output= and save the returned model yourself."
        )
    final = None if output is None else check_output_path(output, what="output")
    proto, raw, had_external = _load(model)
    started = time.perf_counter()
    index = GraphIndex(proto.graph)
    matches, misses = find_msda(index)
    fused, fused_nodes = apply_matches(proto, index, matches, variant) if matches else (proto, [])
    report = FuseReport(
        variant=variant,
        fused=fused_nodes,
        near_misses=misses,
        nodes_before=len(proto.graph.node),
        nodes_after=len(fused.graph.node),
        match_seconds=time.perf_counter() - started,
    )
    if not matches:
        report.proof_note = "nothing fused: no proof needed"
    elif prove:
        _prove(
            proto,
            fused,
            report,
            probes=[m.output for m in matches],
            seed=seed,
            dims=dims or {},
            inputs=inputs,
            rtol=rtol,
            atol=atol,
            kernels=kernels,
        )
    else:
        report.proof_note = "not proven (prove=False)"
    if final is not None:
        if not matches and raw is not None:
            atomic_write(final, raw)
        elif had_external or serialized_size(fused) > external_threshold():
            save_with_external_data(fused, final)
        else:
            atomic_write(final, fused.SerializeToString())
        report.written = str(final)
    return fused, report

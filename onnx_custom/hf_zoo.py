"""The real-model zoo: transformers detectors (`onnx_custom.models.hf_detectors`) exported with
both exporters, verified in ONNX Runtime, and checked against what raw ``torch.onnx.export`` does.

``onnx-custom zoo --hf`` runs it. Each row (a family under one exporter) is a chain of steps, one
function each, whose options pass through (`HfOptions`): build, export, raw torch export,
verify at the export size, verify at other sizes/batches (a dynamic file), ORT run, and with
``fuse=True`` a fused export verified against the unfused model (`HfFused`). A row whose
export fails is checked against raw ``torch.onnx.export``: when torch fails too the row says
``torch-fails`` with torch's reason, never a silent skip; when ours exports and torch's does not,
the row's "beyond torch" column says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from onnx_custom.common.rng import DEFAULT_SEED
from onnx_custom.errors import OnnxCustomError

__all__ = [
    "EXPORTERS",
    "HfFused",
    "HfOptions",
    "HfResult",
    "family_names",
    "format_hf_table",
    "raw_torch_export",
    "recognised_attention",
    "run_hf_row",
    "run_hf_zoo",
    "transformers_missing",
]

EXPORTERS = ("dynamo", "torchscript")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
MIN_OTHER_SIZES = 1
"""A dynamic row must verify at this many sizes besides the export one."""


def transformers_missing() -> str:
    """Why the hf zoo cannot run here ("" when it can)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return (
            "transformers is not installed; the hf zoo needs the hf extra:"
            " pip install -c constraints.txt -e '.[hf]'"
        )
    return ""


def family_names() -> list[str]:
    from onnx_custom.models.hf_detectors import family_names as names

    return names()


@dataclasses.dataclass(frozen=True)
class HfOptions:
    """What every step of a row receives (new columns add a field here, e.g. fusion)."""

    seed: int = DEFAULT_SEED
    opset: int | None = None
    check_torch: bool = True  # also export with raw torch.onnx.export ("beyond torch" column)
    dynamic: bool = True  # verify at other sizes where the family allows dynamic dims
    # float32 through dozens of layers: torch.testing's per-op defaults (1.3e-6, 1e-5) flag
    # single elements a few ulps off (D-FINE: 1.45e-5 at |2.2|); None keeps those defaults
    rtol: float | None = 1e-4
    atol: float | None = 1e-4
    export_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    fuse: bool = False  # also export with fuse=True and verify that file (the "fused" column)


@dataclasses.dataclass
class HfFused:
    """The fused column: an export with ``fuse=True`` verified against the model as written."""

    status: str  # "pass", "fail", "not-fused" (no attention module our op computes)
    msda_nodes: int = 0  # onnx_custom::MultiScaleDeformableAttn nodes in the fused file
    grid_samples: int = 0  # GridSample nodes left in the fused file
    reasons: list[str] = dataclasses.field(default_factory=list)  # the report's not-fused sites
    detail: str = ""  # why it failed, or why nothing was fused

    def describe(self) -> str:
        if self.status == "not-fused":
            return f"not fused: {self.detail}"
        text = f"{self.msda_nodes} MSDA, {self.grid_samples} GridSample"
        if self.reasons:
            text += f"; {len(self.reasons)} not fused: {self.reasons[0]}"
        if self.status == "fail":
            text += f"; FAIL: {self.detail}"
        return text


@dataclasses.dataclass
class HfResult:
    family: str
    exporter: str
    status: str  # "pass", "fail", "torch-fails"
    detail: str = ""
    torch: str = ""  # raw torch.onnx.export: "ok", "fails: <reason>" or "" (not checked)
    sizes: str = ""  # where verify ran: "1x3x64x64" and other sizes
    nodes: int = 0
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # per step
    fused: HfFused | None = None  # with HfOptions(fuse=True) and an unfused export that passed

    @property
    def beyond_torch(self) -> bool:
        """We export (and verify) a model raw torch cannot export."""
        return self.status == "pass" and self.torch.startswith("fails")

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


# ---------------------------------------------------------------------------- steps


def build_step(family: str, options: HfOptions) -> tuple[Any, tuple[Any, ...], Any]:
    """The family's model, example inputs and `HfFamily` entry."""
    from onnx_custom.models.hf_detectors import FAMILIES, build

    model, args = build(family, options.seed)
    return model, args, FAMILIES[family]


def dynamic_shapes_of(entry: Any, exporter: str) -> Any:
    """The family's dynamic dims in the exporter's form (None: a static file)."""
    if entry.dynamic is None:
        return None
    if exporter == "torchscript":
        return None  # the tracer bakes these models' feature-map sizes into the graph
    return tuple(dims or None for dims in entry.dynamic)


def _first_line(exc: BaseException) -> str:
    """The reason in one line: the innermost cause's first line (torch wraps the missing op in
    two generic "Failed to convert" layers), without terminal colours; for torch.export's
    data-dependent guard, the model's line that raised it."""
    from onnx_custom.exporter.constraints import data_dependent_site

    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    lines = [line.strip() for line in _ANSI.sub("", str(inner)).splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if len(lines) > 1 and len(head) < 40:  # a bare header ("4 op(s) cannot be exported:")
        head = f"{head} {lines[1]}"
    site = data_dependent_site(inner)
    where = f" (at {site})" if site else ""
    return f"{type(inner).__name__}: {head[:300]}{where}"


def export_step(
    model: Any, args: tuple[Any, ...], exporter: str, dynamic: Any, options: HfOptions
) -> Any:
    from onnx_custom.api import export

    with contextlib.redirect_stdout(io.StringIO()):  # torch's dynamo exporter prints progress
        return export(
            model,
            args,
            exporter=exporter,
            opset=options.opset,
            dynamic_shapes=dynamic,
            fuse=options.fuse,
            **options.export_kwargs,
        )


def raw_torch_export(model: Any, args: tuple[Any, ...], exporter: str, dynamic: Any = None) -> str:
    """Export with ``torch.onnx.export`` alone and load the file in ONNX Runtime: "ok" or
    "fails: <torch's or ORT's reason>"."""
    import onnxruntime as ort
    import torch

    from onnx_custom.common.torch_chatter import quiet_torch

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "raw.onnx")
        try:
            with quiet_torch(), contextlib.redirect_stdout(io.StringIO()):
                if exporter == "dynamo":
                    torch.onnx.export(model, args, path, dynamo=True, dynamic_shapes=dynamic)
                else:
                    torch.onnx.export(model, args, path, dynamo=False)
        except Exception as exc:
            return f"fails: {_first_line(exc)}"
        try:
            ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as exc:
            return f"fails: ONNX Runtime refuses torch's file: {_first_line(exc)}"
    return "ok"


def verify_step(
    model: Any, args: tuple[Any, ...], proto: Any, dynamic: Any, options: HfOptions
) -> Any:
    from onnx_custom.verification.verifier import verify

    return verify(
        model,
        args,
        proto,
        raise_on_mismatch=False,
        seed=options.seed,
        rtol=options.rtol,
        atol=options.atol,
        dynamic_shapes=dynamic if options.dynamic else None,
    )


def ort_run_step(model: Any, proto: Any, args: tuple[Any, ...]) -> float:
    """Seconds of one ONNX Runtime run of the file on the example inputs (after one warm-up).

    Inputs bind by ``forward``'s parameter names: an input the model never reads (OmDet-Turbo's
    task tokens under TorchScript) is not in the file, so positions would not line up."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = [i.name for i in session.get_inputs()]
    names = list(inspect.signature(model.forward).parameters)
    by_name = {n: a for n, a in zip(names, args, strict=False) if n in wanted}
    if len(by_name) != len(wanted):
        by_name = dict(zip(wanted, args, strict=False))
    feeds = {n: a.numpy() for n, a in by_name.items()}
    session.run(None, feeds)
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def _sizes(report: Any, args: tuple[Any, ...]) -> tuple[str, int]:
    shape = "x".join(map(str, args[0].shape))
    other = [t for t in report.shapes_tried if t.kind == "shape" and t.status == "passed"]
    text = shape + "".join(
        f"; {','.join(f'{k}={v}' for k, v in dict(t.sizes).items())}" for t in other
    )
    return text, len(other)


def _count_nodes(proto: Any, op_type: str, domain: str | None = None) -> int:
    """Nodes of ``op_type`` in the graph, its subgraphs and the file's functions."""

    def walk(nodes: Iterable[Any]) -> int:
        total = 0
        for node in nodes:
            if node.op_type == op_type and (domain is None or node.domain == domain):
                total += 1
            for attr in node.attribute:
                for graph in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                    total += walk(graph.node)
        return total

    return walk(proto.graph.node) + sum(walk(f.node) for f in proto.functions)


def recognised_attention(model: Any) -> int:
    """How many places fusion can replace: module instances of a recognised attention class, and
    the recognised attention functions the model's own modeling modules define or import."""
    import sys

    from onnx_custom.fusion import msda

    classes = (*msda.library_modules(), *(cls for cls, _ in msda.library_v2_modules()))
    instances = sum(isinstance(m, classes) for m in model.modules()) if classes else 0
    functions = msda.library_functions()
    namespaces = {type(m).__module__ for m in model.modules()}
    used = {
        id(fn)
        for name in namespaces
        if (module := sys.modules.get(name)) is not None
        for fn in functions
        if any(v is fn for v in vars(module).values())
    }
    return instances + len(used)


def fused_step(
    model: Any, args: tuple[Any, ...], entry: Any, exporter: str, dynamic: Any, options: HfOptions
) -> HfFused:
    """Export with ``fuse=True`` and verify the file against the model as written (unfused)."""
    from onnx_custom.fusion import fusion_report

    if not recognised_attention(model):
        why = entry.fusion_note or "no recognised deformable attention implementation in the model"
        return HfFused("not-fused", detail=why)
    try:
        proto = export_step(model, args, exporter, dynamic, dataclasses.replace(options, fuse=True))
    except Exception as exc:
        return HfFused("fail", detail=_first_line(exc))
    report = fusion_report(proto)
    fused = HfFused(
        "fail",
        msda_nodes=_count_nodes(proto, "MultiScaleDeformableAttn", "onnx_custom"),
        grid_samples=_count_nodes(proto, "GridSample"),
        reasons=[s.describe() for s in report.not_fused] if report is not None else [],
    )
    if report is None or not report.fused:
        fused.status = "not-fused"
        fused.detail = fused.reasons[0] if fused.reasons else "the fusion report is empty"
        return fused
    try:
        verified = verify_step(model, args, proto, dynamic, options)
    except Exception as exc:
        fused.detail = _first_line(exc)
        return fused
    if not verified.passed:
        fused.detail = str(verified).strip().splitlines()[0]
        return fused
    fused.status = "pass"
    return fused


# ---------------------------------------------------------------------------- a row


def run_hf_row(family: str, exporter: str, options: HfOptions | None = None) -> HfResult:
    """Build, export, verify and run one family under one exporter; never raises."""
    options = options or HfOptions()
    unfused = dataclasses.replace(options, fuse=False)
    result = HfResult(family, exporter, "fail")
    clock = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        result.seconds[step] = now - clock
        clock = now

    try:
        model, args, entry = build_step(family, options)
        lap("build")
        dynamic = dynamic_shapes_of(entry, exporter) if options.dynamic else None
        try:
            proto = export_step(model, args, exporter, dynamic, unfused)
        except Exception as exc:
            lap("export")
            result.detail = _first_line(exc)
            result.torch = raw_torch_export(model, args, exporter, dynamic)
            lap("torch")
            if result.torch.startswith("fails"):
                result.status = "torch-fails"
            return result
        lap("export")
        result.nodes = len(proto.graph.node)
        if options.check_torch:
            result.torch = raw_torch_export(model, args, exporter, dynamic)
            lap("torch")
        report = verify_step(model, args, proto, dynamic, options)
        lap("verify")
        result.sizes, other = _sizes(report, args)
        if not report.passed:
            result.detail = str(report).strip().splitlines()[0]
            return result
        if dynamic is not None and other < MIN_OTHER_SIZES:
            result.detail = f"dynamic file verified at {other} other size(s)"
            return result
        result.seconds["ort run"] = ort_run_step(model, proto, args)
        clock = time.perf_counter()
        result.status = "pass"
        if options.fuse:
            result.fused = fused_step(model, args, entry, exporter, dynamic, options)
            lap("fused")
    except Exception as exc:
        result.detail = _first_line(exc)
        if not isinstance(exc, OnnxCustomError):
            result.detail = f"unexpected: {result.detail}"
    return result


def run_hf_zoo(
    families: Iterable[str] | None = None,
    exporters: Sequence[str] = EXPORTERS,
    options: HfOptions | None = None,
    on_row: Callable[[HfResult], None] | None = None,
) -> list[HfResult]:
    """Every (family, exporter) row, in order; ``on_row`` hears each result as it lands."""
    missing = transformers_missing()
    if missing:
        raise OnnxCustomError(missing)
    known = family_names()
    wanted = list(families) if families else known
    unknown = [f for f in wanted if f not in known]
    if unknown:
        raise OnnxCustomError(
            f"Unknown hf zoo family {unknown}; expected names from: {', '.join(known)}."
        )
    results = []
    for family in wanted:
        for exporter in exporters:
            result = run_hf_row(family, exporter, options)
            results.append(result)
            if on_row is not None:
                on_row(result)
    return results


def format_hf_row(r: HfResult) -> str:
    beyond = "yes" if r.beyond_torch else ""
    torch_col = r.torch if len(r.torch) <= 60 else r.torch[:57] + "..."
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in r.seconds.items() if k != "ort run")
    ort = f"; ORT run {r.seconds['ort run'] * 1000:.1f} ms" if "ort run" in r.seconds else ""
    what = r.sizes if r.status == "pass" else r.detail
    fused = f"  fused: {r.fused.describe()}" if r.fused is not None else ""
    return (
        f"{r.family:<15} {r.exporter:<12} {r.status.upper():<12} {r.total:>6.1f}s"
        f"  {beyond:<6} {torch_col:<60}  {what} ({steps}{ort}){fused}"
    )


def format_hf_table(results: Sequence[HfResult]) -> str:
    head = (
        f"{'family':<15} {'exporter':<12} {'status':<12} {'time':>7}  {'beyond':<6}"
        f" {'raw torch.onnx.export':<60}  verified at / why (steps)"
    )
    passed = sum(r.status == "pass" for r in results)
    failed = sum(r.status == "fail" for r in results)
    torch_fails = sum(r.status == "torch-fails" for r in results)
    beyond = sum(r.beyond_torch for r in results)
    counts = (
        f"{passed} passed, {failed} failed, {torch_fails} that torch cannot export either;"
        f" {beyond} beyond torch"
    )
    fused = [r.fused for r in results if r.fused is not None]
    if fused:
        counts += (
            f"; fused: {sum(f.status == 'pass' for f in fused)} passed,"
            f" {sum(f.status == 'fail' for f in fused)} failed,"
            f" {sum(f.status == 'not-fused' for f in fused)} not fused"
        )
    return "\n".join([head, *map(format_hf_row, results), counts])

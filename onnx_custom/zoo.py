"""The model zoo: every example model in `onnx_custom.models`, exported with both exporters at
the opsets that matter, verified in ONNX Runtime. ``onnx-custom zoo`` streams the rows.

Every model also gets `compile_rows`: ``torch.compile(model, backend=onnx_custom)`` vs eager
(``compile-opset18-custom``) and, when the module declares ``dynamic_shapes``, the same under
``dynamic=True`` at other batch sizes with no recompile (``compile-opset18-custom-dynamic``).

A model module declares ``Model``, ``example_inputs()``, optionally ``dynamic_shapes`` and
``input_generator``, and ``ZOO``: its rows (`ZooCase`). A ``dynamic=True`` row exports with
``dynamic_shapes`` and must verify at `MIN_OTHER_SIZES` or more other sizes of its dynamic dims.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, Protocol

from onnx_custom.common.native_build import builds_announced_by_caller
from onnx_custom.common.rng import DEFAULT_SEED, seeded
from onnx_custom.errors import OnnxCustomError
from onnx_custom.testing import ZooCase

__all__ = [
    "COMPILE",
    "COMPILE_OPSET",
    "MIN_OTHER_SIZES",
    "NATIVE_BUILDS",
    "NativeBuild",
    "ZooListener",
    "ZooResult",
    "compile_rows",
    "counts_line",
    "discover",
    "format_table",
    "list_zoo",
    "pending_builds",
    "run_builds",
    "run_case",
    "run_compile_case",
    "run_zoo",
]

MIN_OTHER_SIZES = 3
"""A dynamic row passes only if verify ran (and passed) at this many sizes besides the export
one."""


NOT_ZOO_MODELS = frozenset({"hf_detectors"})
"""Modules of `onnx_custom.models` that are not zoo models (``onnx-custom zoo --hf`` runs them)."""

MODULE_ROW = ZooCase("", 0)
"""The case of a result that stands for a whole model module (import failed or skipped)."""


@dataclasses.dataclass(frozen=True)
class ZooResult:
    model: str
    case: ZooCase
    status: str  # "pass", "fail", "skip"
    detail: str
    seconds: float
    nodes: str = ""
    # The VerificationReport of a verified row (per-output statistics for --report files).
    report: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def summary(self) -> str:
        """One line: the worst difference and the sizes tried, or the first line of the problem."""
        if self.report is None or self.status != "pass":
            return self.detail.splitlines()[0] if self.detail else ""
        worst = max((c.max_abs_diff for c in self.report.comparisons), default=0.0)
        other = [
            dict(t.sizes)
            for t in self.report.shapes_tried
            if t.kind == "shape" and t.status == "passed"
        ]
        if not other:
            return f"max abs {worst:.2g}"
        names = sorted({k for sizes in other for k in sizes})
        sizes = "; ".join(f"{n} {','.join(str(s[n]) for s in other if n in s)}" for n in names)
        return f"max abs {worst:.2g}; also at {sizes}"


# ---------------------------------------------------------------------------- native builds


@dataclasses.dataclass(frozen=True)
class NativeBuild:
    """A one-time native build zoo rows need (then cached on disk by source hash).

    `run_zoo` runs the pending ones before the first row, each announced with its usual
    duration, so no row's time (or the ETA) includes a build.
    """

    name: str
    duration: str
    built: Callable[[], bool]  # already in the build cache?
    build: Callable[[], Any]  # build (or load) it
    models: frozenset[str] | None  # zoo models needing it; None: every model


def _shim_built() -> bool:
    from onnx_custom.runtime.shim_build import shim_built

    return shim_built()


def _build_shim() -> None:
    from onnx_custom.runtime.shim_build import shim_path

    shim_path()


def _extension_built(module: str) -> bool:
    """Whether the C++ extension of ``module`` (which has ``build_directory()``) is cached."""
    from onnx_custom.common.native_build import extension_built

    return extension_built(importlib.import_module(module).build_directory())


def _load_extension(module: str, loader: str = "load_extension") -> None:
    getattr(importlib.import_module(module), loader)()


def _extension_build(
    name: str, duration: str, module: str, models: set[str], loader: str = "load_extension"
) -> NativeBuild:
    return NativeBuild(
        name,
        duration,
        functools.partial(_extension_built, module),
        functools.partial(_load_extension, module, loader),
        frozenset(models),
    )


NATIVE_BUILDS = (
    NativeBuild("ONNX Runtime kernel shim (C)", "~5 s", _shim_built, _build_shim, None),
    _extension_build(
        "onnx_custom_ext C++ extension",
        "~30 s",
        "onnx_custom.ops.extension",
        {"my_add_ext", "autograd_fn"},
        loader="load_my_ops",
    ),
    _extension_build(
        "deform_conv2d C++ kernels", "~30-60 s", "onnx_custom.ops.deform_conv", {"deform_conv"}
    ),
    _extension_build(
        "bev_pool_v2 C++ kernels", "~30-60 s", "onnx_custom.ops.bev_pool", {"bev_pool"}
    ),
    _extension_build(
        "multi_scale_deformable_attn C++ kernels", "~30-60 s", "onnx_custom.ops.msda", {"msda"}
    ),
)


def pending_builds(models: Iterable[str]) -> list[NativeBuild]:
    """The `NATIVE_BUILDS` these zoo models need that are not cached yet."""
    wanted = set(models)
    pending = []
    for build in NATIVE_BUILDS:
        if build.models is not None and not build.models & wanted:
            continue
        try:
            done = build.built()
        except Exception:  # cannot even tell (a broken install): let the build itself report it
            done = False
        if not done:
            pending.append(build)
    return pending


def run_builds(builds: Sequence[NativeBuild], listener: ZooListener | None = None) -> None:
    """Build each one now (a failure is left to the rows needing it: they skip or fail)."""
    for build in builds:
        if listener is not None:
            listener.building(build)
        start = time.perf_counter()
        error: BaseException | None = None
        try:
            with builds_announced_by_caller():  # the listener reports it (no second announcement)
                build.build()
        except Exception as exc:
            error = exc
        if listener is not None:
            listener.built(build, time.perf_counter() - start, error)


# ---------------------------------------------------------------------------- listener


class ZooListener(Protocol):
    """What `run_zoo` reports while it runs (`onnx_custom.cli.zoo_console.ZooConsole` prints it)."""

    def pending(self, builds: Sequence[NativeBuild]) -> None: ...
    def building(self, build: NativeBuild) -> None: ...
    def built(self, build: NativeBuild, seconds: float, error: BaseException | None) -> None: ...
    def planned(self, rows: Sequence[tuple[str, ZooCase]]) -> None: ...
    def started(self, index: int, total: int, model: str, case: ZooCase) -> None: ...
    def finished(self, index: int, total: int, result: ZooResult) -> None: ...


# ---------------------------------------------------------------------------- running


def discover(names: Iterable[str] | None = None) -> dict[str, Any]:
    """Example-model modules by short name (``asinh`` -> ``onnx_custom.models.asinh``)."""
    import onnx_custom.models as package

    wanted = set(names) if names else None
    found = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in NOT_ZOO_MODELS:
            continue
        if wanted is not None and info.name not in wanted:
            continue
        found[info.name] = f"{package.__name__}.{info.name}"
    if wanted is not None and wanted - set(found):
        raise OnnxCustomError(
            f"Unknown zoo model(s) {sorted(wanted - set(found))}; expected names from:"
            f" {', '.join(discover())}; fix: see `onnx-custom zoo --list`."
        )
    return found


def _node_summary(proto: Any) -> str:
    kinds: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type == "Constant":
            continue
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(k if v == 1 else f"{k} x{v}" for k, v in kinds.items())


def _dynamic_shortfall(report: Any) -> str:
    """Why a dynamic row's verification did not cover `MIN_OTHER_SIZES` other sizes
    ('' if it did)."""
    other = [t for t in report.shapes_tried if t.kind == "shape"]
    passed = [t for t in other if t.status == "passed"]
    if len(passed) >= MIN_OTHER_SIZES:
        return ""
    skipped = "; ".join(t.describe() for t in other if t.status == "skipped")
    why = (
        f"skipped: {skipped}"
        if skipped
        else (
            "the file's dynamic dims and their ranges allow no more; check the module's"
            " dynamic_shapes"
        )
    )
    return (
        f"dynamic row verified at {len(passed)} other size(s), expected at least {MIN_OTHER_SIZES}"
        f" ({why})"
    )


COMPILE = "compile"
"""The `ZooCase.exporter` of a compile row (run by `run_compile_case`, not exported)."""
COMPILE_OPSET = 18
_NO_BATCH = (
    "no dynamic_shapes: the model declares no dynamic batch, so dynamic=True has nothing to sweep"
)


def compile_rows(module: Any) -> tuple[ZooCase, ...]:
    """The compile rows every zoo model gets (the dynamic one skips without ``dynamic_shapes``)."""
    has_batch = getattr(module, "dynamic_shapes", None) is not None
    return (
        ZooCase(COMPILE, COMPILE_OPSET, "custom", note="torch.compile vs eager"),
        ZooCase(
            COMPILE,
            COMPILE_OPSET,
            "custom",
            dynamic=True,
            note="dynamic=True, other batch sizes, no recompile",
            skip=None if has_batch else _NO_BATCH,
        ),
    )


def _rows(module: Any) -> tuple[ZooCase, ...]:
    return tuple(getattr(module, "ZOO", ())) + compile_rows(module)


def run_compile_case(
    name: str, module: Any, case: ZooCase, registry: Any, seed: int, start: float
) -> ZooResult:
    """A compile row: `onnx_custom.compile.zoo_rows.check_compiled` as a `ZooResult`."""
    from onnx_custom.compile.zoo_rows import check_compiled

    with seeded(seed):
        model = module.Model().eval()
        args = module.example_inputs()
    dynamic = getattr(module, "dynamic_shapes", None) if case.dynamic else None
    if case.dynamic and dynamic is None:
        raise OnnxCustomError(
            f"zoo row {case.label} is dynamic but {module.__name__} has no dynamic_shapes"
        )
    check = check_compiled(
        model, args, dynamic_shapes=dynamic, seed=seed, registry=registry, opset=case.opset
    )
    where = (
        f"ORT {check.ort_nodes}/{check.nodes} nodes, {check.partitions} partition(s),"
        f" {check.graphs} graph(s)"
    )
    if check.fallbacks:
        where += f"; eager: {', '.join(check.fallbacks)}"
    seconds = time.perf_counter() - start
    if not check.passed:
        return ZooResult(
            name,
            case,
            "fail",
            check.describe() or "the compiled model produced no output to compare",
            seconds,
            where,
        )
    sizes = f"; batch {','.join(map(str, check.batches))}, no recompile" if case.dynamic else ""
    return ZooResult(name, case, "pass", f"max abs {check.worst:.2g}{sizes}", seconds, where)


def run_case(name: str, module: Any, case: ZooCase, *, seed: int = DEFAULT_SEED) -> ZooResult:
    """Export and verify one row; never raises (failures become ``status="fail"`` rows)."""
    from onnx_custom.api import export
    from onnx_custom.translate.registry import default_registry
    from onnx_custom.verification.verifier import verify

    start = time.perf_counter()
    if case.skip:
        return ZooResult(name, case, "skip", case.skip, 0.0)
    try:
        with seeded(seed):
            model = module.Model().eval()
            args = module.example_inputs()
        registry = default_registry()
        if case.variant:
            registry = registry.with_variants(case.variant)
        if case.exporter == COMPILE:
            return run_compile_case(name, module, case, registry, seed, start)
        dynamic = getattr(module, "dynamic_shapes", None) if case.dynamic else None
        if case.dynamic and dynamic is None:
            raise OnnxCustomError(
                f"zoo row {case.label} is dynamic but {module.__name__} has no dynamic_shapes"
            )
        try:
            proto = export(
                model,
                args,
                exporter=case.exporter,
                opset=case.opset,
                registry=registry,
                dynamic_shapes=dynamic,
                progress=False,  # the zoo draws its own progress line
            )
        except OnnxCustomError as exc:
            if case.expect_error and case.expect_error in str(exc):
                return ZooResult(
                    name,
                    case,
                    "pass",
                    f"refused as documented: {case.note}",
                    time.perf_counter() - start,
                )
            raise
        if case.expect_error:
            return ZooResult(
                name,
                case,
                "fail",
                f"expected a refusal containing {case.expect_error!r}",
                time.perf_counter() - start,
            )
        generator = getattr(module, "input_generator", None)
        report = verify(
            model,
            args,
            proto,
            trials=case.trials,
            input_generator=generator,
            raise_on_mismatch=False,
            seed=seed,
            dynamic_shapes=dynamic,
            progress=False,
        )
        shortfall = _dynamic_shortfall(report) if case.dynamic else ""
        status = "pass" if report.passed and not shortfall else "fail"
        detail = "" if status == "pass" else "\n".join(filter(None, [shortfall, str(report)]))
        return ZooResult(
            name, case, status, detail, time.perf_counter() - start, _node_summary(proto), report
        )
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, OnnxCustomError):
            detail += "\n" + traceback.format_exc(limit=6)
        return ZooResult(name, case, "fail", detail, time.perf_counter() - start)


def _import(short: str, module_name: str) -> ModuleType | ZooResult:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        skip_reason = getattr(exc, "skip_reason", None)
        status = "skip" if skip_reason else "fail"
        return ZooResult(
            short,
            MODULE_ROW,
            status,
            skip_reason or f"import failed: {type(exc).__name__}: {exc}",
            0.0,
        )


def run_zoo(
    names: Iterable[str] | None = None,
    *,
    seed: int = DEFAULT_SEED,
    listener: ZooListener | None = None,
) -> list[ZooResult]:
    """Run every row of the named zoo models (default: all), in order; ``listener`` hears why."""
    modules = discover(names)
    pending = pending_builds(modules)
    if listener is not None:
        listener.pending(pending)
    run_builds(pending, listener)
    rows: list[tuple[str, ModuleType | None, ZooCase, ZooResult | None]] = []
    for short, module_name in modules.items():
        imported = _import(short, module_name)
        if isinstance(imported, ZooResult):
            rows.append((short, None, MODULE_ROW, imported))
            continue
        rows += [(short, imported, case, None) for case in _rows(imported)]
    if listener is not None:
        listener.planned([(short, case) for short, _, case, _ in rows])
    results = []
    for index, (short, module, case, done) in enumerate(rows, start=1):
        if listener is not None:
            listener.started(index, len(rows), short, case)
        result = done if done is not None else run_case(short, module, case, seed=seed)
        results.append(result)
        if listener is not None:
            listener.finished(index, len(rows), result)
    return results


def list_zoo(names: Iterable[str] | None = None) -> str:
    """The zoo's models and rows (``onnx-custom zoo --list``), importing nothing but the models."""
    lines = []
    for short, module_name in discover(names).items():
        imported = _import(short, module_name)
        if isinstance(imported, ZooResult):
            lines.append(f"{short}: {imported.status.upper()} ({imported.detail.splitlines()[0]})")
            continue
        doc = (imported.__doc__ or "").strip().splitlines()
        lines.append(f"{short}: {doc[0] if doc else ''}")
        for case in _rows(imported):
            extra = (
                f"  (skip: {case.skip})" if case.skip else (f"  ({case.note})" if case.note else "")
            )
            lines.append(f"  {case.label}{extra}")
    return "\n".join(lines)


def format_table(results: Sequence[ZooResult]) -> str:
    """All rows as a table (nodes last, never truncated) and the counts."""
    model_width = max((len(r.model) for r in results), default=5)
    case_width = max((len(r.case.label) for r in results), default=4)
    rows = [
        f"{'model':<{model_width}}  {'case':<{case_width}}  {'status':<6} {'time':>7} "
        f" {'result':<40}  nodes"
    ]
    for r in results:
        rows.append(
            f"{r.model:<{model_width}}  {r.case.label:<{case_width}}  {r.status.upper():<6}"
            f" {r.seconds:>6.1f}s  {r.summary:<40}  {r.nodes}"
        )
    rows.append(counts_line(results))
    return "\n".join(rows)


def counts_line(results: Sequence[ZooResult]) -> str:
    passed = sum(r.status == "pass" for r in results)
    failed = sum(r.status == "fail" for r in results)
    skipped = sum(r.status == "skip" for r in results)
    return f"{passed} passed, {failed} failed, {skipped} skipped"

"""The model zoo: every example model in `onnx_custom.models`, exported with both exporters at
the opsets that matter, verified in ONNX Runtime. ``onnx-custom zoo`` prints the table."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from onnx_custom.errors import OnnxCustomError

__all__ = ["ZooCase", "ZooResult", "discover", "format_table", "run_case", "run_zoo"]


@dataclasses.dataclass(frozen=True)
class ZooCase:
    """One row: export ``model`` with ``exporter`` at ``opset`` (preferring ``variant``), verify.

    ``expect_error``: the export is *meant* to be refused with an `OnnxCustomError` whose message
    contains this text (e.g. an autograd.Function under the dynamo exporter); the row passes when
    it is, and the note documents the alternative.
    """

    exporter: str
    opset: int
    variant: str | None = None
    dynamic: bool = False
    trials: int = 2
    note: str = ""
    expect_error: str | None = None

    @property
    def label(self) -> str:
        parts = [self.exporter, f"opset{self.opset}"]
        if self.variant:
            parts.append(self.variant)
        if self.dynamic:
            parts.append("dynamic")
        return "-".join(parts)


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


def discover(names: Iterable[str] | None = None) -> dict[str, Any]:
    """Example-model modules by short name (``asinh`` -> ``onnx_custom.models.asinh``)."""
    import onnx_custom.models as package

    wanted = set(names) if names else None
    found = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or (wanted is not None and info.name not in wanted):
            continue
        found[info.name] = f"{package.__name__}.{info.name}"
    if wanted is not None and wanted - set(found):
        raise OnnxCustomError(f"Unknown zoo model(s) {sorted(wanted - set(found))}; known: {sorted(discover())}.")
    return found


def _node_summary(proto: Any) -> str:
    kinds: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type == "Constant":
            continue
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        kinds[key] = kinds.get(key, 0) + 1
    return ",".join(k if v == 1 else f"{k}x{v}" for k, v in kinds.items())


def run_case(name: str, module: Any, case: ZooCase) -> ZooResult:
    import onnx_custom

    start = time.perf_counter()
    try:
        model = module.Model().eval()
        args = module.example_inputs()
        registry = onnx_custom.default_registry()
        if case.variant:
            registry = registry.with_variants(case.variant)
        dynamic = getattr(module, "dynamic_shapes", None) if case.dynamic else None
        try:
            proto = onnx_custom.export(model, args, exporter=case.exporter, opset=case.opset, registry=registry, dynamic_shapes=dynamic)
        except OnnxCustomError as exc:
            if case.expect_error and case.expect_error in str(exc):
                return ZooResult(name, case, "pass", f"refused as documented: {case.note}", time.perf_counter() - start)
            raise
        if case.expect_error:
            return ZooResult(name, case, "fail", f"expected a refusal containing {case.expect_error!r}", time.perf_counter() - start)
        generator = getattr(module, "input_generator", None)
        report = onnx_custom.verify(model, args, proto, trials=case.trials, input_generator=generator, raise_on_mismatch=False)
        worst = max((c.max_abs_diff for c in report.comparisons), default=0.0)
        status = "pass" if report.passed else "fail"
        detail = f"max_abs={worst:.2e}" if report.passed else str(report)
        return ZooResult(name, case, status, detail, time.perf_counter() - start, _node_summary(proto), report)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, OnnxCustomError):
            detail += "\n" + traceback.format_exc(limit=6)
        return ZooResult(name, case, "fail", detail, time.perf_counter() - start)


def run_zoo(names: Iterable[str] | None = None, *, progress: Callable[[str], None] | None = None) -> list[ZooResult]:
    results = []
    modules = discover(names)
    for short, module_name in modules.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            skip_reason = getattr(exc, "skip_reason", None)
            case = ZooCase("-", 0)
            status = "skip" if skip_reason else "fail"
            results.append(ZooResult(short, case, status, skip_reason or f"import failed: {type(exc).__name__}: {exc}", 0.0))
            continue
        cases = getattr(module, "ZOO", ())
        for case in cases:
            if progress:
                progress(f"[{len(results) + 1}] {short} {case.label} ...")
            results.append(run_case(short, module, case))
    return results


def format_table(results: list[ZooResult]) -> str:
    rows = [f"{'model':<16} {'case':<30} {'status':<6} {'time':>7}  {'nodes':<40} detail"]
    for r in results:
        first_line = r.detail.splitlines()[0] if r.detail else ""
        rows.append(f"{r.model:<16} {r.case.label:<30} {r.status.upper():<6} {r.seconds:>6.1f}s  {r.nodes[:40]:<40} {first_line}")
    passed = sum(r.status == "pass" for r in results)
    failed = sum(r.status == "fail" for r in results)
    skipped = sum(r.status == "skip" for r in results)
    rows.append(f"{passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(rows)

"""``onnx_custom.verify``: PyTorch eager vs ONNX Runtime, dtype-aware tolerances, hard pass/fail.

A file is checked at the shapes it claims: when its inputs have dynamic dims, trials at other
sizes run by default (`onnx_custom.verification.trial_shapes` says which), and the types the
file declares for its outputs (and custom-node outputs) must match what ONNX Runtime returns
(`onnx_custom.verification.declared`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import torch

from onnx_custom.common.progress import ProgressArg, TerminalProgress, progress_for
from onnx_custom.common.progress import close as close_progress
from onnx_custom.errors import InvalidArgumentError, OnnxCustomError, VerificationError
from onnx_custom.exporter import trace_provenance
from onnx_custom.exporter.arguments import check_args, check_model
from onnx_custom.exporter.trace_provenance import TracerWarningRecord
from onnx_custom.fusion import check_fuse, fusing, fusion_report
from onnx_custom.runtime.failures import KernelRunError
from onnx_custom.verification.compare import (
    OutputComparison,
    check_tolerances,
    compare_arrays,
    flatten_outputs,
)
from onnx_custom.verification.declared import DeclaredTypes, TypeMismatch
from onnx_custom.verification.half_reference import HalfReference
from onnx_custom.verification.initializers import (
    InitializerMismatch,
    InitializerMismatchWarning,
    compare_initializers,
)
from onnx_custom.verification.localize import localize as localize_trial
from onnx_custom.verification.runner import (
    InputBinding,
    bind_inputs,
    custom_node_types,
    load_model,
    make_reference,
    make_session,
    plain_session,
    release_session,
    run_onnx,
    shared_session,
    tensor_inputs,
)
from onnx_custom.verification.trial_shapes import (
    DEFAULT_SHAPE_TRIALS,
    ApartCase,
    DimPlan,
    ShapeSpecError,
    apart_case,
    default_cases,
    describe_sizes,
    map_tensors,
    plan_dims,
    resize_inputs,
    resolve_cases,
)

if TYPE_CHECKING:
    from onnx_custom.translate.registry import Registry

__all__ = [
    "BACKENDS",
    "DEFAULT_SHAPE_TRIALS",
    "InitializerMismatch",
    "InitializerMismatchWarning",
    "OutputComparison",
    "ShapeSpecError",
    "TrialRecord",
    "TypeMismatch",
    "VerificationReport",
    "compare_arrays",
    "flatten_outputs",
    "load_model",
    "make_reference",
    "make_session",
    "verify",
]

BACKENDS = ("onnxruntime", "reference", "onnxruntime-bodies", "onnxruntime-native")
# Plain ONNX Runtime, nothing registered: the file's function bodies run instead of our kernels.
BODIES_BACKEND = "onnxruntime-bodies"
# ONNX Runtime with the native library (libonnx_custom_ops.so) first, as a C++ deployment runs
# the file: its kernels are not the Python kernels "onnxruntime" verified.
NATIVE_BACKEND = "onnxruntime-native"

InputGenerator = Callable[[int, tuple[Any, ...]], tuple[Any, ...]]
# Trial kinds at sizes other than the export's: eager refusing them skips the trial.
OTHER_SIZES = ("shape", "apart")


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial: its dynamic-dim sizes, the input shapes fed, and how it went.

    ``kind``: ``"example"`` (the example inputs), ``"values"`` (new values at the export shape),
    ``"shape"`` (other sizes of the dynamic dims), ``"apart"`` (dims the file names apart but
    that every shape trial gives one size, at sizes of their own: `trial_shapes.apart_case`) or
    ``"pruned"`` (the example with the values of the inputs the file does not take permuted,
    for a traced file whose TracerWarnings say the trace fixed values: `_permute_pruned`).
    ``status``: ``"passed"``, ``"failed"`` or ``"skipped"`` (PyTorch eager cannot take these
    sizes; ``reason`` holds its error).
    """

    trial: int
    kind: str
    sizes: tuple[tuple[str, int], ...]
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    status: str = "passed"
    reason: str = ""

    def describe(self) -> str:
        inputs = ", ".join(f"{n}{list(s)}" for n, s in self.input_shapes)
        text = (
            f"trial {self.trial} ({self.kind}) {describe_sizes(dict(self.sizes))}: {inputs} ->"
            f" {self.status.upper()}"
        )
        return f"{text}: {self.reason}" if self.reason else text


@dataclasses.dataclass
class VerificationReport:
    """Every comparison of every trial; ``str(report)`` is a table.

    Beyond the comparisons: ``shapes_tried`` (one `TrialRecord` per trial, skipped ones with the
    reason), ``type_mismatches`` (declared vs returned types), ``pruned_inputs`` (arguments the
    file has no input for), ``input_matching``, ``initializer_mismatches`` and ``notes``.
    """

    comparisons: list[OutputComparison]
    trials: int
    backends: tuple[str, ...] = ("onnxruntime",)
    localization: Any = None  # filled by verify(..., localize=True)
    shapes_tried: list[TrialRecord] = dataclasses.field(default_factory=list)
    type_mismatches: list[TypeMismatch] = dataclasses.field(default_factory=list)
    pruned_inputs: tuple[str, ...] = ()
    input_matching: str = ""
    initializer_mismatches: list[InitializerMismatch] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    # backend -> what ran each non-standard node type (`onnx_custom.runtime.implementations`)
    implementations: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    fusion: Any = None  # the file's `onnx_custom.fusion.FusionReport` (export(..., fuse=...))
    # the TracerWarnings the TorchScript export raised (the file's metadata), shown on a failure
    tracer_warnings: list[TracerWarningRecord] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            all(c.passed for c in self.comparisons)
            and not self.type_mismatches
            and not self.failed_trials()
        )

    def failures(self) -> list[OutputComparison]:
        return [c for c in self.comparisons if not c.passed]

    def failed_trials(self) -> list[TrialRecord]:
        return [r for r in self.shapes_tried if r.status == "failed"]

    def skipped(self) -> list[TrialRecord]:
        return [r for r in self.shapes_tried if r.status == "skipped"]

    def table(self) -> str:
        header = (
            f"{'trial':>5} {'backend':<12} {'output':<24} {'shape':<18} {'dtype':<9}"
            f" {'max_abs':>10} {'max_rel':>10} {'mismatch':>16} {'rtol':>8} {'atol':>8}  tolerance"
        )
        rows = [header]
        for c in self.comparisons:
            mism = f"{c.mismatched}/{c.total} ({c.mismatched_percent:.2f}%)"
            rows.append(
                f"{c.trial:>5} {c.backend:<12} {c.name[:24]:<24} {str(list(c.shape))[:18]:<18}"
                f" {c.dtype:<9} {c.max_abs_diff:>10.3g} {c.max_rel_diff:>10.3g} {mism:>16}"
                f" {c.rtol:>8.2g} {c.atol:>8.2g}  {c.tolerance_source}"
            )
            if c.worst:
                rows.append(f"{'':>5} worst {c.worst}")
        return "\n".join(rows)

    def findings(self) -> list[str]:
        """The lines after the table: shapes tried, type mismatches, inputs, weights, notes."""
        lines = []
        if self.shapes_tried:
            lines.append("Shapes tried:")
            lines += [f"  {r.describe()}" for r in self.shapes_tried]
        if self.type_mismatches:
            lines.append("Declared types that ONNX Runtime contradicts:")
            lines += [f"  {m.describe()}" for m in self.type_mismatches]
        if self.input_matching and (self.pruned_inputs or "by position" in self.input_matching):
            lines.append(f"Inputs: {self.input_matching}")
        if self.initializer_mismatches:
            lines.append("WARNING: the file's weights differ from the model's:")
            lines += [f"  {m.describe()}" for m in self.initializer_mismatches]
        lines += [f"Note: {n}" for n in self.notes]
        lines += self.implementation_lines()
        if self.tracer_warnings and not self.passed:
            lines += tracer_warning_lines(self.tracer_warnings)
        return lines

    def implementation_lines(self) -> list[str]:
        """What ran each custom node, per backend (one block per backend that has any)."""
        lines = []
        for backend, found in self.implementations.items():
            if found:
                lines.append(f"Custom nodes in {backend}:")
                lines += [f"  {i.describe()}" for i in found]
        return lines

    def passed_by_backend(self) -> dict[str, bool]:
        return {b: all(c.passed for c in self.comparisons if c.backend == b) for b in self.backends}

    def diagnosis(self) -> str:
        """Which side to suspect when backends disagree (empty when they agree)."""
        by_backend = self.passed_by_backend()
        if len(by_backend) < 2 or len(set(by_backend.values())) == 1:
            return ""
        good = [b for b, ok in by_backend.items() if ok]
        bad = [b for b, ok in by_backend.items() if not ok]
        return (
            f"Backends disagree: {', '.join(bad)} mismatch PyTorch but {', '.join(good)} match(es)"
            " it. The translation is likely right; suspect the runtime or a custom kernel of the"
            " failing backend."
        )

    def __str__(self) -> str:
        status = "PASSED" if self.passed else "FAILED"
        text = (
            f"Verification {status}: {len(self.comparisons)} comparison(s) over {self.trials}"
            f" trial(s)\n{self.table()}"
        )
        findings = self.findings()
        if findings:
            text += "\n" + "\n".join(findings)
        diagnosis = self.diagnosis()
        if diagnosis:
            text += f"\n{diagnosis}"
        if self.localization is not None:
            text += f"\n{self.localization}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "trials": self.trials,
            "backends": list(self.backends),
            "outputs": [
                {k: v for k, v in dataclasses.asdict(c).items() if k != "abs_diffs"}
                | {"passed": c.passed}
                for c in self.comparisons
            ],
            "shapes_tried": [
                dataclasses.asdict(r)
                | {
                    "sizes": dict(r.sizes),
                    "input_shapes": {n: list(s) for n, s in r.input_shapes},
                }
                for r in self.shapes_tried
            ],
            "type_mismatches": [dataclasses.asdict(m) for m in self.type_mismatches],
            "pruned_inputs": list(self.pruned_inputs),
            "input_matching": self.input_matching,
            "initializer_mismatches": [dataclasses.asdict(m) for m in self.initializer_mismatches],
            "notes": list(self.notes),
            "implementations": {
                b: [dataclasses.asdict(i) | {"describe": i.describe()} for i in found]
                for b, found in self.implementations.items()
            },
            "diagnosis": self.diagnosis(),
            "tracer_warnings": [dataclasses.asdict(w) for w in self.tracer_warnings],
            "localization": (
                self.localization.to_dict()
                if hasattr(self.localization, "to_dict")
                else (None if self.localization is None else str(self.localization))
            ),
        }


def tracer_warning_lines(found: Sequence[TracerWarningRecord]) -> list[str]:
    """The export's TracerWarnings as report lines: the trace fixed a decision made from data."""
    return [
        f"The TorchScript export raised {sum(w.count for w in found)} TracerWarning(s): the trace"
        " fixed what the model's code decided from the example's values there, so the file may"
        " compute another branch (export with exporter='dynamo', or make the code trace-safe):",
        *(f"  {w.describe()}" for w in found),
    ]


def _random_like(example: tuple[Any, ...], generator: torch.Generator) -> tuple[Any, ...]:
    """Same shapes/dtypes; floats redrawn from N(0, 1), ints/bools kept (they are often indices)."""

    def redraw(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.dtype)
        if isinstance(x, (tuple, list)):
            return type(x)(redraw(v) for v in x)
        return x

    return tuple(redraw(x) for x in example)


def _make_backend(
    name: str, proto: onnx.ModelProto, kernels: Any = None, *, as_written: bool = False
) -> Any:
    """A session of backend ``name``. ``as_written`` (the size trials): ONNX Runtime with its
    graph optimizations off (`make_session`), not shared: those trials check the file's shape
    computations as every runtime reads them, not as ORT's optimizer may have rewritten them."""
    try:
        if name == BODIES_BACKEND:
            return (
                plain_session(proto, as_written=True)
                if as_written
                else shared_session(proto, plain=True)
            )
        if name == NATIVE_BACKEND:
            return make_session(proto, "native", as_written=as_written)
        if name == "onnxruntime":
            return (
                make_session(proto, kernels, as_written=True)
                if as_written
                else shared_session(proto, kernels)
            )
        return make_reference(proto, kernels)
    except OnnxCustomError:
        raise
    except Exception as exc:
        raise VerificationError(
            f"Could not load the ONNX model in backend {name!r}: {type(exc).__name__}: {exc}"
        ) from exc


def _implementations(
    name: str, session: Any, proto: onnx.ModelProto, kernels: Any
) -> tuple[Any, ...]:
    """What ``session`` (of backend ``name``) runs each non-standard node type with."""
    from onnx_custom.runtime.implementations import node_implementations

    recorded = getattr(session, "implementations", None)
    if recorded is not None:  # our InferenceSession decided it (native, Python, body)
        return tuple(recorded)
    if name == "reference" and custom_node_types(proto):
        from onnx_custom.runtime.session import required_kernels

        return tuple(node_implementations(proto, required_kernels(proto, kernels)))
    return tuple(node_implementations(proto))  # plain ONNX Runtime: bodies and built-in ops


def _runs_on_bodies(proto: onnx.ModelProto) -> bool:
    """Every custom node has a function body in the file (so plain ONNX Runtime can run it)."""
    bodies = {f"{f.domain}::{f.name}" for f in proto.functions}
    return bool(bodies) and set(custom_node_types(proto)) <= bodies


def _localize_safely(
    model: Any, args: tuple[Any, ...], proto: onnx.ModelProto, trial: int, **options: Any
) -> Any:
    """A `Localization`, or a one-line reason why none could be made (never raises)."""
    if not isinstance(model, torch.nn.Module):
        return f"Localization unavailable: it needs a torch.nn.Module, got {type(model).__name__}."
    try:
        return localize_trial(model, args, proto, trial=trial, **options)
    except Exception as exc:
        return f"Localization unavailable: {type(exc).__name__}: {exc}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


@dataclasses.dataclass
class _Trial:
    index: int
    kind: str
    sizes: dict[str, int]
    # Added by verify itself (the sign trial): eager refusing its values skips it, as a shape does.
    optional: bool = False


class _DeclaredCheck:
    """Checks declared types once per distinct input shape and backend. Every backend: each is
    a runtime the file is deployed on, and a file declaring a dim its kernels do not produce
    passed on onnxruntime-native and reference when only "onnxruntime" was checked."""

    def __init__(self, proto: onnx.ModelProto, kernels: Any) -> None:
        self.declared = DeclaredTypes(proto)
        self.kernels = kernels
        self.seen: set[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]] = set()
        self._augmented: onnx.ModelProto | None = None
        self._sessions: dict[str, Any] = {}  # backend -> session of the augmented file

    def run(
        self,
        backend: str,
        trial: int,
        args: tuple[Any, ...],
        binding: InputBinding,
        outputs: dict[str, np.ndarray],
        input_shapes: dict[str, tuple[int, ...]],
    ) -> list[TypeMismatch]:
        key = (backend, tuple(sorted(input_shapes.items())))
        if key in self.seen:
            return []
        self.seen.add(key)
        values = outputs
        if self.declared.extra_outputs:  # custom-node outputs: one more run of a file exposing them
            if self._augmented is None:
                self._augmented = self.declared.augmented()
            augmented = self._augmented
            if backend not in self._sessions:
                self._sessions[backend] = _make_backend(backend, augmented, self.kernels)
            values = dict(
                zip(
                    [o.name for o in augmented.graph.output],
                    run_onnx(self._sessions[backend], augmented, args, binding),
                    strict=True,
                )
            )
        return [
            dataclasses.replace(m, backend=backend)
            for m in self.declared.check(trial, values, input_shapes)
        ]


def _trial_plan(
    trials: int,
    cases: list[dict[str, int]],
    sign_trial: bool = False,
    apart: ApartCase | None = None,
    pruned_trial: bool = False,
) -> list[_Trial]:
    plan = [_Trial(t, "example" if t == 0 else "values", {}) for t in range(trials)]
    if sign_trial:
        plan.append(_Trial(trials, "values", {}, optional=True))
    if pruned_trial:
        plan.append(_Trial(len(plan), "pruned", {}, optional=True))
    plan += [_Trial(len(plan) + i, "shape", case) for i, case in enumerate(cases)]
    if apart is not None and apart.sizes not in cases:
        plan.append(_Trial(len(plan), "apart", apart.sizes))
    return plan


def _permuted(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values in reverse order (same shape, dtype and value set: token ids stay
    valid ids, a mask stays a mask)."""
    return tensor.detach().flatten().flip(0).reshape(tensor.shape).clone()


def _permutable_pruned(binding: InputBinding, args: tuple[Any, ...]) -> list[str]:
    """The inputs the file does not take whose values a permutation changes. Left out: one that
    shares memory with an input the file takes (the same tensor passed twice), and one whose
    values are all equal (``torch.ones`` masks: no permutation moves them)."""
    tensors = tensor_inputs(args)
    fed = {tensors[p].data_ptr() for p in binding.positions if tensors[p].numel()}
    found = []
    for name, tensor in zip(binding.leaf_names, tensors, strict=False):
        if name not in binding.pruned or tensor.numel() < 2 or tensor.data_ptr() in fed:
            continue
        if not torch.equal(_permuted(tensor), tensor):
            found.append(name)
    return found


def _permute_pruned(args: tuple[Any, ...], binding: InputBinding) -> tuple[Any, ...]:
    """``args`` with the permutable inputs the file does not take permuted (`_permuted`)."""
    names = set(_permutable_pruned(binding, args))
    leaf_names = binding.leaf_names

    def permute(position: int, tensor: torch.Tensor) -> torch.Tensor:
        if position < len(leaf_names) and leaf_names[position] in names:
            return _permuted(tensor)
        return tensor

    return tuple(map_tensors(args, permute))


def _pruned_reason(names: Sequence[str]) -> str:
    """Why a "pruned" trial failed: the file cannot see these inputs, PyTorch can."""
    return (
        f"PyTorch's outputs changed with the values of {', '.join(names)} (permuted here), which"
        " the file does not take: the trace fixed their example values into the file (see the"
        " TracerWarnings below; a cache or branch keyed on tensor values). Fix: export with"
        " exporter='dynamo', or make the code trace-safe"
    )


def _run_failure(
    backend: str, trial: _Trial, input_shapes: Mapping[str, tuple[int, ...]], exc: Exception
) -> str:
    """A backend's failure to run a trial, naming the trial's sizes and input shapes."""
    shape = f" at {describe_sizes(trial.sizes)}" if trial.kind in OTHER_SIZES else ""
    # a default ORT session may still run it: its optimizer can rewrite a wrong shape computation
    # (a custom kernel's own error is not about that)
    optimizable = shape and backend != "reference" and not isinstance(exc, KernelRunError)
    written = (
        ", with graph optimizations off (the file as written, as other runtimes read it)"
        if optimizable
        else ""
    )
    inputs = ", ".join(f"{n}{list(s)}" for n, s in input_shapes.items())
    return (
        f"Backend {backend!r} failed to run the ONNX model on trial {trial.index}{shape}"
        f" ({inputs}){written}: {type(exc).__name__}: {exc}"
    )


def _apart_note(apart: ApartCase, plan: DimPlan, trial: int) -> str:
    """Said when eager refuses the apart trial: the file and the model disagree about the dims."""
    return (
        f"the file names {apart.describe_groups(plan)} apart, so a deployment may feed them"
        f" different sizes, but the model refused different sizes (trial {trial} skipped). If they"
        " must agree, give them one name (one Dim in dynamic_shapes, or a shape rule that ties"
        " them) so the file says so."
    )


def _one_signed_inputs(feeds: Mapping[str, torch.Tensor]) -> list[str]:
    """The file's float inputs whose example values all have one sign (``torch.rand``, images in
    [0, 1], ``torch.ones``): on them a sign bug (a missing ``abs``, ``x`` for ``relu(x)``) is
    invisible. Single values are left out (a positive scale is not a sign-blind sample)."""
    found = []
    for name, tensor in feeds.items():
        if (
            tensor.is_floating_point()
            and tensor.numel() >= 2
            and (bool(tensor.min() >= 0) or bool(tensor.max() <= 0))
        ):
            found.append(name)
    return found


def _sign_note(names: list[str], trial: int) -> str:
    return (
        f"the example values of {', '.join(names)} all have one sign, which hides sign bugs, so"
        f" trial {trial} draws N(0, 1) values (as trials=2 would). If the model takes only one"
        " sign, pass input_generator= to draw valid values, or shapes=() (--no-shape-trials) for"
        " the example inputs only."
    )


# Modules whose training mode makes each eager call differ (dropout draws) or differ from the file
# (batch norm: batch statistics, and running statistics updated by every call).
_TRAINING_SENSITIVE = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)


def _training_note(model: Any) -> str | None:
    """Why eager disagreed with the file when the model was left in training mode (said only on
    a failure: a file exported in training mode can match such a model)."""
    if not isinstance(model, torch.nn.Module):
        return None
    found = [
        name or type(m).__name__
        for name, m in model.named_modules()
        if m.training and isinstance(m, _TRAINING_SENSITIVE)
    ]
    if not found:
        return None
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return (
        f"the model is in training mode: {', '.join(found[:3])}{more} (dropout, batch norm) give a"
        " different result in each eager call, not what the file computes. Fix: call model.eval()"
        " before export and verify."
    )


def _native_fallback_note(found: Sequence[Any]) -> str | None:
    """Custom nodes onnxruntime-native ran with Python kernels: no C++ deployment runs them."""
    python = [i.node_type for i in found if i.kind == "python"]
    if not python:
        return None
    return (
        f"backend {NATIVE_BACKEND} ran {', '.join(python)} with Python kernels (no native kernel"
        " serves them): a deployment loading only libonnx_custom_ops.so cannot run this file. Fix:"
        " give the op a native kernel (its spec's native:) or a function body (embed_functions)."
    )


def _eager_copies(value: Any) -> Any:
    """``value`` with every tensor copied (layout kept): eager runs on the copies, so a model that
    writes into its inputs (``x.mul_(2)``) changes neither what ONNX Runtime is fed afterwards
    (the file computes from the values before the call) nor the caller's tensors."""
    if isinstance(
        value, torch.Tensor
    ):  # a leaf like the original (no autograd history of the copy)
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, Mapping):
        return type(value)({k: _eager_copies(v) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (tuple, list)):
        return type(value)(_eager_copies(v) for v in value)
    return value


def _written_inputs(names: Sequence[str], copies: tuple[Any, ...]) -> list[str]:
    """The inputs eager wrote into (their copies' version counters moved from 0)."""
    tensors = tensor_inputs(copies)
    return [n for n, t in zip(names, tensors, strict=False) if t._version != 0]


def _trial_args(
    trial: _Trial,
    args: tuple[Any, ...],
    plan: DimPlan,
    generator: torch.Generator,
    input_generator: InputGenerator | None,
    binding: InputBinding,
) -> tuple[Any, ...]:
    if trial.kind == "example":
        return args
    if trial.kind == "values":
        return (
            input_generator(trial.index, args) if input_generator else _random_like(args, generator)
        )
    if trial.kind == "pruned":
        return _permute_pruned(args, binding)
    # "shape", "apart"
    resized = resize_inputs(args, trial.sizes, plan, generator)
    return input_generator(trial.index, resized) if input_generator else resized


def _check_callable_model(model: Any) -> None:
    """verify() runs ``model(*args)``: an nn.Module instance or any callable, not a class."""
    if isinstance(model, type) or not callable(model):
        check_model(model)  # raises with the fix (instantiate the class, ...)


def verify(
    model: torch.nn.Module | Callable[..., Any],
    args: tuple[Any, ...] | torch.Tensor,
    onnx_model: onnx.ModelProto | str | os.PathLike[str] | bytes,
    *,
    trials: int = 1,
    input_generator: InputGenerator | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    raise_on_mismatch: bool = True,
    seed: int = 0,
    backends: Sequence[str] = ("onnxruntime",),
    localize: bool = False,
    exporter: str | None = None,
    opset: int | None = None,
    registry: Registry | None = None,
    progress: ProgressArg = None,
    kernels: Any = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    dynamic_shapes: Any = None,
    fuse: Any = False,
) -> VerificationReport:
    """Run PyTorch eager and ONNX Runtime on the example inputs (+ ``trials - 1`` random ones),
    then at other sizes of the file's dynamic dims.

    Outputs (nested tuples/lists/dicts, flattened in order) are compared with torch.testing's
    per-dtype default tolerances unless ``rtol``/``atol`` are given; NaN/Inf positions must agree;
    ints and bools compare exactly. ``input_generator(trial, example_args)`` makes the extra
    inputs (default: floats redrawn from N(0, 1) at the same shapes, ints/bools kept); for shape
    trials it receives the inputs already drawn at the new shape.

    Shapes: when the file's inputs have dynamic dims (``dim_param`` or unnamed), up to
    `DEFAULT_SHAPE_TRIALS` trials vary them (sizes 1, e + 1, 2e... within each dim's range; see
    `onnx_custom.verification.trial_shapes`). ``shapes=`` replaces those with explicit cases: a
    list of dicts mapping dim names to sizes and/or ONNX input names to full shapes, e.g.
    ``[{"batch": 1}, {"batch": 7}, {"x": (5, 3, 4)}]``; ``shapes=()`` tries the export shape only.
    With the defaults (``trials=1``, ``shapes=None``, no ``input_generator``) and no size trials,
    example floats of one sign (``torch.rand``) add one trial of N(0, 1) values (they hide sign
    bugs; skipped if eager refuses them); ``shapes=()`` or ``trials=`` choose the trials instead.
    ``dynamic_shapes``: the ``torch.export``-style spec given to export; its ``Dim`` ranges bound
    the sizes tried and its ``Dim`` names can be used in ``shapes=`` (default: ranges from the
    file's ``onnx_custom.dynamic_dims`` metadata). A size PyTorch eager rejects is reported as
    skipped; one ONNX Runtime fails on or disagrees at fails verification, naming the shape.

    Every backend's run also checks the file's declared output types (graph outputs, and
    custom-node outputs with a ``value_info``) against the returned arrays. A Python kernel
    failing (`KernelRunError`) at the example's shape raises; at other sizes it fails that trial,
    naming its shapes (the `VerificationError` chains it). Inputs are matched to
    the file's inputs by ``forward``'s parameter names (else by position); arguments the exporter
    pruned are listed in ``report.pruned_inputs``. Initializers that differ from the model's
    parameters/buffers give an `InitializerMismatchWarning` and a report line.

    ``backends``: any of ``"onnxruntime"``, ``"reference"`` (onnx's ReferenceEvaluator with
    our kernels) and ``"onnxruntime-native"`` (the native library first, Python kernels only for
    nodes it cannot serve: what a C++ deployment with ``libonnx_custom_ops.so`` runs); every
    comparison names its backend, and a disagreement between backends points at the
    runtime/kernels rather than the translation. ``localize=True``: on the first failing trial,
    compare every intermediate value (`onnx_custom.verification.localize.localize`) and attach the
    result as ``report.localization`` (also in the `VerificationError` message); ``exporter``,
    ``opset`` and ``registry`` tell it how the file was made (defaults: inferred from the file,
    the default registry). ``progress`` receives one line per trial (a callable); by default
    (None) a terminal's stderr shows the stage, trial and backend on one live line, and nothing
    is written when stderr is not a terminal or ``progress=False`` (`onnx_custom.common.progress`).
    ``kernels``: the
    `onnx_custom.runtime.KernelRegistry` for custom nodes (default: the default kernel registry).

    ``fuse``: how the file was exported (``export(..., fuse=...)``). The reference is always the
    model as written (unfused); ``fuse`` makes localization's re-export fuse the same way, and
    ``report.fusion`` holds the fusion report the file records.
    """
    args, backends = _check_arguments(model, args, trials, rtol, atol, backends)
    check_fuse(fuse)
    reporter = progress_for(progress)
    try:
        return _verify(
            model,
            args,
            onnx_model,
            _Options(
                trials=trials,
                input_generator=input_generator,
                rtol=rtol,
                atol=atol,
                seed=seed,
                backends=backends,
                localize=localize,
                exporter=exporter,
                opset=opset,
                registry=registry,
                progress=reporter,
                kernels=kernels,
                shapes=shapes,
                dynamic_shapes=dynamic_shapes,
                fuse=fuse,
            ),
            raise_on_mismatch,
        )
    finally:
        close_progress(reporter)


def _verify(
    model: Any,
    args: tuple[Any, ...],
    onnx_model: Any,
    options: _Options,
    raise_on_mismatch: bool,
) -> VerificationReport:
    """Plan, run every trial, judge."""
    run = _plan_trials(model, args, onnx_model, options)
    for trial in run.schedule:
        _run_trial(run, trial)
    return _judge(run, raise_on_mismatch)


@dataclasses.dataclass(frozen=True)
class _Options:
    """verify's keyword arguments, checked (`_check_arguments`)."""

    trials: int
    input_generator: InputGenerator | None
    rtol: float | None
    atol: float | None
    seed: int
    backends: tuple[str, ...]
    localize: bool
    exporter: str | None
    opset: int | None
    registry: Registry | None
    progress: Callable[[str], None] | None
    kernels: Any
    shapes: Sequence[Mapping[str, Any]] | None
    dynamic_shapes: Any
    fuse: Any


@dataclasses.dataclass
class _Run:
    """One verification in progress: what `_plan_trials` set up and what the trials accumulate."""

    model: Any
    args: tuple[Any, ...]
    options: _Options
    proto: onnx.ModelProto
    binding: InputBinding
    plan: DimPlan
    apart: ApartCase | None
    schedule: list[_Trial]
    report: VerificationReport
    sessions: dict[str, Any]
    # the size trials' sessions, made when first needed
    as_written: dict[str, Any]
    declared: _DeclaredCheck
    generator: torch.Generator
    # half outputs at default tolerances get a per-element budget from the model in float32
    half: HalfReference | None
    written_noted: bool = False
    # the first KernelRunError at other sizes: the VerificationError's cause
    kernel_error: KernelRunError | None = None

    @property
    def onnx_names(self) -> list[str]:
        return [o.name for o in self.proto.graph.output]


def _stage(progress: Callable[[str], None] | None, text: str) -> None:
    """A finer step for a terminal's live line (a caller's own callable gets one line a trial)."""
    if isinstance(progress, TerminalProgress):
        progress(text)


def _check_arguments(
    model: Any,
    args: tuple[Any, ...] | torch.Tensor,
    trials: int,
    rtol: float | None,
    atol: float | None,
    backends: Sequence[str] | str,
) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """verify's arguments checked before anything runs: the args tuple and the backends tuple."""
    _check_callable_model(model)
    args = check_args(args)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise InvalidArgumentError(
            f"trials must be a positive int; received {trials!r}. Fix: pass trials=1 (the example"
            " inputs) or more."
        )
    check_tolerances(rtol, atol)
    backends = (backends,) if isinstance(backends, str) else tuple(backends)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise InvalidArgumentError(
            f"backends must be a non-empty subset of {BACKENDS}; received {list(backends)!r}. Fix:"
            " pass backends=('onnxruntime',) (and/or 'reference', onnx's reference evaluator, or"
            " 'onnxruntime-native', the native kernel library a C++ deployment loads)."
        )
    return args, backends


def _plan_trials(model: Any, args: tuple[Any, ...], onnx_model: Any, options: _Options) -> _Run:
    """Load the file, bind the inputs, open the sessions and decide the trials (nothing runs)."""
    _stage(options.progress, "verify: loading the file")
    proto = load_model(onnx_model)
    backends = options.backends
    if "onnxruntime" in backends and BODIES_BACKEND not in backends and _runs_on_bodies(proto):
        backends += (BODIES_BACKEND,)  # a file meant for plain ONNX Runtime must pass there too
    binding = bind_inputs(proto, args, model)  # fails on inputs that cannot fit before running
    plan = plan_dims(proto, binding, args, model=model, dynamic_shapes=options.dynamic_shapes)
    shapes = options.shapes
    cases = default_cases(plan) if shapes is None else resolve_cases(shapes, plan)
    apart = apart_case(plan) if shapes is None else None  # explicit shapes= replace every default
    mismatched_weights = compare_initializers(model, proto)
    kernels = options.kernels
    _stage(options.progress, f"verify: opening sessions ({', '.join(backends)})")
    sessions = {name: _make_backend(name, proto, kernels) for name in backends}
    report = VerificationReport(
        [],
        0,
        backends,
        pruned_inputs=binding.pruned,
        input_matching=binding.describe(),
        initializer_mismatches=mismatched_weights,
        notes=list(plan.notes),
        tracer_warnings=trace_provenance.read(proto),
        implementations={
            name: _implementations(name, session, proto, kernels)
            for name, session in sessions.items()
        },
    )
    report.fusion = fusion_report(proto)
    if report.fusion is not None and report.fusion.sites:
        report.notes.append(
            f"{report.fusion} (compared with the model as written, unfused)".replace("\n", "; ")
        )
    fallback = _native_fallback_note(report.implementations.get(NATIVE_BACKEND, ()))
    if fallback:
        report.notes.append(fallback)
    trials = options.trials
    one_signed = (
        _one_signed_inputs(binding.feeds(tensor_inputs(args)))
        if trials == 1 and shapes is None and not cases and options.input_generator is None
        else []
    )
    if one_signed:
        report.notes.append(_sign_note(one_signed, trials))
    default_tolerances = options.rtol is None and options.atol is None
    # a traced file that dropped inputs while its trace turned tensors into Python values: one
    # trial permutes those inputs, which the file cannot see (a value cache, a branch on them)
    pruned_trial = bool(report.tracer_warnings) and bool(_permutable_pruned(binding, args))
    return _Run(
        model=model,
        args=args,
        options=options,
        proto=proto,
        binding=binding,
        plan=plan,
        apart=apart,
        schedule=_trial_plan(
            trials, cases, sign_trial=bool(one_signed), apart=apart, pruned_trial=pruned_trial
        ),
        report=report,
        sessions=sessions,
        as_written=dict.fromkeys(backends),
        declared=_DeclaredCheck(proto, kernels),
        generator=torch.Generator().manual_seed(options.seed),
        half=HalfReference(model, flatten_outputs) if default_tolerances else None,
    )


def _run_trial(run: _Run, trial: _Trial) -> None:
    """One trial: eager, then every backend; its `TrialRecord`, and the localization if asked."""
    progress = run.options.progress
    if progress is not None:
        where = f" ({describe_sizes(trial.sizes)})" if trial.kind in OTHER_SIZES else ""
        progress(f"verify: trial {trial.index + 1}/{len(run.schedule)}{where}")
        _stage(progress, f"verify: trial {trial.index + 1}/{len(run.schedule)}{where}: eager")
    export_sizes = {k: d.export_size for k, d in run.plan.dims.items()}
    sizes = trial.sizes or export_sizes
    trial_args = _trial_args(
        trial, run.args, run.plan, run.generator, run.options.input_generator, run.binding
    )
    input_shapes = {
        n: tuple(t.shape) for n, t in run.binding.feeds(tensor_inputs(trial_args)).items()
    }
    record: dict[str, Any] = dict(
        trial=trial.index,
        kind=trial.kind,
        sizes=tuple(sizes.items()),
        input_shapes=tuple(input_shapes.items()),
    )
    flat = _run_eager(run, trial, trial_args, record)
    if flat is None:
        return
    references = (
        run.half.for_trial(trial_args, flat, run.report.notes) if run.half is not None else None
    )
    problems, compared_bad, ort_outputs = _run_backends(
        run, trial, trial_args, flat, input_shapes, references
    )
    if compared_bad:
        bad = sorted(
            {c.name for c in run.report.comparisons if c.trial == trial.index and not c.passed}
        )
        problems.append(f"outputs mismatch PyTorch: {', '.join(bad)}")
        if trial.kind == "pruned":
            problems.append(_pruned_reason(_permutable_pruned(run.binding, run.args)))
    status = "failed" if problems else "passed"
    run.report.shapes_tried.append(TrialRecord(**record, status=status, reason="; ".join(problems)))
    if run.options.localize and compared_bad and run.report.localization is None:
        _localize(run, trial, trial_args, flat, ort_outputs)


def _run_eager(
    run: _Run, trial: _Trial, trial_args: tuple[Any, ...], record: dict[str, Any]
) -> list[tuple[str, Any]] | None:
    """PyTorch eager on the trial's inputs: its flattened outputs, or None when the trial is
    skipped (eager refused sizes or values that are not the example's; recorded as skipped)."""
    eager_args = _eager_copies(trial_args)
    report = run.report
    try:
        with torch.no_grad():
            expected = run.model(*eager_args)
    except Exception as exc:
        if trial.kind not in OTHER_SIZES and not trial.optional:
            raise VerificationError(
                f"The PyTorch model raised in eager mode on trial {trial.index}:"
                f" {type(exc).__name__}: {exc}"
            ) from exc
        taken = (
            describe_sizes(trial.sizes)
            if not trial.optional
            else "permuted values of the inputs the file does not take"
            if trial.kind == "pruned"
            else "N(0, 1) values"
        )
        reason = f"the model cannot take {taken}: {_first_line(exc)}"
        report.shapes_tried.append(TrialRecord(**record, status="skipped", reason=reason))
        if trial.kind == "apart" and run.apart is not None:
            report.notes.append(_apart_note(run.apart, run.plan, trial.index))
        return None
    written = [] if run.written_noted else _written_inputs(run.binding.leaf_names, eager_args)
    if written:
        run.written_noted = True
        report.notes.append(
            f"the model writes into its input(s) {', '.join(written)} in place; ONNX Runtime"
            " was fed the values before the call (what the file computes from), and the"
            " caller's tensors were left unchanged."
        )
    flat = flatten_outputs(expected)
    non_tensor = [name for name, leaf in flat if not isinstance(leaf, torch.Tensor)]
    if non_tensor:
        raise VerificationError(
            f"Model outputs {non_tensor} are not tensors; only tensor outputs can be compared"
            " with ONNX."
        )
    onnx_names = run.onnx_names
    if len(onnx_names) != len(flat):
        raise VerificationError(
            f"Output structure mismatch: the PyTorch model returns {len(flat)} tensor(s) "
            f"({[n for n, _ in flat]}) but the ONNX model has {len(onnx_names)} output(s) "
            f"({onnx_names}). Was the file exported from this model?"
        )
    return flat


def _run_backends(
    run: _Run,
    trial: _Trial,
    trial_args: tuple[Any, ...],
    flat: list[tuple[str, Any]],
    input_shapes: dict[str, tuple[int, ...]],
    references: Any,
) -> tuple[list[str], bool, list[Any] | None]:
    """Every backend on the trial's inputs, compared with eager's ``flat`` outputs: the
    problems found, whether any comparison failed, and ONNX Runtime's outputs (handed to
    localize, which then need not run the file again)."""
    problems: list[str] = []
    compared_bad = False
    ort_outputs: list[Any] | None = None
    # the export shape runs what a default ORT session runs; other sizes run the file as written
    pool = run.as_written if trial.kind in OTHER_SIZES else run.sessions
    for backend in list(pool):
        _stage(
            run.options.progress, f"verify: trial {trial.index + 1}/{len(run.schedule)}: {backend}"
        )
        actual = _run_backend(run, pool, backend, trial, trial_args, input_shapes, problems)
        if actual is None:
            continue
        if backend == "onnxruntime":
            ort_outputs = list(actual)
        for i, ((path, exp), act, onnx_name) in enumerate(
            zip(flat, actual, run.onnx_names, strict=True)
        ):
            comparison = compare_arrays(
                exp,
                act,
                name=f"{path}={onnx_name}",
                trial=trial.index,
                rtol=run.options.rtol,
                atol=run.options.atol,
                backend=backend,
                reference=references[i] if references else None,
            )
            compared_bad |= not comparison.passed
            run.report.comparisons.append(comparison)
    return problems, compared_bad, ort_outputs


def _run_backend(
    run: _Run,
    pool: dict[str, Any],
    backend: str,
    trial: _Trial,
    trial_args: tuple[Any, ...],
    input_shapes: dict[str, tuple[int, ...]],
    problems: list[str],
) -> Any:
    """One backend's outputs on the trial (its declared types checked), or None when it failed
    to run (the failure appended to ``problems``)."""
    kernels = run.options.kernels
    try:
        session = pool[backend]
        if session is None:  # not needed yet, or dropped before an earlier trial's localization
            session = pool[backend] = _make_backend(
                backend, run.proto, kernels, as_written=pool is run.as_written
            )
        actual = run_onnx(session, run.proto, tuple(trial_args), run.binding)
        mismatches = run.declared.run(
            backend,
            trial.index,
            tuple(trial_args),
            run.binding,
            dict(zip(run.onnx_names, actual, strict=True)),
            input_shapes,
        )
    except KernelRunError as exc:
        if trial.kind not in OTHER_SIZES:
            raise  # at the example's shape: the kernel's own typed error, as always
        # at other sizes: a failing trial like any other (raise_on_mismatch=False gets the
        # report), named by its shapes, which the kernel's message cannot know
        run.kernel_error = run.kernel_error or exc
        problems.append(_run_failure(backend, trial, input_shapes, exc))
        return None
    except OnnxCustomError:
        raise
    except Exception as exc:
        problems.append(_run_failure(backend, trial, input_shapes, exc))
        return None
    if mismatches:
        run.report.type_mismatches += mismatches
        problems.append(
            f"{len(mismatches)} declared type(s) contradicted:"
            f" {', '.join(repr(m.value) for m in mismatches)}"
        )
    return actual


def _localize(
    run: _Run,
    trial: _Trial,
    trial_args: tuple[Any, ...],
    flat: list[tuple[str, Any]],
    ort_outputs: list[Any] | None,
) -> None:
    """Localize the first failing trial's mismatch into ``report.localization``."""
    options = run.options
    if options.progress is not None:
        options.progress(f"verify: localizing the mismatch of trial {trial.index}")
    # ORT's session for the whole file goes (weights, arena) before localize's segments
    # run, also from the shared sessions: it is made again if a later trial needs it.
    for dropped in run.sessions.values():
        release_session(dropped)
    run.sessions, run.as_written = dict.fromkeys(run.sessions), dict.fromkeys(run.as_written)
    with fusing(run.model, tuple(trial_args), options.fuse):  # re-exported as the file was
        run.report.localization = _localize_safely(
            run.model,
            tuple(trial_args),
            run.proto,
            trial.index,
            exporter=options.exporter,
            opset=options.opset,
            registry=options.registry,
            rtol=options.rtol,
            atol=options.atol,
            kernels=options.kernels,
            eager_outputs=[leaf for _, leaf in flat],
            file_outputs=ort_outputs,
        )


def _judge(run: _Run, raise_on_mismatch: bool) -> VerificationReport:
    """The report, finished; a `VerificationError` carrying it when it failed (if asked)."""
    report = run.report
    report.trials = len(report.shapes_tried)
    # a file exported in training mode may pass: said only on a failure
    training = None if report.passed else _training_note(run.model)
    if training:
        report.notes.append(training)
    if raise_on_mismatch and not report.passed:
        raise VerificationError(str(report), report) from run.kernel_error
    return report

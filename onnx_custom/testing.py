"""``check_op``: the tests a spec'd op gets by being declared.

``check_op(spec, sample_inputs)`` registers the spec (for the call, unless it already is) and runs

* ``torch.library.opcheck`` on every sample (schema, fake kernel, autograd registration, AOT);
* the backward, when the spec has one: ``gradcheck`` (finite differences, float64) where the spec
  allows float64, else the declared backward against autograd through the eager math;
* an export with each exporter per translation: the custom node, and every standard translation
  at the first opset it covers; each file is verified in ONNX Runtime (`onnx_custom.verify`)
  against eager PyTorch. Samples with the same attributes, dtypes and ranks share one file,
  exported with every dim ``Dim.AUTO`` (the exporter keeps dynamic what the op's shape rule or
  fake kernel leaves free) and verified at each sample's size and, with ``trials > 1``, at other
  sizes of the file's dynamic dims (1, larger, twice; each dim alone when the op refuses them
  all at once), and once with the dims the file names apart (two inputs' dims the shape rule
  leaves free, exported at one size) at different sizes of at least 2: the file tells a
  deployment they may differ, so the kernel must agree with eager there; an op whose eager math
  ties them (an elementwise op whose rule is ``like:x``) refuses that trial, which is noted, not
  failed, and moves no dim alone. Each case lists the shapes it ran at (``CheckCase.shapes``)
  and says which dims did not vary and why (static in the file, refused by eager, ``trials=1``,
  ``dynamic=False``);
* the custom node at every other declared floating dtype (the eager math and the kernel must
  both take every dtype the spec declares);
* the function body (ONNX Runtime without our kernels) and the native kernel, when declared,
  at the same sizes.

It returns a `CheckReport` and raises `VerificationError` (carrying it) when any case fails.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from onnx_custom.errors import VerificationError
from onnx_custom.runtime.kernel_spec import KernelSpec
from onnx_custom.runtime.registry import KernelRegistry
from onnx_custom.spec import generate, signatures
from onnx_custom.spec.native_source import NativeKernel
from onnx_custom.spec.spec import OpSpec, SpecError
from onnx_custom.spec.torch_op import BoundArgs, bind_args
from onnx_custom.translate.registry import (
    DEFAULT_VARIANT,
    Registry,
    SymbolicEntry,
    default_registry,
)

__all__ = ["CheckCase", "CheckReport", "ZooCase", "check_op"]

EXPORTERS = ("torchscript", "dynamo")
_DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}
_TS_OPSETS = range(7, 21)
_DYNAMO_NATIVE_OPSET = 18
_FLOATS = ("float32", "float64", "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class CheckCase:
    """One check: ``passed`` is None when it was skipped (``detail`` says why). ``shapes``: the
    input shapes ONNX Runtime ran at (one entry per distinct set, e.g. ``"x[3, 4]"``), for the
    cases that ran the file; ``detail`` also says which dims could not vary and why."""

    name: str
    passed: bool | None
    detail: str = ""
    shapes: tuple[str, ...] = ()

    def __str__(self) -> str:
        status = {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]
        return f"{status:<5} {self.name}" + (f"\n      {self.detail}" if self.detail else "")


@dataclasses.dataclass(frozen=True)
class _Verified:
    """What `_Checker.export_and_verify` ran: the detail line and the shapes tried."""

    detail: str
    shapes: tuple[str, ...] = ()


@dataclasses.dataclass
class CheckReport:
    """Every case `check_op` ran; ``str(report)`` lists them."""

    spec: OpSpec
    cases: list[CheckCase]

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.cases)

    def failures(self) -> list[CheckCase]:
        return [c for c in self.cases if c.passed is False]

    def __str__(self) -> str:
        counts = {s: sum(c.passed is s for c in self.cases) for s in (True, False, None)}
        head = (
            f"check_op {self.spec.name}: {counts[True]} passed, {counts[False]} failed,"
            f" {counts[None]} skipped"
        )
        return "\n".join([head, *(str(c) for c in self.cases)])


class _Skip(Exception):
    """A case that does not apply; its message says why."""


def _run(name: str, fn: Callable[[], str | _Verified]) -> CheckCase:
    try:
        result = fn()
    except _Skip as skip:
        return CheckCase(name, None, str(skip))
    except Exception as exc:  # a failing case is a result, not a crash of check_op
        return CheckCase(name, False, f"{type(exc).__name__}: {str(exc).strip()[:2000]}")
    if isinstance(result, _Verified):
        return CheckCase(name, True, result.detail, result.shapes)
    return CheckCase(name, True, result)


# -- samples and the module that calls the op -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    bound: BoundArgs

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The present tensor inputs, a variadic list spread out (the model's inputs)."""
        out: list[torch.Tensor] = []
        for value in self.bound.tensors:
            if isinstance(value, (list, tuple)):
                out.extend(value)
            elif value is not None:
                out.append(value)
        return tuple(out)

    def same_kind(self, other: _Sample) -> bool:
        """Same attributes, dtypes and ranks: one exported file serves both."""
        mine, theirs = self.tensors, other.tensors
        return (
            self.bound.attrs == other.bound.attrs
            and len(mine) == len(theirs)
            and all(
                a.dtype == b.dtype and a.dim() == b.dim() for a, b in zip(mine, theirs, strict=True)
            )
        )

    def cast(self, dtype: torch.dtype) -> _Sample:
        def cast(t: Any) -> Any:
            if isinstance(t, (list, tuple)):
                return [cast(x) for x in t]
            return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        return _Sample(
            (), {}, BoundArgs(tuple(cast(t) for t in self.bound.tensors), self.bound.attrs)
        )

    def describe(self) -> str:
        tensors = ", ".join(
            f"{str(t.dtype).removeprefix('torch.')}[{'x'.join(map(str, t.shape))}]"
            for t in self.tensors
        )
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.bound.attrs.items())
        return f"({tensors}{'; ' + attrs if attrs else ''})"


def _samples(spec: OpSpec, sample_inputs: Any) -> list[_Sample]:
    """One sample or a list; each a tuple of args, a dict of named args, or (args, kwargs)."""
    single = isinstance(sample_inputs, dict) or (
        isinstance(sample_inputs, tuple)
        and bool(sample_inputs)
        and isinstance(sample_inputs[0], torch.Tensor)
    )
    items = [sample_inputs] if single else sample_inputs
    if not isinstance(items, (list, tuple)) or not items:
        raise SpecError(
            f"check_op({spec.name}): sample_inputs must be a non-empty list of samples, each a"
            f" tuple of the op's arguments {spec.schema}; received {type(sample_inputs).__name__}.",
            op=spec.name,
        )
    out: list[_Sample] = []
    for index, sample in enumerate(items):
        if isinstance(sample, dict):
            args, kwargs = (), dict(sample)
        elif (
            isinstance(sample, tuple)
            and len(sample) == 2
            and isinstance(sample[0], tuple)
            and isinstance(sample[1], dict)
        ):
            args, kwargs = sample
        elif isinstance(sample, tuple):
            args, kwargs = sample, {}
        else:
            raise SpecError(
                f"check_op({spec.name}): sample {index} is a {type(sample).__name__}; expected a"
                f" tuple of the op's arguments {spec.schema}.",
                op=spec.name,
            )
        try:
            out.append(_Sample(tuple(args), kwargs, bind_args(spec, args, kwargs)))
        except TypeError as exc:
            raise SpecError(
                f"check_op({spec.name}): sample {index} does not fit the schema {spec.schema}:"
                f" {exc}; fix: pass the op's arguments in schema order.",
                op=spec.name,
            ) from None
    return out


class _OpModule(torch.nn.Module):
    """Calls the op with the sample's attributes baked in (they become node attributes, not
    graph inputs); absent optional inputs stay None. See `_op_module` for ``forward``."""

    def __init__(self, spec: OpSpec, op: Any, sample: _Sample) -> None:
        super().__init__()
        self.op, self.attrs, self.names = (
            op,
            dict(sample.bound.attrs),
            [i.name for i in spec.inputs],
        )
        self.layout = [
            None if t is None else len(t) if item.variadic else -1
            for item, t in zip(spec.inputs, sample.bound.tensors, strict=True)
        ]

    def call(self, *tensors: torch.Tensor) -> Any:
        args: list[Any] = []
        cursor = 0
        for width in self.layout:
            if width is None:
                args.append(None)
            elif width == -1:
                args.append(tensors[cursor])
                cursor += 1
            else:
                args.append(list(tensors[cursor : cursor + width]))
                cursor += width
        return self.op(**dict(zip(self.names, args, strict=True)), **self.attrs)


def _op_module(spec: OpSpec, op: Any, sample: _Sample) -> _OpModule:
    """An `_OpModule` whose ``forward`` has one named parameter per tensor (``xs_0``.. for a
    variadic ``xs``): the exporters name the ONNX inputs after them, and torch.export matches
    dynamic_shapes to them (a bare ``*tensors`` would be one tuple input)."""
    names: list[str] = []
    for item, value in zip(spec.inputs, sample.bound.tensors, strict=True):
        if value is not None:
            names += (
                [f"{item.name}_{i}" for i in range(len(value))] if item.variadic else [item.name]
            )

    def forward(self: _OpModule, *tensors: torch.Tensor) -> Any:
        return self.call(*tensors)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, kind) for n in ("self", *names)]
    )
    cls = type(f"CheckOp_{spec.namespace}_{spec.op_name}", (_OpModule,), {"forward": forward})
    return cls(spec, op, sample)


def _call(spec: OpSpec, op: Any, tensors: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """``op`` on the inputs by name: attributes may sit between inputs in the torch schema."""
    return op(**dict(zip((i.name for i in spec.inputs), tensors, strict=True)), **attrs)


def _dim_plan(model: Any, sample: _Sample, proto: Any) -> Any:
    """verify's plan of the file's dynamic dims for ``sample`` (their export sizes and ranges)."""
    from onnx_custom.verification.runner import bind_inputs
    from onnx_custom.verification.trial_shapes import plan_dims

    return plan_dims(proto, bind_inputs(proto, sample.tensors, model), sample.tensors, model=model)


def _smallest_dim(sample: _Sample) -> int:
    return min((d for t in sample.tensors for d in t.shape), default=0)


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


# -- the checks -----------------------------------------------------------------------------------


@dataclasses.dataclass
class _Checker:
    spec: OpSpec
    registration: generate.SpecRegistration
    samples: list[_Sample]
    trials: int
    dynamic: bool

    @property
    def op(self) -> Any:
        return self.registration.op

    def kinds(self) -> list[_Sample]:
        """One sample per kind, the one each kind's file is exported with: the sample whose
        smallest dim is largest, since torch.export specializes dims of size 0 and 1."""
        if not self.dynamic:
            return list(self.samples)
        firsts = [
            s
            for i, s in enumerate(self.samples)
            if not any(s.same_kind(t) for t in self.samples[:i])
        ]
        return [max((s for s in self.samples if s.same_kind(f)), key=_smallest_dim) for f in firsts]

    def opcheck(self, sample: _Sample) -> str:
        results = torch.library.opcheck(self.op, sample.args, sample.kwargs, raise_exception=False)
        failed = {k: v for k, v in results.items() if v != "SUCCESS"}
        if failed:
            raise AssertionError(
                "; ".join(
                    f"{k}: {(str(v).strip() or type(v).__name__).splitlines()[0]}"
                    for k, v in failed.items()
                )
            )
        return ", ".join(results)

    def backward(self, impl: Any, sample: _Sample) -> str:
        tensors, attrs = sample.bound.tensors, sample.bound.attrs
        floats = [
            i
            for i, t in enumerate(tensors)
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        if not floats:
            raise _Skip("no floating-point tensor input to differentiate")

        def leaves(dtype: torch.dtype | None) -> list[Any]:
            # only the floating inputs are cast (index tensors keep their dtype)
            return [
                (
                    t.detach()
                    .to(dtype if dtype is not None and i in floats else t.dtype)
                    .requires_grad_(i in floats)
                    if isinstance(t, torch.Tensor)
                    else t
                )
                for i, t in enumerate(tensors)
            ]

        if all("float64" in self.spec.inputs[i].dtypes for i in floats):
            inputs = leaves(torch.float64)

            def call(*values: torch.Tensor) -> Any:
                merged = list(inputs)
                for i, value in zip(floats, values, strict=True):
                    merged[i] = value
                return _call(self.spec, self.op, merged, attrs)

            torch.autograd.gradcheck(call, tuple(inputs[i] for i in floats))
            return "gradcheck (finite differences, float64)"
        if impl is None:
            raise _Skip(
                "float64 is not declared and there is no eager impl to differentiate instead"
            )
        ours, ref = leaves(None), leaves(None)
        out_ours, out_ref = (
            _as_tuple(_call(self.spec, self.op, ours, attrs)),
            _as_tuple(impl(*ref, **attrs)),
        )
        if not all(o.requires_grad for o in out_ref):
            raise _Skip("float64 is not declared and autograd cannot differentiate the eager impl")
        cotangents = [torch.randn_like(o) for o in out_ours]
        got = torch.autograd.grad(
            out_ours, [ours[i] for i in floats], cotangents, allow_unused=True
        )
        want = torch.autograd.grad(out_ref, [ref[i] for i in floats], cotangents, allow_unused=True)
        for i, g, w in zip(floats, got, want, strict=True):
            try:
                torch.testing.assert_close(g, w)
            except AssertionError as exc:
                raise AssertionError(
                    f"gradient of input {self.spec.inputs[i].name!r}: {exc}"
                ) from None
        return "backward vs autograd through the eager impl"

    def registry_with(self, entry: SymbolicEntry) -> Registry:
        """The default registry with ``entry`` as this op's only translation."""
        registry = Registry([e for e in default_registry() if e.target.key != entry.target.key])
        registry.add(dataclasses.replace(entry, variant=DEFAULT_VARIANT))
        return registry

    def export_and_verify(
        self,
        entry: SymbolicEntry,
        exporter: str,
        opset: int,
        first: _Sample,
        *,
        dynamic: bool,
        run: bool = True,
        kernels: Any = None,
        body: KernelSpec | None = None,
    ) -> _Verified | str:
        """Export ``first`` through ``entry`` (``dynamic``: every dim marked ``Dim.AUTO``, so the
        exporter keeps free exactly the dims the op's shape rule / fake kernel leaves free);
        verify at every sample of its kind and, with ``trials > 1``, at other sizes of the file's
        dynamic dims (size 1, larger, twice; see `onnx_custom.verify`). ``body``: embed that
        declaration's function body; ``kernels``: what ONNX Runtime may use."""
        from onnx_custom.api import export
        from onnx_custom.function_bodies.embed import embed_functions
        from onnx_custom.verification.trial_shapes import one_dim_cases
        from onnx_custom.verification.verifier import verify

        model = _op_module(self.spec, self.op, first)
        shapes = (
            tuple({d: torch.export.Dim.AUTO for d in range(t.dim())} for t in first.tensors)
            if dynamic
            else None
        )
        proto = export(
            model,
            first.tensors,
            exporter=exporter,
            opset=opset,
            registry=self.registry_with(entry),
            dynamic_shapes=shapes,
        )
        if not run:
            return "exported (no Python kernel is declared: not run in ONNX Runtime)"
        if body is not None:
            proto = embed_functions(proto, KernelRegistry([body]))
            if not proto.functions:
                raise AssertionError(f"no function body was embedded for {self.spec.node_type}")
        runs = (
            [first, *(s for s in self.samples if s.same_kind(first) and s is not first)]
            if dynamic
            else [first]
        )
        records: list[Any] = []
        for sample in runs:
            # trials=1: the samples only, no random inputs at other sizes (index tensors and other
            # data-dependent inputs cannot be drawn at random)
            report = verify(
                model,
                sample.tensors,
                proto,
                trials=self.trials,
                kernels=kernels,
                shapes=() if self.trials == 1 else None,
            )
            records += report.shapes_tried
        plan = None
        if dynamic and self.trials > 1:
            plan = _dim_plan(model, first, proto)
            if any(r.status == "skipped" and r.kind != "apart" for r in records):
                # the op refused every dim moved at once: move each dim alone. Not for a skipped
                # apart trial: dims the file names apart but the op ties are said in a note, and
                # the one-dim sizes (size 1 among them) would feed a kernel written for equal
                # shapes the shapes eager broadcasts
                records += verify(
                    model,
                    first.tensors,
                    proto,
                    trials=1,
                    kernels=kernels,
                    shapes=one_dim_cases(plan),
                ).shapes_tried
        tried: dict[str, None] = {}
        for record in records:
            shape = (
                ", ".join(f"{name}{list(dims)}" for name, dims in record.input_shapes)
                or "no tensor input"
            )
            tried.setdefault(
                (
                    shape
                    if record.status == "passed"
                    else f"{shape} ({record.status}: {record.reason})"
                ),
                None,
            )
        detail = (
            f"verified in ONNX Runtime at {len(tried)} shape(s): {'; '.join(tried)} ({self.trials}"
            " trial(s) per sample)"
        )
        return _Verified(
            f"{detail}{self.fixed_dims_note(proto, dynamic, plan, records)}", tuple(tried)
        )

    def fixed_dims_note(self, proto: Any, dynamic: bool, plan: Any, records: Sequence[Any]) -> str:
        """Why some sizes were not tried: the dims the file keeps static, the dynamic dims no
        other size passed for (with eager's reason), what limits the sizes drawn."""
        if not dynamic:
            return "; other sizes not tried: dynamic=False exports the sample's shape only"
        fixed = [
            f"{i.name} dim {d} = {dim.dim_value}"
            for i in proto.graph.input
            for d, dim in enumerate(i.type.tensor_type.shape.dim)
            if dim.HasField("dim_value")
        ]
        notes = []
        if fixed:
            notes.append(
                f"static in the exported file, so not varied: {', '.join(fixed)} (the exporter kept"
                " the sample's size: the op's shape rule or fake kernel ties the dim to another"
                " input's or to a constant, or the sample's size was 0 or 1)"
            )
        if plan is not None:
            for key, dim in plan.dims.items():
                if any(
                    r.status == "passed"
                    and dict(r.sizes).get(key, dim.export_size) != dim.export_size
                    for r in records
                ):
                    continue
                refused = [
                    r.reason
                    for r in records
                    if r.status != "passed"
                    and r.kind != "apart"
                    and dict(r.sizes).get(key, dim.export_size) != dim.export_size
                ]
                why = f": {refused[0]}" if refused else f" (range {dim.describe_range()})"
                notes.append(
                    f"dynamic dim {key} ({', '.join(dim.where)}) ran at its export size"
                    f" {dim.export_size} only{why}"
                )
        apart = next((r for r in records if r.kind == "apart" and r.status == "skipped"), None)
        if apart is not None:
            notes.append(
                "the dims the file names apart were tried at different sizes, which eager refused:"
                " the op ties dims its shape rule leaves free (a deployment may still feed them"
                " different sizes)"
            )
        if self.trials == 1:
            notes.append(
                "other sizes along the free dims were not drawn: trials=1 (inputs such as index"
                " tensors cannot be drawn at random); only the samples' sizes ran. Fix: pass"
                " samples of other sizes, or trials>=2 if random inputs are valid"
            )
        return "".join(f"; {n}" for n in notes)

    def node_entry(self) -> SymbolicEntry | None:
        """The custom node's translation at its first opset (None: the spec has no node)."""
        nodes = [e for e in self.registration.translations if e.emits]
        return min(nodes, key=lambda e: e.opset) if nodes else None

    def export_cases(
        self, exporters: Sequence[str], opsets: Sequence[int] | None
    ) -> Iterator[CheckCase]:
        node = self.node_entry()
        standard = [e for e in self.registration.translations if not e.emits]
        plans: list[tuple[str, SymbolicEntry, str, int | None, str]] = []
        if node is not None:
            for x in exporters:
                for o in opsets or [max(_DEFAULT_OPSET[x], node.opset)]:
                    usable = o >= node.opset
                    plans.append(
                        (
                            f"custom node {self.spec.node_type}",
                            node,
                            x,
                            o if usable else None,
                            f"the custom node's translation starts at opset {node.opset}",
                        )
                    )
        for entry in sorted(
            standard, key=lambda e: (e.variant != DEFAULT_VARIANT, e.variant, e.opset)
        ):
            # a translation covers its opset up to the next one of its variant
            later = sorted(
                e.opset for e in standard if e.variant == entry.variant and e.opset > entry.opset
            )
            end = later[0] if later else None
            variant = "" if entry.variant == DEFAULT_VARIANT else f", variant {entry.variant!r}"
            label = f"translation opset>={entry.opset}{variant} ({entry.source})"
            for exporter in exporters:
                if exporter == "torchscript":
                    ts_opset = entry.opset if entry.opset in _TS_OPSETS else None
                    plans.append(
                        (
                            label,
                            entry,
                            exporter,
                            ts_opset,
                            (
                                "the TorchScript exporter supports opsets"
                                f" {_TS_OPSETS.start}..{_TS_OPSETS.stop - 1}"
                            ),
                        )
                    )
                else:
                    dynamo_opset = max(entry.opset, _DYNAMO_NATIVE_OPSET)
                    covered = dynamo_opset if end is None or dynamo_opset < end else None
                    plans.append(
                        (
                            label,
                            entry,
                            exporter,
                            covered,
                            (
                                "this translation covers opsets"
                                f" {entry.opset}..{end - 1 if end else ''}, below the dynamo"
                                f" exporter's opset {_DYNAMO_NATIVE_OPSET}"
                            ),
                        )
                    )
        runs_kernel = self.registration.kernel is not None
        for label, entry, exporter, opset, reason in plans:
            for first in self.kinds():
                name = f"{label}, {exporter} opset {opset}, {first.describe()}"
                if opset is None:
                    yield CheckCase(name, None, reason)
                    continue
                run = runs_kernel or not entry.emits
                yield _run(
                    name,
                    functools.partial(
                        self.export_and_verify,
                        entry,
                        exporter,
                        opset,
                        first,
                        dynamic=self.dynamic,
                        run=run,
                    ),
                )

    def node_cases(self, dtypes: bool) -> Iterator[CheckCase]:
        """Other declared dtypes, the function body and the native kernel, for the custom node."""
        custom = self.node_entry()
        if custom is None:
            return
        node, first, ts = (
            self.spec.node_type,
            self.kinds()[0],
            max(_DEFAULT_OPSET["torchscript"], custom.opset),
        )
        verify_at = functools.partial(self.export_and_verify, custom, "torchscript", ts)
        leading = {i: _first_tensor(t) for i, t in enumerate(first.bound.tensors)}
        floats = {i: t for i, t in leading.items() if t is not None and t.is_floating_point()}
        if dtypes and floats and self.registration.kernel is not None:
            common = set.intersection(*(set(self.spec.inputs[i].dtypes) for i in floats))
            current = str(next(iter(floats.values())).dtype).removeprefix("torch.")
            for name in (d for d in _FLOATS if d in common and d != current):
                cast = first.cast(getattr(torch, name))
                yield _run(
                    f"custom node {node} at {name}, torchscript opset {ts}",
                    functools.partial(verify_at, cast, dynamic=self.dynamic),
                )
        if self.spec.function is not None and self.registration.declaration is not None:
            # no Python kernels: ONNX Runtime must inline the body
            yield _run(
                f"function body of {node} (ONNX Runtime without our kernels)",
                functools.partial(
                    verify_at,
                    first,
                    dynamic=self.dynamic,
                    kernels=KernelRegistry(),
                    body=self.registration.declaration,
                ),
            )
        if isinstance(self.spec.native, NativeKernel):
            yield from _user_native_cases(self, custom, first, ts, floats)
        elif self.spec.native:
            if importlib.util.find_spec("onnx_custom.runtime.native") is None:
                yield CheckCase(
                    f"native kernel of {node}",
                    None,
                    "the native library (onnx_custom.runtime.native) is not part of this build",
                )
            else:
                yield _run(
                    f"native kernel of {node}",
                    functools.partial(verify_at, first, dynamic=self.dynamic, kernels="native"),
                )


def _user_native_cases(
    checker: _Checker,
    custom: SymbolicEntry,
    first: _Sample,
    opset: int,
    floats: dict[int, torch.Tensor],
) -> Iterator[CheckCase]:
    """The user's C++ kernel (``native: {source, function}``), built into its own library, against
    eager at the sample's dtype and every other declared floating dtype, at several sizes."""
    from onnx_custom.spec.native_library import build_native_library

    spec = checker.spec
    node = spec.node_type
    library: list[Any] = []

    def built() -> Any:
        if not library:
            library.append(build_native_library([spec]))
        return library[0]

    common = set.intersection(*(set(spec.inputs[i].dtypes) for i in floats)) if floats else set()
    current = str(next(iter(floats.values())).dtype).removeprefix("torch.") if floats else None
    samples = [(current or "sample dtypes", first)] + [
        (d, first.cast(getattr(torch, d))) for d in _FLOATS if d in common and d != current
    ]
    for label, sample in samples:

        def case(sample: _Sample = sample) -> _Verified:
            result = checker.export_and_verify(
                custom, "torchscript", opset, sample, dynamic=checker.dynamic, kernels=built()
            )
            assert isinstance(result, _Verified)  # run=True: the file ran
            return dataclasses.replace(result, detail=f"{result.detail} with {built().path.name}")

        yield _run(
            f"native kernel of {node} ({Path(str(getattr(spec.native, 'source', ''))).name}) at"
            f" {label}, torchscript opset {opset}",
            case,
        )


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value if isinstance(value, torch.Tensor) else None


def check_op(
    spec: OpSpec,
    sample_inputs: Any,
    *,
    exporters: Sequence[str] = EXPORTERS,
    opsets: Sequence[int] | None = None,
    dtypes: bool = True,
    dynamic: bool = True,
    trials: int = 2,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Run every test ``spec`` implies on ``sample_inputs`` (see the module docstring).

    ``sample_inputs``: one sample or a list; a sample is a tuple of the op's arguments in schema
    order (inputs, then attributes; defaults may be left out), a dict by name, or ``(args,
    kwargs)``. ``exporters``: which exporters to run. ``opsets``: opsets for the custom node
    (default: 17 TorchScript, 18 dynamo); standard translations run at the first opset they
    cover. ``dtypes``: also run the custom node at every other declared floating dtype.
    ``dynamic``: export with dynamic dims and verify each file at every sample of its kind.
    ``trials``: verification trials per sample (random inputs of the sample's shapes after the
    first, and other sizes along dynamic dims); ``trials=1`` verifies the samples only, for ops
    whose inputs cannot be drawn at random (index tensors). Raises `VerificationError` (``.report``
    is the `CheckReport`) unless ``raise_on_failure=False``.
    """
    if not isinstance(spec, OpSpec):
        raise SpecError(
            f"check_op expects an onnx_custom.OpSpec; received {type(spec).__name__}; fix: build"
            " one with OpSpec(...) or load_specs(path)."
        )
    exporters = (exporters,) if isinstance(exporters, str) else tuple(exporters)
    unknown = [e for e in exporters if e not in EXPORTERS]
    if unknown or not exporters:
        raise SpecError(
            f"check_op({spec.name}): exporters must be a non-empty subset of {EXPORTERS}; received"
            f" {list(exporters)}.",
            op=spec.name,
        )
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise SpecError(
            f"check_op({spec.name}): trials must be a positive int; received {trials!r}.",
            op=spec.name,
        )
    samples = _samples(spec, sample_inputs)
    with generate.spec_scope():
        checker = _Checker(spec, generate.register_spec(spec), samples, trials, dynamic)
        cases = [
            _run(f"opcheck sample {i}", functools.partial(checker.opcheck, s))
            for i, s in enumerate(samples)
        ]
        if spec.backward is not None:
            impl = signatures.inputs_first(
                spec, signatures.resolve(spec, ("impl",), spec.impl, "impl")
            )
            cases += [
                _run(f"backward sample {i}", functools.partial(checker.backward, impl, s))
                for i, s in enumerate(samples)
            ]
        cases += list(checker.export_cases(exporters, opsets))
        cases += list(checker.node_cases(dtypes))
    report = CheckReport(spec, cases)
    if raise_on_failure and not report.passed:
        raise VerificationError(str(report), report)
    return report


@dataclasses.dataclass(frozen=True)
class ZooCase:
    """One row: export ``model`` with ``exporter`` at ``opset`` (preferring ``variant``), verify.

    ``expect_error``: the export is *meant* to be refused with an `OnnxCustomError` whose message
    contains this text (e.g. an autograd.Function under the dynamo exporter); the row passes when
    it is, and the note documents the alternative. ``skip``: the row cannot run by design (the
    reason is shown as a SKIP row).
    """

    exporter: str
    opset: int
    variant: str | None = None
    dynamic: bool = False
    trials: int = 2
    note: str = ""
    expect_error: str | None = None
    skip: str | None = None

    @property
    def label(self) -> str:
        if not self.exporter:  # the placeholder row of a module that could not be imported
            return "(all rows)"
        parts = [self.exporter, f"opset{self.opset}"]
        if self.variant:
            parts.append(self.variant)
        if self.dynamic:
            parts.append("dynamic")
        return "-".join(parts)

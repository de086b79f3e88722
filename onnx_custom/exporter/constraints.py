"""What torch.export says about the dynamic dims, in the user's own dim names.

A dim the model fixes to a constant, or ties to another, is something only torch.export
notices (the TorchScript tracer records whatever sizes it saw). Its messages name torch's Dim
objects or sources (``L['x'].size()[0]``) and its programs name dims by symbol (``s77``); here
they become the user's dims, inputs and the fix.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from onnx_custom.errors import DynamicShapesError
from onnx_custom.exporter.dynamic_shapes import DynamicSpec
from onnx_custom.exporter.export_flag import onnx_exporting

__all__ = [
    "check_with_torch_export",
    "constraint_violation",
    "data_dependent_site",
    "note_data_dependent",
    "static_axes",
    "symbol_names_of",
    "unchecked_zero_one",
]

_VIOLATION_NAME = re.compile(r"Constraints violated \(([^)]*)\)")
_SOURCE = re.compile(r"""\[['"]([^'"]+)['"]\]\.(?:size\(\)|shape)\[(\d+)\]""")
_SPECIALIZED = re.compile(
    r"You marked (.+?) as dynamic but your code specialized it to be a constant \((-?\d+)\)"
)
_ZERO_ONE = re.compile(
    r"0/1 specialized due to hint of (\d+) for dimension (\S+?)\.?$", re.MULTILINE
)
_RAISED_AT = re.compile(
    r'The following call raised this error:\s*File "(?P<file>[^"]+)", line (?P<line>\d+),'
    r" in (?P<function>\S+)\n\s*(?P<code>[^\n]+)"
)
_TIED = re.compile(r"The values of (\S+) = .*? and (\S+) = .*? must always be equal")


def _violation_text(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if "Constraints violated" in text or ("specialized" in text and "Dim" in text):
            return text
        seen = seen.__cause__ or seen.__context__
    return ""


def _specializations(text: str) -> list[tuple[str, str]]:
    """(torch's name for the dim, the constant) for each dim torch.export fixed."""
    found = [(m.group(1), m.group(2)) for m in _SPECIALIZED.finditer(text)]
    return found + [(m.group(2), m.group(1)) for m in _ZERO_ONE.finditer(text)]


def unchecked_zero_one(exc: BaseException, spec: DynamicSpec) -> list[str]:
    """User names of dynamic dims torch.export fixed because their example size is 0 or 1:
    whether the model itself fixes them cannot be told from such an example."""
    names = {**{n: n for n in spec.dims}, **spec.torch_names}
    return sorted(
        {
            names.get(name, name)
            for name, value in _specializations(_violation_text(exc))
            if value in ("0", "1")
        }
    )


def constraint_violation(
    exc: BaseException, spec: DynamicSpec, *, allow_zero_one: bool = False
) -> DynamicShapesError | None:
    """torch.export's constraint violation (a dynamic dim the model fixes or ties to another)
    as our error, naming the inputs, the dims and the fix; None for any other error.

    ``allow_zero_one``: ignore torch fixing a dim whose example size is 0 or 1 (an artifact of
    tracing with that size, not something the model does; the TorchScript exporter keeps such
    a dim dynamic)."""
    text = _violation_text(exc)
    if not text:
        return None
    names = {**{n: n for n in spec.dims}, **spec.torch_names}

    def user_name(torch_name: str) -> str:
        found = _SOURCE.search(torch_name)
        if found:  # Dim.DYNAMIC is reported by source: L['x'].size()[0]
            axes = spec.axes.get(found.group(1), {})
            return axes.get(int(found.group(2)), torch_name)
        return names.get(torch_name, torch_name)

    def where(torch_name: str) -> str:
        user = user_name(torch_name)
        dim = spec.dims.get(user)
        sites = ", ".join(f"{n}[{a}]" for n, a in dim.sites) if dim else "?"
        return f"{user!r} (input axes {sites})"

    lines = []
    found_specialized = _specializations(text)
    for name, value in found_specialized:
        if allow_zero_one and value in ("0", "1"):
            continue
        hint = (
            " (torch.export fixes sizes 0 and 1: export with an example of size >= 2)"
            if value in ("0", "1")
            else ""
        )
        lines.append(
            f"dynamic dim {where(name)} is specialized by the model to the constant {value}{hint}."
            " Fix: make it static (drop it from dynamic_shapes), use Dim.AUTO to let torch decide,"
            " or change the model so it does not depend on that size (e.g. reshape(-1, ...)"
            " instead of a fixed size)."
        )
    for match in _TIED.finditer(text):
        a, b = match.groups()
        lines.append(
            f"dims {where(a)} and {where(b)} must always be equal in this model. Fix: give them the"
            " same name."
        )
    if not lines:
        if allow_zero_one and found_specialized:
            return None
        found = _VIOLATION_NAME.search(text)
        header = found.group(1) if found else "?"
        lines.append(
            "torch.export refused the dynamic dims"
            f" ({', '.join(where(n.strip()) for n in header.split(','))})."
        )
    detail = text.split("The error above occurred")[0].strip()
    return DynamicShapesError(
        "The model does not accept the dynamic shapes requested:\n  - "
        + "\n  - ".join(dict.fromkeys(lines))
        + f"\ntorch.export said:\n{detail}"
    )


def static_axes(program: torch.export.ExportedProgram, spec: DynamicSpec) -> set[tuple[str, int]]:
    """(input, axis) of the spec's dynamic axes that torch.export made static (a Dim.AUTO)."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    static = set()
    for leaf in spec.leaves:
        node = placeholders.get(leaf.onnx_name)
        val = None if node is None else node.meta.get("val")
        if isinstance(val, torch.Tensor):
            static |= {
                (leaf.onnx_name, axis)
                for axis in spec.axes.get(leaf.onnx_name, {})
                if _static(val.shape[axis])
            }
    return static


def _static(size: Any) -> bool:
    return isinstance(size, int) or bool(size.node.expr.is_number)


@contextlib.contextmanager
def _calls_recorded(functions: Sequence[type]) -> Iterator[list[str]]:
    """The names of the autograd.Functions among ``functions`` that the block applies."""
    called: list[str] = []
    saved = []
    for cls in functions:
        original = cls.__dict__.get("apply")
        inherited = cls.apply  # type: ignore[attr-defined]

        def apply(*a: Any, _inherited: Any = inherited, _name: str = cls.__qualname__) -> Any:
            called.append(_name)
            return _inherited(*a)

        saved.append((cls, original))
        cls.apply = apply  # type: ignore[attr-defined]
    try:
        yield called
    finally:
        for cls, original in saved:
            if original is None:
                del cls.apply  # type: ignore[attr-defined]
            else:
                cls.apply = original  # type: ignore[attr-defined]


def check_with_torch_export(
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    spec: DynamicSpec,
    functions: Sequence[type] = (),
) -> DynamicSpec:
    """The TorchScript tracer records sizes without noticing that the model fixes a dynamic one;
    torch.export does. Trace once with it: a dim the model specializes or ties to another is our
    error, a Dim.AUTO it made static stays static here too (as under the dynamo exporter). Any
    other torch.export failure (a TorchScript-only model) skips the check.

    ``functions``: autograd.Functions the export writes with their symbolic. torch.export traces
    their eager forward, whose Python (a loop over the batch) may fix a dim that the symbolic
    leaves free; when one of them ran, a fixed dim is a warning (verifying the file at other
    sizes decides), not an error."""
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            onnx_exporting(),
            _calls_recorded(functions) as called,
        ):
            warnings.simplefilter(
                "ignore"
            )  # the branch the TorchScript export takes, flag set as there
            program = torch.export.export(
                model, args, kwargs=kwargs, dynamic_shapes=spec.export_shapes, strict=False
            )
    except Exception as exc:
        violation = constraint_violation(exc, spec, allow_zero_one=True)
        if violation is not None and called:
            warnings.warn(
                "torch.export fixes a dynamic dim while tracing the model, which applies the"
                f" autograd.Function(s) {sorted(set(called))}; their eager forward may be what"
                " fixes it (a Python loop over the batch), and this export writes them with"
                " their symbolic instead, so the dims stay dynamic. Verify the file at other"
                f" sizes (onnx_custom.verify) to be sure. torch.export said: {violation}",
                UserWarning,
                stacklevel=4,
            )
            return spec
        if violation is not None:
            raise violation from exc
        unchecked = unchecked_zero_one(exc, spec)
        if unchecked:
            warnings.warn(
                f"Dynamic dim(s) {unchecked} were traced at size 0 or 1, so onnx-custom cannot"
                " check that the model accepts other sizes (torch.export fixes such dims). Fix:"
                " export with examples of size >= 2 along them, or verify the file at other"
                " sizes.",
                UserWarning,
                stacklevel=4,
            )
        return spec
    return spec.without(static_axes(program, spec))


def symbol_names_of(program: torch.export.ExportedProgram, spec: DynamicSpec) -> dict[str, str]:
    """torch's symbols (``s77``) of the program's inputs -> the user's dim names."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = list(program.graph_signature.user_inputs)
    mapping: dict[str, str] = {}
    for index, leaf in enumerate(spec.leaves):
        node = placeholders.get(
            leaf.onnx_name
            if leaf.onnx_name in user_inputs
            else user_inputs[index]
            if index < len(user_inputs)
            else ""
        )
        val = None if node is None else node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for axis, name in spec.axes.get(leaf.onnx_name, {}).items():
            size = val.shape[axis]
            if isinstance(size, int) or _static(size):
                continue  # a Dim.AUTO torch made static
            expr = size.node.expr
            dim = spec.dims[name]
            if expr.is_Symbol:
                mapping.setdefault(str(expr), name)
            elif (
                dim.root is not None and len(expr.free_symbols) == 1
            ):  # 2*s77 for 2*Dim("n"): s77 is n
                mapping.setdefault(str(next(iter(expr.free_symbols))), dim.root)
    return mapping


def data_dependent_site(exc: BaseException) -> str:
    """Where the model's code read a tensor's values into a Python decision that torch.export
    cannot trace (``file:line in function: code``), from torch's data-dependent guard error;
    "" for any other error."""
    if not isinstance(exc, torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode):
        return ""
    found = _RAISED_AT.search(str(exc))
    if found is None:
        return ""
    where = f"{found['file'].rsplit('/', 1)[-1]}:{found['line']}"
    return f"{where} in {found['function']}: {found['code'].strip()}"


def note_data_dependent(exc: BaseException) -> None:
    """Add to torch's data-dependent guard error whose failure it is, the model's line, and what
    to do (the message itself ends in torch's traced graph, which buries the line)."""
    site = data_dependent_site(exc)
    if site:
        exc.add_note(
            "torch.export cannot trace this model (torch's failure, not a translation's: a raw"
            " torch.onnx.export(..., dynamo=True) fails the same way): the model's code at"
            f" {site} turns a tensor's values into Python values (.tolist(), .item(), a loop over"
            " a tensor) that decide what it computes next. Fix: export with"
            " exporter='torchscript', which fixes that decision to the example's values (verify"
            " the file with other input values), or rewrite that line without Python values"
            " (torch._check for sizes, torch.cond for branches)."
        )

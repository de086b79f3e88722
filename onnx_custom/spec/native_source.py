"""`NativeKernel`: an op spec's ``native: {source: acme_kernels.cpp, function: scale_add}``.

It names the user's C++ file and the kernel function in it (see ``onnx_custom/kernel.h``);
`onnx_custom.spec.native_library` generates the ONNX Runtime registration around the function
and compiles both into one library. ``native: true`` (the shipped library serves the node) and
``native: "domain::OpType"`` keep their meaning.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onnx_custom.errors import SpecError

__all__ = ["NativeKernel", "native_field"]

# A C++ function name, optionally qualified by namespaces (acme::kernels::scale_add).
_FUNCTION = re.compile(r"^(?:[A-Za-z_]\w*::)*[A-Za-z_]\w*$")
_CPP_KEYWORDS = {
    "int",
    "float",
    "double",
    "void",
    "class",
    "struct",
    "template",
    "namespace",
    "return",
    "new",
    "delete",
    "operator",
}


@dataclasses.dataclass(frozen=True)
class NativeKernel:
    """The C++ kernel of an op: ``source`` (a C++ file; relative paths resolve against the YAML
    file that declares the spec, or the working directory for specs made in Python) and
    ``function`` (its name; a template is instantiated at every dtype the spec declares)."""

    source: str
    function: str

    def path(self) -> Path:
        return Path(self.source).expanduser().absolute()


def native_field(
    op: str, value: Any, base: str | os.PathLike[str] | None = None
) -> bool | str | NativeKernel:
    """``native`` normalized: bools and node names as given, a ``{source, function}`` mapping as a
    `NativeKernel` (relative ``source`` against ``base``). Raises `SpecError` naming the key."""
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, NativeKernel):
        fields = {"source": value.source, "function": value.function}
    elif isinstance(value, Mapping):
        unknown = sorted(set(value) - {"source", "function"})
        if unknown:
            raise SpecError(
                f"op {op}: native has unknown key(s) {unknown}; expected {{source: my_kernels.cpp,"
                " function: my_kernel}.",
                op=op,
                key=("native", unknown[0]),
            )
        fields = dict(value)
    else:
        raise SpecError(
            f"op {op}: native must be true/false, 'domain::OpType' or {{source: file.cpp, function:"
            f" name}}; received {type(value).__name__} {value!r}.",
            op=op,
            key=("native",),
        )
    for key in ("source", "function"):
        if key not in fields:
            raise SpecError(
                f"op {op}: native names no {key}; expected {{source: my_kernels.cpp, function:"
                f" my_kernel}}; fix: add {key}:.",
                op=op,
                key=("native",),
            )
    source, function = fields["source"], fields["function"]
    if not isinstance(source, (str, os.PathLike)) or not str(source).strip():
        raise SpecError(
            f"op {op}: native.source must be the path of a C++ file; received {source!r}.",
            op=op,
            key=("native", "source"),
        )
    if (
        not isinstance(function, str)
        or not _FUNCTION.match(function)
        or function.split("::")[-1] in _CPP_KEYWORDS
    ):
        raise SpecError(
            f"op {op}: native.function {function!r} is not a C++ function name; expected e.g."
            " 'scale_add' or 'acme::scale_add'.",
            op=op,
            key=("native", "function"),
        )
    path = Path(source).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return NativeKernel(str(path), function)

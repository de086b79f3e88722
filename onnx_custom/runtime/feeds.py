"""ORT's refusals of a ``run`` call's inputs, retold against the model's declared inputs.

Checked only after ONNX Runtime refused the call, so a good call pays nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnx_custom.errors import InvalidArgumentError

__all__ = ["explain_feed_error"]

_ORT_TO_NUMPY = {
    "float": "float32", "double": "float64", "float16": "float16", "int8": "int8", "int16": "int16",
    "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "bool",
}


def _declared(arg: Any) -> str:
    return f"{arg.name!r} ({arg.type}, shape {list(arg.shape)})"


def _problems(session: Any, output_names: Any, input_feed: Any) -> list[str]:
    inputs = {a.name: a for a in session.get_inputs()}
    if not isinstance(input_feed, Mapping):
        return [f"input_feed must be a dict {{input name: array}}; received {type(input_feed).__name__}"]
    problems = []
    missing = [n for n in inputs if n not in input_feed]
    for name in input_feed:
        if name not in inputs:
            close = difflib.get_close_matches(str(name), [*missing, *inputs], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{name!r} is not an input of the model{hint}")
    problems += [f"input {_declared(inputs[n])} is missing" for n in missing]
    for name, value in input_feed.items():
        arg = inputs.get(name)
        if arg is not None and not isinstance(value, (np.ndarray, np.generic)):
            fix = "x.detach().cpu().numpy()" if type(value).__module__.startswith("torch") else "np.asarray(x)"
            problems.append(f"input {name!r} is a {type(value).__module__}.{type(value).__name__}; expected "
                            f"a numpy array: pass {fix}")
            continue
        dtype = getattr(value, "dtype", None)
        if arg is None or dtype is None or not isinstance(getattr(value, "shape", None), tuple):
            continue
        wanted = _ORT_TO_NUMPY.get(arg.type.removeprefix("tensor(").removesuffix(")"))
        if wanted is not None and np.dtype(dtype) != np.dtype(wanted):
            problems.append(f"input {name!r} is {np.dtype(dtype)} but the model declares {arg.type} "
                            f"(numpy {wanted}): cast it with .astype(np.{wanted})")
        if isinstance(arg.shape, list) and len(value.shape) != len(arg.shape):
            problems.append(f"input {name!r} has {len(value.shape)} dim(s) {list(value.shape)} but the model "
                            f"declares {len(arg.shape)}: {list(arg.shape)}")
    known_outputs = [o.name for o in session.get_outputs()]
    for name in output_names or ():
        if name not in known_outputs:
            problems.append(f"output {name!r} is not an output of the model")
    return problems


def explain_feed_error(session: Any, output_names: Any, input_feed: Any, exc: BaseException) -> None:
    """Raise `InvalidArgumentError` (from ``exc``) when the call's inputs or output names do not fit
    the model; return when they do (the failure is something else)."""
    problems = _problems(session, output_names, input_feed)
    if not problems:
        return
    inputs = ", ".join(_declared(a) for a in session.get_inputs())
    outputs = ", ".join(repr(o.name) for o in session.get_outputs())
    raise InvalidArgumentError(
        f"run(): {'; '.join(problems)}. Expected inputs: {inputs}; outputs: {outputs}. Fix: pass "
        "run(None or [output names], {input name: numpy array of the declared dtype and rank})."
    ) from exc

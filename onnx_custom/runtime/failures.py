"""Kernel failures surfaced as typed errors: :class:`KernelRunError` from ORT's error text.

The shim writes every kernel failure into ORT's status text (prefixed ``onnx-custom kernel``) and
keeps the kernel's own exception under a token in that text (see ``host.format_error``); here the
ORT exception is turned back into a typed error carrying it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import onnx
import onnxruntime as ort

from onnx_custom.errors import KernelError, OnnxCustomError
from onnx_custom.runtime.host import take_failure
from onnx_custom.runtime.kernel_spec import KernelSpec

__all__ = ["KernelRunError", "raise_for_type_error", "raise_typed", "typed_kernel_errors"]

_OrtFail: type[Exception] = ort.capi.onnxruntime_pybind11_state.Fail  # type: ignore[attr-defined]


class KernelRunError(KernelError, _OrtFail):  # type: ignore[misc,valid-type]
    """A Python kernel failed while ONNX Runtime created or ran it.

    ``kernel`` (``"domain::OpType"``), ``node`` (the node's name), ``cause_type`` (the name of the
    exception the kernel raised, None when the host itself rejected the kernel's result),
    ``traceback`` (the kernel's traceback text) and ``cause`` (that exception, also chained as
    ``__cause__``). Still an ``onnxruntime`` ``Fail`` for code written against plain ORT.
    """

    def __init__(
        self,
        message: str,
        *,
        kernel: str,
        node: str,
        cause_type: str | None = None,
        traceback: str = "",
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.node = node
        self.cause_type = cause_type
        self.traceback = traceback
        self.cause = cause


_OUR_TEXT = "onnx-custom kernel "
_ORT_NODE = re.compile(r"Name:'([^']*)'")
_OUR_KERNEL = re.compile(r"onnx-custom kernel (\S+?)(?:: | \(node| raised)")
_ORT_STATUS = re.compile(r"(?s)Status Message: (.*)")


def raise_typed(exc: Exception, when: str) -> NoReturn:
    """Re-raise an ORT error that came from one of our kernels as KernelRunError (and a
    KeyboardInterrupt or SystemExit raised inside a kernel as itself); others unchanged."""
    text = str(exc)
    if _OUR_TEXT not in text:
        raise exc
    failure = take_failure(text)
    if failure is not None and isinstance(failure.exception, (KeyboardInterrupt, SystemExit)):
        raise failure.exception from None
    found_kernel = _OUR_KERNEL.search(text)
    found_node = _ORT_NODE.search(text)
    kernel = failure.kernel if failure else found_kernel.group(1) if found_kernel else "?"
    node = failure.node if failure and failure.node else found_node.group(1) if found_node else ""
    where = f"node {node!r}" if node else "an unnamed node"
    if failure is not None:
        cause = failure.exception
        if isinstance(cause, KernelError):  # the host's own check, message already has the fix
            detail = str(cause)
        else:
            detail = (
                f"{type(cause).__name__}: {cause}\n\nkernel traceback:\n{failure.traceback}"
                "fix: the error comes from the kernel's own code (traceback above): "
                "correct the kernel, or the inputs/attributes the node gives it."
            )
        raise KernelRunError(
            f"kernel {kernel} failed while ONNX Runtime {when} {where}: {detail}",
            kernel=kernel,
            node=node,
            cause_type=type(cause).__name__,
            traceback=failure.traceback,
            cause=cause,
        ) from cause
    status = _ORT_STATUS.search(text)
    detail = (status.group(1) if status else text).replace(f"{_OUR_TEXT}{kernel}: ", "")
    raise KernelRunError(
        f"kernel {kernel} failed while ONNX Runtime {when} {where}: {detail}",
        kernel=kernel,
        node=node,
    ) from None


_ORT_BAD_INPUT = re.compile(
    r"Type '(tensor\((\w+)\))' of input parameter \((.*?)\) of operator \((\w+)\) "
    r"in node \((.*?)\) is invalid"
)
_ORT_BAD_OUTPUT = re.compile(
    r"Type \((tensor\((\w+)\))\) of output arg \((.*?)\) of node \((.*?)\) does not "
    r"match expected type \((tensor\((\w+)\))\)"
)


def raise_for_type_error(
    exc: Exception, specs: Sequence[KernelSpec], nodes: Sequence[onnx.NodeProto]
) -> None:
    """ORT's type errors about our nodes, retold with the declaration and the fix."""
    text = str(exc)
    ours = {s.op_type: s for s in specs}
    bad_in = _ORT_BAD_INPUT.search(text)
    if bad_in and bad_in.group(4) in ours:
        spec = ours[bad_in.group(4)]
        declared = "; ".join(f"{p.name}: {', '.join(p.dtypes)}" for p in spec.inputs)
        raise KernelError(
            f"node {bad_in.group(5)!r} ({spec.name}) gives input {bad_in.group(3)!r} of dtype"
            f" {bad_in.group(2)}, outside the kernel's declared input dtypes ({declared}); fix:"
            " cast the input (a Cast node) or widen dtypes= at registration."
        ) from exc
    bad_out = _ORT_BAD_OUTPUT.search(text)
    if bad_out:
        producer = next(
            (n for n in nodes if bad_out.group(3) in n.output and n.op_type in ours), None
        )
        if producer is not None:
            spec = ours[producer.op_type]
            raise KernelError(
                f"node {producer.name!r} ({spec.name}) output {bad_out.group(3)!r}: the model"
                f" states {bad_out.group(2)} but the kernel produces {bad_out.group(6)} (its"
                " shape_fn or declared dtypes); fix: correct the model's type for"
                f" {bad_out.group(3)!r}, or the kernel's dtypes=/shape_fn."
            ) from exc


_F = TypeVar("_F", bound=Callable[..., Any])


def typed_kernel_errors(method: _F) -> _F:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except OnnxCustomError:
            raise
        except Exception as exc:
            raise_typed(exc, "ran")

    return wrapper  # type: ignore[return-value]

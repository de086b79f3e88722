"""Qualified names (``ns::op[.overload]``) and translation targets, validated in one place."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from onnx_custom.errors import SymbolicError

__all__ = ["QualifiedName", "Target", "normalize_target", "parse_node_type"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_QUALIFIED = re.compile(rf"^(?P<ns>{_IDENT})::(?P<op>{_IDENT})(?:\.(?P<overload>{_IDENT}))?$")
# ONNX domains may contain dots ("com.microsoft"); op types are identifiers.
_NODE_TYPE = re.compile(rf"^(?:(?P<domain>{_IDENT}(?:\.{_IDENT})*)::)?(?P<op>{_IDENT})$")


@dataclasses.dataclass(frozen=True, order=True)
class QualifiedName:
    """A torch op name: namespace, op name and optional overload (``aten::add.Tensor``)."""

    namespace: str
    name: str
    overload: str = ""

    @classmethod
    def parse(cls, text: str) -> QualifiedName:
        if not isinstance(text, str):
            raise SymbolicError(
                f"Expected a qualified op name string like 'aten::asinh', got {type(text).__name__}"
                f" {text!r}."
            )
        match = _QUALIFIED.match(text.strip())
        if match is None:
            hint = ""
            if ":" in text and "::" not in text:
                hint = " The separator is a double colon '::'."
            elif "::" not in text:
                hint = f" Did you mean 'aten::{text}' or '<your_namespace>::{text}'?"
            raise SymbolicError(
                f"Ill-formed op name {text!r}: expected 'namespace::op' or 'namespace::op.overload'"
                " (e.g. 'aten::asinh', 'torchvision::deform_conv2d',"
                f" 'onnx_custom::my_add.default').{hint}"
            )
        return cls(match["ns"], match["op"], match["overload"] or "")

    @property
    def op(self) -> str:
        """``ns::op`` without the overload (the TorchScript exporter's key)."""
        return f"{self.namespace}::{self.name}"

    def __str__(self) -> str:
        return f"{self.op}.{self.overload}" if self.overload else self.op


@dataclasses.dataclass(frozen=True)
class Target:
    """What a translation is registered for: a torch op by name, or an autograd.Function class."""

    name: QualifiedName | None
    function: type | None = None  # a torch.autograd.Function subclass

    @property
    def key(self) -> str:
        if self.function is not None:
            return f"autograd::{self.function.__module__}.{self.function.__qualname__}"
        assert self.name is not None
        return str(self.name)

    def __str__(self) -> str:
        return self.key


def normalize_target(target: Any) -> Target:
    """Turn a user-supplied target into a `Target`,
    or raise `SymbolicError` saying how to fix it."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        raise SymbolicError(
            f"Got the OpOverloadPacket {target!r}; expected an OpOverload such as "
            f"{target}.default or a name string '{target._qualified_op_name}'. "
            "Pick the overload explicitly (the dynamo exporter dispatches on overloads)."
        )
    if isinstance(target, torch._ops.OpOverload):
        ns, _, rest = target.name().partition("::")
        op, _, overload = rest.partition(".")
        return Target(QualifiedName(ns, op, overload or "default"))
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return Target(None, function=target)
    if isinstance(target, str):
        return Target(QualifiedName.parse(target))
    raise SymbolicError(
        f"Unsupported translation target {target!r} of type {type(target).__name__}: expected a"
        " qualified name 'ns::op[.overload]', a torch OpOverload, or a torch.autograd.Function"
        " subclass."
    )


def parse_node_type(text: str) -> tuple[str, str]:
    """``"onnx_custom::my_add"`` -> ``("onnx_custom", "my_add")``; ``"Asinh"``
    -> ``("", "Asinh")``."""
    match = _NODE_TYPE.match(text) if isinstance(text, str) else None
    if match is None:
        raise SymbolicError(
            f"Ill-formed ONNX node type {text!r}: expected 'OpType' for the default domain or "
            "'domain::OpType' (e.g. 'Asinh', 'onnx_custom::my_add', 'com.microsoft::FusedConv')."
        )
    domain = match["domain"] or ""
    if domain in ("ai.onnx", "onnx"):
        domain = ""
    return domain, match["op"]

"""A custom op's fake (meta) kernel checked against its real kernel at dynamo export.

torch.export traces custom ops through their fake kernels (``register_fake``), and the dynamo
exporter writes the rank and dtype the fake declares into the ONNX file. A fake that disagrees
with the real kernel (``empty_like(x)`` for an op that adds a dimension) gives a file whose types
do not describe what the op computes: a consumer fails far from the cause, or only verify's
first eager run notices. `check_fake_kernels` catches it at export, cheaply: each custom op of
the traced graph runs its real CPU kernel once per distinct call (op, input shapes and dtypes,
other arguments), on the program's own buffers, parameters and example inputs where the call
reads them directly, and zeros of the traced shape and dtype elsewhere (no other part of the
model runs). Then the outputs' ranks and dtypes are compared with the fake's.

The shipped ``onnx_custom::`` ops are not run (their op specs check the meta functions against
eager already). Never a false alarm: a call is skipped when the op has no CPU kernel (a CUDA-only
op, a fake-only op), when an input's size is data-dependent (no example value), when its inputs
would exceed `MAX_INPUT_BYTES`, or when the real kernel raises on these inputs (zeros may be
invalid input). An op spec's eager call compares its meta function with the impl itself: its
shape disagreement becomes a `FakeKernelError` too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from onnx_custom.common.op_namespace import NAMESPACE
from onnx_custom.errors import FakeKernelError, SpecError

__all__ = ["MAX_INPUT_BYTES", "check_fake_kernels"]

MAX_INPUT_BYTES = 256 << 20  # a call whose inputs are bigger is not run (memory, time)
# torch's own ops, and the shipped ones (their op specs check the meta functions against eager at
# each new signature; running them here could build their C++ extension during an export)
_SKIPPED_NAMESPACES = frozenset(
    {
        "aten",
        "prims",
        "rngprims",
        "quantized_decomposed",
        "_c10d_functional",
        "c10d_functional",
        NAMESPACE,
    }
)
_REAL_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


class _Skip(Exception):
    """This call cannot be run honestly on example values."""


def _has_cpu_kernel(op: torch._ops.OpOverload) -> bool:
    name = op.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in _REAL_KEYS)


def _size(value: Any) -> int:
    """The example value of a (symbolic) size, or `_Skip` for a data-dependent one."""
    if isinstance(value, int):
        return value
    hint = getattr(getattr(value, "node", None), "hint", None)
    if hint is None:
        raise _Skip
    return int(hint)


def _scalar(value: Any) -> Any:
    if isinstance(value, torch.SymInt):
        return _size(value)
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        hint = getattr(value.node, "hint", None)
        if hint is None:
            raise _Skip
        return hint
    return value


def _known_values(
    program: torch.export.ExportedProgram, args: Any, kwargs: Mapping[str, Any] | None
) -> dict[str, torch.Tensor]:
    """Placeholder name -> real tensor: the program's buffers, parameters and constants, and the
    user's example inputs when they line up with the program's user inputs."""
    signature = program.graph_signature
    known: dict[str, torch.Tensor] = {}
    for placeholder, fqn in {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }.items():
        tensor = program.state_dict.get(fqn)
        if tensor is None:
            tensor = program.constants.get(fqn)
        if isinstance(tensor, torch.Tensor):
            known[placeholder] = tensor
    leaves = pytree.tree_leaves((tuple(args or ()), dict(kwargs or {})))
    users = list(signature.user_inputs)
    if len(leaves) == len(users):
        for name, leaf in zip(users, leaves, strict=True):
            if isinstance(leaf, torch.Tensor):
                known[name] = leaf
    return known


def _materialize(value: Any, node: Any, known: Mapping[str, torch.Tensor]) -> tuple[Any, int]:
    """A real argument for one argument of a call, and its bytes: the known tensor of a
    placeholder, else zeros of the traced shape and dtype; scalars as their example values."""
    if isinstance(value, (list, tuple)):
        items = [_materialize(v, node, known) for v in value]
        return type(value)(v for v, _ in items), sum(n for _, n in items)
    if not isinstance(value, torch.fx.Node):
        return _scalar(value), 0
    meta = value.meta.get("val")
    if isinstance(meta, torch.Tensor):
        real = known.get(value.name) if value.op == "placeholder" else None
        shape = [_size(d) for d in meta.shape]
        if math.prod(shape) * meta.element_size() > MAX_INPUT_BYTES:
            raise _Skip  # not even one such input is made
        if (
            real is None
            or list(real.shape) != shape
            or real.dtype != meta.dtype
            or real.device.type != "cpu"
        ):
            if meta.device.type not in ("cpu", "meta"):
                raise _Skip  # traced for another device: the CPU kernel is not the one used
            real = torch.zeros(shape, dtype=meta.dtype)
        else:
            real = real.detach().clone()  # a kernel writing into its input must not touch ours
        return real, real.numel() * real.element_size()
    if meta is None:
        raise _Skip
    return _scalar(meta), 0


def _describe(tensor: Any) -> str:
    shape = [d if isinstance(d, int) else str(d) for d in tensor.shape]
    return f"a rank-{tensor.dim()} {str(tensor.dtype).removeprefix('torch.')} tensor ({shape})"


def _calls(graph: torch.fx.Graph) -> Iterator[tuple[torch.fx.Node, torch._ops.OpOverload]]:
    for node in graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.namespace not in _SKIPPED_NAMESPACES
        ):
            yield node, target


def check_fake_kernels(
    program: torch.export.ExportedProgram, args: Any = (), kwargs: Mapping[str, Any] | None = None
) -> int:
    """Run each custom op call of ``program`` (once per distinct signature) through its real CPU
    kernel and compare the outputs' ranks and dtypes with what its fake kernel declared (the
    traced ``meta["val"]``); `FakeKernelError` on a difference. Returns how many calls ran."""
    calls = list(_calls(program.graph))
    if not calls:
        return 0
    known = _known_values(program, args, kwargs)
    seen: set[tuple[Any, ...]] = set()
    ran = 0
    for node, op in calls:
        if not _has_cpu_kernel(op):
            continue
        try:
            real_args, nbytes_args = _materialize(tuple(node.args), node, known)
            items = [(k, _materialize(v, node, known)) for k, v in node.kwargs.items()]
        except _Skip:
            continue
        real_kwargs = {k: v for k, (v, _) in items}
        if nbytes_args + sum(n for _, (_, n) in items) > MAX_INPUT_BYTES:
            continue
        key = (op, _signature(real_args), _signature(real_kwargs))
        if key in seen:
            continue
        seen.add(key)
        try:
            with torch.no_grad():
                result = op(*real_args, **real_kwargs)
        except SpecError as exc:
            if exc.key == ("shape",) and exc.op:  # an op spec's eager call compared its meta
                raise FakeKernelError(  # function with the impl: they disagree
                    f"The custom op {op.name()}: its meta function and its real kernel disagree on"
                    " the example inputs, and the dynamo exporter writes the meta function's"
                    f" shapes into the ONNX file. {exc}"
                ) from exc
            continue
        except Exception:  # zeros may be invalid input for this kernel: nothing to compare
            continue
        ran += 1
        _compare(op, node, result)
    return ran


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in sorted(value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _compare(op: torch._ops.OpOverload, node: torch.fx.Node, result: Any) -> None:
    declared = node.meta.get("val")
    fakes = list(declared) if isinstance(declared, (list, tuple)) else [declared]
    reals = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(fakes) != len(reals):
        return  # the schema fixes the count; nothing honest to compare
    for index, (fake, real) in enumerate(zip(fakes, reals, strict=True)):
        if not isinstance(fake, torch.Tensor) or not isinstance(real, torch.Tensor):
            continue
        if fake.dim() == real.dim() and fake.dtype == real.dtype:
            continue
        what = "rank" if fake.dim() != real.dim() else "dtype"
        output = f"output {index}" if len(fakes) > 1 else "its output"
        raise FakeKernelError(
            f"The custom op {op.name()}: its fake (meta) kernel declares {output} as"
            f" {_describe(fake)}, but its real CPU kernel returns {_describe(real)}"
            f" for the same inputs (a different {what}). The dynamo exporter writes the fake's"
            " rank and dtype into the ONNX file, which would then not describe what the op"
            f" computes. Fix: make the function registered with @torch.library.register_fake("
            f"'{op.name()}') (or the op's meta kernel) return {output.removeprefix('its ')} with"
            f" the real kernel's rank ({real.dim()}) and dtype ({real.dtype}), e.g."
            f" x.new_empty(<shape of rank {real.dim()}>, dtype={real.dtype}); or export with"
            " exporter='torchscript', which traces the real kernel."
        )

"""The ONE place the compile backend touches torch's private ONNX exporter API.

Translating a graph with torch's own FX -> ONNX translator (``_core._translate_fx_graph``, the
function ``torch.onnx.export(dynamo=True)`` runs after ``torch.export``) costs a small fraction
of a whole ``torch.onnx.export`` per graph. So the backend calls the translator directly, and
every private name it needs is imported here, once, and checked against the torch versions this
adapter was written for (`SUPPORTED_TORCH`): any other torch raises `CompileError` saying so.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from onnx_custom.errors import CompileError

__all__ = [
    "SUPPORTED_TORCH",
    "aot_autograd",
    "check_torch",
    "decompositions",
    "is_registered",
    "is_training_batch_norm",
    "prepare_graph",
    "scoped_registry",
    "torchlib_registry",
    "translate_graph",
]

SUPPORTED_TORCH = ("2.13",)
"""``major.minor`` of the torch releases whose private exporter API this module was checked
against."""

# Private names used, by module (torch.onnx._internal.exporter.<module>): checked in check_torch.
_NEEDED = {
    "_core": ("_translate_fx_graph",),
    "_registration": ("ONNXRegistry",),
    "_decomp": ("create_onnx_friendly_decomposition_table", "get_onnx_implemented_overloads"),
    "_ir_passes": ("add_opset_imports",),
    "_fx_passes": ("insert_type_promotion_nodes", "remove_assertion_nodes"),
}

# Training batch norm: torchlib's translation computes inference statistics only (wrong
# gradients and running stats), so these are decomposed into plain ATen ops instead.
TRAINING_BATCH_NORM = (
    "aten::_native_batch_norm_legit_functional",
    "aten::_native_batch_norm_legit",
    "aten::native_batch_norm",
    "aten::native_batch_norm_backward",
    "aten::_batch_norm_with_update",
    "aten::_batch_norm_with_update_functional",
    "aten::batch_norm_backward",
)


@functools.cache
def _modules() -> dict[str, Any]:
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version not in SUPPORTED_TORCH:
        raise CompileError(
            "the onnx_custom compile backend uses torch's private FX->ONNX translator, checked "
            f"against torch {', '.join(SUPPORTED_TORCH)}; this is torch {torch.__version__}. Fix: "
            f"install a supported torch (pip install 'torch=={SUPPORTED_TORCH[-1]}.*'), or use "
            "onnx_custom.export for ahead-of-time export, which relies on public APIs only."
        )
    found: dict[str, Any] = {}
    missing = []
    for name, attrs in _NEEDED.items():
        try:
            module = importlib.import_module(f"torch.onnx._internal.exporter.{name}")
        except ImportError:
            missing.append(name)
            continue
        found[name] = module
        missing += [f"{name}.{a}" for a in attrs if not hasattr(module, a)]
    if missing:
        raise CompileError(
            f"torch {torch.__version__} lacks the exporter internals the compile backend needs"
            f" ({', '.join(missing)}). Fix: reinstall torch {SUPPORTED_TORCH[-1]} (a partial or"
            " patched install?)."
        )
    return found


def check_torch() -> None:
    """Raise `CompileError` unless this torch has the private API below
    (cheap after the first call)."""
    _modules()


@functools.cache
def torchlib_registry(opset: int) -> Any:
    """torch's ``ONNXRegistry`` of torchlib translations at ``opset`` (built once per process)."""
    return _modules()["_registration"].ONNXRegistry.from_torchlib(opset_version=opset)


def scoped_registry(base: Any, custom: dict[Any, Callable[..., Any]]) -> Any:
    """A copy of ``base`` with ``custom`` translations (OpOverload -> function) taking precedence.

    Only the ops a graph contains are passed in ``custom``: the shared base is never mutated, so
    no translation leaks into another graph.
    """
    registration = _modules()["_registration"]
    registry = registration.ONNXRegistry()
    registry._opset_version = base.opset_version
    registry.functions = dict(base.functions)
    for overload, function in custom.items():
        registry.functions[overload.name()] = [
            registration.OnnxDecompMeta(
                onnx_function=function, fx_target=overload, signature=None, is_custom=True
            )
        ]
    return registry


def is_registered(registry: Any, target: Any) -> bool:
    """Whether torchlib (or a custom entry) translates ``target``."""
    try:
        return bool(registry.is_registered(target))
    except Exception:  # a target the registry cannot even name (e.g. a Python callable)
        return False


def decompositions(registry: Any, keep: Iterable[Any] = ()) -> dict[Any, Callable[..., Any]]:
    """aot_autograd's decomposition table: torch's decompositions of every op that neither
    torchlib nor ``keep`` (our translated ops) covers, and of training batch norm always."""
    decomp = _modules()["_decomp"]
    implemented = set(decomp.get_onnx_implemented_overloads(registry)) | set(keep)
    implemented = {op for op in implemented if _qualified(op) not in TRAINING_BATCH_NORM}
    return decomp.create_onnx_friendly_decomposition_table(implemented)  # type: ignore[no-any-return]


def is_training_batch_norm(op: Any) -> bool:
    return _qualified(op) in TRAINING_BATCH_NORM


def _qualified(op: Any) -> str:
    name = getattr(op, "name", None)
    if not callable(name):
        return ""
    text = str(name())
    return text.split(".")[0]


def prepare_graph(gm: torch.fx.GraphModule) -> None:
    """What ``torch.onnx.export`` does to a graph before translating it, in place: explicit type
    promotion nodes (ONNX ops take one dtype: ``Mul(float, int64)`` is invalid) and no runtime
    assertion nodes (dynamo's guards already check the shapes)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    passes = _modules()["_fx_passes"]
    with unset_fake_temporarily():
        passes.remove_assertion_nodes(gm)
        passes.insert_type_promotion_nodes(gm)
    gm.recompile()


def translate_graph(graph: torch.fx.Graph, registry: Any, graph_name: str = "main_graph") -> Any:
    """``graph`` -> an ``onnx_ir.Model`` (inputs: placeholders, outputs:
    the output node's values)."""
    import onnx_ir as ir
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    modules = _modules()
    model = ir.Model(
        graph=ir.Graph([], [], nodes=[], name=graph_name),
        ir_version=10,
        producer_name="onnx_custom.compile",
    )
    # aot_autograd calls its compilers inside its fake mode: translations make real constants.
    with unset_fake_temporarily():
        modules["_core"]._translate_fx_graph(
            graph,
            model,
            graph_like=model.graph,
            owned_graphs={},
            lower="at_conversion",
            registry=registry,
        )
    modules["_ir_passes"].add_opset_imports(model)
    return model


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """``torch._dynamo.backends.common.aot_autograd`` (semi-public; imported here with the rest)."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)  # type: ignore[no-any-return]

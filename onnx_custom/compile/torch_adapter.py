"""The ONE place the compile backend touches torch's private ONNX exporter API.

Translating a graph with torch's own FX -> ONNX translator (``_core._translate_fx_graph``, the
function ``torch.onnx.export(dynamo=True)`` runs after ``torch.export``) costs a small fraction
of a whole ``torch.onnx.export`` per graph. So the backend calls the translator directly, and
every private name it needs is imported here, once, by feature detection: each name (and the
keyword arguments the backend passes) is looked up on the installed torch, whatever its version
string says. A torch that lacks one raises `CompileError` naming the torch version and the
missing piece (`missing_features` lists them without raising). Checked on torch 2.11 to 2.15.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

from onnx_custom.common.torch_onnx import torch_fixes
from onnx_custom.errors import CompileError

__all__ = [
    "aot_autograd",
    "check_torch",
    "decompositions",
    "is_registered",
    "is_training_batch_norm",
    "missing_features",
    "prepare_graph",
    "scoped_registry",
    "torchlib_registry",
    "translate_graph",
]

# Private names used, by module (torch.onnx._internal.exporter.<module>): checked in check_torch.
_NEEDED = {
    "_core": ("_translate_fx_graph", "TorchTensor"),
    "_registration": ("ONNXRegistry", "OnnxDecompMeta"),
    "_decomp": ("create_onnx_friendly_decomposition_table", "get_onnx_implemented_overloads"),
    "_ir_passes": ("add_opset_imports",),
    "_fx_passes": ("insert_type_promotion_nodes", "remove_assertion_nodes"),
}
# Keyword arguments translate_graph passes to ``_core._translate_fx_graph``.
_TRANSLATE_KEYWORDS = ("model", "graph_like", "owned_graphs", "lower", "registry")

# The ops that lift a constant tensor into the traced graph: never decomposed (see decompositions).
LIFTS = ("aten::lift", "aten::lift_fresh", "aten::lift_fresh_copy")

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


def _find() -> tuple[dict[str, Any], list[str]]:
    """(the private modules found, the pieces missing) on the installed torch."""
    found: dict[str, Any] = {}
    missing: list[str] = []
    for name, attrs in _NEEDED.items():
        try:
            module = importlib.import_module(f"torch.onnx._internal.exporter.{name}")
        except ImportError:
            missing.append(f"torch.onnx._internal.exporter.{name}")
            continue
        found[name] = module
        missing += [f"{name}.{a}" for a in attrs if not hasattr(module, a)]
    translate = getattr(found.get("_core"), "_translate_fx_graph", None)
    if translate is not None:
        try:
            parameters = inspect.signature(translate).parameters
        except (TypeError, ValueError):  # not introspectable: trust the name
            parameters = None
        if parameters is not None:
            missing += [
                f"_core._translate_fx_graph({k}=...)"
                for k in _TRANSLATE_KEYWORDS
                if k not in parameters
            ]
    try:
        from torch._dynamo.backends.common import aot_autograd  # noqa: F401
        from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: F401
    except ImportError as error:
        missing.append(f"{error.name or error}")
    return found, missing


@functools.cache
def _probe() -> tuple[dict[str, Any], tuple[str, ...]]:
    found, missing = _find()
    return found, tuple(missing)


def missing_features() -> tuple[str, ...]:
    """The private torch pieces the compile backend needs that this torch lacks (empty: none)."""
    return _probe()[1]


def _modules() -> dict[str, Any]:
    found, missing = _probe()
    if missing:
        raise CompileError(
            f"torch {torch.__version__} lacks the private FX->ONNX translator pieces the"
            f" onnx_custom compile backend needs: {', '.join(missing)} (found on torch 2.11 to"
            " 2.15). Fix: install a torch that has them (pip install 'torch>=2.11,<2.16'), or"
            " use onnx_custom.export for ahead-of-time export, which does not need them."
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
    table = decomp.create_onnx_friendly_decomposition_table(implemented)
    # A tensor made from Python data inside forward (torch.tensor / torch.as_tensor of a list)
    # reaches aot_autograd's tracer as a real constant behind aten.lift_fresh: the tracer turns it
    # into a graph constant, unless a decomposition (alias) runs first on the real tensor inside
    # the fake mode, which fails ("Please convert all Tensors to FakeTensors first").
    return {op: fn for op, fn in table.items() if _qualified(op) not in LIFTS}


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
    with unset_fake_temporarily(), torch_fixes():
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
    # A get_attr tensor constant (a tensor made from Python data inside forward) is translated as
    # an input, then made an initializer holding the real tensor: torch's translator handles such
    # nodes itself only from 2.13 (and from a real meta["val"], which aot_autograd leaves fake).
    constants = _tensor_constants(graph)
    for node in constants:
        node.op = "placeholder"
    # aot_autograd calls its compilers inside its fake mode: translations make real constants.
    try:
        with unset_fake_temporarily():
            modules["_core"]._translate_fx_graph(
                graph,
                model,
                graph_like=model.graph,
                owned_graphs={},
                lower="at_conversion",
                registry=registry,
            )
    finally:
        for node in constants:
            node.op = "get_attr"
    if constants:
        inputs = {value.name: value for value in model.graph.inputs}
        for node, tensor in constants.items():
            value = inputs[node.name]
            model.graph.inputs.remove(value)
            value.const_value = modules["_core"].TorchTensor(tensor, name=node.name)
            model.graph.initializers[node.name] = value
    modules["_ir_passes"].add_opset_imports(model)
    return model


def _tensor_constants(graph: torch.fx.Graph) -> dict[torch.fx.Node, torch.Tensor]:
    """get_attr nodes naming a real tensor of the graph's module -> that tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    module = graph.owning_module
    found = {}
    for node in graph.nodes:
        if node.op != "get_attr" or module is None or not isinstance(node.target, str):
            continue
        value: Any = module
        for part in node.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            found[node] = value
    return found


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """``torch._dynamo.backends.common.aot_autograd`` (semi-public; imported here with the rest)."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)  # type: ignore[no-any-return]

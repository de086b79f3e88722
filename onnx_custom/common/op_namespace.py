"""``torch.ops.onnx_custom.<op>`` after a plain ``import onnx_custom``.

The shipped ops are defined when their modules run (`onnx_custom.common.builtins.OP_MODULES`),
which imports torch and takes seconds, while ``import onnx_custom`` imports no torch at all. So
the package only arranges for torch's ``onnx_custom`` op namespace to define them on the first
lookup of a name it does not have yet: `install` gives that namespace this behaviour as soon as
torch is imported (at once when it already is, else right after its import completes).
"""

from __future__ import annotations

import _thread
import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from onnx_custom.common.builtins import OP_MODULES

if TYPE_CHECKING:
    from collections.abc import Sequence

# Only what ``import onnx_custom`` already loads, at import time (importlib.abc, importlib.util
# and threading would add a few milliseconds to it): the finder and loader are duck-typed.

__all__ = ["NAMESPACE", "define_shipped_ops", "install"]

NAMESPACE = "onnx_custom"

_lock = _thread.RLock()
_defined = False
_defining = False
_namespace_classes: dict[type, type] = {}


def define_shipped_ops() -> bool:
    """Import the shipped op modules once; False when done before (or under way in this thread)."""
    global _defined, _defining
    with _lock:
        if _defined or _defining:
            return False
        _defining = True
        try:
            for name in OP_MODULES:
                importlib.import_module(name)
            _defined = True
        finally:
            _defining = False
        return True


def _namespace_class(base: type) -> type:
    """torch's op-namespace class, extended: a name it lacks defines the shipped ops first."""
    if base not in _namespace_classes:

        class ShippedOpsNamespace(base):  # type: ignore[misc, valid-type]
            def __getattr__(self, op_name: str) -> Any:
                try:
                    return super().__getattr__(op_name)
                except AttributeError:
                    if op_name.startswith("__") or not define_shipped_ops():
                        raise
                return super().__getattr__(op_name)

        _namespace_classes[base] = ShippedOpsNamespace
    return _namespace_classes[base]


def _patch(torch: ModuleType) -> None:
    """Give ``torch.ops.onnx_custom`` the define-on-miss behaviour (its cached ops are kept)."""
    namespace = getattr(torch.ops, NAMESPACE)
    if type(namespace) not in _namespace_classes.values():
        namespace.__class__ = _namespace_class(type(namespace))


def _patch_quietly(torch: ModuleType) -> None:
    try:
        _patch(torch)
    except Exception:  # a torch whose op namespaces work otherwise: ``import onnx_custom.ops``
        pass


class _AfterTorchImport:
    """Finds nothing itself: hands back torch's own spec, with a loader that patches after it."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname != "torch" or self._busy:
            return None
        import importlib.util

        self._busy = True  # the lookup below asks the other finders (and this one, again)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self)  # type: ignore[assignment]
        return spec


class _PatchingLoader:
    def __init__(self, inner: Any, finder: _AfterTorchImport) -> None:
        self._inner = inner
        self._finder = finder

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._inner  # torch keeps its own loader, as if we were not there
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        _patch_quietly(module)


def install() -> None:
    """Make ``torch.ops.onnx_custom`` define the shipped ops on first use, importing no torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if hasattr(torch, "ops"):
            _patch_quietly(torch)
        return
    if not any(isinstance(f, _AfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchImport())

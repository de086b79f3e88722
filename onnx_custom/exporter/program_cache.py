"""The ``torch.export`` program the dynamo exporter traced last, kept for localization to reuse.

Localization runs the model's ``torch.export`` program node by node; tracing it again costs more
than a whole `verify` (profiled with benchmarks/verify_cost.py on the DCN net). When the
file was exported in this process, the exporter already traced that very program (its FX node
names are the file's value names), so `remember` keeps it and `recall` hands it back.

A program is handed back only for the same live model object (held weakly: the cache never keeps
a model alive), the same example-argument signature (structure, shapes, dtypes, devices, and the
non-tensor values), the same ``training`` flags, and the same parameter/buffer tensors at the same
version counters (an in-place weight update or ``load_state_dict`` is a miss). What it cannot see
is a change of the model's *code* after export; localize therefore checks the program's final
outputs against the eager outputs verify computed and traces afresh when they differ.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["clear", "recall", "remember"]

_CAPACITY = 2  # the last exports; each holds only its graph (weights are the model's own tensors)


@dataclasses.dataclass(frozen=True)
class _Entry:
    model: weakref.ReferenceType[torch.nn.Module]
    signature: tuple[Any, ...]
    state: tuple[Any, ...]
    program: torch.export.ExportedProgram


_lock = threading.Lock()
_entries: OrderedDict[int, _Entry] = OrderedDict()


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        return ("tensor", tuple(leaf.shape), leaf.dtype, leaf.device.type, leaf.requires_grad)
    if isinstance(leaf, (int, float, bool, str, type(None))):
        return (type(leaf).__name__, leaf)
    return ("object", id(leaf))  # anything else: only the very same object matches


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    leaves, spec = torch.utils._pytree.tree_flatten(args)
    return (str(spec), *(_leaf_key(leaf) for leaf in leaves))


def _state(model: torch.nn.Module) -> tuple[Any, ...]:
    tensors = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    return (
        tuple(m.training for m in model.modules()),
        tuple((name, id(t), t._version) for name, t in tensors),
    )


def remember(model: Any, args: tuple[Any, ...], program: torch.export.ExportedProgram) -> None:
    """Keep ``program`` as what ``torch.export`` made of ``model(*args)`` (modules only)."""
    if not isinstance(model, torch.nn.Module):
        return
    try:
        entry = _Entry(weakref.ref(model), _signature(args), _state(model), program)
    except TypeError:  # not weak-referenceable or unhashable leaves: nothing to reuse
        return
    with _lock:
        _entries.pop(id(model), None)
        _entries[id(model)] = entry
        while len(_entries) > _CAPACITY:
            _entries.popitem(last=False)


def recall(model: Any, args: tuple[Any, ...]) -> torch.export.ExportedProgram | None:
    """The remembered program of ``model(*args)``, or None when anything it depends on changed."""
    if not isinstance(model, torch.nn.Module):
        return None
    with _lock:
        entry = _entries.get(id(model))
    if entry is None or entry.model() is not model:
        return None
    if entry.signature != _signature(args) or entry.state != _state(model):
        return None
    return entry.program


def clear() -> None:
    """Forget every remembered program (benchmarks measure the cold path with it)."""
    with _lock:
        _entries.clear()

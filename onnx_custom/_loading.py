"""Load ``path/to/file.py:Model`` or ``package.module:Model`` specs and parse input specs."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from types import ModuleType
from typing import Any

import torch

from onnx_custom.errors import OnnxCustomError

__all__ = ["LoadedModel", "load_model_spec", "parse_input_spec"]

_DTYPES = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
    "int32": torch.int32, "int64": torch.int64, "long": torch.int64, "bool": torch.bool,
}


@dataclasses.dataclass
class LoadedModel:
    module: ModuleType
    model: torch.nn.Module
    spec: str


def _import_file(path: str) -> ModuleType:
    path = os.path.abspath(path)
    # A models/ file inside this package imports as part of the package (so its relative
    # imports and registrations are shared with `onnx_custom.models.<name>`).
    import onnx_custom.models as models

    for root in models.__path__:
        if os.path.dirname(path) == os.path.abspath(root):
            return importlib.import_module(f"onnx_custom.models.{os.path.splitext(os.path.basename(path))[0]}")
    name = "onnx_custom_user_" + hashlib.sha1(path.encode()).hexdigest()[:10]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise OnnxCustomError(f"Cannot import {path!r} as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_model_spec(spec: str) -> LoadedModel:
    """``models/asinh.py:Model``, ``onnx_custom.models.asinh:Model`` or ``asinh`` (a zoo name)."""
    target, _, attr = spec.partition(":")
    attr = attr or "Model"
    try:
        if target.endswith(".py"):
            if not os.path.exists(target):
                raise OnnxCustomError(f"Model file {target!r} does not exist.")
            module = _import_file(target)
        elif "." not in target and importlib.util.find_spec(f"onnx_custom.models.{target}") is not None:
            module = importlib.import_module(f"onnx_custom.models.{target}")
        else:
            module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise OnnxCustomError(f"Cannot import model spec {spec!r}: {exc}. Expected 'path/file.py:Class' or 'package.module:Class'.") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise OnnxCustomError(f"{module.__name__} has no attribute {attr!r} (spec {spec!r}).")
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise OnnxCustomError(f"{spec!r} built a {type(model).__name__}, expected a torch.nn.Module.")
    return LoadedModel(module, model.eval(), spec)


_SHAPE = re.compile(r"^(?P<dims>\d+(?:x\d+)*|scalar)(?::(?P<dtype>\w+))?$")


def parse_input_spec(text: str, seed: int = 0, index: int = 0) -> torch.Tensor:
    """``2x3x8:float32`` -> a random tensor of that shape/dtype (ints in [0, 10))."""
    match = _SHAPE.match(text.strip())
    if match is None:
        raise OnnxCustomError(f"Bad input spec {text!r}: expected DIMS[:DTYPE] like '2x3x8:float32' or 'scalar:int64'.")
    dtype_name = (match["dtype"] or "float32").lower()
    if dtype_name not in _DTYPES:
        raise OnnxCustomError(f"Unknown dtype {dtype_name!r} in {text!r}; known: {sorted(_DTYPES)}.")
    dtype = _DTYPES[dtype_name]
    shape: tuple[int, ...] = () if match["dims"] == "scalar" else tuple(int(d) for d in match["dims"].split("x"))
    gen = torch.Generator().manual_seed(seed + index)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randint(0, 10, shape, generator=gen, dtype=dtype)


def example_args(loaded: LoadedModel, inputs: list[str] | None, seed: int = 0) -> tuple[Any, ...]:
    if inputs:
        return tuple(parse_input_spec(t, seed, i) for i, t in enumerate(inputs))
    factory = getattr(loaded.module, "example_inputs", None)
    if factory is None:
        raise OnnxCustomError(f"{loaded.spec!r} has no example_inputs(); pass --input DIMS:DTYPE for each input.")
    return tuple(factory())

"""Translations of ``onnx_custom_ext::my_add`` (the C++ extension op, declared in
``onnx_custom/ops/extension.py``) and of ``MyAddFunction``.

Two routes, as in the seed article:

* ``onnx_custom_ext::my_add`` itself (both exporters): Mul + Add by default, or a
  ``onnx_custom::my_add`` node (variant ``"custom"``, kernel in ``ort_kernels/seed.py``) -- all
  generated from its spec.
* ``MyAddFunction`` (an ``autograd.Function`` calling the C++ op): TorchScript exporter only,
  with the very same translations. The dynamo exporter inlines Functions, so
  ``onnx_custom.export(..., exporter="dynamo")`` refuses a model whose Function has a
  translation here; export ``onnx_custom_ext::my_add`` directly instead.

Importing this module does not build the extension.
"""

from __future__ import annotations

import dataclasses

from onnx_custom.ops.extension import SPECS, MyAddFunction
from onnx_custom.spec import spec_translations
from onnx_custom.translate.names import normalize_target

__all__ = ["registry"]

registry = spec_translations(*SPECS)
for _entry in list(registry):  # MyAddFunction exports exactly like the op it calls
    registry.add(dataclasses.replace(_entry, target=normalize_target(MyAddFunction)))

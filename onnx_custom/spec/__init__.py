"""Op specs: declare a custom op once and get its torch op, fake kernel, autograd hookup,
translations for both exporters, Python-kernel binding, ONNX schema and tests.

```python
from onnx_custom.spec import OpSpec, Input, Output, Attribute, register_spec

spec = OpSpec(
    "acme::scale_add", op_type="ScaleAdd",
    inputs=[Input("x", ["float32", "float16"]), Input("y", ["float32", "float16"])],
    outputs=[Output("out", shape="like:x")],
    attributes=[Attribute("alpha", "float", 2.0)],
    impl="acme_ops:scale_add", kernel="acme_ops:scale_add_np",
)
with register_spec(spec):              # scoped; or keep the handle and call .unregister()
    torch.ops.acme.scale_add(x, y, 0.5)
```

The YAML form (`load_specs`) and every key are described in `onnx_custom.spec.yaml_loader`.

A built-in op family declares its specs once and builds everything from them without touching
the default registries at import time: ``define_op(spec)`` in its ops module (the torch op),
``registry = spec_translations(spec)`` in ``symbolics/`` and ``kernels = spec_kernels(spec)``
in ``ort_kernels/`` (assembled lazily via `onnx_custom.common.builtins`).
"""

from __future__ import annotations

from onnx_custom.spec.generate import (
    CUSTOM_VARIANT,
    SpecRegistration,
    define_op,
    register_spec,
    registered_specs,
    spec_kernels,
    spec_scope,
    spec_translations,
    unregister_spec,
)
from onnx_custom.spec.native_library import build_native_library, write_cmake_project
from onnx_custom.spec.native_source import NativeKernel
from onnx_custom.spec.spec import (
    ATTRIBUTE_TYPES,
    EAGER,
    NO_DEFAULT,
    NODE,
    Attribute,
    Input,
    OpSpec,
    Output,
    SpecError,
)
from onnx_custom.spec.torch_op import op_arguments
from onnx_custom.spec.yaml_loader import YAML_KEYS, load_specs, parse_specs

__all__ = [
    "ATTRIBUTE_TYPES",
    "CUSTOM_VARIANT",
    "EAGER",
    "NODE",
    "NO_DEFAULT",
    "YAML_KEYS",
    "Attribute",
    "Input",
    "NativeKernel",
    "OpSpec",
    "Output",
    "SpecError",
    "SpecRegistration",
    "build_native_library",
    "define_op",
    "load_specs",
    "op_arguments",
    "parse_specs",
    "register_spec",
    "registered_specs",
    "spec_kernels",
    "spec_scope",
    "spec_translations",
    "unregister_spec",
    "write_cmake_project",
]

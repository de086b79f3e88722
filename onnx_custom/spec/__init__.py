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
"""

from __future__ import annotations

from onnx_custom.spec.generate import (
    CUSTOM_VARIANT,
    SpecRegistration,
    register_spec,
    registered_specs,
    spec_scope,
    unregister_spec,
)
from onnx_custom.spec.spec import (
    ATTRIBUTE_TYPES,
    NO_DEFAULT,
    Attribute,
    Input,
    OpSpec,
    Output,
    SpecError,
)
from onnx_custom.spec.yaml_loader import YAML_KEYS, load_specs, parse_specs

__all__ = [
    "ATTRIBUTE_TYPES",
    "CUSTOM_VARIANT",
    "NO_DEFAULT",
    "YAML_KEYS",
    "Attribute",
    "Input",
    "OpSpec",
    "Output",
    "SpecError",
    "SpecRegistration",
    "load_specs",
    "parse_specs",
    "register_spec",
    "registered_specs",
    "spec_scope",
    "unregister_spec",
]

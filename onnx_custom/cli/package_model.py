"""``onnx-custom package model.onnx -o dist/``: the model plus the native library its custom nodes
need (built for this machine) and a README with the load snippets, or a refusal naming every
custom node no native kernel serves."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx

from onnx_custom.common.external_data import external_tensors
from onnx_custom.errors import CliInputError, ExtensionBuildError, KernelError, ModelLoadError
from onnx_custom.runtime.native import build_library, shipped_library
from onnx_custom.runtime.session import custom_nodes, load_model
from onnx_custom.spec import OpSpec, build_native_library

__all__ = ["package_model"]

_README = """\
# {model}

`{model}` runs in plain ONNX Runtime with the custom-op library `{library}` (built for {machine};
rebuild it for another machine with `onnx-custom build-library`{spec_hint}). Its custom nodes:
{nodes}.

Python (only `onnxruntime` and `numpy` needed):

```python
import onnxruntime as ort
so = ort.SessionOptions()
so.register_custom_ops_library("./{library}")  # a path: a bare name would search LD_LIBRARY_PATH
sess = ort.InferenceSession("{model}", so, providers=["CPUExecutionProvider"])
```

C (onnx-custom's `examples/run_model.c`, float32 inputs and output as OCTENSOR files):

```bash
cc -std=c11 -O2 -I <onnx_custom>/runtime/include examples/run_model.c -ldl -o run_model
./run_model <path to libonnxruntime.so> ./{library} {model} out.tensor input0.tensor ...
```

C++ (ONNX Runtime's C++ API):

```cpp
Ort::Env env;
Ort::SessionOptions so;
so.RegisterCustomOpsLibrary(ORT_TSTR("./{library}"));
Ort::Session session(env, ORT_TSTR("{model}"), so);
```
"""


def package_model(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    specs: Sequence[OpSpec] = (),
    *,
    name: str | None = None,
) -> list[Path]:
    """Write the model, one native library serving all its custom nodes and a README into
    ``output_dir``; returns the written files. ``specs`` with C++ kernels (``native: {source,
    function}``) add the user's ops (then one library holds them and the shipped kernels).
    Raises `KernelError` naming every custom node no native kernel serves."""
    model, _ = load_model(model_path)
    nodes = custom_nodes(model)
    local = {(f.domain, f.name) for f in model.functions}
    needed: dict[str, list[str]] = {}
    for node in nodes:
        if (node.domain, node.op_type) not in local:
            needed.setdefault(f"{node.domain}::{node.op_type}", []).append(node.name or "<unnamed>")
    if not needed:
        raise CliInputError(
            f"{model_path} has no custom nodes: it runs in plain ONNX Runtime as it is; nothing to"
            " package."
        )
    user = [s for s in specs if s.node_type in needed]
    served = set(shipped_library().ops) | {str(s.node_type) for s in user}
    missing = {op: where for op, where in needed.items() if op not in served}
    if missing:
        listed = "; ".join(
            f"{op} (node{'s' if len(w) > 1 else ''} {', '.join(w[:5])})"
            for op, w in sorted(missing.items())
        )
        raise KernelError(
            f"{len(missing)} custom op type(s) in {model_path} have no native kernel: {listed}; the"
            f" shipped library serves {', '.join(shipped_library().ops)}; fix: give each op's spec"
            " a C++ kernel (native: {source: file.cpp, function: name}) and pass --spec, or"
            " embed function bodies (export(..., functions=True))."
        )
    folder = Path(output_dir)
    with (
        tempfile.TemporaryDirectory() as tmp
    ):  # everything complete before anything lands in folder
        staged = Path(tmp)
        if user:
            shipped_too = any(op in shipped_library().ops for op in needed)
            library = build_native_library(
                user, staged, name=name, include_shipped=shipped_too
            ).path
        else:
            library = build_library(staged)
        model_name = (
            Path(model_path).name if isinstance(model_path, (str, os.PathLike)) else "model.onnx"
        )
        data_files = _data_files(model, model_path)
        for location in data_files:  # the model keeps pointing at them by the same relative names
            (staged / location).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(model_path).parent / location, staged / location)
        onnx.save(model, staged / model_name)
        hint = " --spec <your specs>" if user else ""
        (staged / "README.md").write_text(
            _README.format(
                model=model_name,
                library=library.name,
                machine=platform.machine() or "this machine",
                spec_hint=hint,
                nodes=", ".join(sorted(needed)),
            ),
            encoding="utf-8",
        )
        try:
            folder.mkdir(parents=True, exist_ok=True)
            written = []
            for item in (
                *data_files,
                model_name,
                library.name,
                "README.md",
            ):  # data before the model that needs it
                target = folder / item
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.with_name(f".{target.name}.tmp")
                shutil.copyfile(staged / item, temporary)
                os.replace(temporary, target)
                written.append(target)
        except OSError as exc:
            raise ExtensionBuildError(
                f"cannot write the package into {folder}: expected a writable folder ({exc}); fix:"
                " pass a writable folder."
            ) from exc
    return written


def _data_files(model: onnx.ModelProto, model_path: str | os.PathLike[str]) -> list[str]:
    """The external data files ``model`` (loaded without its data) points at, as the relative
    names it uses; ones outside the model's folder are refused (the package could not hold them)."""
    locations: list[str] = []
    for tensor in external_tensors(model):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        relative = Path(location)
        if relative.is_absolute() or ".." in relative.parts:
            raise ModelLoadError(
                f"{model_path} keeps tensor {tensor.name!r} in {location!r}, outside the model's"
                " folder, so a package cannot carry it; fix: re-export with the data next to the"
                " model (export(..., external_data=True))."
            )
        if location not in locations:
            locations.append(location)
    return locations

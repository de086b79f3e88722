"""``onnx-custom build-library``: the shipped native kernel library, or (``--spec``) a library of
the user's own C++ kernels named by their op specs. A first-time compile announces itself on
stderr (``common.native_build.announce_build``)."""

from __future__ import annotations

import argparse

from onnx_custom.cli.shared import stderr

__all__ = ["cmd_build_library"]


def cmd_build_library(ns: argparse.Namespace) -> int:
    from onnx_custom.cli.loading import CliInputError

    if ns.spec:
        return _build_user_library(ns)
    for flag in ("name", "cmake"):
        if getattr(ns, flag):
            raise CliInputError(
                f"--{flag} needs --spec (it applies to a library built from your op specs); fix:"
                f" add --spec acme.yaml or drop --{flag}."
            )
    from onnx_custom.runtime.native import build_library, native_ops

    path = build_library(ns.output)
    print(path, flush=True)
    stderr(
        f"serves {', '.join(native_ops())}; load it with SessionOptions.register_custom_ops_library"
        " (Python) or RegisterCustomOpsLibrary_V2 (C API)"
    )
    return 0


def _build_user_library(ns: argparse.Namespace) -> int:
    from onnx_custom.spec import build_native_library, parse_specs, write_cmake_project

    specs = [spec for path in ns.spec for spec in parse_specs(path)]
    if ns.cmake:
        write_cmake_project(specs, ns.cmake, name=ns.name, include_shipped=ns.with_shipped)
        stderr(
            f"wrote the CMake project into {ns.cmake} (cmake -S {ns.cmake} -B build && cmake"
            " --build build)"
        )
    library = build_native_library(specs, ns.output, name=ns.name, include_shipped=ns.with_shipped)
    print(library.path, flush=True)
    stderr(
        f"serves {', '.join(library.ops)}; load it with SessionOptions.register_custom_ops_library"
        " (Python) or RegisterCustomOpsLibrary_V2 (C API)"
    )
    return 0

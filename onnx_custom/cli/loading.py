"""What the command line loads: model specs (``file.py:Model``, ``package.module:Model``, a zoo
name), user modules (``--import``) and input specs (``2x3:float32``).

Every failure is a `CliInputError` whose message says what was expected, what was received and
the fix: the command line prints it as one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from onnx_custom.common.rng import DEFAULT_SEED, seeded
from onnx_custom.errors import CliInputError, OnnxCustomError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SEED",
    "CliInputError",
    "LoadedModel",
    "check_paths",
    "example_args",
    "import_user_module",
    "load_model_spec",
    "load_user_import",
    "parse_input_spec",
    "seeded",
]

MAX_INPUT_ELEMENTS = 1 << 30

# --input dtype spellings -> torch dtype names (torch itself loads only when a command runs:
# this module is imported by `onnx-custom --help`).
_DTYPES = {
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "long": "int64",
    "bool": "bool",
}


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    module: ModuleType
    model: torch.nn.Module
    spec: str


def _user_module_name(path: str) -> str:
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    return f"onnx_custom_user_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"


def _exec_file(path: str, seed: int) -> ModuleType:
    path = os.path.abspath(path)
    # A models/ file of this package imports as part of it (its registrations are shared with
    # `onnx_custom.models.<name>`).
    import onnx_custom.models as models

    for root in models.__path__:
        if os.path.dirname(path) == os.path.abspath(root):
            return _import_module(
                f"onnx_custom.models.{os.path.splitext(os.path.basename(path))[0]}", path
            )
    name = _user_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliInputError(
            f"Cannot import {path!r}: expected a Python source file (.py), got a file Python cannot"
            " load; fix: pass a .py file."
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The file's folder on sys.path while it runs,
    # so its own sibling imports work as in `python file.py`.
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        with seeded(seed):  # weights of models built at import time are reproducible too
            spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise _import_failed(path, exc, f"python {path}") from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _exception_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _with_fix(message: str, fix: str) -> str:
    """Our own errors carry their fix; one that does not gets the CLI's."""
    return message if "fix" in message.lower() else f"{message.rstrip('.')}; fix: {fix}."


def _failing_file(exc: BaseException) -> str | None:
    """Where the error happened: a SyntaxError's file, else the innermost traceback frame's
    (a module the user's file imports fails in that module, not in the user's file)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}, line {exc.lineno}"
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    import sysconfig

    libraries = tuple(
        {
            os.path.realpath(sysconfig.get_paths()[k]) + os.sep
            for k in ("stdlib", "purelib", "platlib")
        }
    )
    for frame in reversed(frames):
        filename = frame.tb_frame.f_code.co_filename
        # not importlib's frozen frames, nor torch's or the stdlib's
        # (the user's call into them is the culprit)
        if not filename.startswith("<") and not os.path.realpath(filename).startswith(libraries):
            return f"{filename}, line {frame.tb_lineno}"
    return None


def _import_failed(shown: str, exc: BaseException, rerun: str) -> CliInputError:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return CliInputError(
            f"Importing {shown} failed: it imports {exc.name!r}, which is not installed; expected"
            f" its dependencies to be importable; fix: install {exc.name.partition('.')[0]} (pip"
            " install ...) or remove the import."
        )
    if isinstance(exc, OnnxCustomError):  # our own errors carry their fix
        return CliInputError(
            _with_fix(
                f"Importing {shown} failed: {type(exc).__name__}: {' '.join(str(exc).split())}",
                f"correct {shown}, or run `{rerun}` for the traceback",
            )
        )
    where = _failing_file(exc)
    culprit = None if where is None else where.rpartition(", line")[0]
    if (
        culprit is not None
        and os.path.abspath(culprit) != os.path.abspath(shown)
        and os.path.exists(culprit)
    ):
        # the error is in a module the user's file imports: blame that module
        line = f"SyntaxError: {exc.msg}" if isinstance(exc, SyntaxError) else _exception_line(exc)
        return CliInputError(
            f"Importing {shown} failed in {where} (imported from it): {line}; expected a module"
            f" that imports cleanly; fix: correct {culprit} (run `{rerun}` to see the traceback, or"
            " add --debug)."
        )
    return CliInputError(
        f"Importing {shown} failed: {_exception_line(exc)}; expected a module that imports cleanly;"
        f" fix: run `{rerun}` to see the traceback (or add --debug)."
    )


def _import_module(name: str, shown: str | None = None) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise  # the module itself is missing: the caller says what to write instead
        raise _import_failed(shown or name, exc, f"python -c 'import {name}'") from exc
    except Exception as exc:
        raise _import_failed(shown or name, exc, f"python -c 'import {name}'") from exc


def _zoo_names() -> list[str]:
    import pkgutil

    import onnx_custom.models as models

    return sorted(
        i.name for i in pkgutil.iter_modules(models.__path__) if not i.name.startswith("_")
    )


def import_user_module(
    target: str, *, what: str = "--import", seed: int = DEFAULT_SEED
) -> ModuleType:
    """Import ``path/to/file.py`` or ``package.module`` (registering its symbolics and kernels)."""
    if not target:
        raise CliInputError(
            f"{what} got an empty name; expected a module path (pkg.mod) or a file (file.py); fix:"
            f" e.g. {what} mypkg.symbolics or {what} ./my_symbolics.py."
        )
    if target.endswith(".py") or os.sep in target or (os.altsep and os.altsep in target):
        if not os.path.exists(target):
            raise CliInputError(
                f"{what}: file {target!r} does not exist (working directory {os.getcwd()});"
                " expected an existing .py file; fix: check the path."
            )
        if os.path.isdir(target):
            raise CliInputError(
                f"{what}: {target!r} is a directory; expected a .py file; fix: name the file"
                " inside it."
            )
        if not target.endswith(".py"):
            raise CliInputError(
                f"{what}: {target!r} is not a .py file; expected Python source; fix: pass the .py"
                " file."
            )
        return _exec_file(target, seed)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", target):
        raise CliInputError(
            f"{what}: {target!r} is neither a module path (pkg.mod) nor a .py file; fix: pass e.g."
            " mypkg.symbolics or ./my_symbolics.py."
        )
    try:
        return _import_module(target)
    except ModuleNotFoundError as exc:
        local = target.replace(".", os.sep) + ".py"
        hint = (
            f"; fix: write {local!r} (a file path) instead"
            if os.path.exists(local)
            else "; fix: install the package, or pass a .py file path"
        )
        raise CliInputError(
            f"{what}: cannot import {target!r} ({exc}); expected an installed module (the working"
            f" directory is not on the import path){hint}."
        ) from exc


def load_user_import(target: str) -> None:
    """``--import``: a .yaml/.yml op-spec file (`onnx_custom.load_specs`),
    a .py file or a module."""
    if not target.endswith((".yaml", ".yml")):
        import_user_module(target)
        return
    if not os.path.isfile(target):
        raise CliInputError(
            f"--import: op-spec file {target!r} does not exist (working directory {os.getcwd()});"
            " expected an existing .yaml file; fix: check the path."
        )
    from onnx_custom.spec import load_specs

    folder = os.path.dirname(os.path.abspath(target))
    sys.path.insert(
        0, folder
    )  # the spec's impl/kernel "module:function" paths may be its neighbours
    try:
        load_specs(target)
    except OnnxCustomError as exc:
        raise CliInputError(
            _with_fix(
                f"--import {target}: {' '.join(str(exc).split())}",
                f"correct {target} (its format: help(onnx_custom.load_specs))",
            )
        ) from exc
    finally:
        if folder in sys.path:
            sys.path.remove(folder)


def _check_file_target(target: str, what: str, suffixes: tuple[str, ...]) -> None:
    if not os.path.exists(target):
        raise CliInputError(
            f"{what}: file {target!r} does not exist (working directory {os.getcwd()}); expected an"
            f" existing {suffixes[0]} file; fix: check the path."
        )
    if os.path.isdir(target):
        raise CliInputError(
            f"{what}: {target!r} is a directory; expected a {suffixes[0]} file; fix: name the file"
            " inside it."
        )
    if not target.endswith(suffixes):
        kind = "Python source" if suffixes[0] == ".py" else "a YAML op-spec file"
        raise CliInputError(
            f"{what}: {target!r} is not a {suffixes[0]} file; expected {kind}; fix: pass the"
            f" {suffixes[0]} file."
        )


def check_paths(model_spec: str | None, imports: Sequence[str] = ()) -> None:
    """The file paths in a model spec and ``--import`` targets exist: checked before torch loads,
    so a typo is answered at once (importing torch alone takes seconds)."""
    for target in imports:
        if target.endswith((".yaml", ".yml")):
            _check_file_target(target, "--import", (".yaml", ".yml"))
        elif target.endswith(".py") or os.sep in target or (os.altsep and os.altsep in target):
            _check_file_target(target, "--import", (".py",))
    if model_spec:
        target = model_spec.partition(":")[0]
        if target.endswith(".py") or os.sep in target:
            _check_file_target(target, f"Model spec {model_spec!r}", (".py",))


def _resolve_module(target: str, spec: str, seed: int) -> ModuleType:
    if target.endswith(".py") or os.sep in target:
        return import_user_module(target, what=f"Model spec {spec!r}", seed=seed)
    if "." not in target and target in _zoo_names():
        return _import_module(f"onnx_custom.models.{target}")
    try:
        return import_user_module(target, what=f"Model spec {spec!r}", seed=seed)
    except CliInputError as exc:
        if "." not in target and "cannot import" in str(exc):
            local = f"{target}.py"
            fix = (
                f"write '{local}:{spec.partition(':')[2] or 'Model'}' (a file path)"
                if os.path.exists(local)
                else (
                    "pass a file (path/file.py:Class), a module (package.module:Class) or a zoo"
                    f" name ({', '.join(_zoo_names())})"
                )
            )
            raise CliInputError(
                f"Model spec {spec!r}: no zoo model or importable module named {target!r}; expected"
                f" a file, a module or a zoo name; fix: {fix}."
            ) from exc
        raise


def _public_modules(module: ModuleType) -> list[str]:
    import torch

    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if (
            isinstance(value, type)
            and issubclass(value, torch.nn.Module)
            and value.__module__ == module.__name__
        ) or isinstance(value, torch.nn.Module):
            found.append(name)
    return found


def _build(factory: Any, spec: str, seed: int) -> torch.nn.Module:
    import torch

    if isinstance(factory, torch.nn.Module):
        return factory
    if not callable(factory):
        raise CliInputError(
            f"Model spec {spec!r} names a {type(factory).__name__}; expected an nn.Module class, a"
            " factory function or an nn.Module instance; fix: point the spec at one."
        )
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise CliInputError(
            f"Model spec {spec!r}: {getattr(factory, '__name__', factory)!s}() cannot be called"
            f" without arguments ({exc}); expected a class or factory that takes none; fix: give"
            " its arguments defaults, or add `def make_model(): return MyModel(...)` to the file"
            " and pass file.py:make_model."
        ) from exc
    except ValueError:  # builtins without a signature: just try
        pass
    with seeded(seed):
        try:
            model = factory()
        except Exception as exc:
            raise CliInputError(
                f"Building the model of {spec!r} raised {_exception_line(exc)}; expected it to"
                " build without arguments; fix: correct the model's constructor (add --debug for"
                " the traceback)."
            ) from exc
    if isinstance(model, type):
        raise CliInputError(
            f"Model spec {spec!r} returned the class {model.__name__}; expected an instance (an"
            f" nn.Module object); fix: return {model.__name__}() from the factory."
        )
    if not isinstance(model, torch.nn.Module):
        raise CliInputError(
            f"Model spec {spec!r} built a {type(model).__name__}; expected a torch.nn.Module; fix:"
            " wrap the function in an nn.Module whose forward calls it."
        )
    return model


def load_model_spec(spec: str, seed: int = DEFAULT_SEED) -> LoadedModel:
    """``models/asinh.py:Model``, ``onnx_custom.models.asinh:Model`` or ``asinh`` (a zoo name).

    The file is imported and the model built with torch's RNG seeded with ``seed`` (restored
    afterwards), so random weights come out the same in every process.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise CliInputError(
            "Empty model spec; expected path/file.py:Class, package.module:Class or a zoo name;"
            " fix: e.g. models/asinh.py:Model (see: onnx-custom zoo --list)."
        )
    target, _, attr = spec.partition(":")
    if not target:
        raise CliInputError(
            f"Model spec {spec!r} has no module before ':'; expected path/file.py:Class or"
            " package.module:Class; fix: put the file or module before the colon, e.g."
            f" model.py{spec}."
        )
    if attr and not attr.isidentifier():
        raise CliInputError(
            f"Model spec {spec!r}: {attr!r} is not a Python name; expected file.py:Class (one ':'"
            " before the class or factory name); fix: name the class or factory after the colon,"
            f" e.g. {target}:Model."
        )
    attr = attr or "Model"
    module = _resolve_module(target, spec, seed)
    if not hasattr(module, attr):
        available = _public_modules(module)
        raise CliInputError(
            f"Model spec {spec!r}: {target} has no attribute {attr!r}; expected one of its"
            f" nn.Module classes, factories or instances ({', '.join(available) or 'none found'});"
            f" fix: write {target}:<name>."
        )
    model = _build(getattr(module, attr), spec, seed)
    return LoadedModel(module, model.eval(), spec)


_SHAPE = re.compile(r"^(?P<dims>\d+(?:x\d+)*|scalar)(?::(?P<dtype>\w+))?$")


def parse_input_spec(text: str, seed: int = DEFAULT_SEED, index: int = 0) -> torch.Tensor:
    """``2x3x8:float32`` -> a random tensor of that shape/dtype (ints in [0, 10))."""
    import torch

    match = _SHAPE.match(text.strip())
    if match is None:
        raise CliInputError(
            f"Bad --input {text!r}: expected DIMS[:DTYPE] such as '2x3x8:float32', '4x16' (float32)"
            " or 'scalar:int64'; fix: separate dims with 'x' and the dtype with ':'."
        )
    dtype_name = (match["dtype"] or "float32").lower()
    if dtype_name not in _DTYPES:
        raise CliInputError(
            f"Bad --input {text!r}: unknown dtype {dtype_name!r}; expected one of"
            f" {', '.join(sorted(_DTYPES))}; fix: e.g. --input {match['dims']}:float32."
        )
    dtype = getattr(torch, _DTYPES[dtype_name])
    shape: tuple[int, ...] = (
        () if match["dims"] == "scalar" else tuple(int(d) for d in match["dims"].split("x"))
    )
    elements = 1
    for d in shape:
        elements *= d
    if elements > MAX_INPUT_ELEMENTS:
        raise CliInputError(
            f"Bad --input {text!r}: {elements} elements; expected at most {MAX_INPUT_ELEMENTS} (an"
            " example input only needs to be small); fix: use smaller dims."
        )
    gen = torch.Generator().manual_seed(seed + index)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randint(0, 10, shape, generator=gen, dtype=dtype)


def _forward_arity(model: torch.nn.Module) -> tuple[int, int | None, list[str]]:
    """(required, maximum or None for *args, names) of ``model.forward``'s positional parameters."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return 0, None, []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    return required, None if variadic else len(positional), [p.name for p in positional]


def example_args(
    loaded: LoadedModel, inputs: Sequence[str] | None, seed: int = DEFAULT_SEED
) -> tuple[Any, ...]:
    """``--input`` specs as tensors, else the module's ``example_inputs()``."""
    if inputs:
        args = tuple(parse_input_spec(t, seed, i) for i, t in enumerate(inputs))
        required, maximum, names = _forward_arity(loaded.model)
        if len(args) < required or (maximum is not None and len(args) > maximum):
            expected = (
                f"{required}"
                if maximum == required
                else f"{required} to {'any' if maximum is None else maximum}"
            )
            raise CliInputError(
                f"{loaded.spec!r}: got {len(args)} --input(s) but forward({', '.join(names)}) takes"
                f" {expected}; expected one --input per tensor argument; fix: pass {expected}."
            )
        return args
    factory = getattr(loaded.module, "example_inputs", None)
    if factory is None:
        raise CliInputError(
            f"{loaded.spec!r} has no example_inputs(); expected --input DIMS[:DTYPE] per forward"
            f" argument (or an example_inputs() function in {loaded.module.__name__}); fix: pass"
            " e.g. --input 2x3:float32."
        )
    try:
        with seeded(seed):
            produced = factory()
    except Exception as exc:
        raise CliInputError(
            f"example_inputs() of {loaded.spec!r} raised {_exception_line(exc)}; expected a tuple"
            " of tensors; fix: correct it, or pass --input DIMS[:DTYPE] per argument."
        ) from exc
    return tuple(produced) if isinstance(produced, (tuple, list)) else (produced,)

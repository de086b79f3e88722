"""ONNX files with external data: when to use it, writing the pair crash-safe, checking it on load.

Protobuf cannot serialize a message over 2 GiB, so a bigger model keeps its tensors in a data
file next to it. `external_threshold` says when: past protobuf's limit, or past
``$ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD`` bytes when set (tests lower it).

Crash safety, for any reader (ONNX Runtime and ``onnx.load`` included, not only ours): by default
every write puts its tensors in a data file of its own, named after a random token of this write
(`data_file_name`: ``model.onnx.<token>.data``), which the model's ``location`` entries point at.
Steps:

1. the new data file is written whole (temporary file + rename); the previous pair is untouched;
2. the new model is written whole (temporary file + rename): the one atomic switch to the new pair;
3. only then are the previous write's data files removed (`remove_stale_data`).

A crash before 2 leaves the old pair (plus an unreferenced new data file, removed by the next
write); a crash after 2 leaves the new pair (plus the old data file, likewise). No reader can see
the old model with the new data or the reverse. A chosen name (``external_data="weights.bin"``)
is written exactly: when that file does not exist yet, the same three steps write it directly;
when it does (the previous model may read it), the write switches through a data file of its own
(``weights.<token>.bin``) so the same holds (`_save_over_chosen`: only a process killed in the
instant between its last two steps leaves the model pointing at a missing file, which every reader
refuses, never at the other write's data). The data file also starts with a
4 KiB header naming its token and model file, and the model records the token (``metadata_props
["onnx_custom.external_data"]``): `check_external_data` (every onnx-custom loader) refuses a data
file swapped in by hand. Tensor offsets start after the header, so readers need nothing special.

`session_source` hands ONNX Runtime a model too big to serialize (past the same threshold) as a
temporary model + data pair instead of bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError

from onnx_custom.common.atomic import atomic_open, atomic_write
from onnx_custom.errors import InvalidArgumentError, ModelLoadError, OutputPathError

__all__ = [
    "METADATA_KEY",
    "PROTOBUF_LIMIT",
    "THRESHOLD_ENV",
    "check_chosen_data_name",
    "check_external_data",
    "data_file_name",
    "external_tensors",
    "external_threshold",
    "referenced_data_files",
    "remove_stale_data",
    "save_with_external_data",
    "serialized_size",
    "session_source",
]

PROTOBUF_LIMIT = 2**31 - 1
THRESHOLD_ENV = "ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD"
METADATA_KEY = "onnx_custom.external_data"
_MAGIC = b"onnx-custom external data "
_ALIGN = 4096  # every tensor starts on a page boundary (ONNX Runtime can map it directly)
_MIN_TENSOR = 1024  # smaller tensors stay inside the model, as onnx.save_model does
_TOKEN_CHARS = 16  # hex characters of a write's token (64 random bits)
_MAX_POINTER_MODEL = 64 << 20  # a previous model file bigger than this holds its tensors itself


def external_threshold() -> int:
    """Serialized size (bytes) above which a model is written with external data."""
    text = os.environ.get(THRESHOLD_ENV, "").strip()
    if not text:
        return PROTOBUF_LIMIT
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(
            f"${THRESHOLD_ENV} must be a byte count (a non-negative integer); received {text!r}."
            f" Fix: unset it (default: protobuf's limit, {PROTOBUF_LIMIT} bytes) or set e.g."
            " 1000000."
        )
    return min(value, PROTOBUF_LIMIT)


def serialized_size(model: onnx.ModelProto) -> int:
    """Bytes ``model`` serializes to; past protobuf's limit (where ``ByteSize`` itself fails) the
    bytes of its tensor data, which is then at least that large."""
    try:
        return model.ByteSize()
    except EncodeError:
        return max(sum(len(t.raw_data) for t in _tensors(model.graph)), PROTOBUF_LIMIT + 1)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the main graph (and its subgraphs) whose data lives in another file."""
    return [t for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]


def _movable(tensor: onnx.TensorProto) -> bool:
    return (
        tensor.data_location != onnx.TensorProto.EXTERNAL
        and tensor.HasField("raw_data")
        and len(tensor.raw_data) >= _MIN_TENSOR
    )


def data_file_name(model_name: str, chosen: str | None, token: str) -> str:
    """The data file of one write: ``<model_name>.<token>.data`` by default; for a chosen name
    the token goes before its last suffix (``weights.bin`` -> ``weights.<token>.bin``), or after a
    name without one (``weights`` -> ``weights.<token>``)."""
    if chosen is None:
        return f"{model_name}.{token}.data"
    stem, dot, suffix = chosen.rpartition(".")
    return f"{stem}.{token}.{suffix}" if dot and stem else f"{chosen}.{token}"


def _stale_pattern(model_name: str, chosen: str | None) -> re.Pattern[str]:
    """Names `data_file_name` gives (any token) for this model and choice."""
    token = f"[0-9a-f]{{{_TOKEN_CHARS}}}"
    if chosen is None:
        return re.compile(rf"{re.escape(model_name)}\.{token}\.data")
    stem, dot, suffix = chosen.rpartition(".")
    if dot and stem:
        return re.compile(rf"{re.escape(stem)}\.{token}\.{re.escape(suffix)}")
    return re.compile(rf"{re.escape(chosen)}\.{token}")


def _header(token: str, model_name: str) -> bytes:
    text = _MAGIC + token.encode() + b" " + json.dumps(model_name).encode() + b"\n"
    if len(text) > _ALIGN:
        text = _MAGIC + token.encode() + b"\n"  # a model name of thousands of bytes: token only
    return text + b"\0" * (_ALIGN - len(text))


def _header_of(path: Path) -> tuple[str, str | None] | None:
    """``(token, model file name)`` from a data file onnx-custom wrote (name None in files of
    older versions), or None for any other file."""
    try:
        with open(path, "rb") as handle:
            line = handle.read(_ALIGN).split(b"\n", 1)[0]
    except OSError:
        return None
    if not line.startswith(_MAGIC):
        return None
    token, _, name = line[len(_MAGIC) :].decode("utf-8", "replace").partition(" ")
    with contextlib.suppress(ValueError):
        return token, json.loads(name) if name else None
    return token, None


def referenced_data_files(path: Path) -> set[str]:
    """Names of the external data files the model file ``path`` points at (empty when it has
    none, is missing or does not parse). Only small files are read: a model with external data is.
    """
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_POINTER_MODEL:
            return set()  # a pipe or device has no previous pair (and opening it could block)
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # any unreadable previous file simply references nothing
        return set()
    found = set()
    for tensor in external_tensors(model):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if location and os.path.basename(location) == location:
            found.add(location)
    return found


def remove_stale_data(
    final: Path, chosen: str | None, keep: set[str], previous: set[str], started: float
) -> None:
    """After ``final`` was replaced: remove the data files of earlier writes of this model that
    onnx-custom wrote (their header says so): the ones the replaced model pointed at
    (``previous``), and ones an interrupted write left (named like ours for this model, naming
    this model in their header, older than this write). Files in ``keep``, files of other models
    and files a write started later are left alone."""
    folder = final.parent
    pattern = _stale_pattern(final.name, chosen)
    candidates = set(previous)
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if (
                pattern.fullmatch(entry.name)
                and entry.is_file()
                and entry.stat().st_mtime <= started
            ):
                header = _header_of(Path(entry.path))
                if header is not None and header[1] == final.name:
                    candidates.add(entry.name)
    for name in sorted(candidates - keep):
        path = folder / name
        if _header_of(path) is not None:  # ours: never a file the user put there
            with contextlib.suppress(OSError):
                os.unlink(path)


@contextlib.contextmanager
def _pointing_at(
    model: onnx.ModelProto, data_name: str, token: str, offsets: list[tuple[onnx.TensorProto, int]]
) -> Iterator[None]:
    """``model`` with its big tensors pointing into ``data_name`` (and the token recorded) for the
    duration of the block; restored exactly afterwards, so the caller's proto never changes."""
    saved = []
    try:
        for tensor, offset in offsets:
            saved.append((tensor, tensor.raw_data, tensor.HasField("data_location")))
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", data_name),
                ("offset", str(offset)),
                ("length", str(len(saved[-1][1]))),
            ):
                tensor.external_data.add(key=key, value=value)
        entry = model.metadata_props.add(
            key=METADATA_KEY, value=json.dumps({"location": data_name, "token": token})
        )
        yield
    finally:
        with contextlib.suppress(NameError, ValueError):
            model.metadata_props.remove(entry)
        for tensor, data, had_location in saved:
            del tensor.external_data[:]
            tensor.ClearField("data_location")
            if had_location:
                tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = data


def _write_data(
    model: onnx.ModelProto, path: Path, token: str, model_name: str
) -> list[tuple[onnx.TensorProto, int]]:
    """Write the data file ``path`` whole (temporary file + rename): the header, then every
    movable tensor page-aligned. Returns each tensor's offset."""
    offsets: list[tuple[onnx.TensorProto, int]] = []
    with atomic_open(path, "wb") as handle:
        handle.write(_header(token, model_name))
        position = _ALIGN
        for tensor in _tensors(model.graph):
            if not _movable(tensor):
                continue
            pad = -position % _ALIGN
            handle.write(b"\0" * pad)
            position += pad
            offsets.append((tensor, position))
            handle.write(tensor.raw_data)
            position += len(tensor.raw_data)
    return offsets


def _write_model(
    model: onnx.ModelProto,
    final: Path,
    data_name: str,
    token: str,
    offsets: list[tuple[onnx.TensorProto, int]],
) -> None:
    """Replace ``final`` by ``model`` pointing into ``data_name`` (one atomic rename)."""
    with _pointing_at(model, data_name, token, offsets):
        atomic_write(final, model.SerializeToString())


def _hidden_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def _backup(path: Path) -> Path | None:
    """A hidden second name of the file ``path`` (a hard link, else a copy), or None when the
    file system allows neither. Only for model files: ``onnx.load`` refuses *data* files with
    several links."""
    name = _hidden_name(path)
    try:
        os.link(path, name)
        return name
    except OSError:
        pass
    try:
        shutil.copy2(path, name)
        return name
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(name)
        return None


def check_chosen_data_name(final: Path, chosen: str) -> None:
    """``external_data=chosen`` would overwrite the data file of another model in the folder (its
    header names that model, which still points at it): an `OutputPathError` naming it."""
    header = _header_of(final.with_name(chosen))
    if header is None or header[1] is None or header[1] == final.name:
        return
    owner = final.with_name(header[1])
    if chosen in referenced_data_files(owner):
        raise OutputPathError(
            f"external_data={chosen!r}: {str(final.with_name(chosen))!r} holds the tensors of the"
            f" model {str(owner)!r}, which still reads it; writing this model's tensors there"
            f" would break that model. Fix: choose another name (e.g. external_data="
            f"'{Path(final.name).stem}.bin'), or remove {str(owner)!r} first."
        )


def save_with_external_data(model: onnx.ModelProto, final: Path, chosen: str | None = None) -> str:
    """Write ``model`` to ``final`` with its tensors of 1 KiB or more in a data file: one of this
    write (`data_file_name`) by default, or exactly ``chosen`` (the user's ``external_data=``
    name, a plain file name); then remove the previous write's data (see the module doc).
    Returns the data file's name."""
    token = secrets.token_hex(_TOKEN_CHARS // 2)
    started = time.time()
    previous = referenced_data_files(final)
    if chosen is not None:
        check_chosen_data_name(final, chosen)
        if os.path.lexists(final.with_name(chosen)):
            _save_over_chosen(model, final, chosen, token)
            remove_stale_data(final, chosen, {chosen}, previous, started)
            return chosen
    data_name = chosen if chosen is not None else data_file_name(final.name, None, token)
    offsets = _write_data(model, final.with_name(data_name), token, final.name)
    try:
        _write_model(model, final, data_name, token, offsets)
    except BaseException:
        if data_name not in referenced_data_files(final):  # the model was not replaced: no reader
            with contextlib.suppress(OSError):
                os.unlink(final.with_name(data_name))
        raise
    remove_stale_data(final, chosen, {data_name}, previous, started)
    return data_name


def _save_over_chosen(model: onnx.ModelProto, final: Path, chosen: str, token: str) -> None:
    """``chosen`` exists (the current model may read it), so it cannot simply be replaced: for a
    moment the old model would read the new data. The write switches through a data file of its
    own instead:

    1. the data goes to ``<chosen stem>.<token>.<suffix>`` (whole, temporary file + rename);
    2. the model is replaced, pointing there: the atomic switch to the new, complete pair;
    3. the previous ``chosen`` is renamed to a hidden backup (nothing reads it now), and the new
       data file is renamed to ``chosen``;
    4. the model is replaced again, pointing at ``chosen``.

    No moment shows a model with the other write's data. Only a process killed between the last
    rename of 3 and the end of 4 leaves the model pointing at a missing file (every reader
    refuses it; the next write repairs it). Any exception before 4 completes restores the previous
    model and ``chosen`` exactly (`_roll_back`)."""
    target = final.with_name(chosen)
    staged = final.with_name(data_file_name(final.name, chosen, token))
    offsets = _write_data(model, staged, token, final.name)
    existed = os.path.lexists(final)
    model_backup = _backup(final) if existed else None
    data_backup = _hidden_name(target)
    stage = 0
    try:
        _write_model(model, final, staged.name, token, offsets)
        stage = 1
        os.replace(target, data_backup)
        stage = 2
        os.replace(staged, target)
        stage = 3
        _write_model(model, final, chosen, token, offsets)
        stage = 4
    except BaseException:
        _roll_back(final, target, staged, data_backup, model_backup, existed, stage)
        raise
    finally:
        for backup in (model_backup, data_backup):
            if backup is not None:
                with contextlib.suppress(OSError):
                    os.unlink(backup)
        if staged.name not in referenced_data_files(final):
            with contextlib.suppress(OSError):
                os.unlink(staged)


def _roll_back(
    final: Path,
    target: Path,
    staged: Path,
    data_backup: Path,
    model_backup: Path | None,
    existed: bool,
    stage: int,
) -> None:
    """Undo `_save_over_chosen` interrupted after ``stage`` of its steps (1: the model points at
    the staged data; 2: ``chosen`` moved to its backup; 3: the staged data renamed to ``chosen``),
    newest first, so each moment shows one complete pair. Without a backup of the previous model
    (a file system with neither links nor room for a copy) the new pair stays, complete."""
    if stage in (0, 4):
        return
    if stage >= 3:
        os.replace(target, staged)  # the new model's data under the name it reads
    if stage >= 2:
        os.replace(data_backup, target)  # nothing reads it: the model points at staged
    if model_backup is not None:
        os.replace(model_backup, final)  # the switch back to the previous pair
    elif not existed:
        with contextlib.suppress(OSError):
            os.unlink(final)  # there was no model before this write


@contextlib.contextmanager
def session_source(model: onnx.ModelProto) -> Iterator[bytes | str]:
    """What to hand ``onnxruntime.InferenceSession`` for an in-memory model: its bytes, or, when
    it serializes to more than `external_threshold` bytes (protobuf cannot serialize past 2 GiB),
    the path of a temporary copy with its tensors in external data, removed when the block exits
    (the session has read its tensors by then)."""
    if serialized_size(model) <= external_threshold():
        yield model.SerializeToString()
        return
    with tempfile.TemporaryDirectory(
        prefix="onnx_custom_session_", ignore_cleanup_errors=True
    ) as folder:
        path = Path(folder) / "model.onnx"
        save_with_external_data(model, path)
        yield str(path)


def _recorded(model: onnx.ModelProto) -> dict[str, str]:
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(prop.value)
                if isinstance(value, dict):
                    return {str(k): str(v) for k, v in value.items()}
    return {}


def check_external_data(model: onnx.ModelProto, folder: Path, what: str) -> None:
    """Every external tensor's file is there, long enough, and (for files onnx-custom wrote) from
    the same write as the model; else `ModelLoadError` saying which file and the fix."""
    recorded = _recorded(model)
    sizes: dict[str, int] = {}
    for tensor in external_tensors(model):
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        path = folder / location
        if location not in sizes:
            if not location or not path.is_file():
                raise ModelLoadError(
                    f"{what} keeps tensor {tensor.name!r} in the external data file {location!r},"
                    f" which is missing (expected at {str(path)!r}). Fix: keep the data file next"
                    " to the model (copy/move both together), or re-export the model."
                )
            sizes[location] = path.stat().st_size
            if recorded.get("location") == location:
                _check_token(path, recorded.get("token", ""), what)
        end = int(info.get("offset", "0") or 0) + int(info.get("length", "0") or 0)
        if sizes[location] < end:
            raise ModelLoadError(
                f"{what}: its external data file {str(path)!r} is truncated ({sizes[location]}"
                f" bytes; tensor {tensor.name!r} needs bytes up to {end}). Fix: copy the data file"
                " again completely, or re-export the model."
            )


def _check_token(path: Path, token: str, what: str) -> None:
    header = _header_of(path)
    if header is None or header[0] != token:
        raise ModelLoadError(
            f"{what} and its external data file {str(path)!r} come from different exports (an "
            "export was interrupted between writing the data and the model, or the data file was "
            "replaced): the weights would not be this model's. Fix: re-export the model."
        )

"""ONNX files with external data: when to use it, writing the pair crash-safe, checking it on load.

Protobuf cannot serialize a message over 2 GiB, so a bigger model keeps its tensors in a data
file next to it (``model.onnx`` + ``model.onnx.data``). `external_threshold` says when: past
protobuf's limit, or past ``$ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD`` bytes when set (tests lower it).

Crash safety: `save_with_external_data` writes the data file first, then the model, each whole
(temporary file + rename). The data file starts with a header holding a random token of this
write, and the model records the same token (``metadata_props["onnx_custom.external_data"]``),
so if the process dies between the two renames, the old model and the new data disagree and
`check_external_data` (run by every onnx-custom loader) raises `ModelLoadError` instead of
running the old graph on the new weights. Tensor offsets start after the header, so ONNX Runtime
and ``onnx.load`` read the file as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import EncodeError

from onnx_custom.common.atomic import atomic_open, atomic_write
from onnx_custom.errors import InvalidArgumentError, ModelLoadError

__all__ = [
    "METADATA_KEY",
    "PROTOBUF_LIMIT",
    "THRESHOLD_ENV",
    "check_external_data",
    "external_tensors",
    "external_threshold",
    "save_with_external_data",
    "serialized_size",
]

PROTOBUF_LIMIT = 2**31 - 1
THRESHOLD_ENV = "ONNX_CUSTOM_EXTERNAL_DATA_THRESHOLD"
METADATA_KEY = "onnx_custom.external_data"
_MAGIC = b"onnx-custom external data "
_ALIGN = 4096  # every tensor starts on a page boundary (ONNX Runtime can map it directly)
_MIN_TENSOR = 1024  # smaller tensors stay inside the model, as onnx.save_model does


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
            f"${THRESHOLD_ENV} must be a byte count (a non-negative integer); received {text!r}. "
            f"Fix: unset it (default: protobuf's limit, {PROTOBUF_LIMIT} bytes) or set e.g. 1000000."
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
    return tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.HasField("raw_data") and len(tensor.raw_data) >= _MIN_TENSOR


def _header(token: str) -> bytes:
    text = _MAGIC + token.encode() + b"\n"
    return text + b"\0" * (_ALIGN - len(text))


@contextlib.contextmanager
def _pointing_at(model: onnx.ModelProto, data_name: str, token: str, offsets: list[tuple[onnx.TensorProto, int]]) -> Iterator[None]:
    """``model`` with its big tensors pointing into ``data_name`` (and the token recorded) for the
    duration of the block; restored exactly afterwards, so the caller's proto never changes."""
    saved = []
    try:
        for tensor, offset in offsets:
            saved.append((tensor, tensor.raw_data, tensor.HasField("data_location")))
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(saved[-1][1])))):
                tensor.external_data.add(key=key, value=value)
        entry = model.metadata_props.add(key=METADATA_KEY, value=json.dumps({"location": data_name, "token": token}))
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


def save_with_external_data(model: onnx.ModelProto, final: Path, data_name: str) -> None:
    """Write ``model`` to ``final`` with its tensors of 1 KiB or more in ``data_name`` (a file name
    in the same folder): data first, then the model, each whole (see the module doc)."""
    token = secrets.token_hex(8)
    offsets: list[tuple[onnx.TensorProto, int]] = []
    with atomic_open(final.with_name(data_name), "wb") as handle:
        handle.write(_header(token))
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
    with _pointing_at(model, data_name, token, offsets):
        atomic_write(final, model.SerializeToString())


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
                    f"{what} keeps tensor {tensor.name!r} in the external data file {location!r}, which is "
                    f"missing (expected at {str(path)!r}). Fix: keep the data file next to the model "
                    f"(copy/move both together), or re-export the model."
                )
            sizes[location] = path.stat().st_size
            if recorded.get("location") == location:
                _check_token(path, recorded.get("token", ""), what)
        end = int(info.get("offset", "0") or 0) + int(info.get("length", "0") or 0)
        if sizes[location] < end:
            raise ModelLoadError(
                f"{what}: its external data file {str(path)!r} is truncated ({sizes[location]} bytes; "
                f"tensor {tensor.name!r} needs bytes up to {end}). Fix: copy the data file again "
                "completely, or re-export the model."
            )


def _check_token(path: Path, token: str, what: str) -> None:
    with open(path, "rb") as handle:
        head = handle.read(len(_MAGIC) + len(token) + 1)
    if head != _MAGIC + token.encode() + b"\n":
        raise ModelLoadError(
            f"{what} and its external data file {str(path)!r} come from different exports (an "
            "export was interrupted between writing the data and the model, or the data file was "
            "replaced): the weights would not be this model's. Fix: re-export the model."
        )

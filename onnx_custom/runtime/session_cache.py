"""ONNX Runtime sessions shared across calls on the same file (`SessionCache`).

A new session per ``verify`` call would cost session creation plus the first-touch
memory of its arena and worker thread, for a file it often verified a moment earlier (the
samples of ``check_op``, a test suite, a loop). A cached session is reused only when nothing that
decides what it computes has changed:

- the file's bytes (a blake2b digest of the serialized model: a changed weight or node is another
  file; a path's contents are read by the caller, so a rewritten file is another file too);
- the Python kernels serving its custom nodes (the very `KernelSpec` objects a new session would
  register: a kernel replaced in the registry is another session);
- ORT's log severity (``$ONNX_CUSTOM_ORT_LOG_SEVERITY`` may change between calls).

Bounded: `MAX_ENTRIES` sessions (least recently used goes first), of files up to
`MAX_FILE_BYTES` (a large file's weights are not kept alive after the call). A cached session
keeps its arena, so what it holds after a call is the file's weights plus one run's working
memory; `clear_session_cache` (or `SessionCache.discard`) gives it back.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Hashable
from typing import Any

import onnx
from google.protobuf.message import EncodeError

from onnx_custom.common.external_data import external_threshold
from onnx_custom.runtime.ort_log_level import ort_log_severity
from onnx_custom.runtime.registry import KernelRegistry
from onnx_custom.runtime.session import required_kernels

__all__ = [
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "SessionCache",
    "clear_session_cache",
    "shared_sessions",
]

MAX_ENTRIES = 3  # a file's session, its declared-types twin, and its plain-ORT (bodies) session
MAX_FILE_BYTES = 16 << 20  # past this the weights' memory matters more than a session's ~ms

# the file's serialized bytes (None: too large to keep, serialize it yourself) -> a new session
SessionBuilder = Callable[[bytes | None], Any]


@dataclasses.dataclass
class _Entry:
    session: Any
    # The kernel specs whose ids are in the key: held so that an id cannot be reused by another
    # spec while the entry lives.
    pinned: tuple[Any, ...]


class SessionCache:
    """At most ``max_entries`` sessions of files of at most ``max_file_bytes`` (see module doc)."""

    def __init__(
        self, max_entries: int = MAX_ENTRIES, max_file_bytes: int = MAX_FILE_BYTES
    ) -> None:
        self.max_entries = max_entries
        self.max_file_bytes = max_file_bytes
        self._entries: collections.OrderedDict[Hashable, _Entry] = collections.OrderedDict()
        self._lock = threading.Lock()

    def session(
        self,
        model: onnx.ModelProto,
        build: SessionBuilder,
        kernels: KernelRegistry | None = None,
        *,
        plain: bool = False,
    ) -> Any:
        """The cached session of ``model``, else ``build(model's bytes)`` (kept when small enough;
        a larger file gets ``build(None)``, a session of its own, as before).

        ``kernels``: the registry serving the custom nodes (None: the default registry);
        ``plain``: ``build`` makes a session without our kernels (their specs are not part of
        the key). Errors of ``build`` propagate and nothing is kept.
        """
        if not (plain or kernels is None or isinstance(kernels, KernelRegistry)):
            return build(None)  # native libraries and invalid kernels= are left to the builder
        data = self._small_file_bytes(model)  # a new session needs them too: serialized once
        if data is None:
            return build(None)
        # The specs a new session would register (and the KernelError it would raise).
        specs = () if plain else tuple(required_kernels(model, kernels))
        digest = hashlib.blake2b(data, digest_size=32).digest()
        key = (digest, len(data), plain, tuple(id(s) for s in specs), ort_log_severity())
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry.session
        session = build(data)
        with self._lock:
            self._entries[key] = _Entry(session, specs)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return session

    def _small_file_bytes(self, model: onnx.ModelProto) -> bytes | None:
        """``model``'s bytes when it is small enough to keep, else None (serialized only then: a
        large file's weights are counted first, and past 2 GiB it cannot be serialized). Past the
        external-data threshold sessions read a temporary model + data pair (`session_source`),
        which the builder makes: never bytes, so not cached."""
        limit = min(self.max_file_bytes, external_threshold())
        if sum(len(t.raw_data) for t in model.graph.initializer) > limit:
            return None
        try:
            data = model.SerializeToString()
        except (ValueError, EncodeError):  # protobuf's 2 GiB limit, reached by constants
            return None
        return data if len(data) <= limit else None

    def discard(self, session: Any) -> None:
        """Forget ``session`` (its memory goes once the caller drops it too)."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.session is session]:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


# verify's sessions: one cache per process
shared_sessions = SessionCache()


def clear_session_cache() -> None:
    """Drop every session `verify` keeps for reuse (their weights and arenas go with them)."""
    shared_sessions.clear()

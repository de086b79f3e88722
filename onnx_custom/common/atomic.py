"""Files written whole or not at all: a temporary file in the same folder, then ``os.replace``.

Every file onnx-custom writes (ONNX models and their external data, reports, built libraries)
goes through here, so a failure midway (an exception, a full disk, Ctrl-C) leaves the previous
file exactly as it was and no temporary file behind. ``os.replace`` within one folder is atomic
on POSIX and Windows: a reader sees the old file or the new one, never a truncated one.

- `atomic_write(path, data)`: bytes or text.
- `atomic_open(path, "w"/"wb")`: a file object for code that streams its output.
- `atomic_path(path)`: a temporary path for tools that write the file themselves (a compiler's
  ``-o``); moved into place when the block succeeds.
- `check_output_path(path)`: is ``path`` a file we can write? Checked before long work starts.

A path that names an existing device, FIFO or socket (``/dev/null``, ``/dev/stdout``, a named
pipe) is written in place: replacing it with a regular file would destroy the device (as root)
or fail (as anyone else), and such targets have no "previous content" to protect.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from onnx_custom.errors import InvalidArgumentError, OutputPathError

__all__ = [
    "atomic_open",
    "atomic_path",
    "atomic_write",
    "check_output_path",
    "commit_file",
    "is_file_object",
    "temporary_folder",
]


def is_file_object(f: Any) -> bool:
    """Whether ``f`` is a file object rather than a path: anything with a ``write`` method that is
    not a str/bytes/PathLike (``io.BytesIO``, ``open(..., "wb")``,
    ``tempfile.NamedTemporaryFile()``, ``gzip.open(..., "wb")``),
    as ``torch.onnx.export`` accepts."""
    return not isinstance(f, (str, bytes, os.PathLike)) and callable(getattr(f, "write", None))


def _final(path: str | os.PathLike[str]) -> Path:
    """Where the bytes must land: through a symlink to its target, so the link stays a link."""
    target = Path(os.fspath(path))
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def _is_special(final: Path) -> bool:
    """An existing device, FIFO or socket: written in place, never replaced (see module doc)."""
    try:
        mode = os.stat(final).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _create_temporary(final: Path) -> tuple[Path, int]:
    """A new file next to ``final`` (same folder, so ``os.replace`` cannot cross devices).
    Created with mode 0o666 so the umask applies, as for a file opened the ordinary way."""
    for _ in range(100):
        candidate = final.with_name(f".{final.name}.{secrets.token_hex(4)}.tmp")
        try:
            return candidate, os.open(
                candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
            )
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(final))  # pragma: no cover


def _keep_mode(final: Path, temporary: Path) -> None:
    """Replacing a file keeps its permission bits (the temporary got the umask's)."""
    with contextlib.suppress(OSError):
        os.chmod(temporary, os.stat(final).st_mode & 0o7777)


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(temporary: Path, final: Path) -> None:
    if _is_special(final):
        shutil.copyfile(temporary, final)  # a device or pipe takes the bytes; it is never replaced
        os.unlink(temporary)
        return
    _keep_mode(final, temporary)
    os.replace(temporary, final)
    _sync_folder(final.parent)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """``open(path, mode)`` whose content replaces ``path`` only when the block exits normally.

    ``mode`` is ``"w"`` (text, UTF-8 unless ``encoding``) or ``"wb"``. On an exception the
    temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise InvalidArgumentError(
            f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}; fix: use one"
            " of those."
        )
    final = _final(path)
    if _is_special(final):
        with open(final, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as special:
            yield special
        return
    temporary, fd = _create_temporary(final)
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _commit(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def atomic_write(
    path: str | os.PathLike[str], data: bytes | str, *, encoding: str = "utf-8"
) -> None:
    """Write ``data`` (bytes, or text encoded with ``encoding``) to ``path`` atomically."""
    payload = data.encode(encoding) if isinstance(data, str) else bytes(data)
    with atomic_open(path, "wb") as handle:
        handle.write(payload)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to ``path``; whatever is written there replaces ``path`` when the
    block exits normally (e.g. ``cc -o <that path>``). Removed on failure, or when nothing was
    written (then ``path`` stays as it was)."""
    final = _final(path)
    temporary, fd = _create_temporary(final)
    os.close(fd)
    os.unlink(temporary)  # the name is reserved by its randomness; the tool creates the file
    try:
        yield temporary
        if temporary.exists():
            _commit(temporary, final)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


@contextlib.contextmanager
def temporary_folder(near: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh folder next to ``near`` (same file system), removed with everything in it on exit:
    for outputs of several files that are moved into place one by one."""
    final = _final(near)
    folder = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def commit_file(temporary: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Move a finished ``temporary`` (in ``path``'s folder) over ``path`` atomically."""
    _commit(Path(temporary), _final(path))


def check_output_path(path: Any, *, what: str = "f", example: str = "model.onnx") -> Path:
    """``path`` as a `Path` we can write a file to, or a typed error saying what to change.

    Checked before any long work: a path (not ``123``), not a folder, a parent folder that exists
    and accepts new files (probed by creating one, which is what the write will do), and no
    read-only file in the way.
    """
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"{what} must be a file path (str or os.PathLike) or a binary file object opened for "
            f"writing; received {type(path).__name__} ({path!r}). Fix: pass a path such as "
            f"{what}={example!r}."
        )
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        raise InvalidArgumentError(
            f"{what} must name a file; received an empty path ({text!r}). Fix: pass a path such as"
            f" {what}={example!r}."
        )
    final = _final(text)
    if final.is_dir():
        raise OutputPathError(
            f"{what}={text!r} is a folder; expected a file path. Fix: name a file inside it, e.g. "
            f"{what}={os.path.join(text, example)!r}."
        )
    folder = final.parent
    if not folder.exists():
        raise OutputPathError(
            f"{what}={text!r}: the folder {str(folder)!r} does not exist; expected an existing "
            f"folder. Fix: create it first (os.makedirs({str(folder)!r}, exist_ok=True)) or choose "
            "another path."
        )
    if not folder.is_dir():
        raise OutputPathError(
            f"{what}={text!r}: {str(folder)!r} is a file, not a folder; expected a folder to hold "
            f"the file. Fix: choose a path inside a folder, e.g. {what}={example!r}."
        )
    if _is_special(final):
        if not os.access(final, os.W_OK):
            raise OutputPathError(
                f"{what}={text!r} is a device or pipe that is not writable; expected a writable "
                f"file or a new path. Fix: choose another path, e.g. {what}={example!r}."
            )
        return final
    if final.exists() and not os.access(final, os.W_OK):
        raise OutputPathError(
            f"{what}={text!r} exists and is read-only; expected a writable file or a new path. "
            f"Fix: make it writable (chmod u+w {text}) or choose another path."
        )
    try:
        probe, fd = _create_temporary(final)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputPathError(
            f"{what}={text!r}: cannot create files in the folder {str(folder)!r} ({reason}); "
            "expected a writable folder. Fix: choose a folder you can write to, or change its "
            "permissions."
        ) from exc
    os.close(fd)
    os.unlink(probe)
    return final

"""Durable file writes shared by every package: atomic replace (the old content or the whole new one,
even across a power cut), directory fsync, file hashes."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from glob import escape as glob_escape
from pathlib import Path
from typing import BinaryIO, Callable

__all__ = ["OutputWriteError", "atomic_write", "atomic_write_json", "file_sha256", "free_bytes", "fsync",
           "remove_temporaries", "write_error"]

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once, at import: os.umask can only be read by setting it, for every thread


class OutputWriteError(OSError):
    """A write that failed (full disk, read-only or vanished folder, quota, file-size limit), with
    a one-line message naming the path; `errno` is the underlying error's."""

    def __init__(self, message: str, errno_code: int | None = None):
        super().__init__(message)
        self.errno = errno_code


_WRITE_PROBLEMS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EFBIG: "the file would exceed the file-size limit",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "the output folder no longer exists",
    errno.ESTALE: "the output folder no longer exists",
    errno.EIO: "an I/O error (failing disk?)",
}
_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_error(error: OSError, path: str | os.PathLike, needed: int | None = None,
                advice: str = "") -> OSError:
    """`error` (raised while writing `path`) as a one-line `OutputWriteError`: the problem, the path, the
    bytes needed and `advice`; errors other than a full, read-only or vanished destination unchanged."""
    problem = _WRITE_PROBLEMS.get(error.errno)
    if problem is None or isinstance(error, OutputWriteError):
        return error
    if error.errno in (errno.ENOENT, errno.ESTALE) and Path(path).parent.is_dir():
        problem = "a file beside the output was removed"
    message = f"cannot write {path}: {problem}"
    if needed is not None and error.errno in _SPACE_ERRORS:
        free = free_bytes(Path(path).parent)
        message += f" (this write needed {needed:,} bytes" + (f", {free:,} are free)" if free is not None else ")")
    return OutputWriteError(message + (f"; {advice}" if advice else ""), error.errno)


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on `folder`'s file system (None if unknown)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def fsync(path: str | os.PathLike) -> None:
    """Flush a file's data, or a folder's entries (renames, new files), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, sync_dir: bool = True) -> None:
    """Write `path` atomically: `write(handle)` fills a temporary file beside it (`.NAME.*.tmp`), which
    is fsynced and renamed over `path`, and the folder is fsynced; permissions follow the umask."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide the file from other users
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync(path.parent)


def remove_temporaries(path: str | os.PathLike) -> None:
    """Delete the temporary files that `atomic_write` calls for `path` left behind when killed;
    only while nothing else writes `path`."""
    path = Path(path)
    for temporary in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        temporary.unlink(missing_ok=True)


def atomic_write_json(path: str | os.PathLike, payload, **dump_options) -> None:
    """`atomic_write` of `payload` as UTF-8 JSON (`dump_options` go to `json.dumps`)."""
    data = json.dumps(payload, **dump_options).encode("utf-8")
    atomic_write(path, lambda stream: stream.write(data))


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()

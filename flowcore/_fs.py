"""Durable file writes shared by every package: atomic replace (the old content or the whole new one,
even across a power cut), directory fsync, file hashes."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from glob import escape as glob_escape
from pathlib import Path
from typing import BinaryIO, Callable

__all__ = ["OutputWriteError", "atomic_write", "atomic_write_json", "check_replaceable", "file_sha256", "free_bytes",
           "fresh_folder", "fsync", "open_existing", "open_new", "remove_temporaries", "write_error", "write_problem"]

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
    errno.ENOTDIR: "a part of its folder path is a file, not a folder",
    errno.EEXIST: "a file stands where its folder should be",
}
_SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_problem(error: OSError) -> str:
    """What a failed write's error means, in words (its strerror where flowcore has no words of its own)."""
    return _WRITE_PROBLEMS.get(error.errno) or (error.strerror or str(error)).lower()


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


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for check, name in _KINDS if check(mode)), "not a regular file")


def check_replaceable(path: str | os.PathLike, what: str | None = None) -> None:
    """An `OutputWriteError` in one line unless `path` may be written by renaming a new file over it: it does
    not exist, is a regular file, or is a link (the link is replaced, its target never written) to a regular
    file or to nothing. A device, pipe, socket, folder or link loop is refused. `what`: how to name `path`."""
    name = what or str(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    link = stat.S_ISLNK(mode)
    if link:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:  # a dangling link: replaced like a file
            return
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise OutputWriteError(f"{name} is a symbolic link loop; remove it or choose another path",
                                       error.errno) from None
            raise
    if not stat.S_ISREG(mode):
        kind = f"a link to {_kind(mode)}" if link else f"{_kind(mode)}, not a regular file"
        raise OutputWriteError(f"{name} is {kind}; flowcore only replaces regular files: choose another path")


def open_new(path: str | os.PathLike, mode: str = "w+b") -> BinaryIO:
    """`path` opened as a new, empty regular file: whatever was there (a file, a link, a pipe) is removed
    first, and the file is created exclusively, so that nothing is ever written through a link."""
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(path)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(descriptor, mode)


def open_existing(path: str | os.PathLike, mode: str = "r+b") -> BinaryIO:
    """An existing regular file opened for reading and writing, never through a link (`OutputWriteError`)."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise OutputWriteError(f"{path} is a symbolic link; flowcore never writes through a link: remove it "
                                   "and rerun with --restart", error.errno) from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OutputWriteError(f"{path} is not a regular file; remove it and rerun with --restart")
    return os.fdopen(descriptor, mode)


def fresh_folder(path: str | os.PathLike) -> None:
    """`path` as a new, empty folder: a folder there is removed with its files; a link or file is unlinked."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.mkdir()


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, sync_dir: bool = True) -> None:
    """Write `path` atomically: `write(handle)` fills a temporary file beside it (`.NAME.*.tmp`), which is
    fsynced and renamed over `path`, and the folder is fsynced; permissions follow the umask. A link at `path`
    is replaced, never written through; a device, pipe, socket or folder there is refused (`check_replaceable`)."""
    path = Path(path)
    check_replaceable(path)
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
    """Delete the temporaries that `atomic_write` calls for `path` left when killed (only while nothing writes it)."""
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

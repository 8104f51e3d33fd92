"""Durable file writes shared by every package: atomic replace, directory fsync, file hashes.

A file written with `atomic_write` is either the old content or the whole new content, never a
torn mix: the bytes go to a temporary file beside the target, are fsynced, renamed over it, and
the folder is fsynced so the rename itself survives a power cut.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from glob import escape as glob_escape
from pathlib import Path
from typing import BinaryIO, Callable

__all__ = ["atomic_write", "atomic_write_json", "file_sha256", "fsync", "remove_temporaries"]

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once, at import: os.umask can only be read by setting it, for every thread


def fsync(path: str | os.PathLike) -> None:
    """Flush a file's data, or a folder's entries (renames, new files), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], *, sync_dir: bool = True) -> None:
    """Write `path` atomically: `write(handle)` fills a temporary file beside it (`.NAME.*.tmp`), which
    is fsynced and renamed over `path`. The file gets the permissions of a normally created one
    (umask)."""
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

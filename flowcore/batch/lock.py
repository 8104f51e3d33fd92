"""One writer per output: `OutputLock`, the `OUT.lock` file a calibration job holds while it runs: an
`fcntl.flock`, which the kernel releases the moment its holder dies, so a lock file left by a killed job is
never taken for a live one (no pid test needed). It holds JSON naming the holder."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path

__all__ = ["OutputLock", "OutputLockedError", "took_over"]


class OutputLockedError(ValueError):
    """Another job (or another run of this one) is writing the same output."""


class OutputLock:
    """An exclusive, non-blocking lock on `OUT.lock` beside an output, held inside a `with` block.

    Args:
        out: the output the lock protects.
        path: the lock file (default: `OUT.lock` beside `out`).

    Example:
        >>> with OutputLock(Path("vectors.npy")) as lock:
        ...     lock.took_over      # the holder record a killed job left, or None
    """

    def __init__(self, out: Path, path: Path | None = None):
        self.out = Path(out)
        self.path = Path(path) if path is not None else self.out.with_name(self.out.name + ".lock")
        self.took_over: dict | None = None
        self._descriptor: int | None = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> "OutputLock":
        """Take the lock at once, or raise `OutputLockedError` naming its holder. The lock file is never opened
        through a link, and anything there but a regular file is refused (`OutputLockedError` naming it)."""
        while True:
            with contextlib.suppress(FileNotFoundError):  # never open a device or a pipe, whatever opening does
                mode = os.lstat(self.path).st_mode
                if not stat.S_ISREG(mode):
                    raise OutputLockedError(self._not_a_lock("a symbolic link" if stat.S_ISLNK(mode) else
                                                             "not a regular file"))
            try:
                descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                     0o666)
            except OSError as error:
                if error.errno == errno.ELOOP:  # a link planted after the check above
                    raise OutputLockedError(self._not_a_lock("a symbolic link")) from None
                raise
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                os.close(descriptor)
                raise OutputLockedError(self._not_a_lock("not a regular file"))
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _read_holder(descriptor)
                os.close(descriptor)
                if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OutputLockedError(self._refusal(holder)) from None
                raise
            # the holder may have removed the file after we opened it: lock the one at the path now
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(descriptor).st_ino == os.stat(self.path).st_ino:
                    break
            os.close(descriptor)
        self._descriptor = descriptor
        self.took_over = _read_holder(descriptor)
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(record).encode("utf-8"), 0)
        return self

    def _not_a_lock(self, kind: str) -> str:
        return (f"{self.path} is {kind}, so it is not a lock flowcore made; flowcore never opens a lock through a "
                f"link or over another kind of file: remove it, then rerun (it guards {self.out})")

    def _refusal(self, holder: dict | None) -> str:
        who = _holder(holder) if holder is not None and "pid" in holder else "it has not recorded itself yet"
        return (f"{self.out} is being written by another flowcore job ({who}); wait for it to finish or stop it, "
                f"then rerun (the lock is {self.path})")

    def release(self) -> None:
        """Remove the lock file and release the lock (no-op when not held)."""
        if self._descriptor is None:
            return
        with contextlib.suppress(OSError):  # the folder may have vanished or become read-only
            self.path.unlink()
        os.close(self._descriptor)  # releases the flock, after the file is gone from the folder
        self._descriptor = None


def took_over(holder: dict) -> str:
    """What a job says of the lock it took over from `holder` (`OutputLock.took_over`), a job killed before."""
    return f"took over the lock of a job that is no longer running ({_holder(holder)})"


def _holder(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def _read_holder(descriptor: int) -> dict | None:
    """The holder record in the lock file (a live job's, or one a killed job left), if any."""
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(os.pread(descriptor, 1 << 16, 0).decode("utf-8"))
        if isinstance(record, dict):
            return record
    return None

"""A watchdog that ends a local Ray session when the process that started it dies, even by SIGKILL: Ray's
dashboard and runtime-env agents outlive a killed driver for a minute or more.

A process in its own session holds the read end of a pipe whose write end only the driver holds
(close-on-exec: nothing Ray starts keeps it). At EOF it waits `SETTLE_S`, then SIGTERMs (after `GRACE_S`,
SIGKILLs) every process holding a file in the session folder open for writing, as each of Ray's does for its
logs; not by command line or environment, which Ray's processes overwrite (`ray::DashboardAgent`) and a
bystander's `tail -f SESSION/logs/…` matches too. Only for a session this process started; Linux only."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["GRACE_S", "SETTLE_S", "session_processes", "watch_session"]

SETTLE_S = 1.0
"""How long the watchdog lets Ray's own cleanup run after the driver died."""
GRACE_S = 5.0
"""How long the session's processes have to exit after SIGTERM before SIGKILL."""

_watchdogs: list[subprocess.Popen] = []
"""The watchdogs this process started (kept: Python warns about a running child it drops)."""
_write_ends: list[int] = []
"""Their pipes' write ends: open until this process dies, never written."""


def watch_session(session_dir: str | None) -> bool:
    """Start a watchdog that ends the Ray session in `session_dir` when this process dies, if this
    process started that session; returns whether it did."""
    if not session_dir or not sys.platform.startswith("linux") or not _started_here(session_dir):
        return False
    read_end, write_end = os.pipe()
    try:
        _watchdogs.append(subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), str(read_end),
                                            session_dir], pass_fds=(read_end,), start_new_session=True,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _write_ends.append(write_end)
    return True


def session_processes(session_dir: str) -> set[int]:
    """The processes (other than this one) that hold a file in `session_dir` open for writing."""
    folders = {os.path.abspath(session_dir), os.path.realpath(session_dir)}
    found = set()
    for pid in _pids():
        with contextlib.suppress(OSError):  # gone, or another user's
            if _writes_in(pid, folders):
                found.add(pid)
    return found


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]


def _writes_in(pid: int, folders: set[str]) -> bool:
    """Whether process `pid` holds a file under one of `folders` open for writing."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if any(target.startswith(folder + "/") for folder in folders):
                flags = re.search(rb"^flags:\s*([0-7]+)", Path(f"/proc/{pid}/fdinfo/{fd}").read_bytes(), re.MULTILINE)
                if flags and int(flags.group(1), 8) & (os.O_WRONLY | os.O_RDWR):
                    return True
    return False


def _started_here(session_dir: str) -> bool:
    """Whether a child of this process names `session_dir` on its command line (Ray's GCS and raylet do)."""
    me = str(os.getpid()).encode()
    named = re.compile(re.escape(os.fsencode(os.path.abspath(session_dir))) + rb"(?![^/\0])")  # it, or a path in it
    for pid in _pids():
        with contextlib.suppress(OSError):  # gone meanwhile
            if Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1] == me and \
                    named.search(Path(f"/proc/{pid}/cmdline").read_bytes()):
                return True
    return False


def _end(session_dir: str) -> None:
    """SIGTERM every process of the session, then SIGKILL those still there after `GRACE_S`."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_processes(session_dir):
            with contextlib.suppress(OSError):  # gone meanwhile
                os.kill(pid, sent)
        deadline = time.monotonic() + GRACE_S
        while session_processes(session_dir) and time.monotonic() < deadline:
            time.sleep(0.1)


def main(argv: list[str]) -> None:
    read_end, session_dir = int(argv[0]), argv[1]
    while os.read(read_end, 1):  # blocks until the driver is gone (EOF); it never writes
        pass
    time.sleep(SETTLE_S)
    _end(session_dir)


if __name__ == "__main__":
    main(sys.argv[1:])

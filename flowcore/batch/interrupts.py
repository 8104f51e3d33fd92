"""Stopping a batch job cleanly on Ctrl-C or `kill`: `StopSignals`, and `JobInterrupted`, what a stopped job
raises. The first SIGINT or SIGTERM sets a flag the job checks at chunk boundaries; a second exits at once
(as safe as kill -9: the progress file records only durable chunks)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

__all__ = ["JobInterrupted", "StopSignals", "interrupts_named"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class JobInterrupted(KeyboardInterrupt):
    """A job stopped by a signal at a chunk boundary. `rows`: the rows done, None when it stopped
    before its job began; `exit_status`: 128 + the signal number."""

    def __init__(self, rows: int | None, signum: int):
        self.rows, self.signum, self.exit_status = rows, signum, 128 + signum
        where = "before the job began" if rows is None else f"at row {rows:,}"
        super().__init__(f"{signal.Signals(signum).name}: stopped {where}; rerun the same command to resume")


@contextlib.contextmanager
def interrupts_named() -> Iterator[None]:
    """A plain KeyboardInterrupt (outside `StopSignals`, e.g. while a model loads) as a `JobInterrupted`."""
    try:
        yield
    except KeyboardInterrupt as error:
        if isinstance(error, JobInterrupted):
            raise
        raise JobInterrupted(None, signal.SIGINT) from None


class StopSignals:
    """While the `with` block runs, SIGINT/SIGTERM request a stop (`requested`) instead of raising; a
    second one exits at once. Only the main thread (where Python runs signal handlers) installs them.

    Args:
        enabled: False makes it a no-op (signals behave as they did).

    Example:
        >>> with StopSignals() as stop:
        ...     for chunk in chunks:
        ...         if stop.requested:
        ...             break
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            os.write(2, f"\n{signal.Signals(signum).name} again: exiting now; "
                     "rerun the same command to resume\n".encode())
            os._exit(128 + signum)
        self.signum = signum
        os.write(2, f"\n{signal.Signals(signum).name}: stopping after the chunk being "
                 "written (again to exit at once)\n".encode())

    def __enter__(self) -> "StopSignals":
        if self.enabled:
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

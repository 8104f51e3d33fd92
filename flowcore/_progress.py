"""How long-running work reports progress on stderr: `progress_wanted` (does a library call draw a bar)
and `ProgressReport` (a long job's bar or plain lines)."""
from __future__ import annotations

import sys
import threading
import time

from flowcore import defaults

__all__ = ["ProgressReport", "progress_wanted"]


def progress_wanted(show_progress_bar: bool | None) -> bool:
    """Whether to show a bar: `show_progress_bar`, or for None whether stderr is a terminal."""
    return sys.stderr.isatty() if show_progress_bar is None else bool(show_progress_bar)


class ProgressReport:
    """A long job's progress on stderr: a bar on a terminal; anywhere else (a file, a pipe, a log collector) a
    plain line every `defaults.PROGRESS_INTERVAL_S` seconds, never a carriage return. Notes (where it resumes, a
    lock it took over) are shown either way; `show_progress_bar=False` (the CLI's `--quiet`) silences all of it.

    Args:
        what: the job's name, first on each line (e.g. "calibrate").
        total: the units (rows) the job has in all.
        done: the units an earlier run already did.
        show_progress_bar: False says nothing at all; True or None report (a bar only on a terminal).
        unit: what is counted ("rows"; "sentences", "steps").

    Example:
        >>> with ProgressReport("calibrate", total=200_000, done=50_176) as report:
        ...     report.note("resuming at row 50,176")
        ...     for rows in chunk_sizes:
        ...         report.advance(rows)
    """

    def __init__(self, what: str, total: int, done: int = 0, show_progress_bar: bool | None = None,
                 unit: str = "rows"):
        self.what, self.total, self.done, self.unit = what, total, done, unit
        self.detail = ""
        self.mode = "off" if show_progress_bar is False else "bar" if sys.stderr.isatty() else "lines"
        self._started = self._last_line = time.monotonic()
        self._done_at_start = done
        self._bar = None
        self._lock = threading.Lock()  # a job may advance from its writer thread

    def __enter__(self) -> ProgressReport:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def note(self, message: str) -> None:
        """One line about the job (not its progress), e.g. where it resumes."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(f"{self.what}: {message}", file=sys.stderr)
        else:
            print(f"{self.what}: {message}", file=sys.stderr, flush=True)

    def advance(self, rows: int, detail: str | None = None) -> None:
        """Count `rows` more units done; `detail` (e.g. "loss 3.2104") is shown beside the count from now on."""
        with self._lock:
            self.done += rows
            if detail is not None:
                self.detail = detail
            if self.mode == "bar":
                self._draw(rows)
            elif self.mode == "lines" and time.monotonic() - self._last_line >= defaults.PROGRESS_INTERVAL_S:
                self._last_line = time.monotonic()
                print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        """The progress as one line: units done of all, the share, units/s in this run, time left, the detail."""
        seconds = time.monotonic() - self._started
        rate = (self.done - self._done_at_start) / seconds if seconds > 0 else 0.0
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        left = f", {_duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        detail = f"; {self.detail}" if self.detail else ""
        unit = self.unit
        return f"{self.what}: {self.done:,} of {self.total:,} {unit}{share}, {rate:,.0f} {unit}/s{left}{detail}"

    def _draw(self, rows: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, initial=self.done - rows, unit=f" {self.unit}", unit_scale=True,
                             dynamic_ncols=True, file=sys.stderr, desc=self.what)
        if self.detail:
            self._bar.set_postfix_str(self.detail, refresh=False)
        self._bar.update(rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _duration(seconds: float) -> str:
    """`seconds` as h:mm:ss (or m:ss under an hour)."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"

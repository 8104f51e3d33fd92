"""When a progress bar shows (`show_progress_bar`, every long library call's option)."""
from __future__ import annotations

import sys

__all__ = ["progress_wanted"]


def progress_wanted(show_progress_bar: bool | None) -> bool:
    """Whether to show a bar: `show_progress_bar`, or for None whether stderr is a terminal."""
    return sys.stderr.isatty() if show_progress_bar is None else bool(show_progress_bar)

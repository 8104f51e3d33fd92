"""The one reader of line-oriented text files (sentence files, STS data, txt/jsonl/csv corpora).

Policy, everywhere: lines end at b"\\n" only (U+2028 and a "\\r" inside a line are text); the
line ending ("\\n", "\\r\\n", or a final "\\r") is removed; a UTF-8 byte-order mark at the start
of the file is dropped; a line that is not valid UTF-8 is never altered or skipped silently.
Streaming readers (`iter_lines`) hand it over as a bad line, which batch jobs put in their rejects
file; whole-file readers (`read_lines`) raise an error naming the file and line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, NamedTuple

__all__ = ["Line", "iter_lines", "read_lines"]

_BOM = b"\xef\xbb\xbf"


class Line(NamedTuple):
    """One line: its 1-based `number`, the byte offset just after it, and its text, or None with
    `bad_byte` (the offset of the first undecodable byte within the line) when it is not UTF-8."""

    number: int
    end: int
    text: str | None
    bad_byte: int | None = None


def iter_lines(path: str | os.PathLike, offset: int = 0, line: int = 0) -> Iterator[Line]:
    """The lines of `path` from byte `offset` on, numbered after `line` lines already read."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        for raw in handle:
            start = offset
            offset += len(raw)
            line += 1
            if start == 0 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                yield Line(line, offset, raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                yield Line(line, offset, None, error.start)


def read_lines(path: str | os.PathLike, error: type[Exception] = ValueError) -> list[str]:
    """Every line of `path`; a missing file or a line that is not UTF-8 raises `error` naming it."""
    path = Path(path)
    if not path.is_file():
        raise error(f"missing file: {path}")
    lines = []
    for entry in iter_lines(path):
        if entry.text is None:
            raise error(f"{path}:{entry.number}: not valid UTF-8 (byte {entry.bad_byte} of the line)")
        lines.append(entry.text)
    return lines

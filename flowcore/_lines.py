"""The one reader of line-oriented text files (sentence files, STS data, txt/jsonl/csv corpora).

Lines end at b"\n" (or b"\r\n"); the ending and a leading UTF-8 byte-order mark are dropped; UTF-16/UTF-32
files, and files whose lines end in a lone b"\r" (classic Mac OS), are refused; a line that is not UTF-8 or
holds a NUL byte or a lone carriage return is handed over unaltered with its `Line.problem` (it is never split
or merged); a line longer than `defaults.LINE_BYTES` is cut as read. Only regular files are read.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple

from flowcore import defaults

__all__ = ["Line", "UnsupportedEncodingError", "check_encoding", "iter_lines", "read_line", "read_lines",
           "require_file"]

_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = (  # UTF-32 first: its little-endian mark starts with UTF-16's
    (b"\xff\xfe\x00\x00", "UTF-32", "little-endian"), (b"\x00\x00\xfe\xff", "UTF-32", "big-endian"),
    (b"\xff\xfe", "UTF-16", "little-endian"), (b"\xfe\xff", "UTF-16", "big-endian"),
)
_SKIP_BYTES = 1 << 16
"""Bytes read at a time past the kept start of a line that is too long."""
_SPECIAL_FILES = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class UnsupportedEncodingError(ValueError):
    """A text file in another encoding than UTF-8 (it starts with a UTF-16 or UTF-32 byte-order mark), or
    whose lines end in a lone carriage return."""


class Line(NamedTuple):
    """One line: its 1-based `number`, the byte offset just after it, and its text; when it is not
    UTF-8, text None, the offset of its first undecodable byte and its `raw` bytes. `nul`: the offset
    of its first NUL byte; `length`: its whole length when it was cut (its text is then its start);
    `cr`: the offset of a carriage return inside it (not part of a b"\r\n" ending)."""

    number: int
    end: int
    text: str | None
    bad_byte: int | None = None
    nul: int | None = None
    raw: bytes | None = None
    length: int | None = None
    cr: int | None = None

    @property
    def too_long(self) -> str | None:
        """Why a cut line cannot be read as a structured record, in words; None for a whole line."""
        if self.length is None:
            return None
        return f"longer than {defaults.LINE_BYTES:,} bytes ({self.length:,} bytes; only the start was read)"

    @property
    def problem(self) -> str | None:
        """Why the line cannot be used as text (not UTF-8, a NUL byte), in words; None for a good line."""
        if self.text is None:
            return f"not valid UTF-8 ({self.where})"
        if self.nul is not None:
            return f"holds a NUL byte ({self.where})"
        if self.cr is not None:
            return f"holds a carriage return (byte {self.cr} of the line), which may end a line: it is not split there"
        return None

    @property
    def where(self) -> str:
        """Where the line's problem is: its first undecodable byte, else its first NUL byte (and a
        hint when every other character is a NUL, as in UTF-16 text without a byte-order mark)."""
        if self.text is None:
            return f"byte {self.bad_byte} of the line"
        evens, odds = (set(self.text[parity::2]) == {"\0"} for parity in (0, 1))
        hint = "; UTF-16 text? flowcore reads UTF-8" if len(self.text) >= 4 and evens != odds else ""
        return f"byte {self.nul} of the line{hint}"


def require_file(path: str | os.PathLike, error: type[Exception] | None = None) -> None:
    """An error saying what `path` is unless a regular file (or a link to one): FileNotFoundError, IsADirectoryError,
    ValueError (a pipe, socket or device) or OSError (unreadable); `error`: raise this type instead."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise (error or FileNotFoundError)(f"input not found: {path}") from None
    except OSError as problem:
        if problem.errno == errno.ELOOP:
            raise (error or OSError)(f"{path} is a symbolic link loop, not a file") from None
        raise (error or OSError)(f"{path}: cannot be read ({problem.strerror})") from None
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise (error or IsADirectoryError)(f"{path} is a folder, not a file; give the file to read")
    kind = next((name for check, name in _SPECIAL_FILES if check(mode)), "not a regular file")
    raise (error or ValueError)(f"{path} is {kind}, not a regular file: inputs are read more than once (to count "
                                "rows, to resume); save it to a file first")


def check_encoding(path: str | os.PathLike) -> None:
    """`UnsupportedEncodingError` naming `path` and the problem when it starts with a UTF-16 or UTF-32
    byte-order mark (flowcore reads UTF-8, with or without its byte-order mark), or when its first line
    ends in a lone carriage return (classic Mac OS line ends, which flowcore does not split on)."""
    with open(path, "rb") as handle:
        start = handle.read(_SKIP_BYTES)
    for mark, encoding, order in _OTHER_BOMS:
        if start.startswith(mark):
            raise UnsupportedEncodingError(
                f"{path}: starts with a {encoding} ({order}) byte-order mark: this is {encoding} text, and flowcore "
                f"reads UTF-8; convert it first (e.g. iconv -f {encoding} -t UTF-8)")
    first = start.split(b"\n", 1)[0].removesuffix(b"\r")
    if b"\r" in first:
        raise UnsupportedEncodingError(
            f"{path}: line 1 ends in a lone carriage return (\\r, classic Mac OS line ends); flowcore reads lines "
            "ending in \\n or \\r\\n and never merges or splits them otherwise: convert it first (e.g. tr '\\r' "
            "'\\n')")


def read_line(handle: BinaryIO, limit: int) -> tuple[bytes, int]:
    """The next line of `handle` (with its ending) and its length in bytes; a longer line than `limit` as its
    start, cut at a character boundary, the rest read past in bounded blocks. (b"", 0) at the end of the file."""
    raw = handle.readline(limit)
    if len(raw) < limit or raw.endswith(b"\n"):
        return raw, len(raw)
    length = len(raw)
    while True:
        rest = handle.readline(_SKIP_BYTES)
        length += len(rest)
        if not rest or rest.endswith(b"\n"):
            return _whole_characters(raw), length


def _whole_characters(raw: bytes) -> bytes:
    """`raw` without a UTF-8 character cut short at its end."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back for the lead byte
            continue
        needed = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if byte >= 0xF0 else 1
        return raw[:-back] if needed > back else raw
    return raw


def iter_lines(path: str | os.PathLike, offset: int = 0, line: int = 0) -> Iterator[Line]:
    """The lines of `path` from byte `offset` on, numbered after `line` lines already read; a file
    in UTF-16 or UTF-32 raises `UnsupportedEncodingError` (`check_encoding`) before any line."""
    check_encoding(path)
    limit = defaults.LINE_BYTES + 2  # a line of LINE_BYTES and its "\r\n" is whole
    with open(path, "rb") as handle:
        handle.seek(offset)
        while True:
            raw, whole = read_line(handle, limit)
            if not whole:
                return
            length = whole if whole > len(raw) else None  # cut: its whole length
            if offset == 0:
                raw = raw.removeprefix(_BOM)
            offset += whole
            line += 1
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            nul = raw.index(b"\0") if b"\0" in raw else None
            cr = raw.index(b"\r") if b"\r" in raw else None
            try:
                yield Line(line, offset, raw.decode("utf-8"), None, nul, None, length, cr)
            except UnicodeDecodeError as error:
                yield Line(line, offset, None, error.start, nul, raw, length, cr)


def read_lines(path: str | os.PathLike, error: type[Exception] = ValueError) -> list[str]:
    """Every line of `path`; a missing file, or a line that is not UTF-8 or holds a NUL byte, raises
    `error` naming it."""
    path = Path(path)
    if not path.exists():
        raise error(f"missing file: {path}")
    require_file(path, error)
    lines = []
    try:
        for entry in iter_lines(path):
            if entry.problem is not None:
                raise error(f"{path}:{entry.number}: {entry.problem}")
            lines.append(entry.text)
    except UnsupportedEncodingError as problem:  # raised before the first line
        raise error(str(problem)) from None
    return lines

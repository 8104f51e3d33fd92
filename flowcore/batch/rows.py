"""Row types, reject reasons and the rules that give them, and the helpers every source needs.
Row `i` of a source is row `i` of the output: a row that cannot be used becomes a `Reject`, never dropped.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from flowcore._lines import require_file

__all__ = [
    "BEYOND_FLOAT32", "BROKEN_CSV", "BROKEN_JSON", "CARRIAGE_RETURN", "CalibratedChunk", "Chunk", "DUPLICATE_KEY",
    "EMPTY_LINE", "EMPTY_TEXT", "INVALID_ID", "INVALID_UTF8", "LINE_TOO_LONG", "MISSING_ID", "MISSING_TEXT",
    "MISSING_VECTOR", "NON_FINITE", "NON_FINITE_OUTPUT", "NOT_A_VECTOR", "NOT_NUMBERS", "NULL", "NUL_CHARACTER",
    "PARQUET_BATCH_ROWS", "Position", "Reject", "TextRow", "WRONG_WIDTH", "ZERO_VECTOR", "check_keep_columns",
    "count_reasons", "detect_format", "file_changed", "file_identity", "id_reject", "line_reject", "not_unicode",
    "one_line", "open_parquet", "parquet_batches", "parquet_schema", "reject_non_finite", "require_columns",
    "require_file", "text_reject", "to_float32", "vector_rejects",
]

# Reject reasons (the `reason` field of a rejects file line).
EMPTY_LINE = "empty line"
EMPTY_TEXT = "empty text"
INVALID_UTF8 = "invalid UTF-8"
NUL_CHARACTER = "NUL character"
LINE_TOO_LONG = "line too long"
BROKEN_JSON = "broken JSON"
BROKEN_CSV = "broken CSV"
CARRIAGE_RETURN = "carriage return"
DUPLICATE_KEY = "duplicate key"
MISSING_TEXT = "missing text field"
MISSING_ID = "missing id field"
INVALID_ID = "invalid id"
MISSING_VECTOR = "missing vector"
NON_FINITE = "NaN/Inf"
NON_FINITE_OUTPUT = "non-finite output"
NOT_A_VECTOR = "not a vector"
WRONG_WIDTH = "wrong width"
ZERO_VECTOR = "zero vector"
BEYOND_FLOAT32 = "beyond float32"

NULL, NOT_NUMBERS = -1, -2
"""The lengths `vector_rejects` reads as a null vector and as a value that is not a list of numbers."""

PARQUET_BATCH_ROWS = 8192
"""Rows per parquet record batch read (sources re-cut batches into chunks)."""


@dataclass(frozen=True)
class Reject:
    """One unusable input row: its 0-based row, 1-based file line (line formats), id when one could be read,
    and the file it is in when the input is several files."""

    row: int
    reason: str
    detail: str = ""
    line: int | None = None
    id: str | None = None
    file: str | None = None

    def to_json(self) -> dict:
        record = {"row": self.row, "id": self.id, "line": self.line, "reason": self.reason,
                  "detail": self.detail or None, "file": self.file}
        return {key: value for key, value in record.items() if value is not None}


@dataclass(frozen=True)
class Position:
    """Where reading stands: rows done, byte offset and lines consumed (line-oriented files)."""

    row: int = 0
    offset: int = 0
    line: int = 0


class TextRow(NamedTuple):
    """One parsed text row: `text` is None exactly when `reject` is set; `meta`: the kept columns' values, or None."""

    row: int
    line: int | None
    id: str | None
    text: str | None
    reject: Reject | None
    meta: tuple | None = None


@dataclass
class Chunk:
    """Rows [row_start, row_start + rows) of a source and the position after them: `texts` (None when rejected) or
    float32 `vectors` (NaN when rejected); `meta` maps each kept column to its values (a list or a pyarrow array)."""

    index: int
    row_start: int
    rows: int
    end: Position
    rejects: list[Reject] = field(default_factory=list)
    ids: list[str | None] | None = None
    texts: list[str | None] | None = None
    vectors: np.ndarray | None = None
    meta: dict | None = None


@dataclass
class CalibratedChunk:
    """Rows [row_start, row_start + len(vectors)) calibrated; rejected rows are NaN; `meta` as in `Chunk`."""

    index: int
    row_start: int
    vectors: np.ndarray
    ids: list[str | None] | None
    rejects: list[Reject]
    end: Position
    meta: dict | None = None


def count_reasons(rejects: Iterable[Reject]) -> dict[str, int]:
    """How many of `rejects` have each reason."""
    return dict(Counter(reject.reason for reject in rejects))


def detect_format(path: str | os.PathLike, formats: dict[str, str]) -> str:
    """The format `formats` maps `path`'s suffix to; a ValueError listing the known suffixes otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in formats:
        raise ValueError(f"{path}: unsupported file type {suffix or '(none)'!r}; "
                         f"expected one of {', '.join(sorted(formats))}")
    return formats[suffix]


def check_keep_columns(path: Path, keep_columns, available: list[str] | None) -> tuple[str, ...]:
    """`keep_columns` (input columns passed through to the output) as a tuple of distinct names,
    each among `available` unless that is None (jsonl, where a missing key is a null)."""
    if isinstance(keep_columns, str):
        raise TypeError("keep_columns is a list of column names, not one string")
    keep = tuple(keep_columns or ())
    for name in keep:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{path}: a kept column needs a non-empty name, got {name!r}")
    repeated = sorted({name for name in keep if keep.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}: column {repeated[0]!r} is kept twice")
    ambiguous = [name for name in keep if available is not None and available.count(name) > 1]
    if ambiguous:
        raise ValueError(f"{path}: {available.count(ambiguous[0])} columns are named {ambiguous[0]!r}; rename them so "
                         "that the one to keep is named once")
    missing = [name for name in keep if available is not None and name not in available]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} to keep (columns: {', '.join(available) or 'none'})")
    return keep


FINGERPRINT_BYTES = 1 << 16
"""Bytes hashed at each end of an input for its `file_identity` fingerprint."""


def file_identity(path: str | os.PathLike) -> dict:
    """What identifies an input file's content cheaply: absolute path, size, mtime, and a SHA-256 of
    its first and last `FINGERPRINT_BYTES` (a copy with the same size and times still differs)."""
    stat = os.stat(path)
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        sha.update(handle.read(FINGERPRINT_BYTES))
        handle.seek(max(FINGERPRINT_BYTES, stat.st_size - FINGERPRINT_BYTES))  # a small file: at its end, adds nothing
        sha.update(handle.read(FINGERPRINT_BYTES))
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "fingerprint": sha.hexdigest()}


def file_changed(identity: dict) -> str | None:
    """How the file of `identity` (a `file_identity`) changed since, by size or mtime; None if it did not."""
    try:
        stat = os.stat(identity["path"])
    except OSError as error:
        return f"it can no longer be read ({error.strerror})"
    if stat.st_size != identity["size"]:
        return f"its size went from {identity['size']:,} to {stat.st_size:,} bytes"
    if stat.st_mtime_ns != identity["mtime_ns"]:
        return "it was modified (its mtime changed)"
    return None


def open_parquet(path: Path):
    """`pyarrow.parquet.ParquetFile(path)`, or a ValueError naming the file when it cannot be read as one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable parquet file ({one_line(error)})") from None


def one_line(error: BaseException) -> str:
    """An error's message on one line, for refusals that name a file."""
    return " ".join(str(error).split())


def require_columns(path: Path, columns: list[str], where: str = "", **wanted: str | None) -> None:
    """Refuse a missing column: `wanted` maps each role (text, id, vector) to its column, None when not read."""
    for role, name in wanted.items():
        if name is not None and name not in columns:
            raise ValueError(f"{path}: no {role} column {name!r}{where} (columns: {', '.join(columns) or 'none'})")


def parquet_schema(path: Path, **wanted: str | None):
    """The arrow schema of the parquet file `path`, with its `wanted` columns (`require_columns`)
    present and its id column (`wanted["id"]`) of a type that holds ids: strings, numbers or UTF-8 binary."""
    import pyarrow as pa

    schema = open_parquet(path).schema_arrow
    require_columns(path, schema.names, **wanted)
    for name in schema.names:
        if schema.names.count(name) > 1 and name in wanted.values():
            raise ValueError(f"{path}: {schema.names.count(name)} columns are named {name!r}; rename them so that "
                             "the one to read is named once")
    if wanted.get("id") is not None:
        kind = schema.field(wanted["id"]).type
        value_kind = kind.value_type if pa.types.is_dictionary(kind) else kind  # dictionary-encoded ids: their values
        if not any(check(value_kind) for check in (
                pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_floating,
                pa.types.is_binary, pa.types.is_large_binary, pa.types.is_null,
                getattr(pa.types, "is_string_view", lambda _: False))):
            raise ValueError(f"{path}: id column {wanted['id']!r} holds {kind}; ids are strings or numbers")
    return schema


def parquet_batches(path: Path, columns: list[str | None], start_row: int) -> Iterator:
    """Record batches of `columns` (each read once; None skipped) from row `start_row` on, skipping whole row groups
    first; data that cannot be decoded raises a ValueError naming the file and the row it starts at."""
    import pyarrow as pa

    columns = list(dict.fromkeys(name for name in columns if name is not None))
    parquet = open_parquet(path)
    group, skip = 0, start_row
    while group < parquet.num_row_groups and skip >= parquet.metadata.row_group(group).num_rows:
        skip -= parquet.metadata.row_group(group).num_rows
        group += 1
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns,
                                   row_groups=range(group, parquet.num_row_groups))
    row = start_row - skip
    try:
        for batch in batches:
            row += batch.num_rows
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            if skip:
                batch, skip = batch.slice(skip), 0
            yield batch
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ValueError(f"{path}: unreadable parquet data from row {row:,} on ({one_line(error)}); "
                         "the rows before it are done") from None


def reject_non_finite(vectors: np.ndarray, row_start: int, candidates: np.ndarray,
                      detail: str | None = None, reason: str = NON_FINITE) -> list[Reject]:
    """Reject the `candidates` rows of `vectors` holding NaN/Inf: each becomes all-NaN and is cleared
    in `candidates` (in place). `detail`: where they came from (default: the row's NaN and Inf counts)."""
    bad = candidates & ~np.isfinite(vectors).all(axis=1)
    rows = vectors[bad]  # one copy of the bad rows, usually none
    nans, infs = np.isnan(rows).sum(axis=1), np.isinf(rows).sum(axis=1)
    rejects = [Reject(row_start + int(offset), reason, detail or f"{nan} NaN, {inf} Inf of {vectors.shape[1]} values")
               for offset, nan, inf in zip(np.flatnonzero(bad), nans, infs)]
    vectors[bad] = np.nan
    candidates &= ~bad
    return rejects


def not_unicode(value) -> bool:
    """Whether a string holds a lone surrogate (JSON "\\ud800"), which no UTF-8 writer accepts."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")  # C speed, where a regex search would read every character in Python's engine
    except UnicodeEncodeError:
        return True
    return False


def text_reject(row: int, line: int | None, text, field: str) -> Reject | None:
    """The one text rule: a reject for None, a non-string, blank text, a lone surrogate or a NUL; else None."""
    if text is None:
        return Reject(row, MISSING_TEXT, f"no {field!r} value", line)
    if not isinstance(text, str):
        return Reject(row, MISSING_TEXT, f"{field!r} is a {type(text).__name__}, not text", line)
    if not text.strip():
        return Reject(row, EMPTY_TEXT, line=line)
    if not_unicode(text):
        return Reject(row, INVALID_UTF8, f"{field!r} holds a lone surrogate (a \\u escape)", line)
    nul = text.find("\0")
    if nul >= 0:
        return Reject(row, NUL_CHARACTER, f"{field!r} holds a NUL character (U+0000) at character {nul}", line)
    return None


def line_reject(row: int, line, structured: bool) -> Reject | None:
    """The reject of a `flowcore._lines.Line` that is not UTF-8, holds a NUL byte or a carriage return, or (`structured`
    formats, whose record a cut breaks) is too long; None for a good line."""
    if line.text is None:
        return Reject(row, INVALID_UTF8, line.where, line.number)
    if line.nul is not None:
        return Reject(row, NUL_CHARACTER, line.where, line.number)
    if line.cr is not None:
        return Reject(row, CARRIAGE_RETURN, line.problem, line.number)
    if structured and line.too_long is not None:
        return Reject(row, LINE_TOO_LONG, line.too_long, line.number)
    return None


def id_reject(row: int, line: int | None, value, field: str) -> tuple[str | None, Reject | None]:
    """The one rule for an id value: (the id as written out, None) or (None, the reject). A string
    is the id, UTF-8 bytes their text, any other JSON value its compact JSON text (`7`, `true`,
    `{"k":1}`); refused: None, text that is not Unicode, NaN/Inf anywhere, a value JSON cannot hold."""
    if value is None:
        return None, Reject(row, MISSING_ID, f"no {field!r} value", line)
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as error:
            return None, Reject(row, INVALID_UTF8, f"{field!r} is not valid UTF-8 (byte {error.start})", line)
    if isinstance(value, float) and not math.isfinite(value):
        return None, Reject(row, INVALID_ID, f"{field!r} is {value!r}, not a finite number", line)
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as error:  # NaN/Inf inside an object or array, a value JSON cannot hold
            return None, Reject(row, INVALID_ID, f"{field!r} has no JSON text ({error})", line)
    if not_unicode(value):
        return None, Reject(row, INVALID_UTF8, f"{field!r} holds a lone surrogate (a \\u escape)", line)
    return value, None


def to_float32(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a float32 copy of the 2-D numeric `values`, a mask of the rows where a finite value lies beyond float32's
    range and so became Inf): the one conversion of stored vectors, so that such rows are named for what they are."""
    values = np.asarray(values)
    with np.errstate(over="ignore"):
        converted = np.array(values, dtype=np.float32)
    beyond = np.zeros(len(converted), dtype=bool)
    if values.dtype.kind == "f" and values.dtype.itemsize > 4:  # only wider floats exceed float32's range
        infinite = np.flatnonzero(np.isinf(converted).any(axis=1))
        beyond[infinite] = np.isfinite(values[infinite]).all(axis=1)
    return converted, beyond


def vector_rejects(vectors: np.ndarray, lengths: np.ndarray, row_start: int,
                   beyond: np.ndarray | None = None) -> list[Reject]:
    """The one rule for stored vectors: row i of `vectors` (n, dim) was given `lengths[i]` values
    (`NULL`, `NOT_NUMBERS`); a row of another length, holding NaN/Inf or (`beyond`, from `to_float32`) a finite
    value beyond float32's range is rejected and becomes all-NaN. Returned in row order."""
    dim = vectors.shape[1]
    fits = lengths == dim
    rejects = []
    for offset in np.flatnonzero(~fits):
        vectors[offset] = np.nan
        length = int(lengths[offset])
        row = row_start + int(offset)
        if length == NULL:
            rejects.append(Reject(row, MISSING_VECTOR))
        elif length == NOT_NUMBERS:
            rejects.append(Reject(row, NOT_A_VECTOR, "not a list of numbers"))
        else:
            rejects.append(Reject(row, WRONG_WIDTH, f"{length} values, expected {dim}"))
    if beyond is not None:
        for offset in np.flatnonzero(beyond & fits):
            vectors[offset] = np.nan
            rejects.append(Reject(row_start + int(offset), BEYOND_FLOAT32,
                                  "a finite value beyond float32's range (about ±3.4e38)"))
        fits = fits & ~beyond
    rejects += reject_non_finite(vectors, row_start, fits)
    return sorted(rejects, key=lambda reject: reject.row)

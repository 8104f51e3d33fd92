"""Chunked, resumable readers for text corpora (txt, jsonl, csv, parquet) and stored embeddings
(.npy, memory-mapped; .parquet vector column).

Every input row keeps its place: row `i` of a source is row `i` of the calibrated output. A row
that cannot be used becomes a `Reject` (row, line, reason, detail) instead of being dropped, so
batch jobs can write it to a rejects file and leave a NaN row in the output.

Readers stream: text files are read line by line from a byte offset, parquet by record batch,
.npy through a read-only memory map whose pages are released once copied, so memory stays flat
however large the input is. A `Position` (row, byte offset, line) marks where a chunk ends, which
is all a resumed job needs to continue.
"""
from __future__ import annotations

import csv
import json
import mmap
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import numpy as np

TEXT_FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                ".parquet": "parquet", ".pq": "parquet"}
EMBEDDING_FORMATS = {".npy": "npy", ".parquet": "parquet", ".pq": "parquet"}

# Reject reasons (the `reason` field of a rejects file line).
EMPTY_LINE = "empty line"
EMPTY_TEXT = "empty text"
INVALID_UTF8 = "invalid UTF-8"
BROKEN_JSON = "broken JSON"
BROKEN_CSV = "broken CSV"
MISSING_TEXT = "missing text field"
MISSING_ID = "missing id field"
MISSING_VECTOR = "missing vector"
NON_FINITE = "NaN/Inf"
WRONG_WIDTH = "wrong width"

_PARQUET_BATCH_ROWS = 8192


@dataclass(frozen=True)
class Reject:
    """One unusable input row: `row` is its 0-based output row, `line` its 1-based file line
    (line-oriented formats only)."""

    row: int
    reason: str
    detail: str = ""
    line: int | None = None

    def to_json(self) -> dict:
        record = {"row": self.row}
        if self.line is not None:
            record["line"] = self.line
        record["reason"] = self.reason
        if self.detail:
            record["detail"] = self.detail
        return record


@dataclass(frozen=True)
class Position:
    """Where reading stands: rows done, byte offset and lines consumed (line-oriented files)."""

    row: int = 0
    offset: int = 0
    line: int = 0


class TextRow(NamedTuple):
    """One parsed text row: `text` is None exactly when `reject` is set."""

    row: int
    line: int | None
    id: str | None
    text: str | None
    reject: Reject | None


@dataclass
class Chunk:
    """Consecutive rows [row_start, row_start + rows) of a source, and the position after them.

    Text sources fill `texts` (None at rejected rows); embedding sources fill `vectors`
    (float32, NaN rows at rejected rows)."""

    index: int
    row_start: int
    rows: int
    end: Position
    rejects: list[Reject] = field(default_factory=list)
    ids: list[str | None] | None = None
    texts: list[str | None] | None = None
    vectors: np.ndarray | None = None


def detect_format(path: str | os.PathLike, formats: dict[str, str]) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in formats:
        raise ValueError(f"{path}: unsupported file type {suffix or '(none)'!r}; "
                         f"expected one of {', '.join(sorted(formats))}")
    return formats[suffix]


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"input not found: {path}")


def file_pin(path: str | os.PathLike) -> dict:
    """What identifies an input file's content cheaply: absolute path, size, mtime."""
    stat = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


# --------------------------------------------------------------------------------------------
# Text corpora
# --------------------------------------------------------------------------------------------


class TextCorpus:
    """A text corpus in txt (one sentence per line), jsonl, csv (with header) or parquet.

    `text_field` / `id_field` name the JSON key or column holding the sentence / its id (txt has
    no fields; its id is the row number). Structural problems (missing column, unknown format)
    raise ValueError on construction; row problems become `Reject`s while reading."""

    kind = "text"

    def __init__(self, path: str | os.PathLike, text_field: str = "text", id_field: str | None = None):
        self.path = Path(path)
        _require_file(self.path)
        self.format = detect_format(self.path, TEXT_FORMATS)
        self.text_field = text_field
        self.id_field = id_field
        if self.format == "txt" and id_field is not None:
            raise ValueError(f"{self.path}: a .txt corpus has no fields; --id-field needs jsonl, csv or parquet")
        if self.format == "csv":
            self._csv_header_end, self._csv_columns = self._read_csv_header()
        if self.format == "parquet":
            self._check_parquet_columns()
        self._rows: int | None = None

    # -- structure -----------------------------------------------------------------------------

    def _read_csv_header(self) -> tuple[int, dict[str, int]]:
        with open(self.path, "rb") as handle:
            raw = handle.readline()
        try:
            header = next(csv.reader([raw.decode("utf-8-sig")]), [])
        except (UnicodeDecodeError, csv.Error) as error:
            raise ValueError(f"{self.path}: line 1: unreadable CSV header ({error})") from None
        columns = {name.strip(): index for index, name in enumerate(header)}
        for role, name in (("text", self.text_field), ("id", self.id_field)):
            if name is not None and name not in columns:
                raise ValueError(f"{self.path}: no {role} column {name!r} in the CSV header "
                                 f"(columns: {', '.join(columns) or 'none'})")
        return len(raw), columns

    def _check_parquet_columns(self) -> None:
        import pyarrow.parquet as pq

        schema = pq.ParquetFile(self.path).schema_arrow
        for role, name in (("text", self.text_field), ("id", self.id_field)):
            if name is not None and name not in schema.names:
                raise ValueError(f"{self.path}: no {role} column {name!r} "
                                 f"(columns: {', '.join(schema.names)})")

    @property
    def rows(self) -> int:
        """Number of rows (good and rejected); counted once with a cheap pass over the file."""
        if self._rows is None:
            self._rows = self._count_rows()
        return self._rows

    def _count_rows(self) -> int:
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).metadata.num_rows
        if self.format == "csv":
            return sum(1 for _ in self._csv_rows(Position()))
        newlines, last = 0, b"\n"
        with open(self.path, "rb") as handle:
            while block := handle.read(1 << 23):
                newlines += block.count(b"\n")
                last = block[-1:]
        return newlines + (last != b"\n")

    def pin(self) -> dict:
        return {**file_pin(self.path), "format": self.format, "text_field": self.text_field,
                "id_field": self.id_field}

    # -- reading -------------------------------------------------------------------------------

    def entries(self, start: Position = Position()) -> Iterator[tuple[TextRow, Position]]:
        """Every row from `start` on, each with the position just after it."""
        if self.format == "txt":
            return self._line_rows(start, self._parse_txt)
        if self.format == "jsonl":
            return self._line_rows(start, self._parse_jsonl)
        if self.format == "csv":
            return self._csv_rows(start)
        return self._parquet_rows(start)

    def chunks(self, chunk_rows: int, start: Position = Position()) -> Iterator[Chunk]:
        """Chunks of `chunk_rows` rows (the last may be shorter), starting at `start`, which
        must be a chunk boundary."""
        texts, ids, rejects = [], [], []
        row_start, index, end = start.row, start.row // chunk_rows, start
        for entry, end in self.entries(start):
            texts.append(entry.text)
            ids.append(entry.id)
            if entry.reject is not None:
                rejects.append(entry.reject)
            if len(texts) == chunk_rows:
                yield Chunk(index, row_start, len(texts), end, rejects, ids, texts)
                texts, ids, rejects = [], [], []
                row_start, index = end.row, index + 1
        if texts:
            yield Chunk(index, row_start, len(texts), end, rejects, ids, texts)

    def _line_rows(self, start: Position, parse) -> Iterator[tuple[TextRow, Position]]:
        row, offset, line = start.row, start.offset, start.line
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            for raw in handle:
                offset += len(raw)
                line += 1
                try:
                    content = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    entry = _rejected(row, line, INVALID_UTF8, f"byte {error.start} of the line")
                else:
                    entry = parse(row, line, content.rstrip("\r\n"))
                row += 1
                yield entry, Position(row, offset, line)

    def _parse_txt(self, row: int, line: int, content: str) -> TextRow:
        if not content.strip():
            return _rejected(row, line, EMPTY_LINE)
        return TextRow(row, line, None, content, None)

    def _parse_jsonl(self, row: int, line: int, content: str) -> TextRow:
        if not content.strip():
            return _rejected(row, line, EMPTY_LINE)
        try:
            record = json.loads(content)
        except json.JSONDecodeError as error:
            return _rejected(row, line, BROKEN_JSON, str(error))
        if not isinstance(record, dict):
            return _rejected(row, line, BROKEN_JSON, f"expected a JSON object, got {type(record).__name__}")
        return self._from_fields(row, line, record.get(self.text_field, _ABSENT),
                                 record.get(self.id_field, _ABSENT) if self.id_field else None)

    def _from_fields(self, row: int, line: int | None, text, record_id) -> TextRow:
        if text is _ABSENT or text is None:
            return _rejected(row, line, MISSING_TEXT, f"no {self.text_field!r} value")
        if not isinstance(text, str):
            return _rejected(row, line, MISSING_TEXT, f"{self.text_field!r} is a {type(text).__name__}, not text")
        if not text.strip():
            return _rejected(row, line, EMPTY_TEXT)
        if self.id_field is not None:
            if record_id is _ABSENT or record_id is None:
                return _rejected(row, line, MISSING_ID, f"no {self.id_field!r} value")
            record_id = str(record_id)
        return TextRow(row, line, record_id, text, None)

    def _csv_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        if start.row == 0:
            start = Position(0, self._csv_header_end, 1)
        state = {"offset": start.offset, "line": start.line, "bad": {}}
        text_index = self._csv_columns[self.text_field]
        id_index = self._csv_columns[self.id_field] if self.id_field else None

        def decoded_lines(handle) -> Iterator[str]:
            for raw in handle:
                state["offset"] += len(raw)
                state["line"] += 1
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    state["bad"][state["line"]] = error.start
                    yield raw.decode("utf-8", errors="replace")

        row = start.row
        with open(self.path, "rb") as handle:
            handle.seek(start.offset)
            reader = csv.reader(decoded_lines(handle))
            while True:
                first_line = state["line"] + 1
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except csv.Error as error:
                    entry = _rejected(row, first_line, BROKEN_CSV, str(error))
                else:
                    bad = [line for line in state["bad"] if first_line <= line <= state["line"]]
                    if bad:
                        entry = _rejected(row, first_line, INVALID_UTF8, f"byte {state['bad'][bad[0]]} of line {bad[0]}")
                    elif not fields or not any(value.strip() for value in fields):
                        entry = _rejected(row, first_line, EMPTY_LINE)
                    else:
                        text = fields[text_index] if text_index < len(fields) else _ABSENT
                        record_id = _ABSENT if id_index is None or id_index >= len(fields) else fields[id_index]
                        entry = self._from_fields(row, first_line, text, record_id if id_index is not None else None)
                state["bad"].clear()
                row += 1
                yield entry, Position(row, state["offset"], state["line"])

    def _parquet_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        columns = [self.text_field] + ([self.id_field] if self.id_field else [])
        row = start.row
        for batch in _parquet_batches(self.path, columns, start.row):
            texts = batch.column(self.text_field).to_pylist()
            ids = batch.column(self.id_field).to_pylist() if self.id_field else [None] * len(texts)
            for text, record_id in zip(texts, ids):
                if isinstance(text, bytes):
                    try:
                        text = text.decode("utf-8")
                    except UnicodeDecodeError as error:
                        entry = _rejected(row, None, INVALID_UTF8, f"byte {error.start} of the value")
                        row += 1
                        yield entry, Position(row)
                        continue
                entry = self._from_fields(row, None, text, record_id if self.id_field else None)
                row += 1
                yield entry, Position(row)


_ABSENT = object()


def _rejected(row: int, line: int | None, reason: str, detail: str = "") -> TextRow:
    return TextRow(row, line, None, None, Reject(row, reason, detail, line))


def _parquet_batches(path: Path, columns: list[str], start_row: int, batch_rows: int = _PARQUET_BATCH_ROWS):
    """Record batches of `columns` from row `start_row` on, skipping whole row groups first."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    group, skip = 0, start_row
    while group < parquet.num_row_groups and skip >= parquet.metadata.row_group(group).num_rows:
        skip -= parquet.metadata.row_group(group).num_rows
        group += 1
    if group == parquet.num_row_groups:
        return
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns,
                                      row_groups=range(group, parquet.num_row_groups)):
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        if skip:
            batch, skip = batch.slice(skip), 0
        yield batch


def read_texts(path: str | os.PathLike, text_field: str = "text", id_field: str | None = None,
               rejects: list[Reject] | None = None) -> Iterator[tuple[int, str | None, str]]:
    """Stream the good rows of a corpus as (row number, id, text); rejected rows are appended
    to `rejects` when a list is given (never silently lost: the caller can count them)."""
    for entry, _ in TextCorpus(path, text_field, id_field).entries():
        if entry.reject is None:
            yield entry.row, entry.id, entry.text
        elif rejects is not None:
            rejects.append(entry.reject)


def sample_texts(path: str | os.PathLike, max_rows: int | None, seed: int = 0, text_field: str = "text",
                 rejects: list[Reject] | None = None) -> list[str]:
    """A reproducible uniform random sample of at most `max_rows` good texts (all of them when
    `max_rows` is None), in file order.

    One pass with reservoir sampling (memory: `max_rows` texts); the same file, `max_rows` and
    `seed` always give the same sample. Rejected rows go to `rejects` as in `read_texts`."""
    if max_rows is None:
        return [text for _, _, text in read_texts(path, text_field, rejects=rejects)]
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    for seen, (row, _, text) in enumerate(read_texts(path, text_field, rejects=rejects)):
        if seen < max_rows:
            reservoir.append((row, text))
        else:
            slot = rng.randrange(seen + 1)
            if slot < max_rows:
                reservoir[slot] = (row, text)
    return [text for _, text in sorted(reservoir)]


# --------------------------------------------------------------------------------------------
# Stored embeddings
# --------------------------------------------------------------------------------------------


class EmbeddingFile:
    """Precomputed embeddings: a 2-D .npy (read through a memory map) or a parquet file with a
    list-of-floats column `vector_field` (and optionally `id_field`).

    Rows with NaN/Inf, a null vector, or (parquet) a length other than the file's width are
    rejected; chunks hold them as NaN rows."""

    kind = "embeddings"

    def __init__(self, path: str | os.PathLike, vector_field: str = "embedding", id_field: str | None = None):
        self.path = Path(path)
        _require_file(self.path)
        self.format = detect_format(self.path, EMBEDDING_FORMATS)
        self.vector_field = vector_field
        self.id_field = id_field
        if self.format == "npy":
            if id_field is not None:
                raise ValueError(f"{self.path}: a .npy file has no id column; ids are row numbers")
            self._header_bytes, self._dtype, (self.rows, self.dim) = _npy_layout(self.path)
        else:
            self.rows, self.dim = self._parquet_layout()

    def _parquet_layout(self) -> tuple[int, int]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(self.path)
        schema = parquet.schema_arrow
        for role, name in (("vector", self.vector_field), ("id", self.id_field)):
            if name is not None and name not in schema.names:
                raise ValueError(f"{self.path}: no {role} column {name!r} (columns: {', '.join(schema.names)})")
        column_type = schema.field(self.vector_field).type
        if pa.types.is_fixed_size_list(column_type):
            return parquet.metadata.num_rows, column_type.list_size
        if not (pa.types.is_list(column_type) or pa.types.is_large_list(column_type)):
            raise ValueError(f"{self.path}: column {self.vector_field!r} holds {column_type}, not vectors")
        # Variable-length lists: the width is the most common length among the first rows.
        for batch in parquet.iter_batches(batch_size=1024, columns=[self.vector_field]):
            lengths = batch.column(0).value_lengths().drop_null().to_numpy()
            if len(lengths):
                values, counts = np.unique(lengths, return_counts=True)
                return parquet.metadata.num_rows, int(values[np.argmax(counts)])
        raise ValueError(f"{self.path}: column {self.vector_field!r} has no vectors")

    def pin(self) -> dict:
        return {**file_pin(self.path), "format": self.format, "vector_field": self.vector_field,
                "id_field": self.id_field}

    def chunks(self, chunk_rows: int, start: Position = Position()) -> Iterator[Chunk]:
        if self.format == "npy":
            return self._npy_chunks(chunk_rows, start.row)
        return self._parquet_chunks(chunk_rows, start.row)

    def _npy_chunks(self, chunk_rows: int, start_row: int) -> Iterator[Chunk]:
        if self.rows == 0:
            return
        row_bytes = self.dim * self._dtype.itemsize
        with open(self.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            matrix = np.ndarray((self.rows, self.dim), self._dtype, mapped, self._header_bytes)
            try:
                for row_start in range(start_row, self.rows, chunk_rows):
                    row_end = min(row_start + chunk_rows, self.rows)
                    vectors = np.array(matrix[row_start:row_end], dtype=np.float32)
                    _release(mapped, self._header_bytes + row_start * row_bytes, (row_end - row_start) * row_bytes)
                    rejects = _reject_non_finite(vectors, row_start, np.ones(len(vectors), dtype=bool))
                    yield Chunk(row_start // chunk_rows, row_start, row_end - row_start, Position(row_end),
                                rejects, vectors=vectors)
            finally:
                del matrix  # the map cannot close while an array still points into it

    def _parquet_chunks(self, chunk_rows: int, start_row: int) -> Iterator[Chunk]:
        import pyarrow as pa

        columns = [self.vector_field] + ([self.id_field] if self.id_field else [])
        pending: list = []
        pending_rows, row_start = 0, start_row

        def flush(batches) -> Chunk:
            table = pa.Table.from_batches(batches)
            vectors, rejects = self._parquet_vectors(table.column(self.vector_field).combine_chunks(), row_start)
            ids = None
            if self.id_field:
                ids = [None if value is None else str(value) for value in table.column(self.id_field).to_pylist()]
                rejected = {reject.row for reject in rejects}
                for offset, value in enumerate(ids):
                    if value is None and row_start + offset not in rejected:
                        vectors[offset] = np.nan
                        rejects.append(Reject(row_start + offset, MISSING_ID, f"no {self.id_field!r} value"))
                rejects.sort(key=lambda reject: reject.row)
            rows = table.num_rows
            return Chunk(row_start // chunk_rows, row_start, rows, Position(row_start + rows), rejects, ids, vectors=vectors)

        for batch in _parquet_batches(self.path, columns, start_row):
            while batch.num_rows:
                take = min(batch.num_rows, chunk_rows - pending_rows)
                pending.append(batch.slice(0, take))
                pending_rows += take
                batch = batch.slice(take)
                if pending_rows == chunk_rows:
                    yield flush(pending)
                    row_start += pending_rows
                    pending, pending_rows = [], 0
        if pending_rows:
            yield flush(pending)

    def _parquet_vectors(self, column, row_start: int) -> tuple[np.ndarray, list[Reject]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        vectors = np.full((len(column), self.dim), np.nan, dtype=np.float32)
        lengths = pc.list_value_length(column).fill_null(-1).to_numpy(zero_copy_only=False)
        fits = lengths == self.dim
        if fits.any():
            values = column.filter(pa.array(fits)).flatten().to_numpy(zero_copy_only=False)
            vectors[fits] = np.asarray(values, dtype=np.float32).reshape(-1, self.dim)
        rejects = []
        for offset in np.flatnonzero(~fits):
            if lengths[offset] < 0:
                rejects.append(Reject(row_start + int(offset), MISSING_VECTOR))
            else:
                rejects.append(Reject(row_start + int(offset), WRONG_WIDTH,
                                      f"{lengths[offset]} values, expected {self.dim}"))
        rejects += _reject_non_finite(vectors, row_start, fits)
        rejects.sort(key=lambda reject: reject.row)
        return vectors, rejects


def _npy_layout(path: Path) -> tuple[int, np.dtype, tuple[int, int]]:
    """Header size, dtype and (rows, dim) of a .npy file, read without loading it."""
    with open(path, "rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy version {version}")
            shape, fortran_order, dtype = read_header(handle)
        except ValueError as error:
            raise ValueError(f"{path}: not a readable .npy file ({error})") from None
        header_bytes = handle.tell()
    if len(shape) != 2:
        raise ValueError(f"{path}: expected a 2-D array of embeddings (rows × dim), got shape {shape}")
    if dtype.kind != "f":
        raise ValueError(f"{path}: expected floating-point embeddings, got dtype {dtype}")
    if fortran_order and shape[0] > 1 and shape[1] > 1:
        raise ValueError(f"{path}: stored in Fortran (column-major) order; save it with "
                         "np.save(path, np.ascontiguousarray(x)) so rows can be streamed")
    expected = header_bytes + shape[0] * shape[1] * dtype.itemsize
    if os.path.getsize(path) < expected:
        raise ValueError(f"{path}: truncated .npy file ({os.path.getsize(path)} bytes, header says {expected})")
    return header_bytes, dtype, shape


def _release(mapped: mmap.mmap, start: int, length: int) -> None:
    """Drop already-copied pages of a read-only map from this process (they stay in the page
    cache), so resident memory does not grow with the file."""
    page_start = start - start % mmap.PAGESIZE
    length += start - page_start
    if length > 0 and hasattr(mapped, "madvise"):
        mapped.madvise(mmap.MADV_DONTNEED, page_start, min(length, len(mapped) - page_start))


def _reject_non_finite(vectors: np.ndarray, row_start: int, candidates: np.ndarray) -> list[Reject]:
    """Reject the candidate rows holding NaN/Inf, and make each such row all-NaN."""
    bad = candidates & ~np.isfinite(vectors).all(axis=1)
    rejects = []
    for offset in np.flatnonzero(bad):
        row = vectors[offset]
        detail = f"{int(np.isnan(row).sum())} NaN, {int(np.isinf(row).sum())} Inf of {vectors.shape[1]} values"
        rejects.append(Reject(row_start + int(offset), NON_FINITE, detail))
        vectors[offset] = np.nan
    return rejects


def count_reasons(rejects: Iterable[Reject]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reject in rejects:
        counts[reject.reason] = counts.get(reject.reason, 0) + 1
    return counts


__all__ = [
    "Chunk", "EmbeddingFile", "Position", "Reject", "TextCorpus", "TextRow", "count_reasons",
    "detect_format", "file_pin", "read_texts", "sample_texts",
]

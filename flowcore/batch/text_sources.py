"""Text corpora as chunked, resumable sources: `TextCorpus` (txt, jsonl, csv, parquet), and the
whole-corpus helpers `read_texts` (the good rows) and `sample_texts` (a reproducible sample).

txt and jsonl are read through `flowcore._lines.iter_lines`, so they follow its one policy
(lines end at "\\n", the ending and a leading byte-order mark are dropped, a line that is not
UTF-8 is handed over, here as an `INVALID_UTF8` reject with its line). csv decodes its own raw
lines, since the csv module must see their line endings (quoted fields span lines), under the
same policy. Text files are read line by line from a byte offset and parquet by record batch,
so memory stays flat however large the corpus is.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Iterator

from flowcore._lines import iter_lines
from flowcore.batch.rows import (
    BROKEN_CSV,
    BROKEN_JSON,
    EMPTY_LINE,
    INVALID_UTF8,
    MISSING_ID,
    Chunk,
    Position,
    Reject,
    TextRow,
    check_keep_columns,
    detect_format,
    file_identity,
    not_unicode,
    open_parquet,
    parquet_batches,
    require_file,
    text_reject,
)
from flowcore.batch.sampling import sample_stream

__all__ = ["TEXT_FORMATS", "TextCorpus", "read_texts", "sample_texts"]

TEXT_FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                ".parquet": "parquet", ".pq": "parquet"}


def _rejected(row: int, line: int | None, reason: str, detail: str = "") -> TextRow:
    return TextRow(row, line, None, None, Reject(row, reason, detail, line))


class TextCorpus:
    """A text corpus in txt (one sentence per line), jsonl, csv (with header) or parquet.

    `text_field` / `id_field` name the JSON key or column holding the sentence / its id (txt has
    no fields; its id is the row number). `keep_columns` names columns passed through to the
    output as they are (`meta_types`): strings from jsonl (other JSON values as their JSON text)
    and csv, the column's own type from parquet; a missing value is None, never a reject.
    Structural problems (missing column, unknown format) raise ValueError on construction; row
    problems become `Reject`s while reading."""

    kind = "text"

    def __init__(self, path: str | os.PathLike, text_field: str = "text", id_field: str | None = None,
                 keep_columns=()):
        self.path = Path(path)
        require_file(self.path)
        self.format = detect_format(self.path, TEXT_FORMATS)
        self.text_field = text_field
        self.id_field = id_field
        if self.format == "txt" and id_field is not None:
            raise ValueError(f"{self.path}: a .txt corpus has no fields; --id-field needs jsonl, csv or parquet")
        if self.format == "txt" and keep_columns:
            raise ValueError(f"{self.path}: a .txt corpus has no fields; --keep-columns needs jsonl, csv or parquet")
        available = None
        if self.format == "csv":
            self._csv_header_end, self._csv_columns = self._read_csv_header()
            available = list(self._csv_columns)
        if self.format == "parquet":
            available = self._check_parquet_columns()
        self.keep_columns = check_keep_columns(self.path, keep_columns, available)
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

    def _check_parquet_columns(self) -> list[str]:
        schema = open_parquet(self.path).schema_arrow
        for role, name in (("text", self.text_field), ("id", self.id_field)):
            if name is not None and name not in schema.names:
                raise ValueError(f"{self.path}: no {role} column {name!r} "
                                 f"(columns: {', '.join(schema.names)})")
        return list(schema.names)

    def meta_types(self) -> list[tuple[str, object]]:
        """(name, pyarrow type) of each kept column: string for jsonl and csv, the stored type
        for parquet."""
        import pyarrow as pa

        if self.format == "parquet" and self.keep_columns:
            schema = open_parquet(self.path).schema_arrow
            return [(name, schema.field(name).type) for name in self.keep_columns]
        return [(name, pa.string()) for name in self.keep_columns]

    @property
    def rows(self) -> int:
        """Number of rows (good and rejected); counted once with a cheap pass over the file."""
        if self._rows is None:
            self._rows = self._count_rows()
        return self._rows

    def _count_rows(self) -> int:
        if self.format == "parquet":
            return open_parquet(self.path).metadata.num_rows
        if self.format == "csv":
            return sum(1 for _ in self._csv_rows(Position()))
        newlines, last = 0, b"\n"
        with open(self.path, "rb") as handle:
            while block := handle.read(1 << 23):
                newlines += block.count(b"\n")
                last = block[-1:]
        return newlines + (last != b"\n")

    def identity(self) -> dict:
        """What identifies this source in a job's manifest: the file and how it is read."""
        return {**file_identity(self.path), "format": self.format, "text_field": self.text_field,
                "id_field": self.id_field, "keep_columns": list(self.keep_columns)}

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
        texts, ids, rejects, metas = [], [], [], []
        row_start, index, end = start.row, start.row // chunk_rows, start

        def chunk() -> Chunk:
            meta = None
            if self.keep_columns:
                nulls = (None,) * len(self.keep_columns)
                columns = zip(*(nulls if values is None else values for values in metas))
                meta = {name: list(values) for name, values in zip(self.keep_columns, columns)}
            return Chunk(index, row_start, len(texts), end, rejects, ids, texts, meta=meta)

        for entry, end in self.entries(start):
            texts.append(entry.text)
            ids.append(entry.id)
            metas.append(entry.meta)
            if entry.reject is not None:
                rejects.append(entry.reject)
            if len(texts) == chunk_rows:
                yield chunk()
                texts, ids, rejects, metas = [], [], [], []
                row_start, index = end.row, index + 1
        if texts:
            yield chunk()

    def _line_rows(self, start: Position, parse) -> Iterator[tuple[TextRow, Position]]:
        row = start.row
        for line in iter_lines(self.path, start.offset, start.line):
            if line.text is None:
                entry = _rejected(row, line.number, INVALID_UTF8, f"byte {line.bad_byte} of the line")
            else:
                entry = parse(row, line.number, line.text)
            row += 1
            yield entry, Position(row, line.end, line.number)

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
        except RecursionError:
            return _rejected(row, line, BROKEN_JSON, "nested too deeply")
        if not isinstance(record, dict):
            return _rejected(row, line, BROKEN_JSON, f"expected a JSON object, got {type(record).__name__}")
        entry = self._from_fields(row, line, record.get(self.text_field),
                                  record.get(self.id_field) if self.id_field else None)
        if self.keep_columns:
            meta = tuple(_json_text(record.get(name)) for name in self.keep_columns)
            unwritable = [name for name, value in zip(self.keep_columns, meta) if not_unicode(value)]
            if unwritable:  # no UTF-8 writer takes the value: the row is rejected, the value never written
                meta = tuple(None if not_unicode(value) else value for value in meta)
                if entry.reject is None:
                    entry = _rejected(row, line, INVALID_UTF8,
                                      f"{unwritable[0]!r} holds a lone surrogate (a \\u escape)")
            entry = entry._replace(meta=meta)
        return entry

    def _from_fields(self, row: int, line: int | None, text, record_id) -> TextRow:
        reject = text_reject(row, line, text, self.text_field)
        if reject is not None:
            return TextRow(row, line, None, None, reject)
        if self.id_field is not None:
            if record_id is None:
                return _rejected(row, line, MISSING_ID, f"no {self.id_field!r} value")
            record_id = str(record_id)
            if not_unicode(record_id):
                return _rejected(row, line, INVALID_UTF8, f"{self.id_field!r} holds a lone surrogate (a \\u escape)")
        return TextRow(row, line, record_id, text, None)

    def _csv_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        if start.row == 0:
            start = Position(0, self._csv_header_end, 1)
        state = {"offset": start.offset, "line": start.line, "bad": {}}
        text_index = self._csv_columns[self.text_field]
        id_index = self._csv_columns[self.id_field] if self.id_field else None
        keep_indexes = [self._csv_columns[name] for name in self.keep_columns]

        def decoded_lines(handle) -> Iterator[str]:
            """Raw lines with their endings, for the csv module; a line that is not UTF-8 is
            recorded (its row becomes a reject) and decoded with replacements only for parsing."""
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
                        detail = f"byte {state['bad'][bad[0]]} of line {bad[0]}"
                        entry = _rejected(row, first_line, INVALID_UTF8, detail)
                    elif not fields or not any(value.strip() for value in fields):
                        entry = _rejected(row, first_line, EMPTY_LINE)
                    else:
                        text = fields[text_index] if text_index < len(fields) else None
                        record_id = None if id_index is None or id_index >= len(fields) else fields[id_index]
                        entry = self._from_fields(row, first_line, text, record_id)
                        if keep_indexes:
                            entry = entry._replace(meta=tuple(fields[i] if i < len(fields) else None
                                                              for i in keep_indexes))
                state["bad"].clear()
                row += 1
                yield entry, Position(row, state["offset"], state["line"])

    def _parquet_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        columns = list(dict.fromkeys([self.text_field, *([self.id_field] if self.id_field else []),
                                      *self.keep_columns]))
        row = start.row
        for batch in parquet_batches(self.path, columns, start.row):
            texts = batch.column(self.text_field).to_pylist()
            ids = batch.column(self.id_field).to_pylist() if self.id_field else [None] * len(texts)
            metas = (zip(*(batch.column(name).to_pylist() for name in self.keep_columns)) if self.keep_columns
                     else [None] * len(texts))
            for text, record_id, meta in zip(texts, ids, metas):
                if isinstance(text, bytes):
                    try:
                        text = text.decode("utf-8")
                    except UnicodeDecodeError as error:
                        entry = _rejected(row, None, INVALID_UTF8, f"byte {error.start} of the value")
                        row += 1
                        yield entry._replace(meta=meta), Position(row)
                        continue
                entry = self._from_fields(row, None, text, record_id if self.id_field else None)
                row += 1
                yield entry._replace(meta=meta), Position(row)


def _json_text(value) -> str | None:
    """A kept jsonl value as text: strings as they are, other JSON values as their JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


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

    One pass (`flowcore.batch.sampling.sample_stream`; memory: `max_rows` texts); the same file,
    `max_rows` and `seed` always give the same sample. Rejected rows go to `rejects` as in
    `read_texts`."""
    texts = (text for _, _, text in read_texts(path, text_field, rejects=rejects))
    return sample_stream(texts, max_rows, seed)

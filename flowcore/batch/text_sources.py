"""Text corpora as chunked, resumable sources (`TextCorpus`: txt, jsonl, csv, parquet); `read_texts`, `sample_texts`.

txt and jsonl follow `flowcore._lines`' line policy; csv decodes its raw lines under the same policy (the csv module
must see their endings), and a record it cannot close is rejected at its first line, the lines after it read again,
so an unclosed quote never swallows the rows after it.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import itertools
import json
import os
from collections import deque
from pathlib import Path
from typing import Iterator, NamedTuple

from flowcore import defaults
from flowcore._json import JSONProblem, parse_json
from flowcore._lines import check_encoding, iter_lines, read_line
from flowcore.batch import rows
from flowcore.batch.rows import Chunk, Position, Reject, TextRow
from flowcore.batch.sampling import sample_stream

__all__ = ["CSV_SPAN_BYTES", "TEXT_FORMATS", "TextCorpus", "read_texts", "sample_texts"]

TEXT_FORMATS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
                ".parquet": "parquet", ".pq": "parquet"}

CSV_SPAN_BYTES = 16 << 20
"""The most bytes a CSV record over several lines may hold; one longer is taken for an unclosed quote."""


def _rejected(row: int, line: int | None, reason: str, detail: str = "", record_id: str | None = None) -> TextRow:
    return TextRow(row, line, record_id, None, Reject(row, reason, detail, line, record_id))


class _CsvLine(NamedTuple):
    """One raw CSV line, its text with its ending; `problem`: a `Reject` reason and detail, or None."""

    text: str
    end: int
    number: int
    problem: tuple[str, str] | None


class _SpanTooLong(Exception):
    """A CSV record ran on past `CSV_SPAN_BYTES` over several lines."""


class _CsvLines:
    """The lines of a CSV file from a byte offset for the csv module, keeping the lines of the record being parsed
    so that a broken record's later lines can be read again (`read_again`)."""

    def __init__(self, handle, offset: int, line: int):
        self.handle, self.offset, self.line = handle, offset, line
        self.again: deque[_CsvLine] = deque()
        self.record: list[_CsvLine] = []
        self.record_bytes = 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.again:
            entry = self.again.popleft()
        else:
            raw, whole = read_line(self.handle, defaults.LINE_BYTES + 2)
            if not whole:
                raise StopIteration
            self.offset += whole
            self.line += 1
            nul = raw.find(b"\0")
            problem = None if nul < 0 else (rows.NUL_CHARACTER, f"byte {nul}")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:  # still text for the csv module; the row is rejected
                text = raw.decode("utf-8", errors="surrogateescape")
                problem = (rows.INVALID_UTF8, f"byte {error.start}")
            if whole > len(raw):  # cut as it was read: the record is lost
                problem = (rows.LINE_TOO_LONG, f"longer than {defaults.LINE_BYTES:,} bytes ({whole:,} bytes)")
            entry = _CsvLine(text, self.offset, self.line, problem)
        if self.record:  # the lines after a record's first, whose quoted field runs on
            if self.record_bytes + len(entry.text) > CSV_SPAN_BYTES:
                self.again.appendleft(entry)
                raise _SpanTooLong(f"a quoted field runs on past {CSV_SPAN_BYTES >> 20} MiB")
            self.record_bytes += len(entry.text)
        self.record.append(entry)
        return entry.text

    def start_record(self) -> None:
        self.record, self.record_bytes = [], 0

    def read_again(self) -> None:
        """Push back every line of the current record but its first."""
        self.again.extendleft(reversed(self.record[1:]))
        self.record = self.record[:1]


class TextCorpus:
    """A text corpus in txt (one sentence per line), jsonl, csv (with header) or parquet.

    `text_field` / `id_field` name the key or column of the sentence / its id (txt has none; ids are row numbers).
    `keep_columns` are passed through to the output (`meta_types`; a missing value is None). Structural problems
    raise ValueError on construction; row problems become `Reject`s while reading."""

    kind = "text"

    def __init__(self, path: str | os.PathLike, text_field: str = defaults.TEXT_FIELD, id_field: str | None = None,
                 keep_columns=()):
        self.path = Path(path)
        rows.require_file(self.path)
        self.format = rows.detect_format(self.path, TEXT_FORMATS)
        if self.format != "parquet":
            check_encoding(self.path)
        self.text_field = text_field
        self.id_field = id_field
        if self.format == "txt" and (id_field is not None or keep_columns):
            flag = "--id-field" if id_field is not None else "--keep-columns"
            raise ValueError(f"{self.path}: a .txt corpus has no fields; {flag} needs jsonl, csv or parquet")
        available = None
        if self.format == "csv":
            with open(self.path, "rb") as handle:
                raw = handle.readline()
            try:
                header = next(csv.reader([raw.decode("utf-8-sig")], strict=True), [])
            except (UnicodeDecodeError, csv.Error) as error:
                raise ValueError(f"{self.path}: line 1: unreadable CSV header ({error})") from None
            self._csv_header_end = len(raw)
            available = [name.strip() for name in header]
            for name in (text_field, id_field):
                if name is not None and available.count(name) > 1:
                    raise ValueError(f"{self.path}: line 1: {available.count(name)} columns are named {name!r}; "
                                     "rename them so that the one to read is named once")
            self._csv_columns = {name: available.index(name) for name in available}
            rows.require_columns(self.path, available, " in the CSV header", text=text_field, id=id_field)
        if self.format == "parquet":
            self._schema = rows.parquet_schema(self.path, text=text_field, id=id_field)
            available = self._schema.names
        self.keep_columns = rows.check_keep_columns(self.path, keep_columns, available)

    def meta_types(self) -> list[tuple[str, object]]:
        """(name, pyarrow type) of each kept column: string, or the stored type for parquet."""
        import pyarrow as pa

        if self.format == "parquet":
            return [(name, self._schema.field(name).type) for name in self.keep_columns]
        return [(name, pa.string()) for name in self.keep_columns]

    @functools.cached_property
    def rows(self) -> int:
        """Number of rows (good and rejected), counted once."""
        if self.format == "parquet":
            return rows.open_parquet(self.path).metadata.num_rows
        if self.format == "csv":
            return sum(1 for _ in self._csv_rows(Position()))
        newlines, last = 0, b"\n"
        with open(self.path, "rb") as handle:
            while block := handle.read(defaults.SCAN_BLOCK_BYTES):
                newlines += block.count(b"\n")
                last = block[-1:]
        return newlines + (last != b"\n")

    def identity(self) -> dict:
        """What identifies this source in a job's manifest: the file and how it is read."""
        return {**rows.file_identity(self.path), "format": self.format, "text_field": self.text_field,
                "id_field": self.id_field, "keep_columns": list(self.keep_columns)}

    def entries(self, start: Position = Position()) -> Iterator[tuple[TextRow, Position]]:
        """Every row from `start` on, each with the position just after it."""
        if self.format in ("txt", "jsonl"):
            return self._line_rows(start)
        if self.format == "csv":
            return self._csv_rows(start)
        return self._parquet_rows(start)

    def chunks(self, chunk_rows: int, start: Position = Position()) -> Iterator[Chunk]:
        """Chunks of `chunk_rows` rows (the last may be shorter) from `start`, a chunk boundary."""
        entries = self.entries(start)
        for index in itertools.count(start.row // chunk_rows):
            batch = list(itertools.islice(entries, chunk_rows))
            if not batch:
                return
            parsed, ends = zip(*batch)
            meta = None
            if self.keep_columns:
                nulls = (None,) * len(self.keep_columns)
                columns = zip(*(nulls if row.meta is None else row.meta for row in parsed))
                meta = {name: list(values) for name, values in zip(self.keep_columns, columns)}
            rejects = [row.reject for row in parsed if row.reject is not None]
            yield Chunk(index, parsed[0].row, len(parsed), ends[-1], rejects, [row.id for row in parsed],
                        [row.text for row in parsed], meta=meta)

    def _line_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        row = start.row
        for line in iter_lines(self.path, start.offset, start.line):
            reject = rows.line_reject(row, line, structured=self.format != "txt")
            if reject is not None:
                entry = self._bad_line(reject, line)
            elif not line.text.strip():
                entry = _rejected(row, line.number, rows.EMPTY_LINE)
            elif self.format == "jsonl":
                entry = self._parse_jsonl(row, line.number, line.text)
            else:
                entry = TextRow(row, line.number, None, line.text, None)
            row += 1
            yield entry, Position(row, line.end, line.number)

    def _bad_line(self, reject: Reject, line) -> TextRow:
        """A line that cannot be read, with its id when one can still be read (jsonl)."""
        record_id = None
        if self.id_field is not None:  # jsonl: a .txt corpus has no id field
            content = line.raw.decode("utf-8", errors="surrogateescape") if line.text is None else line.text
            with contextlib.suppress(JSONProblem, AttributeError):  # not a JSON object: no id
                record_id = parse_json(content).get(self.id_field)
        return self._from_fields(reject.row, reject.line, None, record_id, reject)

    def _parse_jsonl(self, row: int, line: int, content: str) -> TextRow:
        try:
            record = parse_json(content)
        except JSONProblem as problem:
            return _rejected(row, line, rows.DUPLICATE_KEY if problem.duplicate else rows.BROKEN_JSON,
                             str(problem).removeprefix("broken JSON: "))
        if not isinstance(record, dict):
            return _rejected(row, line, rows.BROKEN_JSON, f"expected a JSON object, got {type(record).__name__}")
        entry = self._from_fields(row, line, record.get(self.text_field), record.get(self.id_field))
        if self.keep_columns:
            meta = tuple(_json_text(record.get(name)) for name in self.keep_columns)
            unwritable = [name for name, value in zip(self.keep_columns, meta) if rows.not_unicode(value)]
            if unwritable:  # no UTF-8 writer takes the value: the row is rejected, the value never written
                meta = tuple(None if rows.not_unicode(value) else value for value in meta)
                if entry.reject is None:
                    entry = _rejected(row, line, rows.INVALID_UTF8,
                                      f"{unwritable[0]!r} holds a lone surrogate (a \\u escape)", entry.id)
            entry = entry._replace(meta=meta)
        return entry

    def _from_fields(self, row: int, line: int | None, text, record_id, reject: Reject | None = None) -> TextRow:
        """A row from its text and id values (`text_reject`, `id_reject`), or rejected for `reject` (a
        problem found before them), keeping a sound id when rejected."""
        id_problem = None
        if self.id_field is not None:
            record_id, id_problem = rows.id_reject(row, line, record_id, self.id_field)
        reject = reject or rows.text_reject(row, line, text, self.text_field) or id_problem
        if reject is not None:
            return _rejected(row, line, reject.reason, reject.detail, record_id)
        return TextRow(row, line, record_id, text, None)

    def _csv_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        csv.field_size_limit(2**31 - 1)  # a long line is text (`CSV_SPAN_BYTES` bounds spans)
        if start.row == 0:
            start = Position(0, self._csv_header_end, 1)
        row = start.row
        with open(self.path, "rb") as handle:
            handle.seek(start.offset)
            lines = _CsvLines(handle, start.offset, start.line)
            reader = csv.reader(lines, strict=True)
            while True:
                lines.start_record()
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except (csv.Error, _SpanTooLong) as error:
                    entry, last = self._broken_csv(row, lines, error), lines.record[0]
                else:
                    entry, last = self._csv_record(row, lines.record, fields), lines.record[-1]
                row += 1
                yield entry, Position(row, last.end, last.number)

    def _broken_csv(self, row: int, lines: _CsvLines, error: Exception) -> TextRow:
        """A record the csv module could not close: its first line is rejected, the others read again."""
        first, last = lines.record[0], lines.record[-1]
        detail = str(error)
        if "new-line character seen in unquoted field" in detail:  # the csv module's words for a lone \r
            detail = "a carriage return (\\r) inside an unquoted field; quote the field or remove the \\r"
        if last.number > first.number:
            detail += (f" (a record from line {first.number} to line {last.number}: an unclosed quote?); the lines "
                       "after this one are read again as rows")
        lines.read_again()
        if first.problem is not None and first.problem[0] == rows.LINE_TOO_LONG:  # the cut broke the quoting
            return _rejected(row, first.number, *first.problem)
        return _rejected(row, first.number, rows.BROKEN_CSV, detail)

    def _csv_record(self, row: int, record: list[_CsvLine], fields: list[str]) -> TextRow:
        """A parsed CSV record (over the lines `record`) as a row; a sound id and kept values stay either way."""
        first = record[0].number

        def value(name: str | None) -> str | None:
            index = self._csv_columns.get(name)  # None: no id field
            return fields[index] if index is not None and index < len(fields) else None

        bad = next((entry for entry in record if entry.problem is not None), None)
        if bad is not None:
            reason, where = bad.problem
            entry = self._from_fields(row, first, None, value(self.id_field),
                                      Reject(row, reason, f"{where} of line {bad.number}", first))
        elif not fields or not any(field.strip() for field in fields):
            entry = _rejected(row, first, rows.EMPTY_LINE)
        else:
            entry = self._from_fields(row, first, value(self.text_field), value(self.id_field))
        if self.keep_columns:
            meta = tuple(value(name) for name in self.keep_columns)
            entry = entry._replace(meta=tuple(None if rows.not_unicode(kept) else kept for kept in meta))
        return entry

    def _parquet_rows(self, start: Position) -> Iterator[tuple[TextRow, Position]]:
        row = start.row
        for batch in rows.parquet_batches(self.path, [self.text_field, self.id_field, *self.keep_columns], start.row):
            texts = batch.column(self.text_field).to_pylist()
            ids = batch.column(self.id_field).to_pylist() if self.id_field else [None] * len(texts)
            metas = (zip(*(batch.column(name).to_pylist() for name in self.keep_columns)) if self.keep_columns
                     else [None] * len(texts))
            for text, record_id, meta in zip(texts, ids, metas):
                undecodable = None
                try:
                    text = text.decode("utf-8") if isinstance(text, bytes) else text
                except UnicodeDecodeError as error:
                    undecodable = Reject(row, rows.INVALID_UTF8, f"byte {error.start} of the value")
                entry = self._from_fields(row, None, text, record_id, undecodable)
                row += 1
                yield entry._replace(meta=meta), Position(row)


def _json_text(value) -> str | None:
    """A kept jsonl value as text: strings as they are, other JSON values as their JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def read_texts(path: str | os.PathLike, text_field: str = defaults.TEXT_FIELD, id_field: str | None = None,
               rejects: list[Reject] | None = None) -> Iterator[tuple[int, str | None, str]]:
    """Stream the good rows of a corpus as (row number, id, text); rejected rows go to `rejects` if given."""
    for entry, _ in TextCorpus(path, text_field, id_field).entries():
        if entry.reject is None:
            yield entry.row, entry.id, entry.text
        elif rejects is not None:
            rejects.append(entry.reject)


def sample_texts(path: str | os.PathLike, max_rows: int | None, seed: int = 0, text_field: str = defaults.TEXT_FIELD,
                 rejects: list[Reject] | None = None) -> list[str]:
    """A reproducible uniform random sample of at most `max_rows` good texts (all when None), in file order, in one
    pass (`sample_stream`); rejected rows go to `rejects` as in `read_texts`."""
    texts = (text for _, _, text in read_texts(path, text_field, rejects=rejects))
    return sample_stream(texts, max_rows, seed)

"""Your own labelled sentence pairs (`flowcore sts --pairs`), as `STSPairs` named after the file:
.tsv, .csv, .jsonl and SentEval `STS.input.<name>.txt` files or folders; docs/sts.md has the formats
and columns. A bad line raises `STSDataError` naming `file:line`, or (`skip_bad`) is skipped and counted."""
from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from flowcore._json import JSONProblem, parse_json
from flowcore._lines import UnsupportedEncodingError, check_encoding, iter_lines, require_file
from flowcore.sts.data import BadRecord, STSDataError, STSPairs, checked_score, checked_sentence, semeval_pairs

__all__ = ["PAIRS_SPLIT", "PairColumns", "SCORE_NAMES", "SENTENCE1_NAMES", "SENTENCE2_NAMES", "load_pairs",
           "load_pairs_files", "pairs_name"]

logger = logging.getLogger(__name__)

PAIRS_SPLIT = "pairs"
"""The `split` of pairs read from your files (the built-in datasets have test/train/...)."""

SENTENCE1_NAMES = ("sentence1", "sentence_1", "sentence_a", "s1", "text1", "text_1", "text_a", "sent1")
SENTENCE2_NAMES = ("sentence2", "sentence_2", "sentence_b", "s2", "text2", "text_2", "text_b", "sent2")
SCORE_NAMES = ("score", "label", "similarity", "relatedness_score", "gold", "gold_score", "sim")

_INPUT_PREFIX, _GOLD_PREFIX, _SENTEVAL_SUFFIX = "STS.input.", "STS.gs.", ".txt"


@dataclass(frozen=True)
class PairColumns:
    """The first sentence, second sentence and score columns: three names or three 0-based positions."""

    sentence1: str | int
    sentence2: str | int
    score: str | int

    @classmethod
    def parse(cls, text: str) -> "PairColumns":
        """`"sentence1,sentence2,score"` or `"0,1,2"` (names and positions are not mixed)."""
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"pairs columns {text!r}: expected three comma-separated columns "
                             "(first sentence, second sentence, score), e.g. sentence1,sentence2,score or 0,1,2")
        digits = [part.isdigit() for part in parts]
        if any(digits) and not all(digits):
            raise ValueError(f"pairs columns {text!r}: give three names or three 0-based positions, not a mix")
        columns = [int(part) for part in parts] if all(digits) else parts
        if len(set(columns)) != 3:
            raise ValueError(f"pairs columns {text!r}: the three {'positions' if all(digits) else 'names'} must differ")
        return cls(*columns)

    @property
    def by_position(self) -> bool:
        return isinstance(self.sentence1, int)

    @property
    def keys(self) -> tuple:
        return self.sentence1, self.sentence2, self.score

    def __str__(self) -> str:
        return ",".join(map(str, self.keys))


class _Collector:
    """Raises the first bad line as `STSDataError`, or (skip_bad) counts them."""

    def __init__(self, path: Path, skip_bad: bool):
        self.path, self.skip_bad = path, skip_bad
        self.skipped = 0
        self.first: str | None = None

    def bad(self, number: int, message: str, path: Path | None = None, lines: int = 1) -> None:
        """A bad record at line `number` of `path` (default the file read), `lines` physical lines long."""
        text = f"{path or self.path}:{number}: {message}"
        if not self.skip_bad:
            raise STSDataError(text) from None
        self.skipped += lines
        self.first = self.first or text


def pairs_name(path: str | os.PathLike) -> str:
    """The dataset name of a pairs file: its stem; `<name>` for `STS.input.<name>.txt`; a folder's name."""
    path = Path(path)
    if path.is_dir():
        return path.resolve().name
    if path.name.startswith(_INPUT_PREFIX) and path.name.endswith(_SENTEVAL_SUFFIX):
        return path.name[len(_INPUT_PREFIX):-len(_SENTEVAL_SUFFIX)]
    return path.stem


def load_pairs(path: str | os.PathLike, columns: PairColumns | str | None = None, skip_bad: bool = False,
               name: str | None = None) -> STSPairs:
    """The scored pairs of one file (or SentEval folder), as `STSPairs` named `name` (default
    `pairs_name(path)`), split `PAIRS_SPLIT`, with `source` the path and `skipped_lines` the bad
    lines skipped (`skip_bad`; otherwise the first bad line raises `STSDataError`)."""
    path = Path(path)
    if isinstance(columns, str):
        columns = PairColumns.parse(columns)
    name = name or pairs_name(path)
    collector, suffix = _Collector(path, skip_bad), path.suffix.lower()
    if path.is_dir() or (path.name.startswith(_INPUT_PREFIX) and path.name.endswith(_SENTEVAL_SUFFIX)):
        if columns is not None:
            raise STSDataError(f"{path}: SentEval pairs have fixed columns; --pairs-columns does not apply")
        rows = _senteval_rows(path, collector)
    elif not path.exists():
        raise STSDataError(f"missing file: {path}")
    elif suffix not in (".tsv", ".csv", ".jsonl"):
        raise STSDataError(f"{path}: unknown pairs format: expected a .tsv, .csv or .jsonl file, "
                           f"a SentEval {_INPUT_PREFIX}<name>{_SENTEVAL_SUFFIX} file or a folder of them")
    else:
        require_file(path, STSDataError)
        try:
            check_encoding(path)  # UTF-16 or UTF-32 text is refused
        except UnsupportedEncodingError as error:
            raise STSDataError(str(error)) from None
        if suffix == ".jsonl":
            rows = _jsonl_rows(path, columns, collector)
        elif suffix == ".tsv":  # split at tabs, no quoting
            records = ((number, text.split("\t")) for number, text in _text_lines(path, collector) if text.strip())
            rows = _delimited_rows(path, columns, collector, records)
        else:
            rows = _delimited_rows(path, columns, collector, _csv_records(path, collector))
    rows = [(first, second, score, subset or name) for first, second, score, subset in rows]
    if collector.skipped:
        logger.warning(f"{path}: skipped {collector.skipped} bad line(s); the first: {collector.first}")
    if len(rows) < 2:
        raise STSDataError(f"{path}: {len(rows)} scored pair(s); at least 2 are needed for a correlation")
    return STSPairs.from_rows(name, PAIRS_SPLIT, rows, source=str(path), skipped_lines=collector.skipped)


def load_pairs_files(paths, columns: PairColumns | str | None = None, skip_bad: bool = False) -> list[STSPairs]:
    """`load_pairs` of each path; two with the same name are refused (they would share a table column)."""
    loaded = [load_pairs(path, columns, skip_bad) for path in paths]
    seen: dict[str, str] = {}
    for pairs in loaded:
        if pairs.dataset in seen:
            raise STSDataError(f"{seen[pairs.dataset]} and {pairs.source} are both named {pairs.dataset!r}; "
                               "rename one (each file is one dataset, named after its stem)")
        seen[pairs.dataset] = pairs.source
    return loaded


def _column(key) -> str:
    return f"column {key!r}" if isinstance(key, str) else f"column {key} (0-based)"


def _checked_row(values, keys: tuple) -> tuple[str, str, float, None]:
    """The two sentences and the score of a record, read from the columns `keys`, checked."""
    return (checked_sentence(values[0], _column(keys[0])), checked_sentence(values[1], _column(keys[1])),
            checked_score(values[2], "score", f" in {_column(keys[2])}"), None)


def _text_lines(path: Path, collector: _Collector) -> Iterator[tuple[int, str]]:
    """(number, text) of each line; a line that is not UTF-8 or holds a NUL byte is a bad line."""
    for line in iter_lines(path):
        if (problem := line.problem or line.too_long) is not None:
            collector.bad(line.number, problem)
            continue
        yield line.number, line.text


def _csv_records(path: Path, collector: _Collector):
    """(number of its first line, fields) of each non-blank CSV record; one broken or spanning several lines
    is bad (one pair per line: a quote left open would swallow the next lines)."""
    numbers: list[int] = []  # the line numbers of the record being read

    def feed():
        for number, text in _text_lines(path, collector):
            numbers.append(number)
            yield text + "\n"  # the reader keeps a line break inside a quoted field

    reader = csv.reader(feed(), strict=True)
    while True:
        numbers.clear()
        try:
            fields, problem = next(reader), None
        except StopIteration:
            return
        except csv.Error as error:  # raised on a line read, never before the first
            fields, problem = None, str(error)
        start, last = numbers[0], numbers[-1]
        if last > start:
            detail = f" ({problem})" if problem is not None else ""
            collector.bad(start, f"quoted field spans lines {start}-{last}{detail}; unbalanced quote? "
                          "(pairs files hold one pair per line)", lines=last - start + 1)
        elif problem is not None:
            collector.bad(start, f"broken CSV: {problem}")
        elif any(field.strip() for field in fields):
            yield start, fields


def _header(fields: list[str], columns: PairColumns | None, path: Path, number: int) -> tuple[tuple, tuple]:
    """The names of the sentence and score columns (`columns`, else recognised) and their positions in a header."""
    stripped = [field.strip() for field in fields]
    if columns is None:
        found = [next((field for field in stripped if field.lower() in names), None)
                 for names in (SENTENCE1_NAMES, SENTENCE2_NAMES, SCORE_NAMES)]
        if None in found:
            raise STSDataError(f"{path}:{number}: neither a header naming both sentences and the score (e.g. "
                               "sentence1,sentence2,score or s1,s2,label) nor a headerless pair with a numeric "
                               "score in column 2 (0-based); pass --pairs-columns NAME1,NAME2,SCORE or positions I,J,K")
        columns = PairColumns(*found)
    missing = [key for key in columns.keys if key not in stripped]
    if missing:
        raise STSDataError(f"{path}:{number}: the header has no column {', '.join(map(repr, missing))} "
                           f"(it has: {', '.join(stripped)})")
    repeated = [key for key in columns.keys if stripped.count(key) > 1]
    if repeated:
        raise STSDataError(f"{path}:{number}: {stripped.count(repeated[0])} columns are named {repeated[0]!r}; rename "
                           "them so that the one to read is named once")
    return columns.keys, tuple(stripped.index(key) for key in columns.keys)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _delimited_rows(path: Path, columns: PairColumns | None, collector: _Collector, records):
    """Pairs of a .tsv/.csv: a header line first when the columns are names (given or recognised)."""
    keys = indices = None
    if columns is not None and columns.by_position:
        keys = indices = columns.keys
    for number, fields in records:
        if indices is None:  # the first record: a header, or the first pair of a headerless file
            lowered = {field.strip().lower() for field in fields}
            if columns is None and len(fields) >= 3 and _is_number(fields[2]) and not lowered & set(SCORE_NAMES):
                keys = indices = (0, 1, 2)
            else:
                keys, indices = _header(fields, columns, path, number)
                continue
        try:
            if len(fields) <= max(indices):
                raise BadRecord(f"expected at least {max(indices) + 1} columns, found {len(fields)}")
            yield _checked_row([fields[index] for index in indices], keys)
        except BadRecord as bad:
            collector.bad(number, str(bad))


def _jsonl_rows(path: Path, columns: PairColumns | None, collector: _Collector):
    """Pairs of a .jsonl: objects by key (given or recognised), arrays by position (given or 0, 1, 2)."""
    for number, text in _text_lines(path, collector):
        if not text.strip():
            continue
        try:
            yield _json_pair(text, columns)
        except BadRecord as bad:
            collector.bad(number, str(bad))


def _json_pair(text: str, columns: PairColumns | None):
    try:
        value = parse_json(text)
    except JSONProblem as problem:
        raise BadRecord(str(problem)) from None
    if isinstance(value, dict):
        if columns is not None and columns.by_position:
            raise BadRecord("a JSON object, but the pairs columns are positions (they pick items of JSON arrays)")
        if columns is None:
            lowered = {key.lower(): key for key in value}
            found = [next((lowered[n] for n in names if n in lowered), None)
                     for names in (SENTENCE1_NAMES, SENTENCE2_NAMES, SCORE_NAMES)]
            if None in found:
                raise BadRecord("no recognised keys for both sentences and the score (e.g. sentence1, sentence2, "
                                f"score) among: {', '.join(value) or 'none'}; pass --pairs-columns")
            columns = PairColumns(*found)
        keys = columns.keys
        missing = [key for key in keys if key not in value]
        if missing:
            raise BadRecord(f"missing key {', '.join(map(repr, missing))}")
    elif isinstance(value, list):
        if columns is not None and not columns.by_position:
            raise BadRecord("a JSON array, but the pairs columns are names (they pick keys of JSON objects)")
        keys = columns.keys if columns is not None else (0, 1, 2)
        if len(value) <= max(keys):
            raise BadRecord(f"expected at least {max(keys) + 1} items, found {len(value)}")
    else:
        raise BadRecord(f"expected a JSON object or array, found {type(value).__name__}")
    return _checked_row([value[key] for key in keys], keys)


def _senteval_rows(path: Path, collector: _Collector):
    """SentEval pairs: one `STS.input.<name>.txt` with its gold file, or each in a folder (a subset named `<name>`)."""
    if path.is_dir():
        inputs = sorted(p for p in path.iterdir()
                        if p.name.startswith(_INPUT_PREFIX) and p.name.endswith(_SENTEVAL_SUFFIX))
        if not inputs:
            raise STSDataError(f"{path}: no {_INPUT_PREFIX}<name>{_SENTEVAL_SUFFIX} files in this folder")
    else:
        inputs = [path]
    for input_path in inputs:
        subset = pairs_name(input_path)
        gold_path = input_path.with_name(f"{_GOLD_PREFIX}{subset}{_SENTEVAL_SUFFIX}")
        for first, second, score in semeval_pairs(input_path, gold_path,
                                                  lambda where, number, message: collector.bad(number, message, where)):
            yield first, second, score, subset

"""Hostile and odd text corpora (property-based): random bytes, invalid UTF-8, BOMs, CRLF, lone CRs, NUL
bytes and NUL escapes, U+2028, quotes and embedded newlines, unclosed CSV quotes, 1 MB lines,
UTF-16 and UTF-32 files, duplicate ids and ids of every JSON type, lone surrogates, deep nesting,
numbers past the interpreter's digit limit, duplicate keys and header names.
Whatever the file, the job never raises a traceback and never drops, merges or shifts a row: every row
is calibrated (its vector is the one its own text gives) or listed in the rejects file with its
line, its id where one could be read, and its reason, and the counts add up to the file's; a file
in another encoding than UTF-8, or whose lines end in a lone CR, is refused in one line naming it."""
import csv
import hashlib
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faults_support import DIM
from hypothesis import example, given
from hypothesis import strategies as st

from flowcore._json import JSONProblem, parse_json
from flowcore._lines import UnsupportedEncodingError
from flowcore.batch.job import CalibrationJob
from flowcore.batch.rows import (
    BROKEN_CSV,
    BROKEN_JSON,
    CARRIAGE_RETURN,
    DUPLICATE_KEY,
    EMPTY_LINE,
    EMPTY_TEXT,
    INVALID_ID,
    INVALID_UTF8,
    MISSING_ID,
    MISSING_TEXT,
    NUL_CHARACTER,
    Position,
)
from flowcore.batch.text_sources import TextCorpus

ODD = ["\x00", "\r", "\n", "\r\n", "\u2028", "\u2029", "\ufeff", "\x85", '"', "'", ",", "\t", " ", "\\", "{", "}",
       "é", "日本", "🙂", "\U0010ffff"]
odd_text = st.lists(st.one_of(st.sampled_from(ODD), st.text(max_size=6)), max_size=8).map("".join)
raw_bytes = st.binary(max_size=200)
BOM = b"\xef\xbb\xbf"
HUGE = "w" * (1 << 20)  # a 1 MB line or value


def vector_of(text: str) -> np.ndarray:
    """The stand-in encoder: a vector fixed by the text's bytes, so a shifted row is caught."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return np.frombuffer(digest[:DIM * 4], dtype=np.uint32).astype(np.float32) / 2**32


def encode(texts):
    return np.stack([vector_of(text) for text in texts]) if texts else np.empty((0, DIM), np.float32)


def run_job(path, out, **source_options):
    """The whole job over `path` (identity flow); returns (vectors or parquet table, rejects by row)."""
    source = TextCorpus(path, **source_options)
    CalibrationJob(source, out, lambda x: x, DIM, encode=encode, chunk_rows=16, show_progress_bar=False).run()
    rejects = [json.loads(line) for line in open(f"{out}.rejects.jsonl", encoding="utf-8")]
    rows = [reject["row"] for reject in rejects]
    assert rows == sorted(set(rows)), "each rejected row is listed once, in order"
    return {reject["row"]: reject for reject in rejects}


OTHER_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")  # UTF-16 LE/BE (and UTF-32 LE), UTF-32 BE


def refused_as_another_encoding(path, data: bytes, out, **source_options) -> bool:
    """Whether `data` starts with a UTF-16/UTF-32 byte-order mark, or its first line ends in a lone CR, after
    checking that the job then refuses the whole file in one line naming it and the problem."""
    first_line = data[:1 << 16].split(b"\n", 1)[0].removesuffix(b"\r")
    if not data.startswith(OTHER_BOMS) and b"\r" not in first_line:
        return False
    with pytest.raises(UnsupportedEncodingError) as refused:
        run_job(path, out, **source_options)
    message = str(refused.value)
    what = "starts with a UTF-" if data.startswith(OTHER_BOMS) else "line 1 ends in a lone carriage return"
    assert message.startswith(f"{path}: {what}") and "\n" not in message
    return True


def check_rows(vectors: np.ndarray, rejects: dict, expected: list, lines: list[int] | None):
    """`expected[i]` is row i's text or its reject reason (a `Rejected`); `lines[i]` its first line."""
    assert len(vectors) == len(expected), "the output has one row per input row"
    for row, want in enumerate(expected):
        if isinstance(want, Rejected):
            assert row in rejects and rejects[row]["reason"] == want.reason, (row, want, rejects.get(row))
            assert np.isnan(vectors[row]).all()
        else:
            assert row not in rejects, (row, want, rejects[row])
            np.testing.assert_array_equal(vectors[row], vector_of(want))
        if lines is not None and row in rejects:
            assert rejects[row]["line"] == lines[row]
    assert len(rejects) == sum(isinstance(want, Rejected) for want in expected)


class Rejected:
    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self):
        return f"Rejected({self.reason!r})"


def txt_oracle(data: bytes) -> list:
    """What the line policy (docs/design.md) makes of each line, computed by splitting the bytes."""
    lines = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        lines.pop()
    expected = []
    for index, raw in enumerate(lines):
        raw = raw.removesuffix(b"\r")
        if index == 0 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            expected.append(Rejected(INVALID_UTF8))
            continue
        if "\0" in text:
            expected.append(Rejected(NUL_CHARACTER))
            continue
        if "\r" in text:  # never split there, never merged: the line is a reject
            expected.append(Rejected(CARRIAGE_RETURN))
            continue
        expected.append(text if text.strip() else Rejected(EMPTY_LINE))
    return expected


@given(lines=st.lists(st.one_of(odd_text.map(lambda t: t.encode("utf-8", "surrogatepass")), raw_bytes), max_size=40),
       bom=st.booleans(), crlf=st.booleans(), final_newline=st.booleans(), long_line=st.booleans())
def test_txt_every_line_is_calibrated_or_rejected_in_place(tmp_path_factory, lines, bom, crlf, final_newline,
                                                           long_line):
    folder = tmp_path_factory.mktemp("txt")
    if long_line and lines:
        lines[len(lines) // 2] = b"w" * (1 << 20)
    data = (BOM if bom else b"") + (b"\r\n" if crlf else b"\n").join(lines) + (b"\n" if final_newline else b"")
    (folder / "c.txt").write_bytes(data)
    if refused_as_another_encoding(folder / "c.txt", data, folder / "out.npy"):
        return
    rejects = run_job(folder / "c.txt", folder / "out.npy")
    expected = txt_oracle(data)
    check_rows(np.load(folder / "out.npy"), rejects, expected, lines=list(range(1, len(expected) + 1)))


ODD_IDS = [float("nan"), float("inf"), -float("inf"), True, {"k": 1}, [1, 2], {"k": [float("nan")]}, 1.5, 10**30, "",
           "\ud800", "\x00"]
record = st.fixed_dictionaries({"id": st.one_of(st.sampled_from(["a", "b", "a"]), st.integers(-3, 3), st.none(),
                                                st.sampled_from(ODD_IDS)),
                                "text": st.one_of(odd_text, st.none(), st.integers(), st.just("\ud800x"),
                                                  st.just(HUGE))},
                               optional={"meta": st.one_of(odd_text, st.floats(), st.lists(st.integers()),
                                                           st.just("\udc80"))})
ODD_LINES = [b"[" * 50_000, b"", b'{"id": 1e999, "text": "x"}', b'{"id": NaN, "text": "x"}',
             b'{"id": "k", "text": "caf\xe9"}', b'{"id": "n", "text": "a\x00b"}', b'{"id": "e", "text": "a\\u0000"}',
             b'{"id": ' + b"7" * 5000 + b', "text": "x"}', b'{"id": "d", "text": "x", "text": "y"}',
             b'{"id": "c", "text": "one\rtwo"}', b'{"id": "w",\r"text": "x"}']


def jsonl_line(item) -> bytes:
    if isinstance(item, bytes):
        return item.replace(b"\n", b" ")
    return json.dumps(item, ensure_ascii=True).encode("ascii")


def id_text(value) -> str | None:
    """The id the rules give a JSON value (None: none can be read): strings without lone
    surrogates as they are, any other value its compact JSON text, never with NaN/Infinity."""
    if isinstance(value, str):
        return None if any("\ud800" <= c <= "\udfff" for c in value) else value
    try:
        return None if value is None else json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        return None


def jsonl_oracle(raw: bytes, index: int):
    """(the row's text or its `Rejected`, the id its output row and rejects line carry)."""
    raw = raw.removesuffix(b"\r")
    if index == 0 and raw.startswith(BOM):
        raw = raw[len(BOM):]
    try:
        value, problem = parse_json(raw.decode("utf-8", "surrogateescape")), None
    except JSONProblem as error:
        value, problem = None, error
    record_id = id_text(value.get("id")) if isinstance(value, dict) else None
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Rejected(INVALID_UTF8), record_id
    if "\0" in content:
        return Rejected(NUL_CHARACTER), None  # a raw NUL byte: no JSON text
    if "\r" in content:
        return Rejected(CARRIAGE_RETURN), record_id  # (JSON whitespace may hold it: its id can still be read)
    if not content.strip():
        return Rejected(EMPTY_LINE), None
    if problem is not None and problem.duplicate:
        return Rejected(DUPLICATE_KEY), None
    if not isinstance(value, dict):
        return Rejected(BROKEN_JSON), None
    text = value.get("text")
    if not isinstance(text, str):
        return Rejected(MISSING_TEXT), record_id
    if not text.strip():
        return Rejected(EMPTY_TEXT), record_id
    if any("\ud800" <= c <= "\udfff" for c in text):  # a lone surrogate, which no UTF-8 writer takes
        return Rejected(INVALID_UTF8), record_id
    if "\0" in text:
        return Rejected(NUL_CHARACTER), record_id
    if value.get("id") is None:
        return Rejected(MISSING_ID), None
    if record_id is None:
        return Rejected(INVALID_UTF8 if isinstance(value["id"], str) else INVALID_ID), None
    if value.get("meta") == "\udc80":
        return Rejected(INVALID_UTF8), record_id
    return text, record_id


@given(items=st.lists(st.one_of(record, raw_bytes, st.sampled_from(ODD_LINES)), max_size=30), bom=st.booleans())
@example(items=[b"\x00\x00\xfe\xff"], bom=False)  # random bytes that start as UTF-32 text does
@example(items=[{"id": "a", "text": "first"}, *ODD_LINES[-4:], {"id": 2, "text": "last"}], bom=True)
def test_jsonl_every_record_is_calibrated_or_rejected_in_place_with_its_id(tmp_path_factory, items, bom):
    """Duplicate ids are all kept, each on its own row; an id that is not a string is its JSON
    text (never a Python repr), NaN and Infinity are rejects; a rejected row keeps its id wherever
    it can be read, in the parquet output and in its rejects line."""
    folder = tmp_path_factory.mktemp("jsonl")
    lines = [jsonl_line(item) for item in items]
    data = (BOM if bom else b"") + b"\n".join(lines) + b"\n"
    (folder / "c.jsonl").write_bytes(data)
    if refused_as_another_encoding(folder / "c.jsonl", data, folder / "out.parquet", id_field="id"):
        return
    rejects = run_job(folder / "c.jsonl", folder / "out.parquet", id_field="id", keep_columns=["meta"])
    expected, ids = zip(*[jsonl_oracle(line, index) for index, line in enumerate(data.split(b"\n")[:-1])])
    table = pq.read_table(folder / "out.parquet")
    vectors = np.array([v if v is not None else [np.nan] * DIM for v in table.column("embedding").to_pylist()],
                       dtype=np.float32).reshape(-1, DIM)
    check_rows(vectors, rejects, list(expected), lines=list(range(1, len(expected) + 1)))
    assert table.column("id").to_pylist() == list(ids)
    assert {row: reject.get("id") for row, reject in rejects.items()} == {row: ids[row] for row in rejects}


@given(records=st.lists(st.tuples(odd_text, odd_text), max_size=30),
       dialect=st.sampled_from([("\r\n", csv.QUOTE_MINIMAL), ("\n", csv.QUOTE_ALL), ("\r\n", csv.QUOTE_ALL)]),
       bom=st.booleans())
def test_csv_quoted_fields_with_newlines_and_quotes_round_trip_row_by_row(tmp_path_factory, records, dialect, bom):
    """(QUOTE_MINIMAL with a "\n" terminator leaves a lone "\r" unquoted, which no reader can tell
    from a line break: such files are broken records, covered by the random-body test below.)"""
    folder = tmp_path_factory.mktemp("csv")
    buffer = io.StringIO()
    terminator, quoting = dialect
    writer = csv.writer(buffer, lineterminator=terminator, quoting=quoting)
    writer.writerow(["id", "text"])
    writer.writerows(records)
    data = (BOM if bom else b"") + buffer.getvalue().encode("utf-8", "surrogatepass")
    (folder / "c.csv").write_bytes(data)
    rejects = run_job(folder / "c.csv", folder / "out.npy", id_field="id")
    expected = []
    for record_id, text in records:
        if "\0" in record_id + text:  # a line with a NUL byte is rejected whole
            expected.append(Rejected(NUL_CHARACTER))
        elif not record_id.strip() and not text.strip():
            expected.append(Rejected(EMPTY_LINE))
        elif not text.strip():
            expected.append(Rejected(EMPTY_TEXT))
        else:
            expected.append(text)
    check_rows(np.load(folder / "out.npy"), rejects, expected, lines=None)


CSV_PIECES = [b'"unterminated', b'a,"b""c",d', b"\x00,\x00", b'1,"two\nlines"', b'1,"closed" then text', b'"', b'""',
              b'1,"' + HUGE.encode(), b'1,"' + HUGE.encode() + b'"', b"1,a\x00b", b'1,"a\x00\nb"']


@given(body=st.lists(st.one_of(raw_bytes, st.sampled_from(CSV_PIECES)), max_size=20), span=st.sampled_from([64, None]))
def test_csv_with_a_random_body_accounts_for_every_line(tmp_path_factory, body, span):
    """Unclosed quotes (also around a 1 MB field, also past the span limit), quotes inside fields,
    NUL bytes, random bytes: every row is calibrated or rejected in place, and every line of the
    file belongs to exactly one row: an unclosed quote never swallows the lines after it."""
    import flowcore.batch.text_sources as text_sources

    folder = tmp_path_factory.mktemp("csvbody")
    data = b"id,text\n" + b"\n".join(body)
    (folder / "c.csv").write_bytes(data)
    saved = text_sources.CSV_SPAN_BYTES
    text_sources.CSV_SPAN_BYTES = span or saved
    try:
        corpus = TextCorpus(folder / "c.csv")
        rows = [(entry, end) for entry, end in corpus._csv_rows(Position(0))]
        rejects = run_job(folder / "c.csv", folder / "out.npy")
    finally:
        text_sources.CSV_SPAN_BYTES = saved
    vectors = np.load(folder / "out.npy")
    assert len(vectors) == corpus.rows == len(rows)
    assert all(reject["reason"] in {BROKEN_CSV, INVALID_UTF8, NUL_CHARACTER, EMPTY_LINE, EMPTY_TEXT, MISSING_TEXT}
               for reject in rejects.values())
    for row in range(len(vectors)):
        assert np.isnan(vectors[row]).all() == (row in rejects)
    lines = len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)
    ends = [position.line for _, position in rows]
    assert ends == sorted(ends) and (not ends or ends[-1] == lines)  # rows tile the file's lines, in order
    firsts = [entry.line for entry, _ in rows]
    assert all(first == (ends[i - 1] if i else 1) + 1 for i, first in enumerate(firsts))


@given(lines=st.lists(odd_text, max_size=20), encoding=st.sampled_from(["utf-16", "utf-32", "utf-16-le", "utf-16-be"]),
       suffix=st.sampled_from([".txt", ".jsonl", ".csv"]))
def test_utf16_and_utf32_text_is_refused_whole_or_rejected_line_by_line(tmp_path_factory, lines, encoding, suffix):
    """A file that starts with a UTF-16/UTF-32 byte-order mark is refused in one line naming it
    and its encoding; without the mark (UTF-16-LE/BE) its lines hold NUL bytes and are rejected
    (or, where a line happens to be UTF-8 without a NUL, read as that text), never shifted."""
    folder = tmp_path_factory.mktemp("utf16")
    path = folder / f"c{suffix}"
    data = "\n".join(lines).encode(encoding, "surrogatepass") + "\n".encode(encoding)[-2 if "16" in encoding else -4:]
    path.write_bytes(data)
    if refused_as_another_encoding(path, data, folder / "out.npy"):
        return
    if suffix != ".txt":
        try:
            corpus = TextCorpus(path)
        except ValueError as error:  # a header that is not one: refused naming the file
            assert str(error).startswith(str(path)) and "\n" not in str(error)
            return
        rejects = run_job(path, folder / "out.npy")
        vectors = np.load(folder / "out.npy")
        assert len(vectors) == corpus.rows
        assert all(np.isnan(vectors[row]).all() == (row in rejects) for row in range(len(vectors)))
        return
    rejects = run_job(path, folder / "out.npy")
    expected = txt_oracle(data)
    check_rows(np.load(folder / "out.npy"), rejects, expected, lines=list(range(1, len(expected) + 1)))


@given(texts=st.lists(st.one_of(odd_text, st.none(), st.binary(max_size=8)), max_size=40),
       ids=st.lists(st.sampled_from(["x", "y", None]), min_size=40, max_size=40))
def test_parquet_text_values_of_every_kind_are_calibrated_or_rejected_in_place(tmp_path_factory, texts, ids):
    folder = tmp_path_factory.mktemp("parquet")
    as_bytes = [t if isinstance(t, bytes) or t is None else t.encode("utf-8", "surrogatepass") for t in texts]
    pq.write_table(pa.table({"text": pa.array(as_bytes, pa.binary()), "id": ids[:len(texts)]}),
                   folder / "c.parquet", row_group_size=7)
    rejects = run_job(folder / "c.parquet", folder / "out.npy", id_field="id")
    expected = []
    for value, record_id in zip(as_bytes, ids):
        try:
            text = None if value is None else value.decode("utf-8")
        except UnicodeDecodeError:
            expected.append(Rejected(INVALID_UTF8))
            continue
        if text is None:
            expected.append(Rejected(MISSING_TEXT))
        elif not text.strip():
            expected.append(Rejected(EMPTY_TEXT))
        elif "\0" in text:
            expected.append(Rejected(NUL_CHARACTER))
        elif record_id is None:
            expected.append(Rejected(MISSING_ID))
        else:
            expected.append(text)
    check_rows(np.load(folder / "out.npy"), rejects, expected, lines=None)


@given(data=st.binary(max_size=300), suffix=st.sampled_from([".parquet", ".csv"]))
def test_random_bytes_as_a_structured_corpus_are_refused_in_one_line_naming_the_file(tmp_path_factory, data, suffix):
    folder = tmp_path_factory.mktemp("random")
    path = folder / f"c{suffix}"
    path.write_bytes(data)
    try:
        run_job(path, folder / "out.npy")
    except (ValueError, OSError) as error:
        message = str(error)
        assert message.startswith(str(path)) and "\n" not in message, message
    else:
        assert suffix == ".csv"  # a header with a text column: the body is then read row by row


def test_a_truncated_parquet_corpus_is_refused_naming_the_file(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"] * 50}), tmp_path / "c.parquet")
    data = (tmp_path / "c.parquet").read_bytes()
    (tmp_path / "c.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"c.parquet: not a readable parquet file"):
        TextCorpus(tmp_path / "c.parquet")

"""Text sources: every row keeps its place, every bad row becomes a reject with its line/row
number and reason, reading resumes exactly from any chunk boundary, and txt/jsonl follow the one
line policy of `flowcore._lines`."""
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowcore.batch.rows import (
    BROKEN_CSV,
    BROKEN_JSON,
    CARRIAGE_RETURN,
    EMPTY_LINE,
    EMPTY_TEXT,
    INVALID_UTF8,
    MISSING_ID,
    MISSING_TEXT,
)
from flowcore.batch.text_sources import TextCorpus, read_texts, sample_texts

TXT = b"first sentence\n\n   \nbad \xff byte\r\nsecond sentence\r\nno final newline"
JSONL = (b'{"text": "alpha", "id": 7}\n'
         b'{"text": "broken\n'
         b'{"title": "no text"}\n'
         b'["not", "an", "object"]\n'
         b'{"text": ""}\n'
         b'\n'
         b'{"text": "caf\xc3\x28"}\n'
         b'{"text": 12}\n'
         b'{"text": "no id"}\n'
         b'{"text": "omega", "id": "z9"}\n')
CSV = (b'id,text\n'
       b'1,hello\n'
       b'2,"two\nlines"\n'
       b'\n'
       b'3,\n'
       b'4,bad\xff\n'
       b'5\n'
       b'6,a\rb\n'
       b'7,fine\n')


def write(tmp_path, name, content: bytes):
    path = tmp_path / name
    path.write_bytes(content)
    return path


def outcomes(corpus):
    return [(entry.row, entry.line, entry.id, entry.text, entry.reject and entry.reject.reason)
            for entry, _ in corpus.entries()]


def test_txt_rows_keep_their_place_and_bad_lines_are_rejected(tmp_path):
    corpus = TextCorpus(write(tmp_path, "c.txt", TXT))
    assert outcomes(corpus) == [
        (0, 1, None, "first sentence", None),
        (1, 2, None, None, EMPTY_LINE),
        (2, 3, None, None, EMPTY_LINE),
        (3, 4, None, None, INVALID_UTF8),
        (4, 5, None, "second sentence", None),
        (5, 6, None, "no final newline", None),
    ]
    assert corpus.rows == 6


def test_jsonl_rejects_each_kind_of_bad_record(tmp_path):
    corpus = TextCorpus(write(tmp_path, "c.jsonl", JSONL), id_field="id")
    assert outcomes(corpus) == [
        (0, 1, "7", "alpha", None),
        (1, 2, None, None, BROKEN_JSON),
        (2, 3, None, None, MISSING_TEXT),
        (3, 4, None, None, BROKEN_JSON),
        (4, 5, None, None, EMPTY_TEXT),
        (5, 6, None, None, EMPTY_LINE),
        (6, 7, None, None, INVALID_UTF8),
        (7, 8, None, None, MISSING_TEXT),
        (8, 9, None, None, MISSING_ID),
        (9, 10, "z9", "omega", None),
    ]
    assert corpus.rows == 10
    details = {entry.row: entry.reject.detail for entry, _ in corpus.entries() if entry.reject}
    assert "expected a JSON object" in details[3] and "int" in details[7]


def test_csv_handles_quoted_newlines_and_rejects_bad_records(tmp_path):
    corpus = TextCorpus(write(tmp_path, "c.csv", CSV), id_field="id")
    assert outcomes(corpus) == [
        (0, 2, "1", "hello", None),
        (1, 3, "2", "two\nlines", None),
        (2, 5, None, None, EMPTY_LINE),
        (3, 6, "3", None, EMPTY_TEXT),  # a rejected row keeps the id it holds
        (4, 7, "4", None, INVALID_UTF8),
        (5, 8, "5", None, MISSING_TEXT),
        (6, 9, None, None, BROKEN_CSV),
        (7, 10, "7", "fine", None),
    ]
    assert corpus.rows == 8


def test_csv_without_the_text_column_is_refused_with_its_columns(tmp_path):
    with pytest.raises(ValueError, match=r"no text column 'sentence'.*id, text"):
        TextCorpus(write(tmp_path, "c.csv", CSV), text_field="sentence")


def test_parquet_text_rejects_nulls_and_empty_values(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a", None, "", "b"], "id": [1, 2, 3, None]}), path, row_group_size=3)
    corpus = TextCorpus(path, id_field="id")
    assert outcomes(corpus) == [(0, None, "1", "a", None), (1, None, "2", None, MISSING_TEXT),
                                (2, None, "3", None, EMPTY_TEXT), (3, None, None, None, MISSING_ID)]
    assert corpus.rows == 4
    with pytest.raises(ValueError, match="no text column 'body'"):
        TextCorpus(path, text_field="body")


def test_txt_has_no_id_field_and_unknown_formats_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--id-field"):
        TextCorpus(write(tmp_path, "c.txt", TXT), id_field="id")
    with pytest.raises(ValueError, match="unsupported file type '.xml'"):
        TextCorpus(write(tmp_path, "c.xml", b"<a/>"))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        TextCorpus(tmp_path / "missing.txt")


def _parquet_corpus(tmp_path):
    path = tmp_path / "c.parquet"
    texts = [f"sentence {i}" if i % 5 else None for i in range(23)]
    pq.write_table(pa.table({"text": texts, "id": list(range(23))}), path, row_group_size=4)
    return path


@pytest.mark.parametrize("name", ["c.txt", "c.jsonl", "c.csv", "c.parquet"])
@pytest.mark.parametrize("chunk_rows", [1, 3, 4])
def test_reading_resumes_exactly_at_every_chunk_boundary(tmp_path, name, chunk_rows):
    content = {"c.txt": TXT, "c.jsonl": JSONL, "c.csv": CSV}
    path = _parquet_corpus(tmp_path) if name == "c.parquet" else write(tmp_path, name, content[name])
    corpus = TextCorpus(path, id_field=None if name == "c.txt" else "id")
    chunks = list(corpus.chunks(chunk_rows))
    assert sum(chunk.rows for chunk in chunks) == corpus.rows
    assert [chunk.index for chunk in chunks] == list(range(len(chunks)))

    def summary(chunk):
        return chunk.index, chunk.row_start, chunk.texts, chunk.ids, chunk.rejects, chunk.end

    for done, chunk in enumerate(chunks):
        resumed = list(TextCorpus(path, id_field=corpus.id_field).chunks(chunk_rows, chunk.end))
        assert [summary(c) for c in resumed] == [summary(c) for c in chunks[done + 1:]]


def test_read_texts_yields_good_rows_and_collects_rejects(tmp_path):
    rejects = []
    rows = list(read_texts(write(tmp_path, "c.jsonl", JSONL), id_field="id", rejects=rejects))
    assert rows == [(0, "7", "alpha"), (9, "z9", "omega")]
    assert [r.row for r in rejects] == list(range(1, 9))
    assert json.loads(json.dumps(rejects[0].to_json())) == {
        "row": 1, "line": 2, "reason": BROKEN_JSON, "detail": rejects[0].detail}


def test_sample_texts_is_reproducible_uniform_and_in_file_order(tmp_path):
    path = write(tmp_path, "c.txt", "".join(f"s{i}\n" for i in range(20)).encode() + b"\n")
    sample = sample_texts(path, 5, seed=3)
    assert sample == sample_texts(path, 5, seed=3)
    assert len(sample) == 5 and len(set(sample)) == 5
    assert sample == sorted(sample, key=lambda text: int(text[1:]))
    assert sample_texts(path, 50, seed=0) == sample_texts(path, None) == [f"s{i}" for i in range(20)]
    rejects = []
    sample_texts(path, 5, rejects=rejects)
    assert [(r.row, r.reason) for r in rejects] == [(20, EMPTY_LINE)]
    picked = Counter(text for seed in range(400) for text in sample_texts(path, 5, seed=seed))
    assert len(picked) == 20
    assert all(0.15 < count / 400 < 0.35 for count in picked.values())  # each kept with p = 5/20
    with pytest.raises(ValueError, match="max_rows"):
        sample_texts(path, 0)


def test_txt_and_jsonl_follow_the_one_line_policy(tmp_path):
    """`flowcore._lines`: a leading byte-order mark and each line's ending are dropped; U+2028 inside a
    line is text; a "\\r" inside a line (which may end one) is a reject, neither text nor a split."""
    corpus = TextCorpus(write(tmp_path, "c.txt", b"\xef\xbb\xbffirst\r\n" + "a\u2028b\n".encode() + b"x\ry\r\n"))
    assert [entry.text for entry, _ in corpus.entries()] == ["first", "a\u2028b", None]
    assert [entry.reject.reason for entry, _ in corpus.entries() if entry.reject] == [CARRIAGE_RETURN]
    corpus = TextCorpus(write(tmp_path, "c.jsonl", b'\xef\xbb\xbf{"text": "alpha"}\r\n{"text": "beta"}'))
    assert [entry.text for entry, _ in corpus.entries()] == ["alpha", "beta"]
    assert corpus.rows == 2

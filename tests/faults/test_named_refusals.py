"""Inputs and outputs a command cannot use are refused in one line that names the file and the
cause, exit 2, before any work: an output that is an existing directory (or, for a folder output,
an existing file), an input that is a folder or a named pipe, UTF-16/UTF-32 text, a .npy header
with a negative shape. What can be used is used alike everywhere: a big-endian .npy fits as it
calibrates; an unclosed CSV quote rejects one row with its line and loses none; NUL-bearing lines
are rejects; jsonl ids are written as text a user can match, on rejected rows too."""
import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from faults_support import DIM

from flowcore import FlowCalibrator
from flowcore.batch.job import CalibrationJob
from flowcore.batch.rows import (
    BROKEN_CSV,
    BROKEN_JSON,
    CARRIAGE_RETURN,
    DUPLICATE_KEY,
    INVALID_ID,
    LINE_TOO_LONG,
    NUL_CHARACTER,
)
from flowcore.batch.text_sources import TextCorpus
from flowcore.cli import main


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"flowcore {command}: error: "), err
    return err


@pytest.fixture
def inputs(tmp_path, flow_path):
    (tmp_path / "corpus.txt").write_text("a cat\nthe dog\n")
    np.save(tmp_path / "vectors.npy", np.random.default_rng(0).normal(size=(300, DIM)).astype(np.float32))
    (tmp_path / "sts").mkdir()
    return {"flow": str(flow_path), "txt": str(tmp_path / "corpus.txt"), "npy": str(tmp_path / "vectors.npy"),
            "sts": str(tmp_path / "sts")}


# (the command, its arguments with OUT where the output goes, whether OUT is a folder)
WRITERS = {
    "encode": (["encode", "--input", "{txt}", "--out", "OUT"], False),
    "fit": (["fit", "--embeddings", "{npy}", "--out", "OUT", "--calibration", "flow", "--config", "l2_d2_w32",
             "--epochs", "1"], False),
    "calibrate": (["calibrate", "--calibrator", "{flow}", "--embeddings", "{npy}", "--out", "OUT"], False),
    "sts": (["sts", "--data-dir", "{sts}", "--json", "OUT"], False),
    "calibrate-ray": (["calibrate", "--engine", "ray", "--calibrator", "{flow}", "--embeddings", "{npy}", "--out",
                       "OUT"], True),
    "export": (["export", "--calibrator", "{flow}", "--out", "OUT"], True),
    "analyze": (["analyze", "--embeddings", "{npy}", "--out", "OUT"], True),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writing_command_checks_its_output_before_any_work(writer, inputs, tmp_path, capsys):
    """A file output that is an existing directory, or a folder output that is an existing file,
    is one line naming it, exit 2, and nothing is written or loaded."""
    argv, folder = WRITERS[writer]
    out = tmp_path / "taken"
    if folder:
        out.write_text("keep me")
    else:
        out.mkdir()
    before = sorted(os.listdir(tmp_path))
    assert main([part.format(**inputs).replace("OUT", str(out)) for part in argv]) == 2
    error = one_line_error(capsys, argv[0])
    assert str(out) in error and ("is an existing file" if folder else "is a directory") in error
    assert sorted(os.listdir(tmp_path)) == before
    assert (out.read_text() == "keep me") if folder else os.listdir(out) == []


@pytest.mark.parametrize("kind", ["folder", "fifo"])
@pytest.mark.parametrize("command", ["calibrate", "calibrate-calibrator", "encode", "fit", "analyze",
                                     "sts-calibrator"])
def test_an_input_that_is_a_folder_or_a_pipe_is_named_as_such(kind, command, flow_path, tmp_path, capsys):
    source = tmp_path / "corpus.txt"
    if kind == "folder":
        source.mkdir()
    else:
        os.mkfifo(source)
    np.save(tmp_path / "v.npy", np.zeros((4, DIM), np.float32))
    (tmp_path / "sts").mkdir()
    argv = {"calibrate": ["calibrate", "--calibrator", str(flow_path), "--input", str(source), "--out",
                          str(tmp_path / "out.npy")],
            "calibrate-calibrator": ["calibrate", "--calibrator", str(source), "--embeddings", str(tmp_path / "v.npy"),
                                     "--out", str(tmp_path / "out.npy")],
            "encode": ["encode", "--input", str(source), "--out", str(tmp_path / "out.npy")],
            "fit": ["fit", "--input", str(source), "--out", str(tmp_path / "m.flow")],
            "analyze": ["analyze", "--input", str(source), "--out", str(tmp_path / "analysis")],
            "sts-calibrator": ["sts", "--calibrator", str(source), "--data-dir", str(tmp_path / "sts")]}[command]
    assert main(argv) == 2
    error = one_line_error(capsys, command.split("-")[0])
    assert "not found" not in error
    assert (f"{source} is a folder" if kind == "folder" else f"{source} is a named pipe (FIFO)") in error


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_utf16_and_utf32_text_is_refused_in_one_line_naming_the_encoding(encoding, suffix, flow_path, tmp_path,
                                                                         capsys):
    body = {".txt": "a cat\nthe dog\n", ".jsonl": '{"text": "a cat"}\n', ".csv": "text\na cat\n"}[suffix]
    data = body.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data  # its byte-order mark, as editors write it
    source = tmp_path / f"c{suffix}"
    source.write_bytes(data)
    out = tmp_path / "out.npy"
    assert main(["calibrate", "--calibrator", str(flow_path), "--input", str(source), "--out", str(out)]) == 2
    error = one_line_error(capsys, "calibrate")
    assert f"{source}: starts with a {encoding[:6].upper()}" in error and "flowcore reads UTF-8" in error
    assert not out.exists()


def test_utf16_text_is_refused_by_encode_too(tmp_path, capsys):
    (tmp_path / "c.txt").write_bytes("a cat\n".encode("utf-16"))
    assert main(["encode", "--input", str(tmp_path / "c.txt"), "--out", str(tmp_path / "e.npy")]) == 2
    assert "starts with a UTF-16 (little-endian) byte-order mark" in one_line_error(capsys, "encode")


def run_text_job(path, out, seen: list | None = None, **options):
    """The local job over the text corpus `path` with an identity flow and a stand-in encoder (a
    vector fixed by each text; the texts it is given go to `seen`); returns (its summary, its rejects)."""
    def encode(texts):
        (seen if seen is not None else []).extend(texts)
        return np.stack([np.random.default_rng(len(text)).normal(size=DIM) for text in texts]).astype(np.float32)

    summary = CalibrationJob(TextCorpus(path, **options), out, lambda x: x, DIM, encode=encode, chunk_rows=16,
                             show_progress_bar=False).run()
    return summary, [json.loads(line) for line in open(f"{out}.rejects.jsonl", encoding="utf-8")]


def test_lines_holding_nul_bytes_are_rejects_never_vectors(tmp_path):
    """A line of NULs, or UTF-16 text without a byte-order mark, is a reject with its line."""
    source = tmp_path / "c.txt"
    source.write_bytes(b"a cat\n\x00\x00\x00\n" + "the dog".encode("utf-16-le") + b"\nred house\n")
    summary, rejects = run_text_job(source, tmp_path / "out.npy")
    assert [(r["row"], r["line"], r["reason"]) for r in rejects] == [(1, 2, NUL_CHARACTER), (2, 3, NUL_CHARACTER)]
    assert "UTF-16 text?" in rejects[1]["detail"]
    assert summary.rejects == {NUL_CHARACTER: 2}
    result = np.load(tmp_path / "out.npy")
    assert np.isnan(result[[1, 2]]).all() and np.isfinite(result[[0, 3]]).all()


def test_an_unclosed_csv_quote_rejects_its_row_with_its_line_and_loses_none(tmp_path):
    """1,000 rows, one with an unclosed quote: 1,000 rows counted, that one rejected as broken CSV
    naming its line, every other id in place."""
    rows = [f'{i},"sentence {i}"' for i in range(1000)]
    rows[500] = '500,"an unclosed quote'
    (tmp_path / "c.csv").write_text("id,text\n" + "\n".join(rows) + "\n")
    summary, rejects = run_text_job(tmp_path / "c.csv", tmp_path / "out.parquet", id_field="id")
    assert summary.rows == 1000 and summary.rejects == {BROKEN_CSV: 1}
    assert [(r["row"], r["line"], r["reason"]) for r in rejects] == [(500, 502, BROKEN_CSV)]
    assert "unclosed quote" in rejects[0]["detail"]
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == [str(i) if i != 500 else None for i in range(1000)]


def test_jsonl_ids_are_json_text_and_rejected_rows_keep_theirs(tmp_path):
    lines = [{"id": {"doc": 7, "part": [1, 2]}, "text": "a cat"}, {"id": 3, "text": ""}, {"id": 1.5, "text": "a dog"},
             {"id": True, "text": "red"}]
    source = tmp_path / "c.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"id": NaN, "text": "x"}\n'
                      '{"id": 1e999, "text": "y"}\n{"id": "k", "text": "a\\u0000b"}\n')
    _, rejects = run_text_job(source, tmp_path / "out.parquet", id_field="id")
    ids = pq.read_table(tmp_path / "out.parquet").column("id").to_pylist()
    assert ids == ['{"doc":7,"part":[1,2]}', "3", "1.5", "true", None, None, "k"]
    rejects = {r["row"]: r for r in rejects}
    assert {row: (r.get("id"), r["reason"]) for row, r in rejects.items()} == {
        1: ("3", "empty text"), 4: (None, INVALID_ID), 5: (None, INVALID_ID), 6: ("k", NUL_CHARACTER)}


def test_a_big_endian_npy_fits_as_it_calibrates(tmp_path, flow_path, capsys):
    matrix = np.random.default_rng(0).normal(size=(300, DIM)).astype(">f4")
    np.save(tmp_path / "big.npy", matrix)
    assert main(["fit", "--embeddings", str(tmp_path / "big.npy"), "--out", str(tmp_path / "m.flow"),
                 "--calibration", "flow", "--config", "l2_d2_w32", "--epochs", "1", "--quiet"]) == 0, \
        capsys.readouterr().err
    assert main(["calibrate", "--calibrator", str(tmp_path / "m.flow"), "--embeddings", str(tmp_path / "big.npy"),
                 "--out", str(tmp_path / "out.npy"), "--quiet"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"),
                               FlowCalibrator.load(tmp_path / "m.flow").transform(matrix.astype("<f4")), atol=1e-5)


def test_a_negative_shape_in_an_npy_header_is_named(tmp_path, flow_path, capsys):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (-3, DIM)})
    (tmp_path / "neg.npy").write_bytes(header.getvalue() + b"\0" * (4 * DIM * 3))
    assert main(["calibrate", "--calibrator", str(flow_path), "--embeddings", str(tmp_path / "neg.npy"), "--out",
                 str(tmp_path / "out.npy")]) == 2
    assert f"{tmp_path / 'neg.npy'}: not a readable .npy file" in one_line_error(capsys, "calibrate")
    assert main(["fit", "--embeddings", str(tmp_path / "neg.npy"), "--out", str(tmp_path / "m.flow")]) == 2
    error = one_line_error(capsys, "fit")
    assert "neg.npy" in error and "negative" in error


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_a_line_longer_than_the_line_limit_is_read_in_bounded_memory(suffix, tmp_path, monkeypatch):
    """Past `defaults.LINE_BYTES` a line is skipped as it is read: plain text keeps its start
    (cut at a character boundary, more than an encoder reads), a jsonl or CSV record is rejected
    as `line too long` with its line; the rows after it are read as ever, and memory holds only
    the kept start whatever the line's length."""
    import tracemalloc

    from flowcore import defaults
    from flowcore._lines import iter_lines

    monkeypatch.setattr(defaults, "LINE_BYTES", 1 << 16)
    huge = "wé " * 2_000_000  # 8 MB on one line
    body = {".txt": f"a cat\n{huge}\nred\n", ".csv": f'text\na cat\n"{huge}"\nred\n',
            ".jsonl": f'{{"text": "a cat"}}\n{{"text": "{huge}"}}\n{{"text": "red"}}\n'}[suffix]
    path = tmp_path / f"c{suffix}"
    path.write_text(body, encoding="utf-8")
    seen = []
    summary, rejects = run_text_job(path, tmp_path / "out.npy", seen)
    assert summary.rows == 3
    if suffix == ".txt":
        assert rejects == [] and seen[0] == "a cat" and seen[2] == "red"
        assert huge.startswith(seen[1]) and (1 << 16) - 2 <= len(seen[1].encode()) <= (1 << 16) + 2
    else:
        assert [(r["row"], r["line"], r["reason"]) for r in rejects] == [(1, 2 + (suffix == ".csv"), LINE_TOO_LONG)]
        assert "longer than 65,536 bytes" in rejects[0]["detail"] and seen == ["a cat", "red"]
    if suffix == ".txt":
        tracemalloc.start()
        lines = [len(line.text) for line in iter_lines(path)]
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert lines[0] == 5 and peak < 2 << 20  # never the whole 8 MB line


@pytest.mark.parametrize("suffix, body", [(".txt", "one\rtwo\rthree\rfour\rfive\r"),
                                          (".jsonl", '{"text": "one"}\r{"text": "two"}\r'),
                                          (".csv", "text\rone\rtwo\r")])
def test_lone_cr_line_ends_are_refused_never_merged_into_one_row(suffix, body, tmp_path, flow_path, capsys):
    source = tmp_path / f"c{suffix}"
    source.write_text(body, newline="")
    expected = (f"{source}: line 1 ends in a lone carriage return (\\r, classic Mac OS line ends); flowcore reads "
                "lines ending in \\n or \\r\\n and never merges or splits them otherwise: convert it first (e.g. "
                "tr '\\r' '\\n')")
    if suffix == ".txt":
        assert main(["encode", "--input", str(source), "--out", str(tmp_path / "e.npy")]) == 2
        assert one_line_error(capsys, "encode") == f"flowcore encode: error: {expected}"
        assert not (tmp_path / "e.npy").exists()
    with pytest.raises(ValueError) as refused:
        run_text_job(source, tmp_path / "out.npy")
    assert str(refused.value) == expected


def test_a_carriage_return_inside_a_line_is_a_reject_never_a_split(tmp_path):
    source = tmp_path / "c.txt"
    source.write_bytes(b"a cat\r\nthe dog\rran away\nred house\n")
    summary, rejects = run_text_job(source, tmp_path / "out.npy")
    assert summary.rows == 3 and [(r["row"], r["line"], r["reason"]) for r in rejects] == [(1, 2, CARRIAGE_RETURN)]
    assert rejects[0]["detail"] == "holds a carriage return (byte 7 of the line), which may end a line: it is not " \
                                   "split there"


def test_a_cr_inside_an_unquoted_csv_field_is_named_as_such(tmp_path):
    (tmp_path / "c.csv").write_bytes(b'id,text\n1,"a cat"\n2,the dog\rran\n3,red\n')
    summary, rejects = run_text_job(tmp_path / "c.csv", tmp_path / "out.npy", id_field="id")
    assert summary.rows == 3 and [(r["row"], r["reason"]) for r in rejects] == [(1, BROKEN_CSV)]
    assert rejects[0]["detail"] == "a carriage return (\\r) inside an unquoted field; quote the field or remove the \\r"


def test_a_jsonl_number_past_the_digit_limit_is_one_rejected_row_and_the_job_finishes(tmp_path, flow_path):
    source = tmp_path / "c.jsonl"
    source.write_text('{"id": 1, "text": "a cat"}\n{"id": ' + "9" * 5000 + ', "text": "the dog"}\n'
                      '{"id": 3, "text": "red house"}\n{"id": 4, "text": "' + "[" * 10 + '", "n": '
                      + "[" * 100_000 + "]" * 100_000 + "}\n")
    for attempt in range(2):  # and a rerun is no different
        summary, rejects = run_text_job(source, tmp_path / "out.parquet", id_field="id")
        assert summary.rows == 4 and summary.rejects == {BROKEN_JSON: 2}
        assert [(r["row"], r["line"], r["detail"]) for r in rejects] == [
            (1, 2, "invalid number: an integer of more than 4,300 digits"), (3, 4, "nested too deeply")]
        assert pq.read_table(tmp_path / "out.parquet").column("id").to_pylist() == ["1", None, "3", None]


def test_duplicate_json_keys_reject_the_row_naming_the_key(tmp_path):
    source = tmp_path / "c.jsonl"
    source.write_text('{"id": 1, "text": "a cat"}\n{"id": 2, "text": "the dog", "text": "a cat"}\n')
    summary, rejects = run_text_job(source, tmp_path / "out.npy", id_field="id")
    assert summary.rejects == {DUPLICATE_KEY: 1}
    assert [(r["row"], r["line"], r["detail"]) for r in rejects] == [(1, 2, "duplicate key 'text'")]


@pytest.mark.parametrize("header, options, column", [("text,id,text", {}, "text"),
                                                     ("text,id,id", {"id_field": "id"}, "id"),
                                                     ("text,m,m", {"keep_columns": ["m"]}, "m")])
def test_duplicate_csv_header_names_that_are_read_are_refused(tmp_path, header, options, column):
    (tmp_path / "c.csv").write_text(f"{header}\na,1,b\n")
    with pytest.raises(ValueError) as refused:
        TextCorpus(tmp_path / "c.csv", **options)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'c.csv'}: ") and f"columns are named {column!r}" in message
    assert "\n" not in message
    (tmp_path / "ok.csv").write_text("text,x,x\na,1,2\n")  # a repeated column that is not read is no problem
    assert run_text_job(tmp_path / "ok.csv", tmp_path / "ok.npy")[0].rows == 1


@pytest.mark.parametrize("skip_bad", [False, True])
@pytest.mark.parametrize("bad", ['{"s1": "a", "s2": "b", "score": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                 '{"s1": "a", "s2": "b", "score": 1, "n": ' + "9" * 5000 + "}",
                                 '{"s1": "a", "s2": "b", "s2": "c", "score": 1}'])
def test_hostile_json_in_pairs_is_a_bad_line(tmp_path, bad, skip_bad):
    from flowcore.sts.data import STSDataError
    from flowcore.sts.pairs import load_pairs

    lines = ['{"s1": "a cat", "s2": "a dog", "score": 1}', bad, '{"s1": "x", "s2": "y", "score": 2}',
             '{"s1": "z", "s2": "w", "score": 3}']
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    if skip_bad:
        assert load_pairs(tmp_path / "p.jsonl", skip_bad=True).skipped_lines == 1
        return
    with pytest.raises(STSDataError) as refused:
        load_pairs(tmp_path / "p.jsonl")
    assert str(refused.value).startswith(f"{tmp_path / 'p.jsonl'}:2: ") and "\n" not in str(refused.value)


def test_duplicate_pairs_header_columns_are_refused(tmp_path):
    from flowcore.sts.data import STSDataError
    from flowcore.sts.pairs import load_pairs

    (tmp_path / "p.csv").write_text("sentence1,sentence2,score,score\na,b,1,2\nc,d,2,3\n")
    with pytest.raises(STSDataError, match=r"p.csv:1: 2 columns are named 'score'"):
        load_pairs(tmp_path / "p.csv")

"""`flowcore encode`: one row per line (or per corpus row), clear errors, the line-reading policy for bad UTF-8,
--normalize."""
import json

import numpy as np
import pytest

from flowcore.text.encoder import Encoder


def _run_encode_cli(argv):
    from flowcore.cli import main

    return main(["encode", *argv])


def test_cli_encode_writes_one_row_per_line(tiny_bert, tmp_path, capsys):
    lines = ["the cat sat", "", "a dog ran fast", "the cat sat"]
    (tmp_path / "sents.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "emb.npy"
    status = _run_encode_cli(["--input", str(tmp_path / "sents.txt"), "--out", str(out), "--model", tiny_bert,
                              "--pooling", "mean", "--batch-size", "2", "--max-length", "16"])
    assert status == 0
    written = np.load(out)
    np.testing.assert_allclose(written, Encoder(tiny_bert, pooling="mean").encode(lines), rtol=1e-5, atol=1e-6)
    assert "wrote 4 embeddings (4 x 16, pooling mean)" in capsys.readouterr().out


def test_cli_encode_bad_input_is_reported(tiny_bert, tmp_path, capsys):
    assert _run_encode_cli(["--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "e.npy")]) == 2
    assert "missing.txt" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_bytes(b"")
    assert _run_encode_cli(["--input", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "e.npy")]) == 2
    assert "empty.txt is empty" in capsys.readouterr().err
    (tmp_path / "s.txt").write_text("the cat\n", encoding="utf-8")
    assert _run_encode_cli(["--input", str(tmp_path / "s.txt"), "--out", str(tmp_path / "e.npy"),
                            "--model", tiny_bert, "--pooling", "max"]) == 2
    assert "unknown pooling 'max'" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes(b"the cat\r\nthe caf\xe9 dog\nred\n")
    assert _run_encode_cli(["--input", str(tmp_path / "latin1.txt"), "--out", str(tmp_path / "e.npy"),
                            "--model", tiny_bert]) == 0
    written = np.load(tmp_path / "e.npy")
    assert written.shape == (3, 16)
    assert np.isnan(written[1]).all() and np.isfinite(written[[0, 2]]).all(), "an undecodable line is a NaN row"
    err = capsys.readouterr().err
    assert "1 line(s) of" in err and "(lines 2)" in err


def test_cli_encode_normalize_gives_unit_rows_and_keeps_nan_rows(tiny_bert, tmp_path, capsys):
    (tmp_path / "s.txt").write_bytes(b"the cat sat\nthe caf\xe9 dog\nred blue house\n\n")
    out = tmp_path / "unit.npy"
    assert _run_encode_cli(["--input", str(tmp_path / "s.txt"), "--out", str(out), "--model", tiny_bert,
                            "--normalize"]) == 0
    written = np.load(out)
    assert written.shape == (4, 16) and np.isnan(written[1]).all()
    np.testing.assert_allclose(np.linalg.norm(written[[0, 2, 3]].astype(np.float64), axis=1), 1.0, rtol=0, atol=1e-6)
    raw = Encoder(tiny_bert).encode(["the cat sat", "red blue house", ""])
    np.testing.assert_allclose(written[[0, 2, 3]], raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert "wrote 4 unit-length embeddings (4 x 16" in capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_cli_encode_reads_a_corpus_text_field_never_its_raw_lines(tiny_bert, tmp_path, capsys, suffix):
    """jsonl, csv and parquet are corpora: their --text-field is encoded, row i is row i, rejected rows are NaN."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": 1, "body": "the cat sat"}, {"id": 2}, {"id": 3, "body": "a dog ran fast"}]
    path = tmp_path / f"c{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif suffix == ".csv":
        path.write_text("id,body\n1,the cat sat\n2,\n3,a dog ran fast\n")
    else:
        pq.write_table(pa.table({"id": [1, 2, 3], "body": ["the cat sat", None, "a dog ran fast"]}), path)
    assert _run_encode_cli(["--input", str(path), "--out", str(tmp_path / "e.npy"), "--model", tiny_bert,
                            "--text-field", "body"]) == 0
    written = np.load(tmp_path / "e.npy")
    np.testing.assert_allclose(written[[0, 2]], Encoder(tiny_bert).encode(["the cat sat", "a dog ran fast"]),
                               rtol=1e-5, atol=1e-6)
    assert np.isnan(written[1]).all()
    assert f"1 row(s) of {path} were rejected as" in capsys.readouterr().err


def test_cli_encode_normalize_counts_rows_that_have_no_direction(tiny_bert, tmp_path, capsys, monkeypatch):
    """A sentence whose vector is all zeros cannot be scaled to unit length: its row stays zero and is counted."""
    real = Encoder.encode

    def encode(self, sentences, **options):
        vectors = real(self, sentences, **options)
        vectors[[index for index, text in enumerate(sentences) if text == "red"]] = 0.0
        return vectors

    monkeypatch.setattr(Encoder, "encode", encode)
    (tmp_path / "s.txt").write_text("the cat sat\nred\nblue house\n")
    assert _run_encode_cli(["--input", str(tmp_path / "s.txt"), "--out", str(tmp_path / "u.npy"), "--model",
                            tiny_bert, "--normalize"]) == 0
    assert not np.load(tmp_path / "u.npy")[1].any()
    assert ("1 line(s) of " in (err := capsys.readouterr().err)) and "encode to the zero vector" in err
    assert "(lines 2)" in err


@pytest.mark.parametrize("kind", ["same-path", "symlink", "hard-link", "directory", "suffix", "no-folder"])
def test_cli_encode_refuses_a_bad_output_before_any_work(kind, tmp_path, capsys):
    """Never its own input (same path, symlink, hard link), never a directory, only .npy, in an
    existing folder: one line, exit 2, the input untouched."""
    corpus = tmp_path / "corpus.npy"  # a text file, named like an output so that only the same-file check can refuse
    corpus.write_text("the cat\n")
    out = {"same-path": corpus, "symlink": tmp_path / "link.npy", "hard-link": tmp_path / "hard.npy",
           "directory": tmp_path / "folder.npy", "suffix": tmp_path / "out.txt",
           "no-folder": tmp_path / "missing" / "out.npy"}[kind]
    if kind == "symlink":
        out.symlink_to(corpus)
    elif kind == "hard-link":
        out.hardlink_to(corpus)
    elif kind == "directory":
        out.mkdir()
    assert _run_encode_cli(["--input", str(corpus), "--out", str(out), "--model", "/nonexistent/model"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and str(out) in error, error
    expected = {"directory": "is a directory", "suffix": "must end in .npy", "no-folder": "does not exist"}
    assert expected.get(kind, "is the input") in error
    assert corpus.read_text() == "the cat\n"

"""`flowcore fit --input` encodes its corpus once into the embedding cache (never beside the output):
a second fit reuses it and says so, a changed corpus or --restart encodes again, --no-cache keeps
nothing, --cache FILE keeps it where asked; a folder or glob of shards is one corpus; the job's
progress lines say "encode"."""
import numpy as np
import pytest

import flowcore
from flowcore import defaults
from flowcore.cli import main

SENTENCES = [f"the {size} {animal} {verb} over a {colour} {thing}" for size in ("big", "small")
             for animal in ("cat", "dog") for verb in ("runs", "jumps") for colour in ("red", "blue")
             for thing in ("mat", "house", "tree")]  # 48 distinct sentences in the tiny BERT's words


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"{sentence}\n" for sentence in SENTENCES))
    return path


@pytest.fixture
def counted_encodes(monkeypatch):
    """The number of sentences `Encoder.encode` was asked for, call by call."""
    calls, real = [], flowcore.Encoder.encode

    def counting(self, sentences, *args, **kwargs):
        calls.append(len(sentences))
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(flowcore.Encoder, "encode", counting)
    return calls


def _fit(tiny_bert, source, out, *extra):
    return main(["fit", "--input", str(source), "--model", tiny_bert, "--calibration", "whitening", "--out", str(out),
                 "--quiet", *extra])


def test_the_corpus_is_encoded_once_into_the_cache_folder(tiny_bert, corpus, tmp_path, monkeypatch, capsys,
                                                          counted_encodes):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLOWCORE_CACHE", str(cache))
    out = tmp_path / "models" / "a.flow"
    out.parent.mkdir()
    assert _fit(tiny_bert, corpus, out) == 0
    assert sum(counted_encodes) == len(SENTENCES)
    assert sorted(path.name for path in out.parent.iterdir()) == ["a.flow"]  # nothing beside the output
    [vectors] = (cache / "corpora").glob("*.npy")
    assert np.load(vectors).shape == (len(SENTENCES), 16)
    capsys.readouterr()

    counted_encodes.clear()
    assert _fit(tiny_bert, corpus, tmp_path / "models" / "b.flow", "--calibration", "center") == 0
    assert counted_encodes == []  # reused
    assert f"its vectors are already in {vectors}" in capsys.readouterr().out

    assert _fit(tiny_bert, corpus, tmp_path / "models" / "c.flow", "--restart") == 0
    assert sum(counted_encodes) == len(SENTENCES)

    counted_encodes.clear()
    corpus.write_text("".join(f"{sentence}\n" for sentence in SENTENCES[:-3]))  # the corpus changed
    assert _fit(tiny_bert, corpus, tmp_path / "models" / "d.flow") == 0
    assert sum(counted_encodes) == len(SENTENCES) - 3
    assert np.load(vectors).shape == (len(SENTENCES) - 3, 16)


def test_the_same_fit_from_the_cache_flag_the_cache_dir_and_without_a_cache(tiny_bert, corpus, tmp_path):
    kept, folder = tmp_path / "kept.npy", tmp_path / "shared-cache"
    assert _fit(tiny_bert, corpus, tmp_path / "a.flow", "--cache", str(kept)) == 0
    assert _fit(tiny_bert, corpus, tmp_path / "b.flow", "--cache-dir", str(folder)) == 0
    assert _fit(tiny_bert, corpus, tmp_path / "c.flow", "--no-cache") == 0
    assert kept.exists() and len(list((folder / "corpora").glob("*.npy"))) == 1
    sample = np.asarray(flowcore.Encoder(tiny_bert).encode(SENTENCES[:4]))
    first = flowcore.load(tmp_path / "a.flow").transform(sample)
    for name in ("b.flow", "c.flow"):
        np.testing.assert_array_equal(flowcore.load(tmp_path / name).transform(sample), first)


def test_the_cache_flag_is_instead_of_the_cache_folder(tiny_bert, corpus, tmp_path, capsys):
    assert _fit(tiny_bert, corpus, tmp_path / "a.flow", "--cache", str(tmp_path / "v.npy"), "--no-cache") == 2
    assert "--cache FILE is instead of the embedding cache" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["folder", "glob"])
def test_a_folder_or_a_glob_of_shards_is_one_corpus(tiny_bert, tmp_path, given):
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(f'{{"text": "{sentence}"}}\n' for sentence in SENTENCES))
    shards = tmp_path / "shards"
    shards.mkdir()
    for number, start in enumerate(range(0, len(SENTENCES), 8)):
        (shards / f"part-{number}.jsonl").write_text(
            "".join(f'{{"text": "{sentence}"}}\n' for sentence in SENTENCES[start:start + 8]))
    source = shards if given == "folder" else shards / "part-*.jsonl"
    assert _fit(tiny_bert, whole, tmp_path / "whole.flow", "--no-cache") == 0
    assert _fit(tiny_bert, source, tmp_path / "shards.flow", "--no-cache") == 0
    assert _fit(tiny_bert, source, tmp_path / "sampled.flow", "--max-rows", "1000") == 0  # all rows, sampled
    sample = np.asarray(flowcore.Encoder(tiny_bert).encode(SENTENCES[:4]))
    expected = flowcore.load(tmp_path / "whole.flow").transform(sample)
    np.testing.assert_allclose(flowcore.load(tmp_path / "shards.flow").transform(sample), expected, atol=1e-5)
    np.testing.assert_allclose(flowcore.load(tmp_path / "sampled.flow").transform(sample), expected, atol=1e-4)


def test_its_progress_lines_say_encode(tiny_bert, corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "PROGRESS_INTERVAL_S", 0.0)
    assert main(["fit", "--input", str(corpus), "--model", tiny_bert, "--calibration", "center", "--out",
                 str(tmp_path / "m.flow"), "--no-cache", "--progress"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith(f"encode: {len(SENTENCES)} of {len(SENTENCES)} rows") for line in lines), lines
    assert not any(line.startswith("calibrate") for line in lines) and "\r" not in "".join(lines)


def _parquet(path, vectors):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(vectors))],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])}),
                   path)


@pytest.mark.parametrize("layout", ["npy folder", "parquet file", "parquet glob"])
def test_embeddings_from_shards_fit_as_the_one_matrix_they_hold(tmp_path, layout, capsys):
    rng = np.random.default_rng(0)
    vectors = (rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8))).astype(np.float32)
    np.save(tmp_path / "all.npy", vectors)
    shards = tmp_path / "shards"
    shards.mkdir()
    for number, start in enumerate(range(0, 300, 70)):
        if layout == "npy folder":
            np.save(shards / f"part-{number}.npy", vectors[start:start + 70])
        else:
            _parquet(shards / f"part-{number}.parquet", vectors[start:start + 70])
    if layout == "parquet file":
        _parquet(tmp_path / "all.parquet", vectors)
    given = {"npy folder": shards, "parquet file": tmp_path / "all.parquet",
             "parquet glob": shards / "part-*.parquet"}[layout]
    field = [] if layout == "npy folder" else ["--vector-field", "emb"]
    assert main(["fit", "--embeddings", str(tmp_path / "all.npy"), "--calibration", "whitening", "--quiet",
                 "--out", str(tmp_path / "all.flow")]) == 0
    assert main(["fit", "--embeddings", str(given), *field, "--calibration", "whitening", "--quiet",
                 "--out", str(tmp_path / "shards.flow")]) == 0
    capsys.readouterr()
    assert main(["fit", "--embeddings", str(given), *field, "--calibration", "whitening", "--quiet",
                 "--max-rows", "200", "--out", str(tmp_path / "sample.flow")]) == 0
    assert "fitted on 200 x 8" in capsys.readouterr().out
    expected = flowcore.load(tmp_path / "all.flow").transform(vectors[:5])
    np.testing.assert_allclose(flowcore.load(tmp_path / "shards.flow").transform(vectors[:5]), expected, atol=1e-4)
    assert sorted(path.name for path in tmp_path.iterdir() if path.is_file()) == sorted(
        ["all.npy", "all.flow", "shards.flow", "sample.flow"] + (["all.parquet"] if layout == "parquet file" else []))


def test_a_bad_row_in_embedding_shards_is_refused_naming_its_file_and_row(tmp_path, capsys):
    vectors = np.random.default_rng(0).normal(size=(60, 8)).astype(np.float32)
    vectors[45, 3] = np.nan
    shards = tmp_path / "shards"
    shards.mkdir()
    np.save(shards / "a.npy", vectors[:30])
    np.save(shards / "b.npy", vectors[30:])
    assert main(["fit", "--embeddings", str(shards), "--out", str(tmp_path / "m.flow")]) == 2
    error = capsys.readouterr().err
    assert "1 row(s) are not usable vectors" in error and f"{shards / 'b.npy'}, row 45" in error
    assert len(error.strip().splitlines()) == 1 and not (tmp_path / "m.flow").exists()

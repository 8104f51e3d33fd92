"""The embedding cache: each sentence encoded once per model and pooling, across runs sharing a
folder; unreadable or foreign shards are skipped with a warning."""
import logging

import numpy as np
import pytest

from flowcore.text.cache import EmbeddingCache

from helpers.sts_stand_ins import HashEncoder


def test_embedding_cache_encodes_each_sentence_once_per_model_and_pooling(tmp_path):
    encoder = HashEncoder()
    cache = EmbeddingCache(tmp_path)
    first = cache.embed(encoder, ["x", "y", "x"], show_progress_bar=False)
    assert encoder.encoded == ["x", "y"]
    np.testing.assert_array_equal(first[0], first[2])
    fresh = EmbeddingCache(tmp_path)  # a new run, same folder: read from disk
    again = fresh.embed(encoder, ["y", "z", "x"], show_progress_bar=False)
    assert encoder.encoded == ["x", "y", "z"]
    np.testing.assert_array_equal(again[[0, 2]], first[[1, 0]])
    other_pooling = HashEncoder(pooling="static-avg")
    EmbeddingCache(tmp_path).embed(other_pooling, ["x"], show_progress_bar=False)
    assert other_pooling.encoded == ["x"]
    assert len(list(tmp_path.rglob("*.npy"))) == 3 and not list(tmp_path.rglob("*.tmp"))
    memory_only = HashEncoder()
    EmbeddingCache(None).embed(memory_only, ["x"], show_progress_bar=False)
    assert memory_only.encoded == ["x"]


def test_bad_shards_are_skipped_with_a_warning_and_progress_is_logged(tmp_path, caplog):
    EmbeddingCache(tmp_path).embed(HashEncoder(), ["x", "y"], show_progress_bar=False)
    npy, = tmp_path.rglob("*.npy")
    npy.write_bytes(b"not an array")
    encoder = HashEncoder()
    with caplog.at_level(logging.INFO, logger="flowcore.text"):
        EmbeddingCache(tmp_path).embed(encoder, ["x"], show_progress_bar=True)
    assert encoder.encoded == ["x"]
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flowcore.text.cache"]
    assert messages[0][0] == logging.WARNING and "skipping unreadable shard" in messages[0][1]
    assert messages[1] == (logging.INFO, "encoding 1 sentences with hash-encoder (mean pooling)")
    caplog.clear()
    wider = HashEncoder(dim=8)
    with caplog.at_level(logging.INFO, logger="flowcore.text"):
        EmbeddingCache(tmp_path).embed(wider, ["x"], show_progress_bar=False)
    assert wider.encoded == ["x"]
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 2  # both 16-wide shards
    texts = [r.getMessage() for r in caplog.records]
    assert sum("skipping unreadable shard" in t for t in texts) == 1
    assert sum("(it belongs to another model or width)" in t for t in texts) == 1


def test_a_corpus_has_one_file_per_encoder_and_corpus(tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    first = cache.corpus_file(HashEncoder(), "corpus.jsonl", "text")
    assert first.parent == tmp_path / "cache" / "corpora" and first.parent.is_dir() and first.suffix == ".npy"
    assert cache.corpus_file(HashEncoder(), tmp_path.cwd() / "corpus.jsonl", "text") == first  # the same corpus
    others = {cache.corpus_file(HashEncoder(pooling="cls"), "corpus.jsonl", "text"),
              cache.corpus_file(HashEncoder(), "other.jsonl", "text"),
              cache.corpus_file(HashEncoder(), "corpus.jsonl", "body")}
    assert len(others) == 3 and first not in others


def test_an_unwritable_cache_folder_names_the_way_out(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError, match=r"--cache-dir DIR \(or \$FLOWCORE_CACHE\).*--no-cache"):
        EmbeddingCache(tmp_path / "a-file" / "cache").corpus_file(HashEncoder(), "corpus.jsonl", "text")
    with pytest.raises(ValueError, match="in memory keeps no corpus file"):
        EmbeddingCache(None).corpus_file(HashEncoder(), "corpus.jsonl", "text")

"""Token-embedding frequency analyses: a planted frequency-norm relation (and neighbour spacing)
is recovered bucket by bucket; ranks from wordfreq and from a corpus."""
import numpy as np
import pytest

from flowcore.analysis.frequency import bucket_statistics, corpus_ranks, wordfreq_ranks

from helpers.tiny_models import SPECIAL_TOKENS

BUCKETS = ((0, 10), (10, 50), (50, 200), (200, None))


def _planted(vocabulary=400, dim=16, seed=0):
    """Token i has rank i; its norm is 0.5 + rank / 400 and frequent tokens crowd together (their
    directions share a common component that fades with rarity)."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(vocabulary)
    shared = np.ones(dim) / np.sqrt(dim)
    directions = rng.normal(size=(vocabulary, dim)) * (ranks[:, None] / vocabulary + 0.05) + shared
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    norms = 0.5 + ranks / vocabulary
    return (directions * norms[:, None]).astype(np.float32), ranks, norms


def test_a_planted_frequency_norm_relation_is_recovered():
    vectors, ranks, norms = _planted()
    buckets, rho = bucket_statistics(vectors, ranks, BUCKETS, knn=(1, 3))
    assert [(b.start, b.stop, b.tokens) for b in buckets] == [(0, 10, 10), (10, 50, 40), (50, 200, 150),
                                                              (200, 400, 200)]
    for bucket in buckets:
        assert bucket.mean_norm == pytest.approx(norms[bucket.start : bucket.stop].mean(), rel=1e-5)
    assert rho == pytest.approx(100.0)
    distances = [b.knn_distance["3"] for b in buckets]
    assert distances == sorted(distances) and distances[-1] > 3 * distances[0]  # rare tokens are far and sparse
    assert all(b.knn_distance["1"] <= b.knn_distance["3"] for b in buckets)


def test_neighbours_are_other_tokens_only():
    vectors = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=np.float32)
    buckets, _ = bucket_statistics(vectors, np.arange(4), ((0, 4),), knn=(1,))
    # token 0's nearest other token is its duplicate (distance 0), token 2's is token 0/1 or 3 (distance 5)
    assert buckets[0].knn_distance["1"] == pytest.approx((0 + 0 + 5 + 5) / 4)
    ranks = np.array([0, -1, 1, -1])  # unranked tokens are still neighbours, never analysed
    buckets, _ = bucket_statistics(vectors, ranks, ((0, 2),), knn=(1,), neighbours=np.array([0, 2, 3]))
    assert buckets[0].tokens == 2 and buckets[0].knn_distance["1"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="have a frequency rank"):
        bucket_statistics(vectors, np.full(4, -1), ((0, 2),), knn=(1,))


def test_wordfreq_ranks_whole_words_by_english_frequency():
    tokens = ["[PAD]", "the", "##ing", "aardvark", "of", "1999", ",", "qwxzv"]
    ranks = wordfreq_ranks(tokens, special_ids={0})
    assert ranks.tolist() == [-1, 0, -1, 2, 1, -1, -1, -1]


def test_corpus_ranks_count_the_tokenizer_pieces(tmp_path):
    from transformers import BertTokenizerFast

    words = ["a", "cat", "dog", "sat", "bird"]
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + words) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(tmp_path)
    vocabulary = len(SPECIAL_TOKENS) + len(words)
    ranks = corpus_ranks(tokenizer, ["a cat sat", "a dog sat", "a cat"], vocabulary,
                         special_ids=set(tokenizer.all_special_ids))
    by_word = {word: int(ranks[tokenizer.convert_tokens_to_ids(word)]) for word in words}
    assert by_word == {"a": 0, "cat": 1, "sat": 2, "dog": 3, "bird": -1}
    assert (ranks[: len(SPECIAL_TOKENS)] == -1).all()

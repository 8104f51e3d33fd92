"""The BERT-flow paper's word-frequency analyses of token embeddings (in BERT, rare words lie far from the
origin and sparse): mean ℓ2 norm and k-NN distance by frequency-rank bucket, ranked by `wordfreq` or a corpus."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy.stats import spearmanr

from flowcore.extras import require
from flowcore.text.loading import load, resolve_model

__all__ = ["BUCKETS", "FREQUENCY_SOURCES", "KNN", "FrequencyBucket", "TokenEmbeddings", "bucket_statistics",
           "corpus_ranks", "token_embeddings", "wordfreq_ranks"]

BUCKETS = ((0, 100), (100, 500), (500, 5000), (5000, 10000))
"""Frequency-rank buckets [start, stop) of the paper's Table 1; a stop of None: to the last ranked token."""
KNN = (3, 5, 7)
"""The k of the paper's k-nearest-neighbour distances."""
FREQUENCY_SOURCES = ("wordfreq", "corpus")

_WORD = re.compile(r"^[^\W\d_]+$")  # letters only: a whole word wordfreq can know


@dataclass(frozen=True)
class TokenEmbeddings:
    """An encoder's input token embeddings (V, d), vocabulary (`tokens[i]` is id i), special ids, tokenizer."""

    vectors: np.ndarray
    tokens: list[str]
    special_ids: frozenset
    tokenizer: object


def token_embeddings(encoder) -> TokenEmbeddings:
    """The input (word-piece) embedding matrix and vocabulary of an `Encoder`'s frozen model.

    Example:
        >>> table = token_embeddings(Encoder())
        >>> table.vectors.shape
        (30522, 384)
    """
    _, source = resolve_model(encoder.model_id)
    loaded = load(source, encoder.device, None)  # shared with the encoder: not reloaded
    weights = loaded.model.get_input_embeddings().weight.detach().float().cpu().numpy()
    tokens = [""] * weights.shape[0]
    for token, index in loaded.tokenizer.get_vocab().items():
        if index < len(tokens):
            tokens[index] = token
    return TokenEmbeddings(weights, tokens, frozenset(loaded.tokenizer.all_special_ids), loaded.tokenizer)


def wordfreq_ranks(tokens: list[str], special_ids=frozenset(), language: str = "en") -> np.ndarray:
    """Frequency rank (0 = most frequent) of each vocabulary entry by `wordfreq`; −1 if not a known whole word.

    Args:
        tokens: the vocabulary, `tokens[i]` for id i.
        special_ids: ids never ranked.

    Example:
        >>> wordfreq_ranks(["[CLS]", "the", "##s", "aardvark"], special_ids={0})
        array([-1,  0, -1,  1])
    """
    wordfreq = require("wordfreq", "word-frequency ranks (flowcore analyze --frequency wordfreq)", "analysis")
    frequencies = wordfreq.get_frequency_dict(language)
    counts = np.zeros(len(tokens))
    for index, token in enumerate(tokens):
        if index not in special_ids and _WORD.match(token):
            counts[index] = frequencies.get(token.lower(), 0.0)
    return _ranks(counts)


def corpus_ranks(tokenizer, sentences: list[str], vocabulary_size: int, special_ids=frozenset()) -> np.ndarray:
    """Frequency rank (0 = most frequent) of each token id in `sentences`; −1 if absent or special.

    Args:
        tokenizer: a Hugging Face tokenizer (called on a batch of sentences).
        vocabulary_size: the number of ids (rows of the embedding matrix).
        special_ids: ids never ranked.

    Example:
        >>> corpus_ranks(tokenizer, ["a cat", "a dog"], len(tokenizer))[tokenizer.convert_tokens_to_ids("a")]
        0
    """
    counts = Counter()
    for start in range(0, len(sentences), 1000):
        for ids in tokenizer(sentences[start : start + 1000], add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    return _ranks(np.array([0 if index in special_ids else counts[index] for index in range(vocabulary_size)],
                           dtype=np.float64))


def _ranks(frequencies: np.ndarray) -> np.ndarray:
    """Rank by descending frequency (ties by id), −1 where the frequency is 0."""
    ranks = np.full(len(frequencies), -1, dtype=np.int64)
    known = np.flatnonzero(frequencies > 0)
    order = known[np.lexsort((known, -frequencies[known]))]
    ranks[order] = np.arange(len(order))
    return ranks


@dataclass(frozen=True)
class FrequencyBucket:
    """One frequency-rank bucket [start, stop): token count, mean ℓ2 norm, `knn_distance[str(k)]`."""

    start: int
    stop: int
    tokens: int
    mean_norm: float
    knn_distance: dict

    def to_json(self) -> dict:
        return asdict(self)


def bucket_statistics(vectors: np.ndarray, ranks: np.ndarray, buckets=BUCKETS, knn=KNN,
                      neighbours: np.ndarray | None = None, block_rows: int = 2048) -> tuple[list, float]:
    """Mean ℓ2 norm and k-NN ℓ2 distance of the ranked tokens in each bucket, and Spearman ×100 of norm vs rank.

    Args:
        vectors: (V, d) token embeddings.
        ranks: (V,) frequency ranks, −1 for tokens outside the analysis.
        buckets: [start, stop) rank ranges, stop None for "to the end".
        neighbours: ids searched for neighbours (default: every id); a token is never its own neighbour.
        block_rows: query rows per distance block (bounds memory to block_rows × V floats).

    Returns:
        ([FrequencyBucket, ...] for the non-empty buckets, Spearman ×100 of norm vs rank).

    Example:
        >>> stats, rho = bucket_statistics(table.vectors, wordfreq_ranks(table.tokens))
        >>> [round(b.mean_norm, 2) for b in stats]      # rising with rarity in BERT
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    ranks = np.asarray(ranks)
    if vectors.ndim != 2 or len(ranks) != len(vectors):
        raise ValueError(f"expected (V, d) vectors and V ranks, got {vectors.shape} and {ranks.shape}")
    ranked = np.flatnonzero(ranks >= 0)
    if len(ranked) < 2:
        raise ValueError(f"only {len(ranked)} token(s) have a frequency rank: nothing to analyse")
    pool = np.arange(len(vectors)) if neighbours is None else np.asarray(neighbours)
    deepest = max(knn)
    if len(pool) <= deepest:
        raise ValueError(f"{len(pool)} neighbour candidates are too few for k = {deepest}")
    database = torch.from_numpy(vectors[pool])
    database_squares = (database * database).sum(1)
    position = np.full(len(vectors), -1)
    position[pool] = np.arange(len(pool))
    norms = np.linalg.norm(vectors, axis=1)
    limit = max(np.inf if stop is None else stop for _, stop in buckets)
    queried = ranked[ranks[ranked] < limit]  # only tokens some bucket holds need neighbours
    nearest = np.empty((len(queried), deepest))
    for start in range(0, len(queried), block_rows):
        ids = queried[start : start + block_rows]
        queries = torch.from_numpy(vectors[ids])
        # squared distances as one GEMM: |q|² + |p|² − 2 q·p (clamped: rounding can dip below 0)
        squares = ((queries * queries).sum(1, keepdim=True) + database_squares - 2 * queries @ database.T).clamp_(min=0)
        rows = np.flatnonzero(position[ids] >= 0)
        squares[torch.from_numpy(rows), torch.from_numpy(position[ids][rows])] = float("inf")  # not its own neighbour
        closest = torch.topk(squares, deepest, largest=False, sorted=True).values
        nearest[start : start + len(ids)] = closest.double().sqrt().numpy()
    results = []
    for first, stop in buckets:
        last = min(int(ranks.max()) + 1, np.inf if stop is None else stop)
        inside = (ranks[queried] >= first) & (ranks[queried] < last)
        if not inside.any():
            continue
        results.append(FrequencyBucket(
            start=first, stop=int(last), tokens=int(inside.sum()), mean_norm=float(norms[queried][inside].mean()),
            knn_distance={str(k): float(nearest[inside, :k].mean()) for k in knn}))
    rho = 100 * float(spearmanr(norms[ranked], ranks[ranked])[0])
    return results, rho

"""STS metrics: row-wise cosine similarity, Spearman/Pearson ×100 against gold, and the three
aggregations of the multi-subset benchmarks STS12–16 (`all`, `wmean`, `mean`)."""
from __future__ import annotations

import math

import numpy as np

from flowcore.sts.data import STSPairs

__all__ = ["MULTI_SUBSET", "correlations", "cosine_similarity", "score_pairs", "spearman_of"]

MULTI_SUBSET = ("STS12", "STS13", "STS14", "STS15", "STS16")


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (N, D) arrays, computed in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)


def correlations(predicted: np.ndarray, gold: np.ndarray) -> dict:
    """Spearman and Pearson ×100 of predicted similarities against gold scores."""
    if np.ptp(predicted) == 0:
        return {"spearman": math.nan, "pearson": math.nan}
    from scipy.stats import pearsonr, spearmanr  # deferred: scipy is slow to import, the CLI's start-up does without

    return {"spearman": 100 * float(spearmanr(predicted, gold)[0]),
            "pearson": 100 * float(pearsonr(predicted, gold)[0])}


def score_pairs(similarities: np.ndarray, pairs: STSPairs) -> dict:
    """Correlations of one dataset; for STS12–16 (and your own pairs of several subsets: a SentEval
    folder) also per subset and all three aggregations (`spearman`/`pearson` are the `all`
    aggregation, the others are under `*_wmean`, `*_mean`)."""
    result = {**correlations(similarities, pairs.scores), "n_pairs": len(pairs)}
    own_subsets = pairs.source is not None and len(set(pairs.subsets)) > 1
    if pairs.dataset not in MULTI_SUBSET and not own_subsets:
        result["aggregation"] = "single"
        return result
    labels = np.asarray(pairs.subsets)
    subsets = {}
    for name in dict.fromkeys(pairs.subsets):
        mask = labels == name
        subsets[name] = {**correlations(similarities[mask], pairs.scores[mask]), "n_pairs": int(mask.sum())}
    sizes = [subset["n_pairs"] for subset in subsets.values()]
    for metric in ("spearman", "pearson"):
        values = np.array([subset[metric] for subset in subsets.values()])
        result[f"{metric}_wmean"] = float(np.average(values, weights=sizes))
        result[f"{metric}_mean"] = float(values.mean())
    result.update(aggregation="all", subsets=subsets)
    return result


def spearman_of(record: dict, aggregation: str) -> float | None:
    """The record's Spearman under `aggregation` (single-set datasets have only one)."""
    if aggregation == "all" or record.get("aggregation") == "single":
        return record.get("spearman")
    return record.get(f"spearman_{aggregation}")

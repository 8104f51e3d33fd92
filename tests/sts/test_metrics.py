"""STS metrics: cosine and correlations against scipy, and the STS12-16 aggregations."""
import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from flowcore.sts.data import STSPairs
from flowcore.sts.metrics import correlations, cosine_similarity, score_pairs, spearman_of


def _pairs(dataset, similarity, scores, subsets):
    n = len(scores)
    return STSPairs(dataset, "test", [f"a{i}" for i in range(n)], [f"b{i}" for i in range(n)],
                    np.asarray(scores, dtype=float), list(subsets)), np.asarray(similarity, dtype=float)


def test_cosine_and_correlations_match_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(30, 5)), rng.normal(size=(30, 5))
    expected = [x @ y / np.linalg.norm(x) / np.linalg.norm(y) for x, y in zip(a, b)]
    np.testing.assert_allclose(cosine_similarity(a, b), expected, rtol=1e-12)
    gold = rng.uniform(0, 5, size=30)
    result = correlations(np.asarray(expected), gold)
    assert result["spearman"] == pytest.approx(100 * spearmanr(expected, gold)[0])
    assert result["pearson"] == pytest.approx(100 * pearsonr(expected, gold)[0])
    assert math.isnan(correlations(np.ones(30), gold)["spearman"])


def test_aggregations_all_wmean_mean():
    rng = np.random.default_rng(1)
    gold = rng.uniform(0, 5, size=40)
    similarity = np.concatenate([gold[:30] + rng.normal(scale=0.5, size=30), -gold[30:]])
    pairs, similarity = _pairs("STS13", similarity, gold, ["big"] * 30 + ["small"] * 10)
    result = score_pairs(similarity, pairs)
    big = 100 * spearmanr(similarity[:30], gold[:30])[0]
    small = 100 * spearmanr(similarity[30:], gold[30:])[0]
    assert small == pytest.approx(-100)
    assert result["spearman"] == pytest.approx(100 * spearmanr(similarity, gold)[0])
    assert result["spearman_wmean"] == pytest.approx((30 * big + 10 * small) / 40)
    assert result["spearman_mean"] == pytest.approx((big + small) / 2)
    assert result["subsets"]["small"]["n_pairs"] == 10 and result["aggregation"] == "all"
    assert spearman_of(result, "wmean") == result["spearman_wmean"]
    single = score_pairs(*reversed(_pairs("STS-B", similarity, gold, ["x"] * 40)))
    assert single["aggregation"] == "single" and "spearman_wmean" not in single
    assert spearman_of(single, "wmean") == single["spearman"]

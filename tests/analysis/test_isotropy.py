"""Isotropy measures on data with known answers: an isotropic Gaussian scores mean cosine 0,
IsoScore 1 and effective rank d; one dominant direction scores the opposite; the n < d variant."""
import numpy as np
import pytest

from flowcore.analysis.isotropy import HISTOGRAM_BINS, effective_rank, isoscore, isotropy, random_pair_cosines


def test_isotropic_gaussian_is_isotropic():
    X = np.random.default_rng(0).normal(size=(6000, 32))
    report = isotropy(X, pairs=20_000)
    assert abs(report.mean_cosine) < 0.01
    assert report.isoscore > 0.97
    assert report.effective_rank > 0.97 * 32
    assert report.top_variance_share["1"] < 1.5 / 32 and report.top_variance_share["10"] < 1.2 * 10 / 32
    assert sum(report.histogram) == 20_000 and len(report.histogram) == HISTOGRAM_BINS
    # random cosines in 32 dimensions have std 1/sqrt(32); the 99th percentile is about 2.33 of them
    assert report.std_cosine == pytest.approx(1 / np.sqrt(32), rel=0.05)
    assert report.thresholds["p99"] == pytest.approx(2.33 / np.sqrt(32), rel=0.1)
    assert report.thresholds["p95"] < report.thresholds["p99"] < report.thresholds["p99.9"]


def test_a_cone_and_a_dominant_direction_are_anisotropic():
    rng = np.random.default_rng(1)
    cone = rng.normal(size=(3000, 32)) + 4.0  # a shared offset: every pair points the same way
    assert isotropy(cone).mean_cosine > 0.9
    stretched = rng.normal(size=(3000, 32)) * np.r_[30.0, np.ones(31)]
    report = isotropy(stretched)
    assert report.top_variance_share["1"] > 0.95 and report.isoscore < 0.05 and report.effective_rank < 2


def test_isoscore_and_effective_rank_have_their_defining_values():
    assert isoscore(np.ones(50)) == pytest.approx(1.0)
    assert isoscore(np.r_[1.0, np.zeros(49)]) == pytest.approx(0.0)
    assert 0 < isoscore(np.r_[np.ones(25), np.zeros(25)]) < 1
    assert effective_rank(np.ones(50)) == pytest.approx(50.0)
    assert effective_rank(np.r_[1.0, np.zeros(49)]) == pytest.approx(1.0)
    assert effective_rank(np.r_[np.ones(10), np.zeros(40)]) == pytest.approx(10.0)


def test_small_samples_are_scored_on_the_directions_they_span():
    """n = 60 isotropic vectors in d = 400 span only 59 directions: the original IsoScore reads
    the other 341 zero variances as anisotropy; the variant scores the sample as isotropic."""
    X = np.random.default_rng(2).normal(size=(60, 400))
    spanned = np.linalg.svd(X - X.mean(0), compute_uv=False) ** 2  # 60 values, the last one ~0
    assert isoscore(np.r_[spanned, np.zeros(340)]) < 0.2  # all 400 variances
    assert isotropy(X).isoscore > 0.8


def test_random_pairs_are_distinct_rows_and_reproducible():
    X = np.random.default_rng(3).normal(size=(5, 4))
    cosines = random_pair_cosines(X, pairs=500, seed=4)
    assert (cosines < 1 - 1e-9).all()  # a row is never paired with itself
    np.testing.assert_array_equal(cosines, random_pair_cosines(X, pairs=500, seed=4))
    with pytest.raises(ValueError, match="at least 2"):
        isotropy(X[:1])
    X[2, 1] = np.inf
    with pytest.raises(ValueError, match=r"row\(s\) 2"):
        isotropy(X)

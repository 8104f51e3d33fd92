"""How isotropic a set of sentence vectors is: mean random-pair cosine (Ethayarajh 2019), IsoScore (Rudman et al.
2022), effective rank (Roy & Vetterli 2007), top-PC variance shares, and the random-pair cosine distribution with the
thresholds it suggests. Isotropy is not quality (docs/analysis.md). IsoScore falls when n is not well above d, even
on the min(d, n − 1) directions n vectors span: compare at equal n."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from flowcore import defaults
from flowcore.sts.metrics import cosine_similarity
from flowcore.validation import check_matrix

__all__ = ["HISTOGRAM_BINS", "THRESHOLD_PERCENTILES", "TOP_COMPONENTS", "Isotropy", "effective_rank", "isoscore",
           "isotropy", "random_pair_cosines"]

TOP_COMPONENTS = (1, 10)
"""The variance shares reported: of the top 1 and top 10 principal components."""
THRESHOLD_PERCENTILES = (95.0, 99.0, 99.9)
"""Percentiles of the random-pair cosines suggested as similarity thresholds."""
HISTOGRAM_BINS = 100
"""Bins of the random-pair cosine histogram over [-1, 1]."""


def random_pair_cosines(X, pairs: int = defaults.RANDOM_PAIRS, seed: int = 0) -> np.ndarray:
    """Cosines of `pairs` random pairs of distinct rows of X (float64), a fixed sample per seed.

    Args:
        X: (n, d) vectors, n >= 2.
        pairs: how many pairs are drawn (with replacement across pairs).

    Example:
        >>> random_pair_cosines(np.random.randn(1000, 64)).mean()    # about 0 for isotropic vectors
    """
    X = _rows(X)
    rng = np.random.default_rng(seed)
    first = rng.integers(0, len(X), size=pairs)
    second = (first + rng.integers(1, len(X), size=pairs)) % len(X)  # never the same row
    return cosine_similarity(X[first], X[second])


def isoscore(eigenvalues: np.ndarray, rank: int | None = None) -> float:
    """IsoScore of a covariance spectrum: 1 for equal leading variances, 0 when one direction holds all.

    Args:
        eigenvalues: the covariance eigenvalues (any order).
        rank: how many leading eigenvalues to score (default: all).

    Example:
        >>> isoscore(np.ones(50))
        1.0
    """
    values = np.sort(np.asarray(eigenvalues, dtype=np.float64))[::-1][:rank]
    k = len(values)
    if k < 2 or values.sum() <= 0:
        return 0.0
    normalised = np.sqrt(k) * values / np.linalg.norm(values)
    defect = np.linalg.norm(normalised - 1) / np.sqrt(2 * (k - np.sqrt(k)))
    fraction = (k - defect**2 * (k - np.sqrt(k))) ** 2 / k**2
    return float(np.clip((k * fraction - 1) / (k - 1), 0.0, 1.0))


def effective_rank(eigenvalues: np.ndarray) -> float:
    """exp of the entropy of the variance shares λ_i / Σλ: d for equal variances, 1 for one direction.

    Example:
        >>> effective_rank(np.ones(50))
        50.0
    """
    values = np.asarray(eigenvalues, dtype=np.float64)
    values = values[values > 0]
    if len(values) == 0:
        return 0.0
    shares = values / values.sum()
    return float(np.exp(-(shares * np.log(shares)).sum()))


@dataclass(frozen=True)
class Isotropy:
    """The isotropy of one set of vectors (JSON-ready with `to_json`).

    Attributes:
        rows, dim: the sample size and the width.
        mean_cosine, std_cosine: of random pairs of distinct rows.
        isoscore: IsoScore over the min(d, n - 1) directions the sample spans.
        effective_rank: exp(entropy of the variance shares).
        top_variance_share: {k: share of the variance in the top k principal components}.
        thresholds: {"p99": cosine, ...}: the random-pair percentiles (`THRESHOLD_PERCENTILES`).
        histogram: counts of the random-pair cosines in `HISTOGRAM_BINS` equal bins over [-1, 1].
    """

    rows: int
    dim: int
    mean_cosine: float
    std_cosine: float
    isoscore: float
    effective_rank: float
    top_variance_share: dict
    thresholds: dict
    histogram: list

    def to_json(self) -> dict:
        return asdict(self)


def isotropy(X, pairs: int = defaults.RANDOM_PAIRS, seed: int = 0, max_rows: int = 20_000) -> Isotropy:
    """Measure the isotropy of the rows of X.

    Args:
        X: (n, d) vectors, n >= 2, finite.
        pairs: random pairs drawn for the cosine distribution.
        max_rows: the spectrum is computed on at most this many rows (a seeded subsample).

    Example:
        >>> report = isotropy(np.random.randn(5000, 64))
        >>> round(report.mean_cosine, 2), report.effective_rank > 60
        (0.0, True)
    """
    X = _rows(X)
    cosines = random_pair_cosines(X, pairs, seed)
    sample = X
    if len(X) > max_rows:
        sample = X[np.sort(np.random.default_rng(seed).choice(len(X), max_rows, replace=False))]
    singular = np.linalg.svd(sample - sample.mean(axis=0), compute_uv=False)
    spectrum = singular**2 / max(len(sample) - 1, 1)  # the covariance eigenvalues, descending
    total = spectrum.sum()
    shares = {str(k): float(spectrum[:k].sum() / total) if total > 0 else 1.0 for k in TOP_COMPONENTS
              if k <= X.shape[1]}
    counts, _ = np.histogram(cosines, bins=HISTOGRAM_BINS, range=(-1.0, 1.0))
    return Isotropy(
        rows=len(X), dim=X.shape[1], mean_cosine=float(cosines.mean()), std_cosine=float(cosines.std()),
        isoscore=isoscore(spectrum, rank=min(X.shape[1], len(sample) - 1)), effective_rank=effective_rank(spectrum),
        top_variance_share=shares, histogram=[int(c) for c in counts],
        thresholds={f"p{p:g}": float(np.percentile(cosines, p)) for p in THRESHOLD_PERCENTILES})


def _rows(X) -> np.ndarray:
    return check_matrix(X, min_rows=2, name="vectors").double().numpy()

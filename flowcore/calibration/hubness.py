"""Hubness, the signal `auto` calibrates by: the Robin Hood index of the exact k-NN graph of a seeded
sample of distinct rows (docs/calibration.md)."""
from __future__ import annotations

import numpy as np

from flowcore import defaults
from flowcore.calibration.base import positive_int

__all__ = ["DistinctRowSample", "robin_hood_index"]

KNN_BLOCK_ROWS = 1024
"""Rows whose similarities to the whole sample are computed at a time."""
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
"""The multipliers of SplitMix64's finaliser, which spreads a 64-bit key's bits evenly."""


def robin_hood_index(rows: np.ndarray, center: np.ndarray, neighbours: int = defaults.AUTO_NEIGHBOURS) -> float:
    """The Robin Hood index of the cosine k-NN graph of `rows` − `center`: RH = Σ_j |N(j) − k| / (2·k·n),
    N(j) the rows that have row j among their k nearest; 0 when balanced, high when a few "hubs" dominate.

    Args:
        rows: (n, d) distinct vectors (duplicates would be each other's nearest neighbours).
        center: (d,) the corpus mean the cosines are taken around.
        neighbours: k; fewer when there are not k other rows (then every row neighbours all the others).

    Example:
        >>> robin_hood_index(sample.rows, moments.mean)     # e.g. about 0.31 for static-avg vectors
    """
    unit = np.asarray(rows, dtype=np.float64) - np.asarray(center, dtype=np.float64)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    count = len(unit)
    k = min(neighbours, count - 1)
    if k < 1:
        return 0.0
    hits = np.zeros(count, dtype=np.int64)
    for start in range(0, count, KNN_BLOCK_ROWS):
        block = unit[start:start + KNN_BLOCK_ROWS] @ unit.T
        block[np.arange(len(block)), np.arange(start, start + len(block))] = -np.inf  # never its own neighbour
        nearest = np.argpartition(-block, k - 1, axis=1)[:, :k]
        hits += np.bincount(nearest.ravel(), minlength=count)
    return float(np.abs(hits - k).sum() / (2 * k * count))


class DistinctRowSample:
    """A seeded sample of at most `size` distinct rows of a stream, in one pass: those with the `size`
    smallest hashes (bottom-k), so equal rows count once and order or chunking do not matter.

    Args:
        size: the most rows kept.
        seed: chooses the hash, hence the sample.

    Example:
        >>> sample = DistinctRowSample(4000, seed=0)
        >>> for block in blocks:
        ...     sample.add(block)
        >>> sample.rows.shape                  # (min(4000, distinct rows), d), float64
    """

    def __init__(self, size: int = defaults.AUTO_SAMPLE_ROWS, seed: int = 0):
        self.size, self.seed = positive_int(size, "the sample size"), seed
        self._keys = np.empty(0, dtype=np.uint64)
        self._rows: np.ndarray | None = None
        self._multipliers: np.ndarray | None = None

    @property
    def rows(self) -> np.ndarray:
        """The sampled rows, float64 (m, d), in the order of their keys."""
        if self._rows is None:
            raise ValueError("no rows were added to the sample")
        return self._rows

    def add(self, block: np.ndarray) -> None:
        """Offer the rows of a finite (rows, d) block to the sample."""
        block = np.ascontiguousarray(block, dtype=np.float64)
        if len(block) == 0:
            return
        keys = self._hash(block)
        if len(self._keys) == self.size:  # full: only smaller keys can enter
            smaller = keys < self._keys[-1]
            keys, block = keys[smaller], block[smaller]
        keys = np.concatenate([self._keys, keys])
        rows = block if self._rows is None else np.concatenate([self._rows, block])
        keys, first = np.unique(keys, return_index=True)  # sorted, one row per key
        self._keys, self._rows = keys[:self.size], rows[first[:self.size]]

    def _hash(self, block: np.ndarray) -> np.ndarray:
        """Seeded 64-bit keys of the rows: a multilinear hash of their bytes, then SplitMix64's finaliser."""
        words = block.view(np.uint64)
        if self._multipliers is None:
            generator = np.random.default_rng(self.seed)
            self._multipliers = generator.integers(0, 2**64, size=words.shape[1] + 1, dtype=np.uint64) | np.uint64(1)
        elif len(self._multipliers) != words.shape[1] + 1:
            raise ValueError(f"expected rows of {len(self._multipliers) - 1} values, got {words.shape[1]}")
        with np.errstate(over="ignore"):
            key = (words * self._multipliers[1:]).sum(axis=1, dtype=np.uint64) + self._multipliers[0]
            key ^= key >> np.uint64(30)
            key *= _MIX[0]
            key ^= key >> np.uint64(27)
            key *= _MIX[1]
            key ^= key >> np.uint64(31)
        return key

"""Mergeable float64 moments of a stream of vectors (Chan, Golub & LeVeque 1979): the covariance of
a corpus that never fits in memory, in O(d²)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from flowcore import defaults

__all__ = ["Moments", "MomentsAccumulator", "row_blocks"]


def row_blocks(X, rows=None, prepare=None):
    """The rows of X numbered in `rows` (all if None), `defaults.STAT_BLOCK_ROWS` at a time, through `prepare`."""
    count = len(X) if rows is None else len(rows)
    for start in range(0, count, defaults.STAT_BLOCK_ROWS):
        stop = start + defaults.STAT_BLOCK_ROWS
        block = X[start:stop] if rows is None else X[rows[start:stop]]
        yield block if prepare is None else prepare(block)


@dataclass
class Moments:
    """Count, mean and co-moment of a set of d-dimensional rows (float64).

    Args:
        count: rows summarised.
        mean: their mean, shape (d,).
        comoment: Σ (x − mean)(x − mean)ᵀ, shape (d, d).

    Example:
        >>> total = Moments.of(X[:1000]).merge(Moments.of(X[1000:]))
        >>> total.covariance()              # equals np.cov(X, rowvar=False) to rounding
    """

    count: int
    mean: np.ndarray
    comoment: np.ndarray

    @classmethod
    def empty(cls, dim: int) -> "Moments":
        """The moments of no rows (the identity of `merge`)."""
        return cls(0, np.zeros(dim), np.zeros((dim, dim)))

    @classmethod
    def of(cls, X, row_offset: int = 0) -> "Moments":
        """The moments of the rows of X in float64; a row with NaN/Inf is refused by number (from `row_offset`)."""
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"expected a 2-D array of vectors (N, D), got shape {X.shape}")
        bad = ~np.isfinite(X).all(axis=1)
        if bad.any():
            raise ValueError(f"vectors contain NaN or Inf (first bad row: {row_offset + int(np.argmax(bad))})")
        if len(X) == 0:
            return cls.empty(X.shape[1])
        centred = np.array(X, dtype=np.float64)  # one float64 copy, centred in place
        mean = centred.mean(axis=0)
        centred -= mean
        return cls(len(X), mean, centred.T @ centred)

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def merge(self, other: "Moments") -> "Moments":
        """The moments of both sets of rows together: M = M_a + M_b + δδᵀ·n_a·n_b/n, δ = μ_b − μ_a."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge moments of {self.dim}- and {other.dim}-dimensional vectors")
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        comoment = self.comoment + other.comoment + np.outer(delta, delta) * (self.count * other.count / count)
        return Moments(count, mean, comoment)

    def covariance(self, ddof: int = 1) -> np.ndarray:
        """M / (n − ddof): the sample covariance (ddof=1, as `np.cov`), or the ML one (ddof=0)."""
        if self.count <= ddof:
            raise ValueError(f"a covariance needs more than {ddof} row(s), got {self.count}")
        return self.comoment / (self.count - ddof)

    @classmethod
    def of_chunks(cls, chunks: Iterable) -> "Moments":
        """The moments of a stream of (rows, d) chunks, combined pairwise (`MomentsAccumulator`)."""
        accumulator = MomentsAccumulator()
        for chunk in chunks:
            accumulator.add(chunk)
        return accumulator.total()


class MomentsAccumulator:
    """Combines a stream of chunk moments pairwise, as a binary counter does: rounding grows with log(chunks).

    Args:
        dim: the vectors' width, when known in advance (needed for `total` of an empty stream).

    Example:
        >>> accumulator = MomentsAccumulator()
        >>> for chunk in chunks:
        ...     accumulator.add(chunk)           # or add_moments(Moments) from another shard
        >>> moments = accumulator.total()
    """

    def __init__(self, dim: int | None = None):
        self.dim = dim
        self.rows = 0
        self._stack: list[Moments] = []

    def add(self, X) -> None:
        """Add the rows of one chunk (row numbers in errors count from the rows added so far)."""
        self.add_moments(Moments.of(X, row_offset=self.rows))

    def add_moments(self, moments: Moments) -> None:
        """Add the moments of a chunk or shard summarised elsewhere."""
        if self.dim is None:
            self.dim = moments.dim
        elif moments.dim != self.dim:
            raise ValueError(f"expected {self.dim}-dimensional vectors, got {moments.dim}")
        self.rows += moments.count
        while self._stack and self._stack[-1].count <= moments.count:
            moments = self._stack.pop().merge(moments)
        self._stack.append(moments)

    def total(self) -> Moments:
        """The moments of everything added (smallest partial sums merged first)."""
        if self.dim is None:
            raise ValueError("no vectors were added, so their width is unknown")
        total = Moments.empty(self.dim)
        for moments in reversed(self._stack):
            total = moments.merge(total)
        return total

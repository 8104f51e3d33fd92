"""BERT-whitening (Su et al. 2021): the closed-form baseline the flow is compared with.

`fit` estimates the mean μ and the covariance Σ = U·Λ·Uᵀ of the embeddings; `transform` maps
x → (x − μ)·U·Λ^(−1/2), so the result has zero mean and identity covariance. With `dim=k`
only the k directions of largest variance are kept (the paper's dimension reduction).
`from_moments` / `fit_chunks` fit the same thing from mergeable float64 statistics
(`flowcore.calibration.moments`), in O(d²) memory however many rows the corpus has.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from flowcore.calibration.moments import Moments

__all__ = ["Whitening"]


class Whitening:
    """Linear whitening fitted on a corpus of embeddings; optional reduction to `dim` columns.

    Directions whose variance is at most `tolerance` × the largest carry no information (e.g.
    the constant coordinates of a LayerNorm output) and would be blown up by Λ^(−1/2): they are
    dropped, so `output_dim` can be smaller than `dim` on a rank-deficient corpus.

    Args:
        dim: keep only the `dim` directions of largest variance (BERT-whitening-k); None keeps all.
        tolerance: directions with variance <= tolerance × the largest are dropped.

    Attributes:
        mean: μ, shape (D,); matrix: W = U·Λ^(−1/2), shape (D, output_dim); eigenvalues: the kept Λ;
        rank: how many directions have variance above the floor (tolerance × the largest);
        rows: how many rows the fit saw.

    Example:
        >>> whitening = Whitening(dim=256).fit(X)
        >>> Z = whitening.transform(X)          # float32 (n, 256), zero mean, identity covariance
        >>> Whitening(dim=256).fit_chunks(chunks)   # the same from a stream, O(d²) memory
    """

    def __init__(self, dim: int | None = None, tolerance: float = 1e-8):
        if dim is not None and dim < 1:
            raise ValueError(f"whitening dim must be a positive integer, got {dim}")
        self.dim = dim
        self.tolerance = tolerance
        self.mean: np.ndarray | None = None
        self.matrix: np.ndarray | None = None
        self.eigenvalues: np.ndarray | None = None
        self.rank: int | None = None
        self.rows: int | None = None

    def fit(self, X) -> "Whitening":
        """Estimate μ and W = U·Λ^(−1/2) (first `dim` columns) from the rows of X (in memory)."""
        X = self._validated(X, width=None)
        self._check_size(len(X), X.shape[1])
        mean = X.mean(axis=0)
        return self._fit_covariance(mean, np.cov(X - mean, rowvar=False), len(X))

    def fit_chunks(self, chunks: Iterable) -> "Whitening":
        """`fit` over a stream of (rows, D) chunks (e.g. blocks of a memory-mapped file), from
        their pairwise-merged float64 moments: equal to `fit` on all the rows to about 1e-10
        relative, in O(D²) memory.

        Args:
            chunks: arrays of the same width; NaN/Inf rows are refused naming the row.

        Returns:
            self, fitted.
        """
        return self.fit_moments(Moments.of_chunks(chunks))

    def fit_moments(self, moments: Moments) -> "Whitening":
        """Fit from the count, mean and co-moment of the corpus (`flowcore.calibration.moments`),
        e.g. merged from shards computed on other machines.

        Args:
            moments: the corpus's `Moments`.

        Returns:
            self, fitted.
        """
        self._check_size(moments.count, moments.dim)
        return self._fit_covariance(moments.mean, moments.covariance(ddof=1), moments.count)

    @classmethod
    def from_moments(cls, moments: Moments, dim: int | None = None, tolerance: float = 1e-8) -> "Whitening":
        """`Whitening(dim, tolerance).fit_moments(moments)`."""
        return cls(dim=dim, tolerance=tolerance).fit_moments(moments)

    def _check_size(self, rows: int, width: int) -> None:
        if rows < 2:
            raise ValueError(f"whitening needs at least 2 rows to estimate a covariance, got {rows}")
        if self.dim is not None and self.dim > width:
            raise ValueError(f"whitening dim {self.dim} exceeds the embedding width {width}")

    def _fit_covariance(self, mean: np.ndarray, covariance: np.ndarray, rows: int) -> "Whitening":
        """W from the float64 eigendecomposition of Σ; directions at or below the floor
        (tolerance × the largest eigenvalue, which also catches rounding's tiny negatives) are dropped."""
        self.mean = np.asarray(mean, dtype=np.float64)
        eigenvalues, eigenvectors = np.linalg.eigh(np.asarray(covariance, dtype=np.float64))
        order = np.argsort(eigenvalues)[::-1]
        eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
        informative = int((eigenvalues > self.tolerance * eigenvalues[0]).sum())
        if informative == 0:
            raise ValueError("whitening needs embeddings that vary: every row of the corpus is the same")
        keep = min(self.dim or len(self.mean), informative)
        self.rank, self.rows = informative, rows
        self.eigenvalues = eigenvalues[:keep]
        self.matrix = eigenvectors[:, :keep] / np.sqrt(self.eigenvalues)
        return self

    @property
    def output_dim(self) -> int:
        """Columns of `transform`'s result: `dim` (or D), less any directions without variance."""
        if self.matrix is None:
            raise ValueError("Whitening is not fitted: call fit(X) first")
        return self.matrix.shape[1]

    def transform(self, X) -> np.ndarray:
        """Whitened rows of X, float32, shape (N, output_dim)."""
        if self.matrix is None:
            raise ValueError("Whitening is not fitted: call fit(X) first")
        X = self._validated(X, width=self.mean.shape[0])
        return ((X - self.mean) @ self.matrix).astype(np.float32)

    def fit_transform(self, X) -> np.ndarray:
        """`fit(X)`, then `transform(X)`."""
        return self.fit(X).transform(X)

    @staticmethod
    def _validated(X, width: int | None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"expected a 2-D array of embeddings (N, D), got shape {X.shape}")
        if width is not None and X.shape[1] != width:
            raise ValueError(f"expected embeddings of width {width}, got width {X.shape[1]}")
        bad = ~np.isfinite(X).all(axis=1)
        if bad.any():
            raise ValueError(f"embeddings contain NaN or Inf (first bad row: {int(np.argmax(bad))})")
        return X

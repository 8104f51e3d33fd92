"""BERT-whitening (Su et al. 2021): the closed-form baseline the flow is compared with.

`fit` estimates the mean μ and the covariance Σ = U·Λ·Uᵀ of the embeddings; `transform` maps
x → (x − μ)·U·Λ^(−1/2), so the result has zero mean and identity covariance. With `dim=k`
only the k directions of largest variance are kept (the paper's dimension reduction).
"""
from __future__ import annotations

import numpy as np


class Whitening:
    """Linear whitening fitted on a corpus of embeddings; optional reduction to `dim` columns.

    Eigenvalues below `floor` × the largest are raised to that level, so directions without
    variance (rank-deficient corpora) are not blown up to infinity.
    """

    def __init__(self, dim: int | None = None, floor: float = 1e-6):
        if dim is not None and dim < 1:
            raise ValueError(f"whitening dim must be a positive integer, got {dim}")
        self.dim = dim
        self.floor = floor
        self.mean: np.ndarray | None = None
        self.matrix: np.ndarray | None = None
        self.eigenvalues: np.ndarray | None = None

    def fit(self, X) -> "Whitening":
        """Estimate μ and W = U·Λ^(−1/2) (first `dim` columns) from the rows of X."""
        X = self._validated(X, width=None)
        if len(X) < 2:
            raise ValueError(f"whitening needs at least 2 rows to estimate a covariance, got {len(X)}")
        if self.dim is not None and self.dim > X.shape[1]:
            raise ValueError(f"whitening dim {self.dim} exceeds the embedding width {X.shape[1]}")
        self.mean = X.mean(axis=0)
        covariance = np.cov(X - self.mean, rowvar=False)
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        order = np.argsort(eigenvalues)[::-1]
        eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
        eigenvalues = np.maximum(eigenvalues, self.floor * max(eigenvalues[0], np.finfo(float).tiny))
        keep = self.dim or X.shape[1]
        self.eigenvalues = eigenvalues[:keep]
        self.matrix = eigenvectors[:, :keep] / np.sqrt(self.eigenvalues)
        return self

    def transform(self, X) -> np.ndarray:
        """Whitened rows of X, float32, shape (N, dim or D)."""
        if self.matrix is None:
            raise ValueError("Whitening is not fitted: call fit(X) first")
        X = self._validated(X, width=self.mean.shape[0])
        return ((X - self.mean) @ self.matrix).astype(np.float32)

    def fit_transform(self, X) -> np.ndarray:
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

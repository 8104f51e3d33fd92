"""BERT-whitening (Su et al. 2021): the closed-form baseline the flow is compared with.

`fit` estimates the mean μ and the covariance Σ = U·Λ·Uᵀ of the embeddings; `transform` maps
x → (x − μ)·U·Λ^(−1/2), so the result has zero mean and identity covariance. With `dim=k`
only the k directions of largest variance are kept (the paper's dimension reduction).
"""
from __future__ import annotations

import numpy as np

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
        mean: μ, shape (D,); matrix: W = U·Λ^(−1/2), shape (D, output_dim); eigenvalues: the kept Λ.

    Example:
        >>> whitening = Whitening(dim=256).fit(X)
        >>> Z = whitening.transform(X)          # float32 (n, 256), zero mean, identity covariance
    """

    def __init__(self, dim: int | None = None, tolerance: float = 1e-8):
        if dim is not None and dim < 1:
            raise ValueError(f"whitening dim must be a positive integer, got {dim}")
        self.dim = dim
        self.tolerance = tolerance
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
        informative = int((eigenvalues > self.tolerance * eigenvalues[0]).sum())
        if informative == 0:
            raise ValueError("whitening needs embeddings that vary: every row of the corpus is the same")
        keep = min(self.dim or X.shape[1], informative)
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

"""Whitening, tempered and truncated (`whitening`), and ZCA whitening (`zca`)."""
from __future__ import annotations

import warnings

import numpy as np

from flowcore import defaults
from flowcore.calibration.base import positive_int
from flowcore.calibration.linear import TOLERANCE, LinearCalibrator, principal_axes

__all__ = ["Whitening", "ZCAWhitening"]


class Whitening(LinearCalibrator):
    """Whitening, x → (x − μ)·U_k·Λ_k^(−γ) with Σ = U·Λ·Uᵀ: γ = ½ is BERT-whitening (Su et al. 2021), a
    smaller γ tempers it where it would amplify noise. Directions of (near) zero variance are dropped.

    Args:
        keep: keep only the `keep` directions of largest variance (BERT-whitening-k); None keeps all.
        power: γ, from 0 (centre and rotate only) to 1; ½ is full whitening (identity covariance).
        tolerance: directions with variance <= tolerance × the largest are dropped.

    Attributes:
        eigenvalues, axes: the kept Λ_k, U_k; rank: the directions above the floor.

    Example:
        >>> Z = Whitening(keep=256).fit(X).transform(X)   # float32 (n, 256), identity covariance
        >>> Whitening(power=0.3).fit_chunks(chunks)      # tempered, from a stream in O(d²) memory
    """

    name = "whitening"
    _saved_arrays = ("mean", "matrix", "eigenvalues", "axes")
    _saved_values = ("rows", "rank")
    _renamed_settings = {"dim": "keep"}

    def __init__(self, keep: int | None = None, power: float = defaults.WHITENING_POWER, tolerance: float = TOLERANCE,
                 *, dim: int | None = None):
        super().__init__()
        if dim is not None:  # its name until `dim` came to mean the width of the vectors taken, as for every method
            warnings.warn("Whitening(dim=k) is now Whitening(keep=k); the old name goes at 1.0", DeprecationWarning,
                          stacklevel=2)
            keep = dim if keep is None else keep
        self.keep = None if keep is None else positive_int(keep, "whitening keep")
        if isinstance(power, bool) or not isinstance(power, (int, float)) or not 0 <= power <= 1:
            raise ValueError(f"whitening power must be a number from 0 (centre and rotate only) to 1; "
                             f"0.5 is full whitening; got {power!r}")
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise ValueError(f"whitening tolerance must be a number in [0, 1), got {tolerance!r}")
        self.power, self.tolerance = float(power), float(tolerance)
        self.eigenvalues: np.ndarray | None = None
        self.axes: np.ndarray | None = None
        self.rank: int | None = None

    def _fitted_matrix(self, mean, covariance):
        width = len(mean)
        if self.keep is not None and self.keep > width:
            raise ValueError(f"whitening cannot keep {self.keep} directions of {width}-wide vectors")
        eigenvalues, axes = principal_axes(covariance(), self.tolerance)
        self.rank = len(eigenvalues)
        self.eigenvalues, self.axes = eigenvalues[:self.keep].copy(), axes[:, :self.keep].copy()
        return self._matrix()

    def _matrix(self) -> np.ndarray:
        """W from the kept axes and eigenvalues: U_k·Λ_k^(−γ)."""
        return self.axes / self.eigenvalues ** self.power

    def _matrix_problem(self) -> str | None:
        if self.axes.ndim != 2 or self.eigenvalues.shape != self.axes.shape[1:] or self.axes.shape[0] != len(self.mean):
            return (f"its axes of shape {tuple(self.axes.shape)} and eigenvalues of shape "
                    f"{tuple(self.eigenvalues.shape)} do not fit its mean of shape {tuple(self.mean.shape)}")
        if (self.keep is not None and self.keep != self.axes.shape[1]) or not np.all(self.eigenvalues > 0):
            return f"its kept directions do not fit its settings ({self.settings()})"
        expected = self._matrix()
        if expected.shape != self.matrix.shape or not np.allclose(expected, self.matrix, rtol=1e-9, atol=0):
            return f"its matrix is not the {self.name} matrix of its axes, eigenvalues and settings ({self.settings()})"
        return None


class ZCAWhitening(Whitening):
    """ZCA whitening, x → (x − μ)·U·Λ^(−½)·Uᵀ: full whitening rotated back onto the input axes.

    Args:
        tolerance: directions with variance <= tolerance × the largest are dropped.

    Example:
        >>> Z = ZCAWhitening().fit(X).transform(X)      # float32 (n, d), identity covariance
    """

    name = "zca"

    def __init__(self, tolerance: float = TOLERANCE):
        super().__init__(tolerance=tolerance)

    def _matrix(self) -> np.ndarray:
        """W = U·Λ^(−½)·Uᵀ."""
        return super()._matrix() @ self.axes.T


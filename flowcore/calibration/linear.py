"""The linear calibrators, x → (x − μ)·W with W chosen from the corpus's covariance: the identity
(`none`), mean-centring (`center`) and all-but-the-top (`abtt`) here, whitening and ZCA in `whitening`;
and `principal_axes`, the one covariance eigen-decomposition."""
from __future__ import annotations

from abc import abstractmethod
from typing import Callable, ClassVar, Iterable

import numpy as np

from flowcore import defaults
from flowcore.calibration.base import Calibrator, positive_int, setting_names
from flowcore.calibration.moments import Moments

__all__ = ["TOLERANCE", "AllButTheTop", "Identity", "LinearCalibrator", "MeanCentering", "principal_axes"]

TOLERANCE = 1e-8
"""Directions with variance at most this × the largest carry no information and are dropped."""


def principal_axes(covariance: np.ndarray, tolerance: float = TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """(Λ, U): a covariance's eigenvalues, largest first, and unit eigenvectors as columns; directions
    at or below tolerance × the largest are dropped.

    Example:
        >>> eigenvalues, axes = principal_axes(np.cov(X, rowvar=False))
    """
    eigenvalues, eigenvectors = np.linalg.eigh(np.asarray(covariance, dtype=np.float64))
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    rank = int((eigenvalues > tolerance * eigenvalues[0]).sum())
    if rank == 0:
        raise ValueError("the embeddings do not vary: every row of the corpus is the same")
    return eigenvalues[:rank], eigenvectors[:, :rank]


def _rows(X, width: int | None, name: str, row_offset: int = 0) -> np.ndarray:
    """X as float64 numpy, checked (2-D, numeric, finite rows: bad rows named; `width` columns if given)."""
    from flowcore.validation import check_matrix

    rows = check_matrix(X, name="X", row_offset=row_offset, min_rows=0)
    if width is not None and rows.shape[1] != width:
        raise ValueError(f"X has {rows.shape[1]} features per row but this {name} calibrator was fitted on {width}")
    return rows.detach().cpu().double().numpy()


class LinearCalibrator(Calibrator):
    """x → (x − μ)·W, fitted without labels; subclasses choose W from the corpus mean and covariance.

    Attributes:
        mean: μ, float64 (dim,); matrix: W, float64 (dim, output_dim); rows: rows fitted on.
    """

    _saved_arrays: ClassVar[tuple[str, ...]] = ("mean", "matrix")
    """The float64 arrays a file holds (as "linear.<name>" tensors), restored on load."""
    _saved_values: ClassVar[tuple[str, ...]] = ("rows",)
    """The plain values a file holds (in its header's "fit"), restored on load."""

    def __init__(self):
        super().__init__()
        self.mean: np.ndarray | None = None
        self.matrix: np.ndarray | None = None
        self.rows: int | None = None

    @abstractmethod
    def _fitted_matrix(self, mean: np.ndarray, covariance: Callable[[], np.ndarray]) -> np.ndarray:
        """W for a corpus of mean μ; `covariance()` computes its sample covariance when W needs it."""

    def _matrix_problem(self) -> str | None:
        """Why the loaded W is not what this method computes from its other saved parts and settings (None: it
        is, or W has no other source): a file whose header names another method or settings than its tensors."""
        return None

    def settings(self) -> dict:
        """The constructor's settings, which these classes keep as attributes of the same names."""
        return {name: getattr(self, name) for name in setting_names(self.name)}

    def fit(self, X, encoder=None) -> LinearCalibrator:
        """Estimate μ and W from the rows of X (at least 2, finite), in memory in float64.

        Args:
            X: (n, d) sentence vectors.
            encoder: the `Encoder` (or `EncoderProvenance`) that produced X, saved as `provenance`.
        """
        encoder = self._encoder_of(X, encoder)
        X = _rows(X, None, self.name)
        if len(X) < 2:
            raise ValueError(f"{self.name} needs at least 2 rows, got {len(X)}")
        mean = X.mean(axis=0)
        return self._fit(mean, lambda: np.atleast_2d(np.cov(X - mean, rowvar=False)), len(X), encoder)

    def fit_moments(self, moments: Moments, encoder=None) -> LinearCalibrator:
        """Fit from the corpus's moments, e.g. merged from shards computed elsewhere (`flowcore.ray.moments`).

        Args:
            moments: the corpus's `Moments`.
            encoder: as in `fit`.
        """
        return self._fit(moments.mean, lambda: moments.covariance(ddof=1), moments.count, encoder)

    def fit_chunks(self, chunks: Iterable, encoder=None) -> LinearCalibrator:
        """`fit` over a stream of (rows, d) chunks, from their merged float64 moments in O(d²) memory.

        Args:
            chunks: arrays of the same width; a row with NaN/Inf is refused by number.
            encoder: as in `fit`.

        Example:
            >>> Whitening(keep=256).fit_chunks(block for _, block in NpyMatrix("big.npy").blocks(16384))
        """
        return self.fit_moments(Moments.of_chunks(chunks), encoder=encoder)

    @classmethod
    def from_moments(cls, moments: Moments, **settings) -> LinearCalibrator:
        """`cls(**settings).fit_moments(moments)`."""
        return cls(**settings).fit_moments(moments)

    def _fit(self, mean, covariance: Callable[[], np.ndarray], rows: int, encoder) -> LinearCalibrator:
        if rows < 2:
            raise ValueError(f"{self.name} needs at least 2 rows, got {rows}")
        provenance = self._provenance_of(encoder)
        mean = np.asarray(mean, dtype=np.float64)
        self.matrix = self._fitted_matrix(mean, covariance)
        self.mean, self.rows, self.provenance = mean, int(rows), provenance
        return self

    def _fitted(self) -> np.ndarray:
        if self.matrix is None:
            raise ValueError(f"this {type(self).__name__} is not fitted: call fit(X) or flowcore.load(path) first")
        return self.matrix

    @property
    def dim(self) -> int:
        return self._fitted().shape[0]

    @property
    def output_dim(self) -> int:
        return self._fitted().shape[1]

    def transform(self, X) -> np.ndarray:
        """Calibrated rows of X, float32 (n, output_dim); a row with NaN/Inf, or whose result does not fit
        float32, is refused by number."""
        return self._map_chunks(X, self._map_chunk, defaults.TRANSFORM_CHUNK_ROWS)

    def _map_chunk(self, rows, row_offset: int) -> np.ndarray:
        return (_rows(rows, self.dim, self.name, row_offset) - self.mean) @ self.matrix

    def as_module(self):
        """x -> (x − μ)·W as a float32 `LinearMap` (see `Calibrator.as_module`)."""
        from flowcore.calibration.modules import LinearMap

        return LinearMap(self.mean, self._fitted()).eval()

    def _contents(self) -> tuple[dict, dict]:
        import torch

        self._fitted()
        tensors = {f"linear.{name}": torch.from_numpy(np.ascontiguousarray(getattr(self, name)))
                   for name in self._saved_arrays}
        return tensors, {"settings": self.settings(), "fit": {name: getattr(self, name) for name in self._saved_values}}

    @classmethod
    def _from_file(cls, path, tensors: dict, info: dict, device) -> LinearCalibrator:
        settings = {cls._renamed_settings.get(key, key): value for key, value in info.get("settings", {}).items()}
        unknown = sorted(set(settings) - set(setting_names(cls.name)))
        if unknown:
            raise ValueError(f"its settings name {', '.join(unknown)}, which {cls.name} does not have")
        expected = {f"linear.{name}" for name in cls._saved_arrays}
        if set(tensors) != expected:
            extra, missing = sorted(set(tensors) - expected), sorted(expected - set(tensors))
            raise ValueError(f"it holds {'the tensors ' + ', '.join(extra) if extra else 'no tensor ' + missing[0]}, "
                             f"which a {cls.name} file does {'not ' if extra else ''}have")
        calibrator = cls(**settings)
        for name in cls._saved_arrays:
            setattr(calibrator, name, tensors[f"linear.{name}"].double().numpy().copy())
        mean, matrix = calibrator.mean, calibrator.matrix
        if mean.ndim != 1 or matrix.ndim != 2 or matrix.shape[0] != mean.shape[0]:
            raise ValueError(f"mean of shape {tuple(mean.shape)} does not fit a matrix of shape {tuple(matrix.shape)}")
        if 0 in matrix.shape:
            raise ValueError(f"its matrix of shape {tuple(matrix.shape)} maps no vector to anything")
        for name in cls._saved_values:
            setattr(calibrator, name, info.get("fit", {}).get(name))
        problem = calibrator._matrix_problem()
        if problem is not None:
            raise ValueError(problem)
        return calibrator


class Identity(Calibrator):
    """x → x: the raw vectors, as a calibrator; fitting only records the width (others are then refused).

    Example:
        >>> Identity().transform(X)      # float32 copy of X
    """

    name = "none"

    def __init__(self):
        super().__init__()
        self._dim: int | None = None

    def fit(self, X, encoder=None) -> Identity:
        """Check X and record its width and `encoder`; nothing is learnt."""
        return self.fit_chunks([X], encoder=self._encoder_of(X, encoder))

    def fit_chunks(self, chunks: Iterable, encoder=None) -> Identity:
        """`fit` over a stream of (rows, d) chunks, each checked (rows numbered across the stream)."""
        provenance = self._provenance_of(encoder)
        width, count = None, 0
        for chunk in chunks:
            checked = _rows(chunk, width, self.name, row_offset=count)
            width, count = checked.shape[1], count + len(checked)
        if width is None:
            raise ValueError("none needs at least 1 row, got 0")
        self._dim, self.provenance = width, provenance
        return self

    @property
    def dim(self) -> int:
        if self._dim is None:
            raise ValueError("this Identity has no width until fitted: call fit(X) or flowcore.load(path) first")
        return self._dim

    def transform(self, X) -> np.ndarray:
        """A float32 copy of the rows of X; a finite row beyond float32 is refused (`NonFiniteOutputError`)."""
        width = np.shape(X)[1] if self._dim is None and np.ndim(X) == 2 else self._dim  # unfitted: any width
        return self._map_chunks(X, lambda rows, row_offset: _rows(rows, self._dim, self.name, row_offset),
                                defaults.TRANSFORM_CHUNK_ROWS, output_dim=width)

    def as_module(self):
        """x -> x as a `Passthrough` module (see `Calibrator.as_module`)."""
        from flowcore.calibration.modules import Passthrough

        return Passthrough(self.dim).eval()

    def _contents(self) -> tuple[dict, dict]:
        return {}, {"settings": {}, "fit": {"dim": self.dim}}

    @classmethod
    def _from_file(cls, path, tensors: dict, info: dict, device) -> Identity:
        if tensors or info.get("settings"):
            raise ValueError(f"it holds {'tensors' if tensors else 'settings'}, which a none file does not have")
        calibrator = cls()
        calibrator._dim = positive_int(info["fit"]["dim"], "its width")
        return calibrator


class MeanCentering(LinearCalibrator):
    """x → x − μ: removes the common direction every vector shares (the cheapest remedy).

    Example:
        >>> Z = MeanCentering().fit(X).transform(X)      # float32 (n, d), zero mean
    """

    name = "center"

    def _fitted_matrix(self, mean, covariance):
        return np.eye(len(mean))

    def _matrix_problem(self) -> str | None:
        return None if np.array_equal(self.matrix, np.eye(len(self.mean))) else "its matrix is not the identity"


class AllButTheTop(LinearCalibrator):
    """Mu & Viswanath's all-but-the-top: x → (x − μ)(I − U_k U_kᵀ), removing the `k` top principal directions.

    Args:
        k: directions removed; None uses the authors' rule, round(d / 100), at least 1.

    Example:
        >>> Z = AllButTheTop(k=3).fit(X).transform(X)    # float32 (n, d)
    """

    name = "abtt"

    def __init__(self, k: int | None = None):
        super().__init__()
        self.k = None if k is None else positive_int(k, "all-but-the-top k")

    def removed(self, dim: int) -> int:
        """How many directions are removed from `dim`-wide vectors."""
        return self.k if self.k is not None else max(1, round(dim / 100))

    def _fitted_matrix(self, mean, covariance):
        width = len(mean)
        k = self.removed(width)
        if k >= width:
            raise ValueError(f"all-but-the-top k={k} must be below the embedding width {width}")
        top = principal_axes(covariance())[1][:, :k]
        return np.eye(width) - top @ top.T

    def _matrix_problem(self) -> str | None:
        width, k = self.matrix.shape[0], self.removed(self.matrix.shape[0])
        if self.matrix.shape != (width, width) or round(float(np.trace(self.matrix))) != width - k:
            return f"its matrix is not a projection removing {k} of {width} directions"
        return None

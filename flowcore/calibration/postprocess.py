"""The linear post-processings the flow is compared with, as calibrators: mean-centring,
all-but-the-top (Mu & Viswanath 2018), PCA whitening (BERT-whitening, and whitening-k) and ZCA
whitening. Each maps x → (x − μ)·W with one fitted matrix W, and all share the flow's API:
`fit(X, encoder=...)`, `transform`, `save`, `load` into the same safetensors + JSON file
(`flow_file.save_flow`), whose `info["kind"]` says which calibrator it holds;
`load_calibrator` dispatches on it (a file without a kind is a `FlowCalibrator`'s).

Every eigen-decomposition goes through `flowcore.calibration.whitening.Whitening` (float64 `eigh`,
directions without variance dropped), so the covariance math has one home.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from flowcore.calibration.flow_file import EncoderProvenance, FlowFileError, load_flow, save_flow
from flowcore.calibration.whitening import Whitening
from flowcore.validation import check_matrix

__all__ = ["AllButTheTop", "FLOW_KIND", "LINEAR_KINDS", "LinearCalibrator", "MeanCentering", "PCAWhitening",
           "ZCAWhitening", "load_calibrator"]

FLOW_KIND = "flow"
"""The kind of a `FlowCalibrator` file (files that record no kind are flow files)."""


class LinearCalibrator(ABC):
    """x → (x − μ)·W, fitted without labels; subclasses choose W from the corpus's covariance.

    Attributes:
        mean: μ, float64 (D,); matrix: W, float64 (D, output_dim).
        provenance: the `EncoderProvenance` of the fit vectors (saved in the file), or None.
        metadata: JSON-able values of your own, saved with the calibrator.
    """

    kind: str = ""

    def __init__(self):
        self.mean: np.ndarray | None = None
        self.matrix: np.ndarray | None = None
        self.provenance: EncoderProvenance | None = None
        self.metadata: dict = {}

    def settings(self) -> dict:
        """The constructor arguments, as saved in the file."""
        return {}

    @abstractmethod
    def _matrix(self, X: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """W for the float64 rows X with mean μ."""

    def fit(self, X, encoder=None) -> "LinearCalibrator":
        """Estimate μ and W from the rows of X (at least 2, finite).

        Args:
            X: (n, d) sentence vectors.
            encoder: the `Encoder` (or `EncoderProvenance`) that produced X, saved as `provenance`.
        """
        X = self._rows(X, width=None)
        if len(X) < 2:
            raise ValueError(f"{self.kind} needs at least 2 rows, got {len(X)}")
        mean = X.mean(axis=0)
        self.matrix, self.mean = self._matrix(X, mean), mean
        if encoder is not None:
            self.provenance = encoder if isinstance(encoder, EncoderProvenance) else EncoderProvenance.of(encoder)
        return self

    @property
    def dim(self) -> int:
        """Width of the vectors taken."""
        return self._fitted().shape[0]

    @property
    def output_dim(self) -> int:
        """Width of the vectors returned."""
        return self._fitted().shape[1]

    def _fitted(self) -> np.ndarray:
        if self.matrix is None:
            raise ValueError(f"this {type(self).__name__} is not fitted: call fit(X) or load(path) first")
        return self.matrix

    def transform(self, X) -> np.ndarray:
        """Calibrated rows of X, float32 (N, output_dim)."""
        matrix = self._fitted()
        X = self._rows(X, width=matrix.shape[0])
        return ((X - self.mean) @ matrix).astype(np.float32)

    def _rows(self, X, width: int | None) -> np.ndarray:
        rows = check_matrix(X, name="X")  # 2-D, numeric, finite (names the bad rows)
        if width is not None and rows.shape[1] != width:
            raise ValueError(f"X has {rows.shape[1]} features per row but this {self.kind} calibrator "
                             f"was fitted on {width}")
        return rows.double().numpy()

    def fit_transform(self, X, encoder=None) -> np.ndarray:
        """`fit(X)`, then `transform(X)`."""
        return self.fit(X, encoder=encoder).transform(X)

    def save(self, path) -> None:
        """Write the calibrator to one safetensors file with a JSON header (atomically)."""
        matrix = self._fitted()
        info = {"kind": self.kind, "settings": self.settings(), "metadata": self.metadata,
                "encoder": self.provenance.to_json() if self.provenance is not None else None}
        save_flow(path, {"linear.mean": torch.from_numpy(self.mean), "linear.matrix": torch.from_numpy(matrix)}, info)

    @classmethod
    def load(cls, path) -> "LinearCalibrator":
        """The calibrator saved at `path`; refuses a file of another kind, naming both."""
        calibrator = load_calibrator(path)
        if not isinstance(calibrator, cls):
            raise FlowFileError(f"{path}: holds the {_kind_of(calibrator)} calibrator, not {cls.kind or cls.__name__}; "
                                f"load it with flowcore.calibration.postprocess.load_calibrator")
        return calibrator


class MeanCentering(LinearCalibrator):
    """x → x − μ: removes the common direction every vector shares (the cheapest remedy).

    Example:
        >>> Z = MeanCentering().fit(X).transform(X)      # float32 (n, d), zero mean
    """

    kind = "center"

    def _matrix(self, X, mean):
        return np.eye(X.shape[1])


class AllButTheTop(LinearCalibrator):
    """Mu & Viswanath's all-but-the-top: centre, then remove the `k` top principal directions,
    x → (x − μ)(I − U_k U_kᵀ); the width is kept.

    Args:
        k: directions removed; None uses the authors' rule, round(d / 100), at least 1.

    Example:
        >>> Z = AllButTheTop(k=3).fit(X).transform(X)    # float32 (n, d)
    """

    kind = "abtt"

    def __init__(self, k: int | None = None):
        super().__init__()
        if k is not None and k < 1:
            raise ValueError(f"all-but-the-top k must be a positive integer, got {k}")
        self.k = k

    def settings(self) -> dict:
        return {"k": self.k}

    def removed(self, dim: int) -> int:
        """How many directions are removed from `dim`-wide vectors."""
        return self.k if self.k is not None else max(1, round(dim / 100))

    def _matrix(self, X, mean):
        k = self.removed(X.shape[1])
        if k >= X.shape[1]:
            raise ValueError(f"all-but-the-top k={k} must be below the embedding width {X.shape[1]}")
        top = _principal_directions(Whitening(dim=k).fit(X))
        return np.eye(X.shape[1]) - top @ top.T


class PCAWhitening(LinearCalibrator):
    """BERT-whitening, x → (x − μ)·U·Λ^(−1/2), optionally keeping the `dim` largest-variance
    directions (whitening-k); the same W as `flowcore.Whitening`, in the calibrator file format.

    Args:
        dim: directions kept (None: all that vary).

    Example:
        >>> Z = PCAWhitening(dim=256).fit(X).transform(X)   # float32 (n, 256), identity covariance
    """

    kind = "pca-whitening"

    def __init__(self, dim: int | None = None):
        super().__init__()
        if dim is not None and dim < 1:
            raise ValueError(f"whitening dim must be a positive integer, got {dim}")
        self.dim_kept = dim

    def settings(self) -> dict:
        return {"dim": self.dim_kept}

    def _matrix(self, X, mean):
        return Whitening(dim=self.dim_kept).fit(X).matrix


class ZCAWhitening(LinearCalibrator):
    """ZCA whitening, x → (x − μ)·U·Λ^(−1/2)·Uᵀ: identity covariance like PCA whitening, rotated
    back so that each output coordinate stays as close as possible to its input coordinate.

    Example:
        >>> Z = ZCAWhitening().fit(X).transform(X)      # float32 (n, d), identity covariance
    """

    kind = "zca-whitening"

    def _matrix(self, X, mean):
        whitening = Whitening().fit(X)
        return whitening.matrix @ _principal_directions(whitening).T


LINEAR_KINDS = {cls.kind: cls for cls in (MeanCentering, AllButTheTop, PCAWhitening, ZCAWhitening)}
"""Linear calibrator classes by the `kind` recorded in their files."""


def _principal_directions(whitening: Whitening) -> np.ndarray:
    """U (D, kept): the unit eigenvectors behind a fitted Whitening's W = U·Λ^(−1/2)."""
    return whitening.matrix * np.sqrt(whitening.eigenvalues)


def _kind_of(calibrator) -> str:
    return getattr(calibrator, "kind", FLOW_KIND)


def load_calibrator(path, device=None):
    """Any calibrator file: a `FlowCalibrator` (kind "flow", or no kind) or a linear one.

    Args:
        path: a file written by `save` of any calibrator (or `flowcore fit`).
        device: torch device for a flow (linear calibrators run in numpy).

    Example:
        >>> calibrator = load_calibrator("abtt.flow")      # AllButTheTop, fitted
    """
    tensors, info = load_flow(path)
    kind = info.get("kind", FLOW_KIND)
    if kind == FLOW_KIND:
        from flowcore.calibration.calibrator import FlowCalibrator

        return FlowCalibrator.load(path, device=device)
    if kind not in LINEAR_KINDS:
        raise FlowFileError(f"{path}: unknown calibrator kind {kind!r}; this flowcore reads "
                            f"{', '.join([FLOW_KIND, *LINEAR_KINDS])}")
    try:
        calibrator = LINEAR_KINDS[kind](**info.get("settings", {}))
        mean = tensors["linear.mean"].double().numpy().copy()
        matrix = tensors["linear.matrix"].double().numpy().copy()
        if mean.ndim != 1 or matrix.ndim != 2 or matrix.shape[0] != mean.shape[0]:
            raise ValueError(f"mean of shape {tuple(mean.shape)} does not fit a matrix of shape {tuple(matrix.shape)}")
        encoder = info.get("encoder")
        calibrator.provenance = EncoderProvenance(**encoder) if encoder is not None else None
    except (KeyError, TypeError, ValueError) as error:
        raise FlowFileError(f"{path}: {kind} calibrator file does not match its recorded settings: {error}") from None
    calibrator.mean, calibrator.matrix = mean, matrix
    calibrator.metadata = info.get("metadata", {})
    return calibrator

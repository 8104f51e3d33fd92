"""`auto`: the calibration chosen from the fit corpus alone, without labels: whitening of the fewest
leading directions holding 90 % of the variance when the corpus's hubness (`flowcore.calibration.hubness`)
reaches a threshold, the raw vectors otherwise (docs/calibration.md explains the rule)."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from flowcore import defaults
from flowcore.calibration.base import positive_int
from flowcore.calibration.hubness import DistinctRowSample, robin_hood_index
from flowcore.calibration.linear import LinearCalibrator, _rows, principal_axes
from flowcore.calibration.moments import Moments, MomentsAccumulator, row_blocks
from flowcore.calibration.whitening import Whitening

__all__ = ["AutoCalibration"]

CHOICES = ("none", "whitening")


class AutoCalibration(LinearCalibrator):
    """Whitening or the raw vectors, chosen by the hubness of the fit corpus (see the module); once
    fitted, the chosen linear map x → (x − μ)·W (μ = 0 and W = I for none).

    Args:
        seed: chooses the sample of fit rows the hubness is measured on (same seed, same choice).
        threshold: whitening is chosen when the Robin Hood index is at least this.
        variance_share: whitening keeps the fewest leading directions holding this share of the variance.
        sample_rows: the most distinct fit rows sampled (the threshold is calibrated for the default).
        neighbours: k of the k-NN graph.

    Attributes:
        choice: "none" or "whitening".
        signals: the evidence: {"hubness": the Robin Hood index, "sampled_rows", "dim": the directions
            whitening keeps (or would keep), "rank": directions with variance, and the settings used}.

    Example:
        >>> auto = AutoCalibration().fit(X)
        >>> auto.choice, auto.signals["hubness"]    # e.g. ("whitening", 0.31) for static-avg vectors
        >>> Z = auto.transform(X)
        >>> AutoCalibration().fit_chunks(block for _, block in NpyMatrix("big.npy").blocks(16384))
    """

    name = "auto"
    _saved_values = ("rows", "choice", "signals")

    def __init__(self, seed: int = 0, threshold: float = defaults.AUTO_HUBNESS_THRESHOLD,
                 variance_share: float = defaults.AUTO_VARIANCE_SHARE, sample_rows: int = defaults.AUTO_SAMPLE_ROWS,
                 neighbours: int = defaults.AUTO_NEIGHBOURS):
        super().__init__()
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"auto seed must be an integer, got {seed!r}")
        for setting, value in (("threshold", threshold), ("variance_share", variance_share)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"auto {setting} must be a number in (0, 1], got {value!r}")
        self.seed, self.threshold, self.variance_share = int(seed), float(threshold), float(variance_share)
        self.sample_rows = positive_int(sample_rows, "auto sample_rows")
        self.neighbours = positive_int(neighbours, "auto neighbours")
        self.choice: str | None = None
        self.signals: dict = {}

    @property
    def reason(self) -> str:
        """What was chosen and why, in one line, e.g. "whitening, 199 directions (hubness 0.310 ≥ 0.265)"."""
        self._fitted()
        signals = self.signals
        few = "" if signals["sampled_rows"] >= self.sample_rows else (
            f"; measured on only {signals['sampled_rows']} distinct rows, fewer than the {self.sample_rows} the "
            "threshold is set for")
        if self.choice == "none":
            return (f"none, the raw vectors (hubness {signals['hubness']:.3f} < {signals['threshold']:g}: "
                    f"neighbourhoods already balanced{few})")
        return (f"whitening, {signals['dim']} directions (hubness {signals['hubness']:.3f} ≥ "
                f"{signals['threshold']:g}{few})")

    def fit(self, X, encoder=None) -> AutoCalibration:
        """Choose and fit on the rows of X (at least 2, finite), read `defaults.STAT_BLOCK_ROWS` at a time.

        Args:
            X: (n, d) sentence vectors, e.g. a memory map.
            encoder: the `Encoder` (or `EncoderProvenance`) that produced X, saved as `provenance`.
        """
        if np.ndim(X) != 2:
            _rows(np.asarray(X), None, self.name)  # the shape error
        return self.fit_chunks(row_blocks(X), encoder=self._encoder_of(X, encoder))

    def fit_chunks(self, chunks: Iterable, encoder=None) -> AutoCalibration:
        """`fit` over a stream of (rows, d) chunks in one pass, in O(d² + sample_rows·d) memory: the same choice.

        Args:
            chunks: arrays of the same width; a row with NaN/Inf is refused by number.
            encoder: as in `fit`.
        """
        provenance = self._provenance_of(encoder)
        accumulator, sample, width = MomentsAccumulator(), DistinctRowSample(self.sample_rows, self.seed), None
        for chunk in chunks:
            rows = _rows(chunk, width, self.name, row_offset=accumulator.rows)
            width = rows.shape[1]
            accumulator.add(rows)
            sample.add(rows)
        if accumulator.rows < 2:
            raise ValueError(f"{self.name} needs at least 2 rows, got {accumulator.rows}")
        self._choose(accumulator.total(), sample.rows)
        self.provenance = provenance
        return self

    def _fitted_matrix(self, mean, covariance):  # only `fit_moments` calls this: refused, `_choose` fits from rows
        raise ValueError("auto measures the hubness of a sample of the fit rows, which moments alone do not hold: "
                         "fit it with fit(X) or fit_chunks(chunks)")

    def _choose(self, moments: Moments, sample: np.ndarray) -> None:
        eigenvalues, _ = principal_axes(moments.covariance())
        shares = np.cumsum(eigenvalues) / eigenvalues.sum()
        dim = min(int(np.searchsorted(shares, self.variance_share)) + 1, len(eigenvalues))
        hubness = robin_hood_index(sample, moments.mean, self.neighbours)
        signals = {"hubness": hubness, "threshold": self.threshold, "neighbours": self.neighbours,
                   "sampled_rows": len(sample), "dim": dim, "variance_share": self.variance_share,
                   "rank": len(eigenvalues)}
        if hubness >= self.threshold:
            whitening = Whitening(keep=dim).fit_moments(moments)
            self.mean, self.matrix, self.choice = whitening.mean, whitening.matrix, "whitening"
        else:
            self.mean, self.matrix, self.choice = np.zeros(moments.dim), np.eye(moments.dim), "none"
        self.rows, self.signals = moments.count, signals

    def _map_chunk(self, rows, row_offset: int) -> np.ndarray:
        """Whitened rows, or for none the checked rows themselves."""
        if self.choice == "none":
            return _rows(rows, self.dim, self.name, row_offset)
        return super()._map_chunk(rows, row_offset)

    def report(self) -> dict:
        """`Calibrator.report`, with what auto chose and on what evidence."""
        self._fitted()
        return {**super().report(), "choice": self.choice, "signals": dict(self.signals), "reason": self.reason,
                "summary": f"auto: {self.reason}"}

    def as_module(self):
        """The chosen map: whitening's `LinearMap`, or for none a `Passthrough` (see `Calibrator.as_module`)."""
        self._fitted()
        if self.choice == "none":
            from flowcore.calibration.modules import Passthrough

            return Passthrough(self.dim).eval()
        return super().as_module()

    def _matrix_problem(self) -> str | None:
        if self.choice not in CHOICES:
            return f"unknown choice {self.choice!r}; auto chooses {' or '.join(CHOICES)}"
        width = len(self.mean)
        if self.choice == "none" and not (np.array_equal(self.matrix, np.eye(width)) and not self.mean.any()):
            return "it chose none, but its mean and matrix are not zero and the identity"
        if self.choice == "whitening" and self.matrix.shape[1] != (self.signals or {}).get("dim"):
            return f"it chose whitening to {(self.signals or {}).get('dim')} directions, but its matrix keeps " \
                   f"{self.matrix.shape[1]}"
        return None

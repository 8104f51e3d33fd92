"""`FlowCalibrator`: fit a Glow on sentence vectors, then map any number of vectors to the
calibrated (isotropic Gaussian) space, scikit-learn style."""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import torch

from flowcore.calibration.flow_file import EncoderProvenance, FlowFileError, load_flow, save_flow
from flowcore.calibration.standardize import Standardizer
from flowcore.flows.glow import CONFIGS, Glow
from flowcore.flows.train import fit
from flowcore.validation import check_matrix

__all__ = ["CHUNK_ROWS", "FlowCalibrator"]

CHUNK_ROWS = 65536
"""Rows mapped per step by `transform`/`inverse_transform` (bounds the working memory)."""


class FlowCalibrator:
    r"""Unsupervised BERT-flow calibration of embeddings.

    `fit(X)` trains a `Glow.from_config(config, dim)` by maximum likelihood; `transform(X)` returns
    the latent z as float32 numpy. With `standardize=True` (the default) each coordinate is first
    standardised over the whole of X and coordinates that never vary bypass the flow (see
    `flowcore.calibration.standardize`); `standardize=False` feeds the raw vectors, as the paper's
    code does.

    Args:
        config: a Glow configuration name from `flowcore.CONFIGS`, e.g. "l2_d3_w32".
        epochs: training epochs over X.
        batch_size: training batch size (the paper's 32).
        lr: Adam's learning rate (the paper's 1e-3).
        seed: seeds the flow's initialisation and the batch order (same seed, same model).
        device: torch device to train and calibrate on (default: where the flow is built, CPU).
        standardize: standardise coordinates before the flow (see above).

    Attributes:
        provenance: the `EncoderProvenance` (encoder and pooling) the vectors came from, saved
            in the flow file and checked by `flowcore calibrate`; None for vectors of unknown origin.
        metadata: a dict of JSON-able values of your own, saved with the model.
        losses: the per-epoch training losses (bits per dimension).

    Example:
        >>> calibrator = FlowCalibrator("l2_d3_w32").fit(X, encoder=encoder)
        >>> Z = calibrator.transform(X)          # float32 (n, d)
        >>> calibrator.save("model.flow")
        >>> calibrator = FlowCalibrator.load("model.flow")
    """

    def __init__(self, config: str = "l2_d3_w32", epochs: int = 1, batch_size: int = 32,
                 lr: float = 1e-3, seed: int = 0, device=None, standardize: bool = True):
        if config not in CONFIGS:
            raise ValueError(f"unknown flow config {config!r}; choose one of {', '.join(CONFIGS)}")
        self.config = config
        self.epochs, self.batch_size, self.lr, self.seed = epochs, batch_size, lr, seed
        self.standardize = standardize
        self.device = torch.device(device) if device is not None else None
        self.flow: Glow | None = None
        self.standardizer: Standardizer | None = None
        self.losses: list[float] = []
        self.metadata: dict = {}
        self.provenance: EncoderProvenance | None = None

    @property
    def dim(self) -> int:
        """Width of the vectors this calibrator takes and returns."""
        self._fitted()
        return self.standardizer.dim if self.standardizer is not None else self.flow.dim

    def _fitted(self) -> Glow:
        if self.flow is None:
            raise RuntimeError("this FlowCalibrator is not fitted yet; call .fit(X) or FlowCalibrator.load(path)")
        return self.flow

    def fit(self, X, progress: bool = True, encoder=None) -> "FlowCalibrator":
        """Train on the rows of `X` (numpy array or tensor, at least 2 rows).

        Args:
            X: (n, d) sentence vectors.
            progress: show a progress bar.
            encoder: the `Encoder` (or an `EncoderProvenance`) that produced X, recorded as
                `provenance`; None keeps the current one.

        Returns:
            self, fitted.
        """
        provenance = self.provenance
        if encoder is not None:
            provenance = encoder if isinstance(encoder, EncoderProvenance) else EncoderProvenance.of(encoder)
        data = check_matrix(X, min_rows=2)
        standardizer = None
        if self.standardize:
            standardizer = Standardizer(data.shape[1]).fit(data)
            data = standardizer(data)[:, standardizer.varying]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            flow = Glow.from_config(self.config, data.shape[1])
        if self.device is not None:
            flow.to(self.device)
            if standardizer is not None:
                standardizer.to(self.device)
        self.losses = fit(flow, data, epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                          seed=self.seed, progress=progress)
        self.flow, self.standardizer, self.provenance = flow.eval(), standardizer, provenance
        return self

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.standardizer is None:
            return self.flow(x)[0]
        y = self.standardizer(x)
        if self.standardizer.all_varying:  # the usual case: no gather/scatter on the hot path
            return self.flow(y)[0]
        varying = self.standardizer.varying
        y[:, varying] = self.flow(y[:, varying])[0]
        return y

    def _inverse(self, z: torch.Tensor) -> torch.Tensor:
        if self.standardizer is None:
            return self.flow.inverse(z)
        if self.standardizer.all_varying:
            return self.standardizer.inverse(self.flow.inverse(z))
        varying = self.standardizer.varying
        y = z.clone()
        y[:, varying] = self.flow.inverse(z[:, varying])
        return self.standardizer.inverse(y)

    def _map(self, X, inverse: bool, chunk_rows: int) -> np.ndarray:
        flow, dim = self._fitted(), self.dim
        parameter = next(flow.parameters())
        rows = len(X)
        out = np.empty((rows, dim), dtype=np.float32)
        for start in range(0, rows, chunk_rows):
            chunk = check_matrix(X[start : start + chunk_rows], dim=dim, row_offset=start,
                                 name="Z" if inverse else "X")
            chunk = chunk.to(device=parameter.device, dtype=parameter.dtype)
            with torch.inference_mode():
                mapped = self._inverse(chunk) if inverse else self._forward(chunk)
            out[start : start + len(chunk)] = mapped.float().cpu().numpy()
        return out

    def transform(self, X, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
        """Calibrated vectors z (float32 numpy), computed `chunk_rows` rows at a time."""
        if np.ndim(X) != 2:
            check_matrix(np.asarray(X))
        return self._map(X, inverse=False, chunk_rows=chunk_rows)

    def transform_iter(self, chunks: Iterable) -> Iterator[np.ndarray]:
        """Calibrate a stream of (rows, dim) arrays, yielding one float32 array per input chunk."""
        offset = 0
        for chunk in chunks:
            try:
                yield self.transform(chunk)
            except ValueError as error:
                raise ValueError(f"in the chunk starting at row {offset}: {error}") from None
            offset += len(chunk)

    def inverse_transform(self, Z, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
        """Map calibrated vectors back to the embedding space."""
        if np.ndim(Z) != 2:
            check_matrix(np.asarray(Z), name="Z")
        return self._map(Z, inverse=True, chunk_rows=chunk_rows)

    def save(self, path) -> None:
        """Write the calibrator to one flow file (safetensors + JSON header, atomically)."""
        flow = self._fitted()
        info = {
            "glow": flow.config,
            "config": self.config,
            "standardize": self.standardizer is not None,
            "dtype": str(next(flow.parameters()).dtype).removeprefix("torch."),
            "training": {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
                         "seed": self.seed, "losses": self.losses},
            "encoder": self.provenance.to_json() if self.provenance is not None else None,
            "metadata": self.metadata,
        }
        tensors = {f"flow.{name}": value for name, value in flow.state_dict().items()}
        if self.standardizer is not None:
            tensors.update({f"input.{name}": value for name, value in self.standardizer.state_dict().items()})
        save_flow(path, tensors, info)

    @classmethod
    def load(cls, path, device=None) -> "FlowCalibrator":
        """A calibrator saved with `save` (or by `flowcore fit`), on `device` if given."""
        tensors, info = load_flow(path)
        try:
            training = info["training"]
            calibrator = cls(config=info["config"], epochs=training["epochs"], batch_size=training["batch_size"],
                             lr=training["lr"], seed=training["seed"], device=device,
                             standardize=info["standardize"])
            # fresh (aligned) copies: results must not depend on where the file put the bytes
            parts = {"flow": {}, "input": {}}
            for name, value in tensors.items():
                part, _, key = name.partition(".")
                parts[part][key] = value.clone()
            with torch.device("meta"):  # shapes only: skip the random LU initialisation
                flow = Glow(**info["glow"])
            flow.load_state_dict(parts["flow"], strict=True, assign=True)
            if calibrator.standardize:
                standardizer = Standardizer(parts["input"]["mean"].shape[0])
                standardizer.load_state_dict(parts["input"], strict=True)
                if standardizer.flow_dim != flow.dim:
                    raise ValueError(f"the input standardizer passes {standardizer.flow_dim} coordinates "
                                     f"to a flow of width {flow.dim}")
                calibrator.standardizer = standardizer
            encoder = info.get("encoder")
            calibrator.provenance = EncoderProvenance(**encoder) if encoder is not None else None
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
            raise FlowFileError(f"{path}: flow file does not match its recorded configuration: {error}") from None
        if device is not None:
            flow.to(device)
            if calibrator.standardizer is not None:
                calibrator.standardizer.to(device)
        calibrator.flow = flow.eval()
        calibrator.losses = training.get("losses", [])
        calibrator.metadata = info.get("metadata", {})
        return calibrator

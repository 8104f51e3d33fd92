"""`FlowCalibrator` (the `flow` calibration): fit a Glow on sentence vectors, then map any number
of vectors to the calibrated (isotropic Gaussian) space, scikit-learn style."""
from __future__ import annotations

import math
import time
from typing import Iterable, Iterator

import numpy as np
import torch

from flowcore import defaults
from flowcore.calibration.base import Calibrator
from flowcore.calibration.cuda_streaming import map_on_cuda
from flowcore.calibration.flow_file import FlowFileError, save_flow
from flowcore.calibration.moments import MomentsAccumulator
from flowcore.calibration.recipes import DEFAULT_RECIPE, FlowRecipe, recipe_named
from flowcore.calibration.standardize import STAT_BLOCK_ROWS, Standardizer
from flowcore.calibration.whitening import Whitening
from flowcore.flows.glow import CONFIGS, Glow
from flowcore.flows.train import fit, row_index, training_matrix
from flowcore.validation import NonFiniteOutputError, check_matrix, check_output

__all__ = ["CHUNK_ROWS", "FlowCalibrator"]

CHUNK_ROWS = defaults.TRANSFORM_CHUNK_ROWS


class FlowCalibrator(Calibrator):
    r"""Unsupervised BERT-flow calibration of embeddings.

    `fit(X)` trains a `Glow.from_config(config, dim)` by maximum likelihood following a fit
    recipe (`flowcore.calibration.recipes`); `transform(X)` returns the latent z as float32 numpy.
    Unless the recipe's input is "raw", each coordinate is first standardised over the whole of X
    and coordinates that never vary bypass the flow (see `flowcore.calibration.standardize`). The
    default recipe, "whitened", starts the flow at BERT-whitening, scores held-out rows 4 times an
    epoch and keeps the best weights, stopping after 2 evaluations in a row without a better score
    (at most 3 epochs): a flow that cannot beat whitening's held-out likelihood stops early and
    stays whitening, and `outcome` says so. "paper" is the paper's code.

    Args:
        config: a Glow configuration name from `flowcore.CONFIGS`, e.g. "l2_d3_w32".
        recipe: a name from `flowcore.calibration.recipes.RECIPES` ("whitened", "standardized", "paper").
        epochs: training epochs over X (the most tried, with a held-out share); None: the recipe's.
        batch_size: training batch size; None: the recipe's.
        lr: Adam's learning rate; None: the recipe's.
        seed: seeds the flow's initialisation, the held-out rows and the batch order (same seed, same model).
        device: torch device to train and calibrate on (default: where the flow is built, CPU).
        standardize: False feeds the raw vectors (input "raw"), True the standardised ones with
            ActNorm's data-dependent start (input "standardize"); None: the recipe's input.
        holdout: the share of X held out to choose the weights kept; None: the recipe's.
        patience: stop after this many held-out evaluations in a row without a better score; None:
            the recipe's.

    Attributes:
        recipe: the `FlowRecipe` followed (saved in the flow file).
        provenance, metadata, source: as every `Calibrator`'s.
        losses: the per-epoch training losses (bits per dimension).
        heldout_bits_per_dim: held-out bits/dim at the start (None unless the start is linear) and
            at each evaluation during training; empty without a held-out share.
        heldout_epochs: the epochs trained (fractions within an epoch) at each of those scores.
        selected_epoch: the epochs trained when the kept weights were scored (0: the start, e.g.
            the whitening start; 0.25: a quarter into the first epoch); None without a held-out share.
        stopped_early: whether held-out evaluations stopped training before its last epoch.
        fit_seconds: how long `fit` took (not saved: a file's bytes depend on its inputs only).
        outcome: one line saying what was kept and why (see the property).

    Example:
        >>> calibrator = FlowCalibrator("l2_d3_w32").fit(X, encoder=encoder)
        >>> Z = calibrator.transform(X)          # float32 (n, d)
        >>> calibrator.save("model.flow")
        >>> calibrator = FlowCalibrator.load("model.flow")
    """

    name = "flow"

    def __init__(self, config: str = defaults.CONFIG, recipe: str = DEFAULT_RECIPE, epochs: int | None = None,
                 batch_size: int | None = None, lr: float | None = None, seed: int = 0, device=None,
                 standardize: bool | None = None, holdout: float | None = None, patience: int | None = None):
        super().__init__()
        if config not in CONFIGS:
            raise ValueError(f"unknown flow config {config!r}; choose one of {', '.join(CONFIGS)}")
        self.config = config
        input = None if standardize is None else ("standardize" if standardize else "raw")
        self.recipe: FlowRecipe = recipe_named(recipe, input=input, epochs=epochs, batch_size=batch_size,
                                               lr=lr, holdout=holdout, patience=patience)
        self.seed = seed
        self.device = torch.device(device) if device is not None else None
        self.flow: Glow | None = None
        self.standardizer: Standardizer | None = None
        self.losses: list[float] = []
        self.heldout_bits_per_dim: list[float | None] = []
        self.heldout_epochs: list[float] = []
        self.selected_epoch: float | None = None
        self.stopped_early = False
        self.fit_seconds: float | None = None

    @property
    def epochs(self) -> int:
        """The recipe's (most) training epochs."""
        return self.recipe.epochs

    @property
    def batch_size(self) -> int:
        """The recipe's training batch size."""
        return self.recipe.batch_size

    @property
    def lr(self) -> float:
        """The recipe's learning rate."""
        return self.recipe.lr

    @property
    def standardize(self) -> bool:
        """Whether coordinates are standardised before the flow (every input but "raw")."""
        return self.recipe.input != "raw"

    @property
    def dim(self) -> int:
        """Width of the vectors this calibrator takes and returns."""
        self._fitted()
        return self.standardizer.dim if self.standardizer is not None else self.flow.dim

    @property
    def output_dim(self) -> int:
        """Width of the calibrated vectors: the flow keeps the width."""
        return self.dim

    def _fitted(self) -> Glow:
        if self.flow is None:
            raise RuntimeError("this FlowCalibrator is not fitted yet; call .fit(X) or FlowCalibrator.load(path)")
        return self.flow

    def fit(self, X, show_progress_bar: bool | None = None, encoder=None, checkpoint=None,
            checkpoint_every: int = defaults.CHECKPOINT_EVERY, rows=None,
            threads: int | None = None) -> "FlowCalibrator":
        """Train on the rows of `X` (numpy array, memory map or tensor, at least 2 rows) in
        O(d² + batch·d) memory: X is never copied. With a held-out share (the default recipe's),
        the best weights scored are kept (`outcome` says which, and why).

        Args:
            X: (n, d) sentence vectors, e.g. `np.load("corpus.npy", mmap_mode="r")`.
            show_progress_bar: a progress bar on stderr; None shows one when stderr is a terminal.
            encoder: the `Encoder` (or an `EncoderProvenance`) that produced X, recorded as
                `provenance`; None keeps the current one.
            checkpoint: a training checkpoint file (`flowcore.flows.train.fit`): written every
                `checkpoint_every` steps, and resumed from when it exists, to the same model.
            checkpoint_every: optimizer steps between checkpoints.
            rows: the row numbers of X to fit on (e.g. those that are not rejects); None: all rows.
            threads: torch CPU threads for training; None: `flowcore.runtime.training_threads`
                (one for batches under 256 rows).

        Returns:
            self, fitted.

        Example:
            >>> FlowCalibrator().fit(np.load("corpus.npy", mmap_mode="r"), rows=np.flatnonzero(good))
        """
        started = time.perf_counter()
        provenance = self._provenance_of(encoder)
        recipe = self.recipe
        data = training_matrix(X, min_rows=2, rows=rows)  # a view of X (a memory map stays one), checked
        selected = None if rows is None else row_index(rows, data.shape[0])
        standardizer, prepare, width = None, None, data.shape[1]
        if recipe.input != "raw":
            standardizer = Standardizer(width).fit(data, rows=selected)
            prepare, width = standardizer.flow_input, standardizer.flow_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            flow = Glow.from_config(self.config, width)
            if recipe.input == "whiten":
                flow.start_linear(*_whitening_start(data, selected, prepare))
        if self.device is not None:
            flow.to(self.device)
        train, heldout = _split_holdout(data.shape[0] if selected is None else len(selected), recipe.holdout,
                                        self.seed)
        if selected is not None:  # positions among the selected rows -> row numbers of X
            train = selected if train is None else selected[train]
            heldout = None if heldout is None else selected[heldout]
        selection = _HeldoutSelection(flow, data, heldout, prepare, linear_start=recipe.input == "whiten",
                                      patience=recipe.patience)
        training_rows = data.shape[0] if train is None else len(train)
        evaluate_every = math.ceil(math.ceil(training_rows / recipe.batch_size) / recipe.evaluations_per_epoch)
        self.losses = fit(flow, data, epochs=recipe.epochs, batch_size=recipe.batch_size, lr=recipe.lr,
                          seed=self.seed, show_progress_bar=show_progress_bar,
                          on_epoch=selection if heldout is not None else None,
                          checkpoint=checkpoint, checkpoint_every=checkpoint_every, rows=train, prepare=prepare,
                          threads=threads, evaluate_every=evaluate_every if heldout is not None else None)
        if heldout is not None:
            selection.restore_best()
        if self.device is not None and standardizer is not None:
            standardizer.to(self.device)  # only now: training standardised its CPU batches
        self.heldout_bits_per_dim, self.heldout_epochs = selection.scores, selection.epochs
        self.selected_epoch = selection.best_epoch
        self.stopped_early = selection.stopped and bool(selection.epochs) and selection.epochs[-1] < recipe.epochs
        self.flow, self.standardizer, self.provenance = flow.eval(), standardizer, provenance
        self.fit_seconds = time.perf_counter() - started
        return self

    @property
    def outcome(self) -> str:
        """One line: which weights were kept and why, and how long the fit took, e.g. "kept the
        whitening start: no trained state was better on held-out data (stopped after 0.5 of at most
        3 epochs); 12 s"."""
        self._fitted()
        took = "" if self.fit_seconds is None else f"; {self.fit_seconds:.0f} s"
        epochs = f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
        if self.selected_epoch is None:
            return f"trained {epochs}, kept the last weights (no held-out rows to choose by){took}"
        trained = self.heldout_epochs[-1] if self.heldout_epochs else 0
        ran = (f"stopped after {trained:.3g} of at most {epochs}: {self.recipe.patience} evaluation"
               f"{'s' if self.recipe.patience != 1 else ''} in a row without a better held-out score"
               if self.stopped_early else f"trained the full {epochs}")
        start = self.heldout_bits_per_dim[0] if self.heldout_bits_per_dim else None
        if self.selected_epoch == 0 and start is not None:
            return f"kept the whitening start: no trained state was better on held-out data ({ran}){took}"
        kept = self.heldout_bits_per_dim[self.heldout_epochs.index(self.selected_epoch)]
        against = "" if start is None else f" against the whitening start's {start:.4f}"
        return (f"kept the flow trained {self.selected_epoch:.3g} epochs: held-out {kept:.4f} bits/dim{against} "
                f"({ran}){took}")

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
        """X mapped through the flow (or back), `chunk_rows` rows at a time: rows with NaN/Inf are
        refused, and so are finite rows mapped to NaN/Inf (`NonFiniteOutputError`), by number."""
        name = "Z" if inverse else "X"
        if np.ndim(X) != 2:
            check_matrix(np.asarray(X), name=name)  # the shape error
        flow, dim = self._fitted(), self.dim
        parameter = next(flow.parameters())
        if parameter.device.type == "cuda":  # transfers overlapped with the compute
            with torch.inference_mode():
                out = map_on_cuda(X, self._inverse if inverse else self._forward, dim=dim, device=parameter.device,
                                  dtype=parameter.dtype, chunk_rows=chunk_rows, name=name)
            return check_output(out, name)
        rows = len(X)
        out = np.empty((rows, dim), dtype=np.float32)
        for start in range(0, rows, chunk_rows):
            chunk = check_matrix(X[start : start + chunk_rows], dim=dim, row_offset=start, name=name)
            chunk = chunk.to(device=parameter.device, dtype=parameter.dtype)
            with torch.inference_mode():
                mapped = self._inverse(chunk) if inverse else self._forward(chunk)
            out[start : start + len(chunk)] = mapped.float().cpu().numpy()
        return check_output(out, name)

    def transform(self, X, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
        """Calibrated vectors z (float32 numpy), computed `chunk_rows` rows at a time. A row with
        NaN/Inf is refused by number (ValueError), and so is a finite row the flow maps to NaN/Inf
        (`flowcore.validation.NonFiniteOutputError`, e.g. values near 3.4e38)."""
        return self._map(X, inverse=False, chunk_rows=chunk_rows)

    def transform_iter(self, chunks: Iterable) -> Iterator[np.ndarray]:
        """Calibrate a stream of (rows, dim) arrays, yielding one float32 array per input chunk;
        errors name the chunk's first row, and `NonFiniteOutputError.rows` count across the stream."""
        offset = 0
        for chunk in chunks:
            try:
                yield self.transform(chunk)
            except NonFiniteOutputError as error:
                raise NonFiniteOutputError(f"in the chunk starting at row {offset}: {error}", error.rows + offset,
                                           error.output) from None
            except ValueError as error:
                raise ValueError(f"in the chunk starting at row {offset}: {error}") from None
            offset += len(chunk)

    def inverse_transform(self, Z, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
        """Map calibrated vectors back to the embedding space (refused as `transform` refuses)."""
        return self._map(Z, inverse=True, chunk_rows=chunk_rows)

    def save(self, path) -> None:
        """Write the calibrator to one flow file (safetensors + JSON header, atomically)."""
        flow = self._fitted()
        info = {
            **self._header(),
            "glow": flow.config,
            "config": self.config,
            "standardize": self.standardizer is not None,
            "dtype": str(next(flow.parameters()).dtype).removeprefix("torch."),
            "training": {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
                         "seed": self.seed, "losses": self.losses, "recipe": self.recipe.to_json(),
                         "heldout_bits_per_dim": self.heldout_bits_per_dim, "heldout_epochs": self.heldout_epochs,
                         "selected_epoch": self.selected_epoch, "stopped_early": self.stopped_early},
        }
        tensors = {f"flow.{name}": value for name, value in flow.state_dict().items()}
        if self.standardizer is not None:
            tensors.update({f"input.{name}": value for name, value in self.standardizer.state_dict().items()})
        save_flow(path, tensors, info)

    @classmethod
    def _from_file(cls, path, tensors: dict, info: dict, device) -> "FlowCalibrator":
        try:
            training = info["training"]
            recipe = training.get("recipe")
            if recipe is None:
                raise FlowFileError(f"{path}: a flow file from an earlier flowcore (before fit recipes), which this "
                                    "one does not read; refit the flow with `flowcore fit`")
            calibrator = cls(config=info["config"], seed=training["seed"], device=device)
            calibrator.recipe = FlowRecipe(**recipe)
            if calibrator.standardize != info["standardize"]:
                raise ValueError(f"recipe input {calibrator.recipe.input!r} with standardize={info['standardize']}")
            # fresh (aligned) copies: results must not depend on where the file put the bytes
            parts = {"flow": {}, "input": {}}
            for name, value in tensors.items():
                part, _, key = name.partition(".")
                parts[part][key] = value.clone()
            with torch.device("meta"):  # shapes only: skip the random LU initialisation
                flow = Glow(**info["glow"])
            _check_state(flow, parts["flow"], "flow.")
            flow.load_state_dict(parts["flow"], strict=True, assign=True)
            if calibrator.standardize:
                standardizer = Standardizer(parts["input"]["mean"].shape[0])
                _check_state(standardizer, parts["input"], "input.")
                standardizer.load_state_dict(parts["input"], strict=True)
                if standardizer.flow_dim != flow.dim:
                    raise ValueError(f"the input standardizer passes {standardizer.flow_dim} coordinates "
                                     f"to a flow of width {flow.dim}")
                calibrator.standardizer = standardizer
        except FlowFileError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
            raise FlowFileError(f"{path}: flow file does not match its recorded configuration: {error}; refit it "
                                "with `flowcore fit`") from None
        if device is not None:
            flow.to(device)
            if calibrator.standardizer is not None:
                calibrator.standardizer.to(device)
        calibrator.flow = flow.eval()
        calibrator.losses = training.get("losses", [])
        calibrator.heldout_bits_per_dim = training.get("heldout_bits_per_dim", [])
        calibrator.selected_epoch = training.get("selected_epoch")
        # files from before evaluations within epochs: one score per epoch, from the start (0)
        calibrator.heldout_epochs = training.get("heldout_epochs", list(range(len(calibrator.heldout_bits_per_dim))))
        calibrator.stopped_early = training.get("stopped_early", False)
        return calibrator


def _check_state(module: torch.nn.Module, state: dict, prefix: str) -> None:
    """A ValueError naming the first tensor of a saved `state` that `module` (built from the
    file's recorded configuration) lacks, does not have, or has in another shape."""
    expected = module.state_dict()
    for name, value in expected.items():
        if name not in state:
            raise ValueError(f"the recorded configuration needs a tensor {prefix}{name}, which the file lacks")
        if tuple(state[name].shape) != tuple(value.shape):
            raise ValueError(f"tensor {prefix}{name} has shape {tuple(state[name].shape)}, the recorded configuration "
                             f"needs {tuple(value.shape)}")
    for name in state:
        if name not in expected:
            raise ValueError(f"tensor {prefix}{name} is not part of the recorded configuration")


def _whitening_start(data: torch.Tensor, rows: torch.Tensor | None, prepare) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, loc) of `Glow.start_linear` that whiten the flow's input (the `rows` of `data`, all
    if None, through `prepare`): float64 BERT-whitening from moments summed over blocks of rows
    (`Whitening.fit_moments`, O(d²) memory); directions without variance, which whitening drops,
    pass unscaled (they stay near zero), so that the map stays invertible and cosines equal whitening's."""
    accumulator = MomentsAccumulator()
    count = data.shape[0] if rows is None else len(rows)
    for start in range(0, count, STAT_BLOCK_ROWS):
        stop = start + STAT_BLOCK_ROWS
        block = data[start:stop] if rows is None else data[rows[start:stop]]
        if prepare is not None:
            block = prepare(block)
        accumulator.add(block.detach().cpu().double().numpy())
    whitening = Whitening().fit_moments(accumulator.total())
    kept = whitening.axes  # orthonormal directions U_k
    rows = [whitening.matrix.T]
    if kept.shape[1] < kept.shape[0]:
        values, vectors = np.linalg.eigh(np.eye(kept.shape[0]) - kept @ kept.T)
        rows.append(vectors[:, values > 0.5].T)
    return torch.from_numpy(np.concatenate(rows)), -torch.from_numpy(whitening.mean)


def _split_holdout(rows: int, share: float, seed: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(training positions, held-out positions), int64 indices into the `rows` rows fitted on: a
    seeded random `share` of them held out, at least 1 and at least 2 rows left to train on;
    (None, None) without a held-out share (train on every row)."""
    count = min(rows - 2, max(1, round(share * rows))) if share > 0 else 0
    if count < 1:
        return None, None
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    return order[count:], order[:count]


class _HeldoutSelection:
    """`fit`'s `on_epoch`: scores the held-out rows (bits/dim, through `prepare`, `STAT_BLOCK_ROWS`
    at a time, so memory stays bounded) at each evaluation, keeps a copy of the best weights, and
    stops training once `patience` evaluations in a row have not beaten them; with a linear start
    the start is scored too and can be the one kept (epoch 0)."""

    def __init__(self, flow: Glow, data: torch.Tensor, heldout: torch.Tensor | None, prepare, linear_start: bool,
                 patience: int = 1):
        self.flow, self.data, self.heldout, self.prepare, self.patience = flow, data, heldout, prepare, patience
        self.scores: list[float | None] = []
        self.epochs: list[float] = []
        self.best_epoch: float | None = None
        self.best_score, self.best_state = float("inf"), None
        self.stopped = False
        if heldout is not None:
            if linear_start:
                self._keep(0, self._score())
            else:
                self.scores.append(None)
                self.epochs.append(0)

    @torch.no_grad()
    def _score(self) -> float:
        self.flow.eval()
        parameter = next(self.flow.parameters())
        total = 0.0
        for rows in self.heldout.split(STAT_BLOCK_ROWS):
            chunk = self.data[rows]
            if self.prepare is not None:
                chunk = self.prepare(chunk)
            total += float(self.flow.bits_per_dim(chunk.to(device=parameter.device, dtype=parameter.dtype))) * len(rows)
        return total / len(self.heldout)

    def _keep(self, epoch: float, score: float) -> None:
        self.scores.append(score)
        self.epochs.append(epoch)
        if score < self.best_score:
            self.best_epoch, self.best_score = epoch, score
            self.best_state = {name: value.clone() for name, value in self.flow.state_dict().items()}

    def __call__(self, epoch: float, loss: float) -> bool:
        self._keep(epoch, self._score())
        since_best = len(self.epochs) - 1 - self.epochs.index(self.best_epoch) if self.best_epoch is not None \
            else len(self.epochs)
        self.stopped = since_best >= self.patience
        return self.stopped

    def checkpoint_state(self) -> tuple[dict, dict]:
        """What a training checkpoint keeps of the selection, so that a resumed fit keeps the same weights."""
        return dict(self.best_state or {}), {"scores": self.scores, "epochs": self.epochs,
                                             "best_epoch": self.best_epoch, "best_score": self.best_score,
                                             "stopped": self.stopped}

    def restore_checkpoint_state(self, tensors: dict, info: dict) -> None:
        """Undo `checkpoint_state`."""
        self.scores, self.epochs = list(info["scores"]), list(info["epochs"])
        self.best_epoch, self.best_score, self.stopped = info["best_epoch"], info["best_score"], info["stopped"]
        self.best_state = tensors or None

    def restore_best(self) -> None:
        """Load the best weights kept (those of the last epoch if no score was finite)."""
        if self.best_state is not None:
            self.flow.load_state_dict(self.best_state)
            self.flow.train(False)

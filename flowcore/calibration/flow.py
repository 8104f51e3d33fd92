"""`FlowCalibrator` (the `flow` calibration): fit a Glow on sentence vectors, then map vectors to the
calibrated (isotropic Gaussian) space."""
from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Iterable, Iterator

import numpy as np
import torch

from flowcore import defaults
from flowcore.calibration.base import Calibrator
from flowcore.calibration.cuda_streaming import map_on_cuda
from flowcore.calibration.file import CalibratorFileError
from flowcore.calibration.moments import row_blocks
from flowcore.calibration.recipes import DEFAULT_RECIPE, RECIPES, FlowRecipe, recipe_named
from flowcore.calibration.standardize import Standardizer
from flowcore.calibration.whitening import Whitening
from flowcore.flows.configs import COUPLINGS, PERMUTATIONS
from flowcore.flows.glow import CONFIGS, Glow
from flowcore.flows.train import fit, row_index, training_matrix
from flowcore.runtime import training_threads
from flowcore.validation import NonFiniteOutputError, check_matrix, check_output

__all__ = ["FlowCalibrator"]

_RECORD = ("losses", "heldout_bits_per_dim", "heldout_epochs", "selected_epoch", "stopped_early")
"""What a flow file records of the fit besides the settings (its header's "training")."""


class FlowCalibrator(Calibrator):
    """Unsupervised BERT-flow calibration: `fit(X)` trains a Glow by maximum likelihood following a fit recipe
    (`flowcore.calibration.recipes`); `transform(X)` returns the latent z, float32. Unless the recipe's input
    is "raw", coordinates are standardised first, and those that never vary bypass the flow (`Standardizer`).

    Args:
        config: a Glow configuration name from `flowcore.CONFIGS`, e.g. "l2_d3_w32".
        recipe: a name from `flowcore.calibration.recipes.RECIPES` ("whitened", "standardized", "paper").
        epochs: training epochs over X (the most tried, with a held-out share); None: the recipe's.
        batch_size: training batch size; None: the recipe's.
        lr: Adam's learning rate; None: the recipe's.
        seed: seeds the flow's initialisation, the held-out rows and the batch order (same seed, same model).
        device: torch device to train and calibrate on (default: where the flow is built, CPU).
        standardize: True sets the recipe's input to "standardize", False to "raw"; None keeps it.
        holdout: the share of X held out to choose the weights kept; None: the recipe's.
        patience: stop after this many held-out evaluations in a row without a better score; None: the recipe's.
        evaluations_per_epoch: held-out evaluations per epoch; None: the recipe's.
        coupling: each step's coupling, "affine" (the default) or "additive", as in the BERT-flow code.
        permutation: each step's invertible 1x1, "lu" (learned, the default) or "reverse" (fixed), as in the
            BERT-flow code; "reverse" has no 1x1 to start at whitening from, so the "whitened" recipe refuses it.

    Attributes:
        recipe: the `FlowRecipe` followed (saved in the flow file).
        losses: the per-epoch training losses (bits per dimension).
        heldout_bits_per_dim: held-out bits/dim at the start (None unless it is linear) and at each evaluation.
        heldout_epochs: the epochs trained (fractions within an epoch) at each of those scores.
        selected_epoch: the epochs trained when the kept weights were scored (0: the start; None: no held-out).
        stopped_early: whether held-out evaluations stopped training before its last epoch.
        fit_seconds: how long `fit` took (not saved: a file's bytes depend on its inputs only).

    Example:
        >>> calibrator = FlowCalibrator("l2_d3_w32").fit(X, encoder=encoder)
        >>> Z = calibrator.transform(X)          # float32 (n, d)
        >>> calibrator.save("model.flow")
        >>> calibrator = FlowCalibrator.load("model.flow")
    """

    name = "flow"
    _file_mismatch = "flow file does not match its recorded configuration: {error}; refit it with `flowcore fit`"

    def __init__(self, config: str = defaults.CONFIG, recipe: str = DEFAULT_RECIPE, epochs: int | None = None,
                 batch_size: int | None = None, lr: float | None = None, seed: int = 0, device=None,
                 standardize: bool | None = None, holdout: float | None = None, patience: int | None = None,
                 evaluations_per_epoch: int | None = None, coupling: str = defaults.COUPLING,
                 permutation: str = defaults.PERMUTATION):
        super().__init__()
        if config not in CONFIGS:
            raise ValueError(f"unknown flow config {config!r}; choose one of {', '.join(CONFIGS)}")
        for name, value, kinds in (("coupling", coupling, COUPLINGS), ("permutation", permutation, PERMUTATIONS)):
            if value not in kinds:
                raise ValueError(f"unknown flow {name} {value!r}; choose one of {', '.join(kinds)}")
        self.config, self.coupling, self.permutation = config, coupling, permutation
        input = None if standardize is None else ("standardize" if standardize else "raw")
        self.recipe: FlowRecipe = recipe_named(recipe, input=input, epochs=epochs, batch_size=batch_size, lr=lr,
                                               holdout=holdout, patience=patience,
                                               evaluations_per_epoch=evaluations_per_epoch)
        if permutation == "reverse" and self.recipe.input == "whiten":
            raise ValueError(f"the {self.recipe.name!r} recipe starts the flow at whitening through its LU 1x1 "
                             "convolutions, which permutation 'reverse' does not have; use recipe 'standardized' "
                             "or 'paper' with it")
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
        return self.standardizer.dim if self.standardizer is not None else self._fitted().dim

    def _fitted(self) -> Glow:
        if self.flow is None:
            raise RuntimeError("this FlowCalibrator is not fitted yet; call .fit(X) or FlowCalibrator.load(path)")
        return self.flow

    def fit(self, X, show_progress_bar: bool | None = None, encoder=None, checkpoint=None,
            checkpoint_every: int = defaults.CHECKPOINT_EVERY, rows=None,
            threads: int | None = None) -> "FlowCalibrator":
        """Train on the rows of `X` (at least 2) in O(d² + batch·d) memory, never copying X; with a
        held-out share, the best weights scored are kept (`outcome` says which, and why).

        Args:
            X: (n, d) sentence vectors, e.g. `np.load("corpus.npy", mmap_mode="r")`.
            show_progress_bar: a progress bar on stderr; None shows one when stderr is a terminal.
            encoder: the `Encoder` (or `EncoderProvenance`) that produced X, recorded as `provenance`.
            checkpoint: a training checkpoint file, written every `checkpoint_every` steps and resumed
                from when it exists, to the same model (`flowcore.flows.train.fit`).
            checkpoint_every: optimizer steps between checkpoints.
            rows: the row numbers of X to fit on (e.g. those that are not rejects); None: all rows.
            threads: torch CPU threads for training; None: `flowcore.runtime.training_threads`.

        Example:
            >>> FlowCalibrator().fit(np.load("corpus.npy", mmap_mode="r"), rows=np.flatnonzero(good))
        """
        started = time.perf_counter()
        provenance = self._provenance_of(self._encoder_of(X, encoder))
        recipe = self.recipe
        data = training_matrix(X, min_rows=2, rows=rows)  # a view of X (a memory map stays one), checked
        selected = None if rows is None else row_index(rows, data.shape[0])
        standardizer, prepare, width = None, None, data.shape[1]
        if recipe.input != "raw":
            standardizer = Standardizer(width).fit(data, rows=selected)
            prepare, width = standardizer.flow_input, standardizer.flow_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            flow = Glow.from_config(self.config, width, coupling=self.coupling, permutation=self.permutation)
            if recipe.input == "whiten":
                flow.start_linear(*_whitening_start(data, selected, prepare))
        flow.to(self.device)  # (None keeps it on the CPU)
        train, heldout = _split_holdout(data.shape[0], selected, recipe.holdout, self.seed)
        selection = _HeldoutSelection(flow, data, heldout, prepare, linear_start=recipe.input == "whiten",
                                      patience=recipe.patience)
        training_rows = data.shape[0] if train is None else len(train)
        evaluate_every = math.ceil(math.ceil(training_rows / recipe.batch_size) / recipe.evaluations_per_epoch)
        self.losses = fit(flow, data, epochs=recipe.epochs, batch_size=recipe.batch_size, lr=recipe.lr,
                          seed=self.seed, show_progress_bar=show_progress_bar,
                          on_epoch=selection if heldout is not None else None,
                          checkpoint=checkpoint, checkpoint_every=checkpoint_every, rows=train, prepare=prepare,
                          threads=threads, evaluate_every=evaluate_every if heldout is not None else None)
        if selection.best_state is not None:  # None without held-out rows or a finite score: keep the last
            flow.load_state_dict(selection.best_state)
        if self.device is not None and standardizer is not None:
            standardizer.to(self.device)  # only now: training standardised its CPU batches
        self.heldout_bits_per_dim, self.heldout_epochs = selection.scores, selection.epochs
        self.selected_epoch = selection.best_epoch
        self.stopped_early = selection.stopped and selection.epochs[-1] < recipe.epochs
        self.flow, self.standardizer, self.provenance = flow.eval(), standardizer, provenance
        self.fit_seconds = time.perf_counter() - started
        return self

    def fit_rows(self, X, rows=None, encoder=None, show_progress_bar: bool | None = None, checkpoint=None,
                 checkpoint_every: int = defaults.CHECKPOINT_EVERY, threads: int | None = None) -> "FlowCalibrator":
        """`fit` on the rows of X numbered in `rows`, reading X itself (never a copy), with `fit`'s options."""
        return self.fit(X, show_progress_bar=show_progress_bar, encoder=encoder, checkpoint=checkpoint,
                        checkpoint_every=checkpoint_every, rows=rows, threads=threads)

    def fit_chunks(self, chunks: Iterable, encoder=None) -> "FlowCalibrator":
        """`fit` on the rows of a stream of (rows, d) arrays, held in memory: training visits them every epoch."""
        return self.fit(np.concatenate([np.asarray(chunk, dtype=np.float32) for chunk in chunks]), encoder=encoder)

    def fit_threads(self) -> int:
        return training_threads(self.batch_size)

    def report(self) -> dict:
        """`Calibrator.report`, with the training record: losses, held-out scores, the epoch kept, early stop."""
        self._fitted()
        record = {name: getattr(self, name) for name in _RECORD}
        variant = "".join(f"{getattr(self, name)} {name}, " for name in ("coupling", "permutation")
                          if getattr(self, name) != getattr(defaults, name.upper()))
        return {**super().report(), **record,
                "summary": f"flow {self.config} ({variant}{self.recipe.name} recipe): {self._kept()}"}

    @property
    def outcome(self) -> str:
        """One line: which weights were kept and why, and how long the fit took."""
        return self._kept() + ("" if self.fit_seconds is None else f"; {self.fit_seconds:.0f} s")

    def _kept(self) -> str:
        """Which weights the fit kept and why."""
        self._fitted()
        epochs = f"{self.epochs} epoch{'s' if self.epochs != 1 else ''}"
        if self.selected_epoch is None:
            return f"trained {epochs}, kept the last weights (no held-out rows to choose by)"
        ran = (f"stopped after {self.heldout_epochs[-1]:.3g} of at most {epochs}: {self.recipe.patience} evaluation"
               f"{'s' if self.recipe.patience != 1 else ''} in a row without a better held-out score"
               if self.stopped_early else f"trained the full {epochs}")
        start = self.heldout_bits_per_dim[0]  # None unless the start was scored
        if self.selected_epoch == 0 and start is not None:
            return f"kept the whitening start: no trained state was better on held-out data ({ran})"
        kept = self.heldout_bits_per_dim[self.heldout_epochs.index(self.selected_epoch)]
        against = "" if start is None else f" against the whitening start's {start:.4f}"
        return f"kept the flow trained {self.selected_epoch:.3g} epochs: held-out {kept:.4f} bits/dim{against} ({ran})"

    def settings(self) -> dict:
        """The constructor's settings (`create("flow", **settings)` builds the same calibrator, unfitted)."""
        recipe = self.recipe
        named = RECIPES.get(recipe.name)
        standardize = None if named is not None and recipe.input == named.input else recipe.input != "raw"
        return {"config": self.config, "recipe": recipe.name, "epochs": recipe.epochs, "batch_size": recipe.batch_size,
                "lr": recipe.lr, "seed": self.seed, "standardize": standardize, "holdout": recipe.holdout,
                "evaluations_per_epoch": recipe.evaluations_per_epoch, "patience": recipe.patience,
                "coupling": self.coupling, "permutation": self.permutation}

    def _on_varying(self, y: torch.Tensor, function) -> torch.Tensor:
        """y with `function` applied to the coordinates that go through the flow."""
        varying = None if self.standardizer is None else self.standardizer.varying
        if varying is None or bool(varying.all()):  # the usual case: no gather/scatter on the hot path
            return function(y)
        y = y.clone()
        y[:, varying] = function(y[:, varying])
        return y

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.standardizer is None else self.standardizer(x)
        return self._on_varying(y, lambda varying: self.flow(varying)[0])

    def _inverse(self, z: torch.Tensor) -> torch.Tensor:
        y = self._on_varying(z, self.flow.inverse)
        return y if self.standardizer is None else self.standardizer.inverse(y)

    @torch.inference_mode()
    def _map(self, X, inverse: bool, chunk_rows: int) -> np.ndarray:
        """X mapped through the flow (or back), `chunk_rows` rows at a time, refused as `transform` says."""
        name, function = ("Z", self._inverse) if inverse else ("X", self._forward)
        parameter, dim = next(self._fitted().parameters()), self.dim
        if parameter.device.type == "cuda":  # transfers overlapped with the compute
            return check_output(map_on_cuda(X, function, dim=dim, device=parameter.device, dtype=parameter.dtype,
                                            chunk_rows=chunk_rows, name=name), name)

        def map_chunk(rows, row_offset: int) -> np.ndarray:
            chunk = check_matrix(rows, dim=dim, row_offset=row_offset, name=name)
            return function(chunk.to(device=parameter.device, dtype=parameter.dtype)).float().cpu().numpy()

        return self._map_chunks(X, map_chunk, chunk_rows, name)

    def transform(self, X, chunk_rows: int = defaults.TRANSFORM_CHUNK_ROWS) -> np.ndarray:
        """Calibrated vectors z, float32, `chunk_rows` rows at a time; a row with NaN/Inf is refused by
        number, and so is a finite row the flow maps to NaN/Inf (`NonFiniteOutputError`)."""
        return self._map(X, inverse=False, chunk_rows=chunk_rows)

    def transform_iter(self, chunks: Iterable) -> Iterator[np.ndarray]:
        """`transform` of each of a stream of (rows, dim) arrays; errors name the chunk's first row, and
        `NonFiniteOutputError.rows` count across the stream."""
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

    def inverse_transform(self, Z, chunk_rows: int = defaults.TRANSFORM_CHUNK_ROWS) -> np.ndarray:
        """Map calibrated vectors back to the embedding space (refused as `transform` refuses)."""
        return self._map(Z, inverse=True, chunk_rows=chunk_rows)

    def as_module(self):
        """The standardizer and the Glow's forward with folded weights, as a float32 `FlowMap` (see
        `Calibrator.as_module`): no inverse, no log-det."""
        from flowcore.calibration.modules import FlowMap

        return FlowMap(self._fitted(), self.standardizer).eval()

    def _contents(self) -> tuple[dict, dict]:
        flow = self._fitted()
        info = {
            "glow": flow.config,
            "config": self.config,
            "standardize": self.standardizer is not None,
            "dtype": str(next(flow.parameters()).dtype).removeprefix("torch."),
            "training": {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed,
                         "recipe": asdict(self.recipe), **{name: getattr(self, name) for name in _RECORD}},
        }
        tensors = {f"flow.{name}": value for name, value in flow.state_dict().items()}
        if self.standardizer is not None:
            tensors.update({f"input.{name}": value for name, value in self.standardizer.state_dict().items()})
        return tensors, info

    @classmethod
    def _from_file(cls, path, tensors: dict, info: dict, device) -> "FlowCalibrator":
        training = info["training"]
        recipe = training.get("recipe")
        if recipe is None:
            raise CalibratorFileError(f"{path}: a flow file from an earlier flowcore (before fit recipes), which this "
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
        _check_step_count(info["glow"], parts["flow"])  # before building: a header can declare any number
        with torch.device("meta"):  # shapes only: skip the random LU initialisation
            flow = Glow(**info["glow"])
        _load_state(flow, parts["flow"], "flow.", assign=True)
        calibrator.flow = flow.to(device).eval()  # (device None keeps it on the CPU)
        calibrator.coupling, calibrator.permutation = flow.config["coupling"], flow.config["permutation"]
        if calibrator.standardize:
            standardizer = Standardizer(parts["input"]["mean"].shape[0])
            _load_state(standardizer, parts["input"], "input.")
            if standardizer.flow_dim != flow.dim:
                raise ValueError(f"the input standardizer passes {standardizer.flow_dim} coordinates "
                                 f"to a flow of width {flow.dim}")
            calibrator.standardizer = standardizer.to(device)
        for name in _RECORD:  # what a file lacks keeps the unfitted value
            setattr(calibrator, name, training.get(name, getattr(calibrator, name)))
        if "heldout_epochs" not in training:  # from before evaluations within epochs: one score an epoch, from 0
            calibrator.heldout_epochs = list(range(len(calibrator.heldout_bits_per_dim)))
        return calibrator


def _check_step_count(glow, state: dict) -> None:
    """A ValueError unless the Glow shape a file declares has as many steps as its tensors, before building it."""
    if not isinstance(glow, dict):
        raise ValueError(f"its Glow shape {glow!r} is not a JSON object")
    levels, depth = glow.get("levels"), glow.get("depth")
    if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 1 for value in (levels, depth)):
        raise ValueError(f"its Glow shape has {levels!r} levels of {depth!r} steps, not positive integers")
    steps = {tuple(name.split(".")[1:3]) for name in state if name.startswith("levels.")}
    if levels * depth != len(steps):
        raise ValueError(f"its header declares {levels} levels of {depth} steps, but it holds the tensors of "
                         f"{len(steps)} steps")


def _load_state(module: torch.nn.Module, state: dict, prefix: str, assign: bool = False) -> None:
    """Load a file's `state` into `module`; a ValueError names the first tensor missing, extra or of another shape."""
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
    module.load_state_dict(state, strict=True, assign=assign)


def _whitening_start(data: torch.Tensor, rows: torch.Tensor | None, prepare) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, loc) of `Glow.start_linear` that whiten the flow's input (`rows` of `data` through `prepare`);
    directions without variance pass unscaled, so the map stays invertible and cosines equal whitening's."""
    blocks = row_blocks(data, rows, prepare)
    whitening = Whitening().fit_chunks(block.detach().cpu().double().numpy() for block in blocks)
    kept = whitening.axes  # orthonormal directions U_k
    rows = [whitening.matrix.T]
    if kept.shape[1] < kept.shape[0]:
        values, vectors = np.linalg.eigh(np.eye(kept.shape[0]) - kept @ kept.T)
        rows.append(vectors[:, values > 0.5].T)
    return torch.from_numpy(np.concatenate(rows)), -torch.from_numpy(whitening.mean)


def _split_holdout(rows: int, selected: torch.Tensor | None, share: float,
                   seed: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(training, held-out) row numbers among the `selected` of X's `rows` rows (None: all): a seeded random
    `share` held out, at least 1, leaving at least 2 to train on; (selected, None) without a held-out share."""
    count = rows if selected is None else len(selected)
    held = min(count - 2, max(1, round(share * count))) if share > 0 else 0
    if held < 1:
        return selected, None
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    order = order if selected is None else selected[order]
    return order[held:], order[:held]


_CHECKPOINTED = ("scores", "epochs", "best_epoch", "best_score", "stopped")
"""What a training checkpoint keeps of a `_HeldoutSelection` besides the best weights."""


class _HeldoutSelection:
    """`fit`'s `on_epoch`: scores the held-out rows (bits/dim) at each evaluation, keeps a copy of the
    best weights, and stops training once `patience` evaluations in a row have not beaten them."""

    def __init__(self, flow: Glow, data: torch.Tensor, heldout: torch.Tensor | None, prepare, linear_start: bool,
                 patience: int = 1):
        self.flow, self.data, self.heldout, self.prepare, self.patience = flow, data, heldout, prepare, patience
        self.scores: list[float | None] = []
        self.epochs: list[float] = []
        self.best_epoch: float | None = None
        self.best_score, self.best_state = float("inf"), None
        self.stopped = False
        if heldout is not None and linear_start:
            self(0, None)  # the start is scored, and can be the one kept
        elif heldout is not None:
            self.scores, self.epochs = [None], [0]

    @torch.no_grad()
    def _score(self) -> float:
        self.flow.eval()
        parameter = next(self.flow.parameters())
        total = 0.0
        for chunk in row_blocks(self.data, self.heldout, self.prepare):
            chunk = chunk.to(device=parameter.device, dtype=parameter.dtype)
            total += float(self.flow.bits_per_dim(chunk)) * len(chunk)
        return total / len(self.heldout)

    def __call__(self, epoch: float, _loss: float | None) -> bool:
        score = self._score()
        self.scores.append(score)
        self.epochs.append(epoch)
        if score < self.best_score:
            self.best_epoch, self.best_score = epoch, score
            self.best_state = {name: value.clone() for name, value in self.flow.state_dict().items()}
        best = -1 if self.best_epoch is None else self.epochs.index(self.best_epoch)
        self.stopped = len(self.epochs) - 1 - best >= self.patience
        return self.stopped

    def checkpoint_state(self) -> tuple[dict, dict]:
        """What a training checkpoint keeps, so that a resumed fit keeps the same weights."""
        return dict(self.best_state or {}), {name: getattr(self, name) for name in _CHECKPOINTED}

    def restore_checkpoint_state(self, tensors: dict, info: dict) -> None:
        """Undo `checkpoint_state`."""
        for name in _CHECKPOINTED:
            setattr(self, name, info[name])
        self.best_state = tensors or None

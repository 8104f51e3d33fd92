"""The calibrations `flowcore sts` compares: none (the raw vectors), BERT-whitening and the flow
(`FlowBaseline`, wrapping `flowcore.calibration.calibrator.FlowCalibrator`), with their
hyper-parameters (`CalibrationSettings`) and the part of them recorded with each result; a
calibrator fitted elsewhere (a flow file) is a `PreFitted`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from flowcore import defaults
from flowcore.calibration.whitening import Whitening

__all__ = ["CALIBRATIONS", "CalibrationSettings", "FlowBaseline", "NoCalibration", "PreFitted", "build_calibrator",
           "prefitted_flow", "settings_record"]

CALIBRATIONS = ("none", "whitening", "flow", "center", "abtt", "zca")
"""`center`, `abtt` (all-but-the-top) and `zca` (ZCA whitening) are the linear baselines of
`flowcore.calibration.postprocess`; `whitening` is BERT-whitening (PCA whitening, `-k` with `whitening_dim`)."""


class NoCalibration:
    """The raw encoder vectors."""

    def fit(self, X) -> "NoCalibration":
        return self

    def transform(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float32)


class FlowBaseline:
    """The flow as `flowcore sts` runs it. `input` says what the flow is fitted on: None (the
    default: what the calibrator's fit recipe says, `flowcore.calibration.recipes`), `standardize`
    (coordinates standardised over the fit corpus, constant ones bypassing the flow; raw
    mean-pooled all-MiniLM-L6-v2 otherwise diverges), `raw` (the vectors unchanged, as the paper's
    code) or `whiten` (BERT-whitening first, then a flow on the raw whitened vectors)."""

    INPUTS = ("standardize", "whiten", "raw")

    def __init__(self, flow_factory, input: str | None = None, progress: bool = True):
        if input is not None and input not in self.INPUTS:
            raise ValueError(f"unknown flow input {input!r}; choose from {', '.join(self.INPUTS)}")
        self.input, self.progress = input, progress
        self.flow = flow_factory(standardize=None if input is None else input == "standardize")
        self.whitening = None

    @property
    def losses(self) -> list[float]:
        return self.flow.losses

    @property
    def heldout_bits_per_dim(self) -> list[float | None]:
        return self.flow.heldout_bits_per_dim

    @property
    def selected_epoch(self) -> int | None:
        return self.flow.selected_epoch

    def _prepared(self, X):
        return self.whitening.transform(X) if self.whitening is not None else X

    def fit(self, X) -> "FlowBaseline":
        if self.input == "whiten":
            self.whitening = Whitening().fit(X)
        self.flow.fit(self._prepared(X), progress=self.progress)
        return self

    def transform(self, X) -> np.ndarray:
        return self.flow.transform(self._prepared(X))


@dataclass(frozen=True)
class CalibrationSettings:
    """Hyper-parameters of the fitted calibrations (recorded with each result)."""

    whitening_dim: int | None = None
    abtt_k: int | None = None
    flow_config: str = defaults.CONFIG
    flow_recipe: str = defaults.RECIPE  # `flowcore.calibration.recipes`; the None fields below are the recipe's
    flow_epochs: int | None = None
    flow_lr: float | None = None
    flow_batch_size: int | None = None
    flow_input: str | None = None
    seed: int = 0
    device: str | None = None


def build_calibrator(name: str, settings: CalibrationSettings, progress: bool = True):
    """A fresh, unfitted calibrator with `fit(X)` and `transform(X)`."""
    if name == "none":
        return NoCalibration()
    if name == "whitening":
        return Whitening(dim=settings.whitening_dim)
    if name == "flow":
        # Deferred: FlowCalibrator imports torch, which `import flowcore.sts` and the CLI's start-up do without.
        from flowcore.calibration.calibrator import FlowCalibrator

        def flow_factory(standardize: bool | None) -> FlowCalibrator:
            return FlowCalibrator(config=settings.flow_config, recipe=settings.flow_recipe, epochs=settings.flow_epochs,
                                  batch_size=settings.flow_batch_size, lr=settings.flow_lr,
                                  seed=settings.seed, device=settings.device, standardize=standardize)

        return FlowBaseline(flow_factory, input=settings.flow_input, progress=progress)
    if name in ("center", "abtt", "zca"):
        from flowcore.calibration.postprocess import AllButTheTop, MeanCentering, ZCAWhitening  # imports torch

        if name == "abtt":
            return AllButTheTop(settings.abtt_k)
        return MeanCentering() if name == "center" else ZCAWhitening()
    raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")


def settings_record(name: str, settings: CalibrationSettings) -> dict:
    """The settings of calibration `name` that are stored in its result records."""
    if name == "whitening":
        return {"whitening_dim": settings.whitening_dim}
    if name == "abtt":
        return {"abtt_k": settings.abtt_k}
    if name == "flow":
        from flowcore.calibration.recipes import recipe_named

        recipe = recipe_named(settings.flow_recipe, epochs=settings.flow_epochs, lr=settings.flow_lr,
                              batch_size=settings.flow_batch_size)
        record = {key: value for key, value in asdict(settings).items() if key.startswith("flow_") or key == "seed"}
        record.update(flow_epochs=recipe.epochs, flow_lr=recipe.lr, flow_batch_size=recipe.batch_size,
                      flow_holdout=recipe.holdout)
        if settings.flow_input is None:  # the recipe's own input, named by flow_recipe
            del record["flow_input"]
        return record
    return {}


@dataclass(frozen=True)
class PreFitted:
    """A calibrator fitted elsewhere (`transform(X)` only), where it came from (`source`, recorded
    as the fit corpus) and its settings for the result records."""

    calibrator: object
    source: str
    record: dict = field(default_factory=dict)


def prefitted_flow(path, device=None) -> PreFitted:
    """The flow of a flow file (`flowcore fit`, `FlowCalibrator.save`), with its training settings."""
    from flowcore.calibration.calibrator import FlowCalibrator
    from flowcore.calibration.recipes import RECIPES

    calibrator = FlowCalibrator.load(path, device=device)
    return PreFitted(calibrator, str(path), {
        "flow_file": str(path), "flow_config": calibrator.config, "flow_epochs": calibrator.epochs,
        "flow_lr": calibrator.lr, "flow_batch_size": calibrator.batch_size, "seed": calibrator.seed,
        "flow_recipe": calibrator.recipe.name, "flow_selected_epoch": calibrator.selected_epoch,
        **({} if calibrator.recipe.name in RECIPES and calibrator.recipe.input == RECIPES[calibrator.recipe.name].input
           else {"flow_input": calibrator.recipe.input})})

"""The calibrations `flowcore sts` compares: none (the raw vectors), BERT-whitening and the flow
(`FlowBaseline`, wrapping `flowcore.calibration.calibrator.FlowCalibrator`), with their
hyper-parameters (`CalibrationSettings`) and the part of them recorded with each result; a
calibrator fitted elsewhere (a flow file) is a `PreFitted`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from flowcore.calibration.whitening import Whitening

__all__ = ["CALIBRATIONS", "CalibrationSettings", "FlowBaseline", "NoCalibration", "PreFitted", "build_calibrator",
           "prefitted_flow", "settings_record"]

CALIBRATIONS = ("none", "whitening", "flow")


class NoCalibration:
    """The raw encoder vectors."""

    def fit(self, X) -> "NoCalibration":
        return self

    def transform(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float32)


class FlowBaseline:
    """The flow as `flowcore sts` runs it. `input` says what the flow is fitted on:
    `standardize` (the engine's default: coordinates standardised over the fit corpus, constant
    ones bypassing the flow; raw mean-pooled all-MiniLM-L6-v2 otherwise diverges), `raw` (the
    vectors unchanged, as the paper's code) or `whiten` (BERT-whitening first)."""

    INPUTS = ("standardize", "whiten", "raw")

    def __init__(self, flow_factory, input: str = "standardize", progress: bool = True):
        if input not in self.INPUTS:
            raise ValueError(f"unknown flow input {input!r}; choose from {', '.join(self.INPUTS)}")
        self.input, self.progress = input, progress
        self.flow = flow_factory(standardize=input == "standardize")
        self.whitening = None

    @property
    def losses(self) -> list[float]:
        return self.flow.losses

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
    flow_config: str = "l2_d3_w32"
    flow_epochs: int = 1
    flow_lr: float = 3e-4
    flow_batch_size: int = 32
    flow_input: str = "standardize"
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

        def flow_factory(standardize: bool) -> FlowCalibrator:
            return FlowCalibrator(config=settings.flow_config, epochs=settings.flow_epochs,
                                  batch_size=settings.flow_batch_size, lr=settings.flow_lr,
                                  seed=settings.seed, device=settings.device, standardize=standardize)

        return FlowBaseline(flow_factory, input=settings.flow_input, progress=progress)
    raise ValueError(f"unknown calibration {name!r}; choose from {', '.join(CALIBRATIONS)}")


def settings_record(name: str, settings: CalibrationSettings) -> dict:
    """The settings of calibration `name` that are stored in its result records."""
    if name == "whitening":
        return {"whitening_dim": settings.whitening_dim}
    if name == "flow":
        return {key: value for key, value in asdict(settings).items() if key.startswith("flow_") or key == "seed"}
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

    calibrator = FlowCalibrator.load(path, device=device)
    return PreFitted(calibrator, str(path), {
        "flow_file": str(path), "flow_config": calibrator.config, "flow_epochs": calibrator.epochs,
        "flow_lr": calibrator.lr, "flow_batch_size": calibrator.batch_size, "seed": calibrator.seed,
        "flow_input": "standardize" if calibrator.standardize else "raw"})

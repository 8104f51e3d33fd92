"""The calibrations `flowcore sts` and `flowcore analyze` compare, built by name through the calibrator protocol:
`_FIELDS` maps `CalibrationSettings` (the result records' keys) to each method's settings."""
from __future__ import annotations

from dataclasses import dataclass, field

from flowcore import defaults
from flowcore.calibration.base import NAMES, create, fit_options, load, setting_names

__all__ = ["CALIBRATIONS", "FLOW_INPUTS", "Baseline", "CalibrationSettings", "PreFitted", "build_calibrator",
           "prefitted", "reported", "settings_record"]

CALIBRATIONS = NAMES
"""Every registered calibration method, `none` (the raw vectors) included."""
FLOW_INPUTS = ("standardize", "prewhiten", "raw")
"""What `flowcore sts --flow-input` fits the flow on, instead of its recipe's own input."""
_FIELDS = {
    "whitening": {"whitening_dim": "keep", "whitening_power": "power"},
    "abtt": {"abtt_k": "k"},
    "auto": {"seed": "seed"},
    "flow": {"flow_config": "config", "flow_recipe": "recipe", "flow_epochs": "epochs", "flow_lr": "lr",
             "flow_batch_size": "batch_size", "seed": "seed", "flow_holdout": "holdout",
             "flow_evaluations_per_epoch": "evaluations_per_epoch", "flow_patience": "patience"},
}
"""{method: {`CalibrationSettings` field, the result records' key: the method's setting}}."""
_INPUTS = {"standardize": True, "raw": False, "prewhiten": None}
"""The `standardize` setting of each flow input (prewhiten: whitening first, then the recipe's own input)."""
_REPORTED_APART = ("method", "dim", "output_dim", "settings", "summary")
"""`report()` entries that records keep elsewhere (or not at all)."""


@dataclass(frozen=True)
class CalibrationSettings:
    """Hyper-parameters of the fitted calibrations (recorded with each result)."""

    whitening_dim: int | None = None
    whitening_power: float = defaults.WHITENING_POWER
    abtt_k: int | None = None
    flow_config: str = defaults.CONFIG
    flow_recipe: str = defaults.RECIPE  # `flowcore.calibration.recipes`; the None fields below are the recipe's
    flow_epochs: int | None = None
    flow_lr: float | None = None
    flow_batch_size: int | None = None
    flow_input: str | None = None  # one of FLOW_INPUTS; None: the recipe's
    seed: int = 0
    device: str | None = None


class Baseline:
    """A calibrator as `flowcore sts` fits it: with its fit's progress bar, and (`prewhiten`) on whitened vectors.

    Args:
        calibrator: a fresh calibrator (`flowcore.calibration.create`).
        prewhiten: fit and apply it on whitened vectors.
        show_progress_bar: its fit's progress bar, where it has one.
    """

    def __init__(self, calibrator, prewhiten: bool = False, show_progress_bar: bool | None = None):
        self.calibrator, self.prewhiten, self.show_progress_bar = calibrator, prewhiten, show_progress_bar
        self.whitening = None

    def _prepared(self, X):
        return self.whitening.transform(X) if self.whitening is not None else X

    def fit(self, X) -> Baseline:
        if self.prewhiten:
            self.whitening = create("whitening").fit(X)
        options = {"show_progress_bar": self.show_progress_bar} \
            if "show_progress_bar" in fit_options(self.calibrator.name) else {}
        self.calibrator.fit_rows(self._prepared(X), **options)
        return self

    def transform(self, X):
        return self.calibrator.transform(self._prepared(X))

    def report(self) -> dict:
        return self.calibrator.report()

    def fit_threads(self) -> int | None:
        return self.calibrator.fit_threads()


def build_calibrator(name: str, settings: CalibrationSettings, show_progress_bar: bool | None = None) -> Baseline:
    """A fresh calibrator of method `name` with its `settings`, as a `Baseline`."""
    accepted = setting_names(name)
    chosen = {setting: getattr(settings, key) for key, setting in _FIELDS.get(name, {}).items()
              if hasattr(settings, key)}  # None: the method's own default (e.g. a flow recipe's epochs)
    if "device" in accepted:
        chosen["device"] = settings.device
    prewhiten = False
    if settings.flow_input is not None and "standardize" in accepted:
        if settings.flow_input not in _INPUTS:
            raise ValueError(f"unknown flow input {settings.flow_input!r}; choose from {', '.join(FLOW_INPUTS)}")
        chosen["standardize"], prewhiten = _INPUTS[settings.flow_input], settings.flow_input == "prewhiten"
    return Baseline(create(name, **chosen), prewhiten, show_progress_bar)


def settings_record(name: str, settings: CalibrationSettings) -> dict:
    """The settings of calibration `name` its result records hold, as the method resolves them (e.g. a flow's
    epochs from its recipe), and a flow's input when one is chosen."""
    resolved = build_calibrator(name, settings).calibrator.settings()
    record = {key: resolved[setting] for key, setting in _FIELDS.get(name, {}).items()}
    if settings.flow_input is not None and "standardize" in resolved:
        record["flow_input"] = settings.flow_input
    return record


def reported(calibrator) -> dict:
    """A fitted calibrator's `report()` entries for result records, named after its method (e.g. "flow_losses")."""
    report = calibrator.report()
    return {f"{report['method']}_{key}": value for key, value in report.items() if key not in _REPORTED_APART}


@dataclass(frozen=True)
class PreFitted:
    """A calibrator fitted elsewhere, its `source` (recorded as the fit corpus) and its settings."""

    calibrator: object
    source: str
    record: dict = field(default_factory=dict)


def prefitted(path, device=None) -> PreFitted:
    """The calibrator of any calibrator file, with its settings and what its fit did as result records name them."""
    calibrator = load(path, device=device)
    fitted = calibrator.settings()
    record = {key: fitted[setting] for key, setting in _FIELDS.get(calibrator.name, {}).items() if setting in fitted}
    record = {"flow_file": str(path), **record, **reported(calibrator)}
    return PreFitted(calibrator, str(path), record)

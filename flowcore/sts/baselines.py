"""The calibrations `flowcore sts` and `flowcore analyze` compare, built by name with their settings."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from flowcore import defaults
from flowcore.calibration.base import NAMES, create, load
from flowcore.calibration.recipes import RECIPES, recipe_named

__all__ = ["CALIBRATIONS", "FLOW_INPUTS", "CalibrationSettings", "FlowBaseline", "PreFitted", "build_calibrator",
           "prefitted", "settings_record"]

CALIBRATIONS = NAMES
"""Every registered calibration method, `none` (the raw vectors) included."""
FLOW_INPUTS = ("standardize", "prewhiten", "raw")
"""What `flowcore sts --flow-input` fits the flow on, instead of its recipe's own input."""
_RECORDED = {"whitening": {"whitening_dim": "dim", "whitening_power": "power"}, "abtt": {"abtt_k": "k"},
             "auto": {"seed": "seed"}}
"""{method: {`CalibrationSettings` field and result key: the method's setting}}."""
_FLOW_RECORD = ("losses", "heldout_bits_per_dim", "heldout_epochs", "selected_epoch", "stopped_early")
"""The flow's training record, read through a `FlowBaseline`."""


class FlowBaseline:
    """The flow as `flowcore sts` fits it, on `input`: None (its recipe's), `standardize`, `raw` (as the
    paper's code) or `prewhiten` (whitening first, then a flow on the whitened vectors)."""

    def __init__(self, flow, input: str | None = None, show_progress_bar: bool | None = None):
        if input is not None and input not in FLOW_INPUTS:
            raise ValueError(f"unknown flow input {input!r}; choose from {', '.join(FLOW_INPUTS)}")
        self.flow, self.input, self.show_progress_bar = flow, input, show_progress_bar
        self.whitening = None

    def __getattr__(self, name: str):
        if name in _FLOW_RECORD:
            return getattr(self.flow, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _prepared(self, X):
        return self.whitening.transform(X) if self.whitening is not None else X

    def fit(self, X) -> "FlowBaseline":
        if self.input == "prewhiten":
            self.whitening = create("whitening").fit(X)
        self.flow.fit(self._prepared(X), show_progress_bar=self.show_progress_bar)
        return self

    def transform(self, X):
        return self.flow.transform(self._prepared(X))


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


def build_calibrator(name: str, settings: CalibrationSettings, show_progress_bar: bool | None = None):
    """A fresh calibrator of method `name` with its `settings`; the flow comes as a `FlowBaseline`."""
    if name == "flow":
        # "prewhiten": the whitened vectors go to the flow as they are
        standardize = None if settings.flow_input is None else settings.flow_input == "standardize"
        flow = create("flow", config=settings.flow_config, recipe=settings.flow_recipe, epochs=settings.flow_epochs,
                      batch_size=settings.flow_batch_size, lr=settings.flow_lr, seed=settings.seed,
                      device=settings.device, standardize=standardize)
        return FlowBaseline(flow, input=settings.flow_input, show_progress_bar=show_progress_bar)
    recorded = _RECORDED.get(name, {})
    return create(name, **{setting: getattr(settings, key) for key, setting in recorded.items()})


def settings_record(name: str, settings: CalibrationSettings) -> dict:
    """The settings of calibration `name` that are stored in its result records."""
    if name == "flow":
        recipe = recipe_named(settings.flow_recipe, epochs=settings.flow_epochs, lr=settings.flow_lr,
                              batch_size=settings.flow_batch_size)
        record = {key: value for key, value in asdict(settings).items() if key.startswith("flow_") or key == "seed"}
        record.update(flow_epochs=recipe.epochs, flow_lr=recipe.lr, flow_batch_size=recipe.batch_size,
                      flow_holdout=recipe.holdout)
        if recipe.holdout > 0:  # held-out evaluations choose the weights and stop training
            record.update(flow_evaluations_per_epoch=recipe.evaluations_per_epoch, flow_patience=recipe.patience)
        if settings.flow_input is None:  # the recipe's own input, named by flow_recipe
            del record["flow_input"]
        return record
    return {key: getattr(settings, key) for key in _RECORDED.get(name, {})}


@dataclass(frozen=True)
class PreFitted:
    """A calibrator fitted elsewhere, its `source` (recorded as the fit corpus) and its settings."""

    calibrator: object
    source: str
    record: dict = field(default_factory=dict)


def prefitted(path, device=None) -> PreFitted:
    """The calibrator of any calibrator file, with its settings as result records name them."""
    calibrator = load(path, device=device)
    record = {"flow_file": str(path)}
    if calibrator.name != "flow":
        fitted = calibrator.settings()
        return PreFitted(calibrator, str(path), {
            **record, **{key: fitted[setting] for key, setting in _RECORDED.get(calibrator.name, {}).items()}})
    recipe = calibrator.recipe
    record.update(flow_config=calibrator.config, flow_epochs=calibrator.epochs, flow_lr=calibrator.lr,
                  flow_batch_size=calibrator.batch_size, seed=calibrator.seed, flow_recipe=recipe.name,
                  flow_selected_epoch=calibrator.selected_epoch)
    if recipe.name not in RECIPES or recipe.input != RECIPES[recipe.name].input:
        record["flow_input"] = recipe.input
    return PreFitted(calibrator, str(path), record)

"""Fit recipes of `FlowCalibrator`: what the flow is fitted on, how long and how fast, and how
the training length is chosen, by name.

- `whitened` (the default): the flow starts at BERT-whitening (`Glow.start_linear`: standardised
  coordinates, then the whitening of the fit corpus as the first step, identities after it), is
  trained on 90 % of the fit corpus for at most 3 epochs, and scores the other 10 % (held-out
  bits/dim) at the start and 4 times an epoch; it keeps the best-scoring weights (the start
  included) and stops once 2 evaluations in a row have not beaten them, so a flow that does not
  beat whitening's likelihood stops within its first epoch and stays whitening. No labels are used.
- `standardized`: standardised coordinates, ActNorm's data-dependent start, lr 3e-4, one epoch
  (`flowcore sts`'s recipe before `whitened`).
- `paper`: the BERT-flow code exactly: raw vectors, lr 1e-3, batch 32, one epoch.

docs/lab-notes.md ("The flow must never lose to whitening", "Calibration study") holds the
measurements behind the default.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from flowcore import defaults

__all__ = ["DEFAULT_RECIPE", "FLOW_INPUTS", "RECIPES", "FlowRecipe", "recipe_named"]

FLOW_INPUTS = ("whiten", "standardize", "raw")


@dataclass(frozen=True)
class FlowRecipe:
    """How a flow is fitted.

    Args:
        name: the recipe's name, recorded in flow files and results.
        input: "whiten" (start at whitening of the standardised coordinates), "standardize"
            (standardised coordinates, ActNorm's data-dependent start) or "raw" (the vectors as they are).
        lr: Adam's learning rate.
        batch_size: training batch size.
        epochs: training epochs; with `holdout`, the most epochs tried.
        holdout: fraction of the fit corpus held out to choose the weights by its bits/dim (0: train
            on all rows and keep the last epoch).
        evaluations_per_epoch: with `holdout`, how many times an epoch the held-out rows are scored
            (evenly spaced; the last at the epoch's end).
        patience: with `holdout`, training stops after this many evaluations in a row that do not
            beat the best held-out score so far.

    Example:
        >>> recipe_named("whitened", lr=5e-4).epochs
    """

    name: str
    input: str
    lr: float
    batch_size: int
    epochs: int
    holdout: float = 0.0
    evaluations_per_epoch: int = 1
    patience: int = 1

    def __post_init__(self):
        if self.input not in FLOW_INPUTS:
            raise ValueError(f"unknown flow input {self.input!r}; choose from {', '.join(FLOW_INPUTS)}")
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"recipe {self.name!r}: epochs and batch_size must be >= 1 and lr > 0 "
                             f"(got {self.epochs}, {self.batch_size}, {self.lr})")
        if self.evaluations_per_epoch < 1 or self.patience < 1:
            raise ValueError(f"recipe {self.name!r}: evaluations_per_epoch and patience must be >= 1 "
                             f"(got {self.evaluations_per_epoch}, {self.patience})")
        if not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"recipe {self.name!r}: holdout must be in [0, 1), got {self.holdout}")

    def to_json(self) -> dict:
        """The recipe as a JSON-able dict (saved in flow files)."""
        return asdict(self)


RECIPES = {
    "whitened": FlowRecipe("whitened", input="whiten", lr=1e-3, batch_size=32, epochs=3, holdout=0.1,
                           evaluations_per_epoch=4, patience=2),
    "standardized": FlowRecipe("standardized", input="standardize", lr=3e-4, batch_size=32, epochs=1),
    "paper": FlowRecipe("paper", input="raw", lr=1e-3, batch_size=32, epochs=1),
}
DEFAULT_RECIPE = defaults.RECIPE


def recipe_named(name: str, **overrides) -> FlowRecipe:
    """The recipe `name` from `RECIPES`, with any field given in `overrides` that is not None replaced.

    Args:
        name: a key of `RECIPES`.
        overrides: `input`, `lr`, `batch_size`, `epochs`, `holdout`, `evaluations_per_epoch` or
            `patience`; None keeps the recipe's.

    Example:
        >>> recipe_named("paper", epochs=2)
    """
    if name not in RECIPES:
        raise ValueError(f"unknown flow recipe {name!r}; choose one of {', '.join(RECIPES)}")
    changed = {key: value for key, value in overrides.items() if value is not None}
    return replace(RECIPES[name], **changed) if changed else RECIPES[name]

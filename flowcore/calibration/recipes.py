"""Fit recipes of `FlowCalibrator` by name: what the flow is fitted on, how long and how fast.
`whitened` (the default) starts at BERT-whitening and keeps the best weights on held-out rows, the start
included; `standardized` fits standardised coordinates from ActNorm's start; `paper` is the BERT-flow code."""
from __future__ import annotations

from dataclasses import dataclass, replace

from flowcore import defaults

__all__ = ["DEFAULT_RECIPE", "FLOW_INPUTS", "RECIPES", "FlowRecipe", "recipe_named"]

FLOW_INPUTS = ("whiten", "standardize", "raw")


@dataclass(frozen=True)
class FlowRecipe:
    """How a flow is fitted.

    Args:
        name: the recipe's name, recorded in flow files and results.
        input: "whiten" (start at whitening), "standardize" (standardised coordinates) or "raw".
        lr: Adam's learning rate.
        batch_size: training batch size.
        epochs: training epochs; with `holdout`, the most epochs tried.
        holdout: fraction held out to choose the weights by its bits/dim (0: keep the last epoch).
        evaluations_per_epoch: with `holdout`, held-out scorings per epoch (the last at its end).
        patience: with `holdout`, stop after this many scorings in a row without a new best.

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
        overrides: other `FlowRecipe` fields (`lr`, `epochs`, ...); None keeps the recipe's.

    Example:
        >>> recipe_named("paper", epochs=2)
    """
    if name not in RECIPES:
        raise ValueError(f"unknown flow recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return replace(RECIPES[name], **{key: value for key, value in overrides.items() if value is not None})

"""Lexical-overlap bias: how much a similarity follows a pair's edit distance rather than its meaning
(a similarity near the gold scores' value leans on surface overlap as much as people do, no more)."""
from __future__ import annotations

import re

import numpy as np
from scipy.stats import spearmanr

from flowcore.extras import require

Levenshtein = require("rapidfuzz.distance", "the lexical-bias analysis (flowcore analyze)", "analysis").Levenshtein

__all__ = ["EDIT_UNITS", "edit_distances", "lexical_bias"]

EDIT_UNITS = ("word", "char")
_WORDS = re.compile(r"\w+")


def edit_distances(sentences1: list[str], sentences2: list[str], unit: str = "word") -> np.ndarray:
    """Levenshtein distance between each pair of sentences, in words or characters.

    Args:
        sentences1, sentences2: the pairs, same length.
        unit: "word" (lower-cased \\w+ tokens) or "char" (the raw strings).

    Example:
        >>> edit_distances(["A man is playing a guitar."], ["A man plays a guitar."])
        array([2])
    """
    if unit not in EDIT_UNITS:
        raise ValueError(f"unknown edit-distance unit {unit!r}; choose from {', '.join(EDIT_UNITS)}")
    if len(sentences1) != len(sentences2):
        raise ValueError(f"{len(sentences1)} first sentences but {len(sentences2)} second ones")
    units = (lambda text: text) if unit == "char" else (lambda text: _WORDS.findall(text.lower()))
    return np.array([Levenshtein.distance(units(a), units(b)) for a, b in zip(sentences1, sentences2)], dtype=np.int64)


def lexical_bias(similarities: dict[str, np.ndarray], distances: np.ndarray) -> dict[str, float]:
    """Spearman ×100 of each named similarity with the edit distance; include "gold" for the reference.

    Args:
        similarities: {name: (n,) scores of the n pairs}, e.g. {"gold": ..., "none": ..., "flow": ...}.
        distances: (n,) edit distances of the same pairs.

    Example:
        >>> bias = lexical_bias({"gold": gold, "none": cosines}, edit_distances(s1, s2))
        >>> bias["none"] < bias["gold"]          # the raw similarity leans on overlap more than people do
    """
    distances = np.asarray(distances)
    result = {}
    for name, values in similarities.items():
        values = np.asarray(values, dtype=np.float64)
        if values.shape != distances.shape:
            raise ValueError(f"{name}: {values.shape[0]} similarities for {distances.shape[0]} pairs")
        constant = np.ptp(values) == 0 or np.ptp(distances) == 0
        result[name] = float("nan") if constant else 100 * float(spearmanr(values, distances)[0])
    return result

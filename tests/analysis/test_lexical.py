"""Lexical-overlap bias: word and character edit distances, and a planted dependence of
similarity on edit distance recovered by its Spearman correlation."""
import math

import numpy as np
import pytest

from flowcore.analysis.lexical import edit_distances, lexical_bias


def test_edit_distances_in_words_and_characters():
    first = ["A man is playing a guitar.", "The cat sat.", "same"]
    second = ["A man plays a guitar!", "the cat sat", "same"]
    assert edit_distances(first, second).tolist() == [2, 0, 0]  # case and punctuation ignored in words
    assert edit_distances(["kitten"], ["sitting"], unit="char").tolist() == [3]
    with pytest.raises(ValueError, match="unknown edit-distance unit"):
        edit_distances(first, second, unit="token")
    with pytest.raises(ValueError, match="3 first sentences but 2"):
        edit_distances(first, second[:2])


def test_a_planted_lexical_bias_is_recovered():
    rng = np.random.default_rng(0)
    distances = rng.integers(0, 20, size=2000)
    surface = -distances + rng.normal(scale=1.0, size=2000)    # a similarity that mostly counts shared words
    semantic = rng.normal(size=2000)                             # one that ignores them
    bias = lexical_bias({"surface": surface, "semantic": semantic, "constant": np.ones(2000)}, distances)
    assert bias["surface"] < -90
    assert abs(bias["semantic"]) < 5
    assert math.isnan(bias["constant"])
    with pytest.raises(ValueError, match="surface: 3 similarities for 2000 pairs"):
        lexical_bias({"surface": surface[:3]}, distances)

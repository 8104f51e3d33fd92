""""Does it help?": the best calibration on labelled pairs (the simpler one within the margin),
no calibration when it hurts, and without labels the isotropy change with the near-isotropic warning."""
import math

import numpy as np

from flowcore.analysis.advice import advise
from flowcore.analysis.isotropy import isotropy

RNG = np.random.default_rng(0)
ISOTROPIC = isotropy(RNG.normal(size=(2000, 16)))
CONE = isotropy(RNG.normal(size=(2000, 16)) + 3.0)


def test_labelled_pairs_pick_the_best_or_a_simpler_near_tie():
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.5, "flow": 70.2})
    assert advice.recommended == "whitening" and "within 0.5 points of the best, whitening" not in advice.reason
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.0, "flow": 70.4})
    assert advice.recommended == "whitening" and "within 0.5 points of the best, flow" in advice.reason
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.0, "flow": 72.0})
    assert advice.recommended == "flow" and "flow 72.00, whitening 70.00, none 60.00" in advice.reason
    assert advice.warnings == []


def test_calibration_that_hurts_is_not_recommended_and_failures_are_left_out():
    advice = advise({"none": ISOTROPIC}, {"none": 82.0, "whitening": 80.3, "flow": math.nan})
    assert advice.recommended == "none" and "does not help" in advice.reason
    assert advice.scores == {"none": 82.0, "whitening": 80.3}
    assert len(advice.warnings) == 1 and "already close to isotropic" in advice.warnings[0]


def test_without_labels_the_isotropy_change_is_reported():
    advice = advise({"none": CONE, "whitening": ISOTROPIC})
    assert advice.recommended is None and advice.scores == {}
    assert f"whitening: mean random-pair cosine {CONE.mean_cosine:.3f} -> {ISOTROPIC.mean_cosine:.3f}" in advice.reason
    assert advice.warnings == [] and "no recommendation" in advice.reason
    assert advise({"none": ISOTROPIC}).warnings  # already isotropic: warned even without labels

""""Does it help?": the best calibration on labelled pairs (the simpler one within the margin),
no calibration when it hurts, and without labels auto's choice, read from the same signal as
`auto`, with the balanced-neighbourhoods warning."""
import math

import numpy as np
import pytest

from flowcore.analysis import analyze
from flowcore.analysis.advice import advise
from flowcore.analysis.isotropy import isotropy
from flowcore.calibration.auto import AutoCalibration

RNG = np.random.default_rng(0)
ISOTROPIC = isotropy(RNG.normal(size=(2000, 16)))
CONE = isotropy(RNG.normal(size=(2000, 16)) + 3.0)


def anisotropic(rows=1500, dim=32, seed=0):
    """Static-avg-like: a narrow cone with a steep spectrum, where a few rows are everyone's neighbours."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) / np.arange(1, dim + 1) + 4.0).astype(np.float32)


def fine_tuned_like(rows=1500, dim=32, seed=0):
    """Close to isotropic around an offset, as a similarity-trained encoder's vectors."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, dim)) * np.linspace(1.0, 0.6, dim) + 0.5).astype(np.float32)


def test_labelled_pairs_pick_the_best_or_a_simpler_near_tie():
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.5, "flow": 70.2})
    assert advice.recommended == "whitening" and "within 0.5 points of the best, whitening" not in advice.reason
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.0, "flow": 70.4})
    assert advice.recommended == "whitening" and "within 0.5 points of the best, flow" in advice.reason
    advice = advise({"none": CONE}, {"none": 60.0, "whitening": 70.0, "flow": 72.0})
    assert advice.recommended == "flow" and "flow 72.00, whitening 70.00, none 60.00" in advice.reason
    assert advice.warnings == [] and advice.auto is None


def test_calibration_that_hurts_is_not_recommended_and_failures_are_left_out():
    auto = AutoCalibration().fit(fine_tuned_like())
    advice = advise({"none": ISOTROPIC}, {"none": 82.0, "whitening": 80.3, "flow": math.nan}, auto=auto)
    assert advice.recommended == "none" and "does not help" in advice.reason
    assert f"without labels, auto would choose {auto.reason}." in advice.reason
    assert advice.scores == {"none": 82.0, "whitening": 80.3}
    assert len(advice.warnings) == 1 and "nearest neighbours are already balanced (hubness 0." in advice.warnings[0]
    assert advice.auto == {"choice": "none", "signals": auto.signals, "reason": auto.reason}


def test_without_labels_or_auto_the_isotropy_change_is_reported():
    advice = advise({"none": CONE, "whitening": ISOTROPIC})
    assert advice.recommended is None and advice.scores == {}
    assert f"whitening: mean random-pair cosine {CONE.mean_cosine:.3f} -> {ISOTROPIC.mean_cosine:.3f}" in advice.reason
    assert advice.warnings == [] and advice.reason.startswith("No labelled pairs, so no recommendation; isotropy ")


@pytest.mark.parametrize("make, expected", [(anisotropic, "whitening"), (fine_tuned_like, "none")])
def test_without_labels_the_advice_is_autos_choice(make, expected):
    """The advice and `auto` (flowcore fit's default) read the same signal: they agree on vectors
    that need whitening and on vectors that do not."""
    vectors = make()
    auto = AutoCalibration().fit(vectors)
    result = analyze(vectors, calibrations=("none", "auto"), frequency_sources=())
    advice = result["advice"]
    assert auto.choice == expected and advice["recommended"] == expected
    assert advice["auto"] == {"choice": auto.choice, "signals": auto.signals, "reason": auto.reason}
    assert advice["reason"].startswith(f"No labelled pairs; auto's rule, from the corpus alone: {auto.reason}; ")
    assert bool(advice["warnings"]) == (expected == "none")  # warned off calibrating balanced vectors

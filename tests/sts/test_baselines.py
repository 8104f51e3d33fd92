"""The calibrations compared: whitening lifts an anisotropic representation; the factory builds
each calibration from its settings and records the settings that matter."""
import numpy as np
import pytest

from flowcore.calibration.whitening import Whitening
from flowcore.sts.baselines import (
    CALIBRATIONS,
    CalibrationSettings,
    FlowBaseline,
    NoCalibration,
    build_calibrator,
    settings_record,
)
from flowcore.sts.data import STSPairs
from flowcore.sts.metrics import cosine_similarity, score_pairs


def test_whitening_lifts_an_anisotropic_representation():
    """Two high-variance nuisance directions plus a shared offset dominate raw cosine; the six
    unit-variance directions that carry the meaning are drowned until whitening equalises them."""
    rng = np.random.default_rng(3)
    n, dim = 400, 8
    gold = rng.uniform(0, 5, size=n)
    meaning = rng.normal(size=(n, dim))
    partner = meaning * (gold[:, None] / 5) + rng.normal(size=(n, dim)) * (1 - gold[:, None] / 5)
    left, right = meaning + 5, partner + 5
    left[:, :2], right[:, :2] = rng.normal(size=(n, 2)) * 10 + 5, rng.normal(size=(n, 2)) * 10 + 5
    pairs = STSPairs("STS-B", "test", [""] * n, [""] * n, gold, ["x"] * n)
    from flowcore import Whitening

    raw = score_pairs(cosine_similarity(left, right), pairs)["spearman"]
    whitening = Whitening().fit(np.concatenate([left, right]))
    calibrated = score_pairs(cosine_similarity(whitening.transform(left), whitening.transform(right)), pairs)
    assert raw < 20 and calibrated["spearman"] > raw + 40


def test_build_calibrator_and_settings_record():
    settings = CalibrationSettings(whitening_dim=4, flow_input="whiten", flow_epochs=2, seed=7)
    assert CALIBRATIONS == ("none", "whitening", "flow", "center", "abtt", "zca")
    none = build_calibrator("none", settings)
    assert isinstance(none, NoCalibration) and none.fit([[1.0]]) is none
    assert none.transform([[1, 2]]).dtype == np.float32
    whitening = build_calibrator("whitening", settings)
    assert isinstance(whitening, Whitening) and whitening.dim == 4
    flow = build_calibrator("flow", settings, progress=False)
    assert isinstance(flow, FlowBaseline) and flow.input == "whiten" and not flow.progress
    assert flow.flow.epochs == 2 and not flow.flow.standardize
    with pytest.raises(ValueError, match="unknown calibration 'pca'"):
        build_calibrator("pca", settings)
    with pytest.raises(ValueError, match="unknown flow input 'sphere'"):
        FlowBaseline(lambda standardize: None, input="sphere")
    assert settings_record("none", settings) == {}
    assert settings_record("whitening", settings) == {"whitening_dim": 4}
    assert settings_record("flow", settings) == {"flow_config": "l2_d3_w32", "flow_recipe": "whitened",
                                                 "flow_epochs": 2, "flow_lr": 1e-3, "flow_batch_size": 32,
                                                 "flow_input": "whiten", "seed": 7, "flow_holdout": 0.1}
